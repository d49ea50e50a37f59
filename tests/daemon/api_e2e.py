#!/usr/bin/python3
"""api_e2e.py: ddtreed and ddtreectl end to end (API.md; DESIGN.md, "Failure policy").

Each case starts its own daemon (`ddtreed serve`) on a fresh state directory and socket (and a
free 127.0.0.1 port when it needs TCP), waits for GET /healthz, drives it over HTTP (stdlib
http.client over the Unix socket or TCP) and through ddtreectl, reads the SQLite store read-only
where the contract is about what is stored, and stops the daemon (SIGTERM; SIGKILL if it is
stuck, which is then a failure, as is a non-zero exit: under the sanitizers that is a report).
Runs use a tiny synthetic config, so a step takes about a millisecond.

Cases:
  1 unix_routes     every route over the Unix socket, JSON shapes, /metrics parsed
  2 tcp_token       TCP with a bearer token: 401 without / with a wrong one; ddtreectl --url
  3 bad_inputs      a table of bad requests: status, error body, and nothing stored
  4 pause_rechunk   pause holds the step still, resume moves it; rechunk shows in the records
  5 kill9_restart   SIGKILL mid-run, restart: interrupted -> running, no committed step lost
  6 sigterm         SIGTERM: exit 0, checkpoint at the exit step, no socket left; resumes
  7 ddtreectl       every command's exit status (0, 1 with the daemon's message, 2, 3)
  8 concurrency     16 threads x 100 scrapes while a run trains: no error; slowdown printed
  9 daemon_vs_foreground  one config through POST /runs and through `ddtreed train`: the same
                    steps (bit for bit), evals, checkpoints, events and runs row
 10 speculate       eval.speculative: tau_spec in GET /runs/ID, the evals rows and /metrics;
                    POST /runs/ID/speculate of the live weights and a checkpoint's, its refusals,
                    ddtreectl speculate
 11 plan_fits       "fits" alike in POST /plan and ddtreectl plan (exit status), the table's
                    rows summing to its peak, the seed's split proposed under 95 GB
 12 export_dest     a manual export (default runs/ID/exports/step-N, or out / --out) survives the
                    final export; bad destinations are 400 naming out
 13 dflash2         a DFlash2 drafter's evaluation: its unary head's figures beside its
                    selector's in GET /runs/ID, the evals rows and ddtreectl show

Output: "ok   NAME" or "FAIL NAME" with indented details, then "N passed, M failed".
Exit 0 all passed, 1 a failure, 77 skipped (ddtreed, ddtreectl or prometheus_client missing;
without ddtreectl the daemon cases still run and a failure among them is still exit 1).

  api_e2e.py --ddtreed build/bin/ddtreed --ddtreectl build/bin/ddtreectl [--only 3,5] [--keep]
"""
import argparse
import http.client
import json
import os
import re
import shutil
import signal
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback

STATES = ["queued", "running", "pausing", "paused", "completed", "failed", "cancelled", "interrupted"]
TOKEN = "e2e-secret-token-5f1c"
RUN_FIELDS = ["id", "name", "state", "step", "max_steps", "loss", "ce", "kl", "cap", "acc", "tau_chain", "unary",
              "tau_spec", "tau_spec_tree", "speculative", "tokens_per_s", "positions_per_s", "peak_memory_bytes", "chunk", "vocab_tile",
              "last_checkpoint_step", "error"]
SLOW = 1.0  # timeouts scale (the sanitizer build is several times slower)


def run_config(steps, name="e2e"):
    return {
        "name": name,
        "target": {"kind": "synthetic", "hidden_size": 32, "num_hidden_layers": 3, "num_attention_heads": 4,
                   "num_key_value_heads": 2, "head_dim": 8, "intermediate_size": 48, "vocab_size": 64},
        "drafter": {"num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
                    "intermediate_size": 48, "block_size": 4},
        "train": {"steps": steps, "sequences_per_step": 2, "seq_len": 24, "max_anchors": 3, "heldout": 2},
        "checkpoint": {"every_steps": 5, "keep": 2},
        "eval": {"every_steps": 10, "sequences": 2},
    }


LONG = 100000  # steps of a run that must stay running while it is poked


# ------------------------------------------------------------------------------------------
# Test bookkeeping

class Abort(Exception):
    """a check that the rest of the case depends on failed"""


class Case:
    def __init__(self, name):
        self.name = name
        self.errors = []
        self.notes = []
        self.daemons = []

    def check(self, cond, msg):
        if not cond:
            self.errors.append(msg)
        return bool(cond)

    def require(self, cond, msg):
        if not cond:
            self.errors.append(msg)
            raise Abort()

    def note(self, msg):
        self.notes.append(msg)


def wait_for(fn, timeout, interval=0.05):
    """fn() until it returns something true, or None after timeout seconds"""
    deadline = time.monotonic() + timeout * SLOW
    while True:
        v = fn()
        if v:
            return v
        if time.monotonic() > deadline:
            return None
        time.sleep(interval)


def short(text, n=300):
    text = text if isinstance(text, str) else repr(text)
    return text if len(text) <= n else text[:n] + "..."


# ------------------------------------------------------------------------------------------
# HTTP

class UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path, timeout=30):
        super().__init__("localhost", timeout=timeout)
        self.unix_path = path

    def connect(self):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(self.timeout)
        try:
            s.connect(self.unix_path)
        except OSError:
            s.close()
            raise
        self.sock = s


class Response:
    def __init__(self, status, headers, body):
        self.status = status
        self.headers = headers  # lower-case names
        self.body = body
        self.text = body.decode("utf-8", "replace")

    def json(self):
        return json.loads(self.text)

    def __repr__(self):
        return "%d %s" % (self.status, short(self.text))


class Client:
    """one endpoint: a Unix socket path, or (host, port); token sent when given"""

    def __init__(self, where, token=None):
        self.where = where
        self.token = token

    def connection(self, timeout=30):
        if isinstance(self.where, str):
            return UnixHTTPConnection(self.where, timeout=timeout)
        return http.client.HTTPConnection(self.where[0], self.where[1], timeout=timeout)

    def request(self, method, path, body=None, headers=None, token=None, conn=None, chunked=False):
        h = dict(headers or {})
        tok = token if token is not None else self.token
        if tok:
            h.setdefault("Authorization", "Bearer " + tok)
        if isinstance(body, (dict, list)):
            body = json.dumps(body)
        if isinstance(body, str):
            body = body.encode()
        if body is not None and not chunked:
            h.setdefault("Content-Type", "application/json")
        own = conn is None
        c = conn or self.connection()
        try:
            if chunked:
                h["Transfer-Encoding"] = "chunked"
                step = 64 * 1024
                parts = (body[i:i + step] for i in range(0, len(body), step))
                c.request(method, path, body=parts, headers=h, encode_chunked=True)
            else:
                c.request(method, path, body=body, headers=h)
            r = c.getresponse()
            data = r.read()
            return Response(r.status, {k.lower(): v for k, v in r.getheaders()}, data)
        finally:
            if own:
                c.close()

    def get(self, path, **kw):
        return self.request("GET", path, **kw)

    def post(self, path, body=None, **kw):
        return self.request("POST", path, body=body, **kw)


def free_port():
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


# ------------------------------------------------------------------------------------------
# The daemon

class Daemon:
    def __init__(self, env, case, state_dir=None, socket_path=None, config=None):
        self.env = env
        self.case = case
        base = env.tmpdir(case.name)
        self.state_dir = state_dir or os.path.join(base, "state")
        self.socket = socket_path or os.path.join(base, "api.sock")
        self.config_path = None
        if config is not None:
            self.config_path = os.path.join(base, "ddtreed.json")
            with open(self.config_path, "w") as f:
                json.dump(config, f)
        self.log_path = os.path.join(base, "daemon-%d.log" % len(case.daemons))
        self.proc = None
        self.unix = Client(self.socket)
        case.daemons.append(self)

    @property
    def db(self):
        return os.path.join(self.state_dir, "ddtree.db")

    def start(self):
        cmd = [self.env.ddtreed, "serve", "--state-dir", self.state_dir, "--socket", self.socket]
        if self.config_path:
            cmd += ["--config", self.config_path]
        self.log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=self.log, stderr=subprocess.STDOUT,
                                     start_new_session=True)

        def healthy():
            if self.proc.poll() is not None:
                return "exited"
            try:
                r = self.unix.get("/healthz")
                return "ok" if r.status == 200 else None
            except OSError:
                return None

        how = wait_for(healthy, 20)
        self.case.require(how == "ok", "the daemon did not answer GET /healthz within %ds (%s); log:\n%s"
                          % (20 * SLOW, how or "timeout", self.log_tail()))
        return self

    def log_tail(self, n=15):
        try:
            with open(self.log_path, "rb") as f:
                lines = f.read().decode("utf-8", "replace").splitlines()
        except OSError:
            return "(no log)"
        return "\n".join("      | " + line for line in lines[-n:])

    def signal(self, sig):
        self.proc.send_signal(sig)

    def wait(self, timeout):
        try:
            return self.proc.wait(timeout=timeout * SLOW)
        except subprocess.TimeoutExpired:
            return None

    def stop(self, check=True):
        """SIGTERM and wait; SIGKILL if stuck. Returns the exit status."""
        if not self.proc or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else None
        self.proc.send_signal(signal.SIGTERM)
        rc = self.wait(30)
        if rc is None:
            self.proc.kill()
            self.proc.wait()
            if check:
                self.case.check(False, "the daemon did not stop within %ds of SIGTERM; log:\n%s"
                                % (30 * SLOW, self.log_tail()))
            return None
        if check:
            self.case.check(rc == 0, "the daemon exited %s after SIGTERM; log:\n%s" % (rc, self.log_tail(25)))
        return rc

    def kill(self):
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    # ---- helpers on top of the API

    def submit(self, cfg):
        r = self.unix.post("/runs", cfg)
        self.case.require(r.status == 201, "POST /runs: %r" % r)
        return r.json()["id"]

    def run(self, rid):
        r = self.unix.get("/runs/" + rid)
        self.case.require(r.status == 200, "GET /runs/%s: %r" % (rid, r))
        return r.json()

    def wait_run(self, rid, what, pred, timeout=30):
        last = {}

        def poll():
            last["run"] = self.run(rid)
            return pred(last["run"])

        ok = wait_for(poll, timeout)
        self.case.require(ok, "run %s never got %s within %ds (last: state=%s step=%s error=%s)"
                          % (rid, what, timeout * SLOW, last.get("run", {}).get("state"),
                             last.get("run", {}).get("step"), last.get("run", {}).get("error")))
        return last["run"]

    def wait_state(self, rid, state, timeout=30, min_step=0):
        return self.wait_run(rid, "state %s (step >= %d)" % (state, min_step),
                             lambda r: r["state"] == state and r["step"] >= min_step, timeout)

    def steps(self, rid, after=None, limit=None):
        q = []
        if after is not None:
            q.append("after=%d" % after)
        if limit is not None:
            q.append("limit=%d" % limit)
        r = self.unix.get("/runs/%s/steps%s" % (rid, "?" + "&".join(q) if q else ""))
        self.case.require(r.status == 200, "GET steps: %r" % r)
        return r.json()["steps"]

    def events(self, rid):
        out, after = [], 0
        while True:
            r = self.unix.get("/runs/%s/events?after=%d&limit=10000" % (rid, after))
            self.case.require(r.status == 200, "GET events: %r" % r)
            page = r.json()["events"]
            out += page
            if len(page) < 10000:
                return out
            after = page[-1]["id"]


def db_query(path, sql, args=()):
    """the store, read-only (never writes, never blocks the daemon for long)"""
    con = sqlite3.connect("file:%s?mode=ro" % path, uri=True, timeout=10)
    try:
        return con.execute(sql, args).fetchall()
    finally:
        con.close()


def db_steps(path, rid):
    return [row[0] for row in db_query(path, "SELECT step FROM steps WHERE run_id = ? ORDER BY step", (rid,))]


# ------------------------------------------------------------------------------------------
# Checks shared by cases

SNAKE = re.compile(r"^[a-z][a-z0-9_]*$")


def check_error(t, what, r, status, field=None):
    """status, and the error body {"error": {"code", "message", "field"?}}"""
    if not t.check(r.status == status, "%s: status %d, want %d; body %s" % (what, r.status, status, short(r.text))):
        return
    t.check(r.headers.get("content-type", "").startswith("application/json"),
            "%s: Content-Type %r, want application/json" % (what, r.headers.get("content-type")))
    try:
        e = r.json()["error"]
    except (ValueError, KeyError, TypeError):
        t.check(False, "%s: the body is not {\"error\": {...}}: %s" % (what, short(r.text)))
        return
    if not t.check(isinstance(e, dict), "%s: error is not an object: %s" % (what, short(r.text))):
        return
    t.check(isinstance(e.get("code"), str) and SNAKE.match(e["code"]),
            "%s: error.code %r is not snake_case" % (what, e.get("code")))
    t.check(isinstance(e.get("message"), str) and e["message"].strip(),
            "%s: error.message missing or empty: %s" % (what, short(r.text)))
    if field is not None:
        t.check(e.get("field") == field, "%s: error.field %r, want %r (%s)" % (what, e.get("field"), field,
                                                                                short(r.text)))
    elif "field" in e:
        t.check(isinstance(e["field"], str) and e["field"], "%s: error.field %r is not a json path"
                % (what, e["field"]))


def parse_metrics(t, text):
    from prometheus_client.parser import text_string_to_metric_families
    try:
        families = list(text_string_to_metric_families(text))
    except Exception as e:  # the parser's errors are ValueError and friends
        t.require(False, "GET /metrics does not parse as Prometheus text: %s" % e)
    types = {f.name: f.type for f in families}
    samples = [s for f in families for s in f.samples]
    return types, samples


def find(samples, name, **labels):
    return [s for s in samples if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())]


def check_histogram(t, types, samples, name):
    if not t.check(types.get(name) == "histogram", "%s: type %r, want histogram" % (name, types.get(name))):
        return
    buckets = find(samples, name + "_bucket")
    count = find(samples, name + "_count")
    t.check(find(samples, name + "_sum"), "%s_sum missing" % name)
    if not t.check(buckets and count, "%s: no buckets or no _count" % name):
        return
    les = [float(b.labels["le"]) for b in buckets]
    t.check(les == sorted(les) and les[-1] == float("inf"), "%s: bucket bounds %s not ascending to +Inf" % (name, les))
    values = [b.value for b in buckets]
    t.check(all(a <= b for a, b in zip(values, values[1:])),
            "%s: bucket counts are not cumulative (each le must count every step at or below it): %s"
            % (name, ", ".join("le=%s:%g" % (b.labels["le"], b.value) for b in buckets)))
    t.check(values[-1] == count[0].value, "%s: le=\"+Inf\" bucket %g != _count %g"
            % (name, values[-1], count[0].value))
    t.check(count[0].value > 0, "%s_count is 0 while a run trains" % name)


HEX_ID = re.compile(r"^[0-9a-f]{256}$")


def check_nccl_unique_id(t, c):
    """POST /nccl/unique-id: 200 with 256 lowercase hex digits, a new id each call (a daemon
    built with CUDA/NCCL, as CI's is), or 501 with an error body (built without)"""
    r = c.post("/nccl/unique-id")
    if r.status == 501:
        check_error(t, "POST /nccl/unique-id without NCCL", r, 501)
        t.note("POST /nccl/unique-id: 501, this ddtreed has no NCCL")
        return
    if not t.check(r.status == 200, "POST /nccl/unique-id: %r (want 200, or 501 without NCCL)" % r):
        return
    first = r.json().get("nccl_unique_id")
    t.check(isinstance(first, str) and HEX_ID.match(first),
            "POST /nccl/unique-id: nccl_unique_id is not 256 lowercase hex digits: %s" % short(r.text))
    r = c.post("/nccl/unique-id")
    t.check(r.status == 200 and r.json().get("nccl_unique_id") != first,
            "POST /nccl/unique-id twice: the second answer %r is not a new id" % r)


# ------------------------------------------------------------------------------------------
# 1. every route over the Unix socket

def case_unix_routes(t, env):
    d = Daemon(env, t, config={"token": TOKEN}).start()
    c = d.unix
    r = c.get("/healthz")
    t.require(r.status == 200, "GET /healthz: %r" % r)
    h = r.json()
    t.check(h.get("status") == "ok" and isinstance(h.get("version"), str) and h["version"],
            "GET /healthz body: %s" % r.text)
    version = h.get("version")

    r = c.get("/status")
    t.require(r.status == 200, "GET /status: %r" % r)
    s = r.json()
    t.check(s.get("version") == version, "GET /status version %r != healthz %r" % (s.get("version"), version))
    t.check(isinstance(s.get("uptime_s"), (int, float)) and s["uptime_s"] >= 0, "GET /status uptime_s: %r"
            % s.get("uptime_s"))
    t.check(s.get("backend") in ("cpu", "cuda"), "GET /status backend: %r" % s.get("backend"))
    devs = s.get("devices")
    if t.check(isinstance(devs, list) and devs, "GET /status devices: %r" % devs):
        for dev in devs:
            missing = [k for k in ("id", "name", "memory_total_bytes", "memory_used_bytes", "run") if k not in dev]
            t.check(not missing, "GET /status device %s lacks %s" % (dev.get("id"), missing))
    runs = s.get("runs")
    t.check(isinstance(runs, dict) and all(isinstance(runs.get(k), int) for k in STATES),
            "GET /status runs: want a count for each of %s, got %r" % (STATES, runs))
    t.check(isinstance(s.get("config"), dict), "GET /status config: %r" % s.get("config"))
    t.check(TOKEN not in r.text, "GET /status shows the token's value: %s" % short(r.text, 600))
    t.check(all(dev.get("run") is None for dev in devs or []), "GET /status: a device has a run before any: %s"
            % devs)

    r = c.post("/runs", run_config(LONG))
    t.require(r.status == 201, "POST /runs: %r" % r)
    j = r.json()
    rid = j.get("id")
    t.require(isinstance(rid, str) and rid, "POST /runs: no id in %s" % r.text)
    t.check(j.get("state") == "queued", "POST /runs: state %r, want queued" % j.get("state"))
    t.check(r.headers.get("location") == "/runs/" + rid, "POST /runs: Location %r, want /runs/%s"
            % (r.headers.get("location"), rid))
    run = d.wait_run(rid, "running with an eval and two checkpoints",
                     lambda x: x["state"] == "running" and x["step"] >= 12 and (x["last_checkpoint_step"] or 0) >= 10)

    devs = c.get("/status").json().get("devices") or []
    t.check(any(dev.get("run") == rid for dev in devs), "GET /status: no device shows run %s: %s" % (rid, devs))
    r = c.get("/runs")
    t.check(r.status == 200 and rid in [x["id"] for x in r.json()["runs"]], "GET /runs lacks %s: %r" % (rid, r))
    r = c.get("/runs?state=running")
    t.check(r.status == 200 and [x["id"] for x in r.json()["runs"]] == [rid], "GET /runs?state=running: %r" % r)
    r = c.get("/runs?state=completed")
    t.check(r.status == 200 and r.json()["runs"] == [], "GET /runs?state=completed: %r" % r)

    run = d.run(rid)
    missing = [k for k in RUN_FIELDS if k not in run]
    for stamp in ("created", "started", "updated"):
        if not any(k.startswith(stamp) for k in run):
            missing.append(stamp + "_*")
    t.check(not missing, "GET /runs/ID lacks %s: %s" % (missing, short(json.dumps(run), 600)))
    t.check(run.get("name") == "e2e" and run.get("max_steps") == LONG, "GET /runs/ID name/max_steps: %s"
            % short(json.dumps(run)))
    for k in ("loss", "ce", "kl", "acc", "tau_chain", "tokens_per_s", "positions_per_s", "chunk", "vocab_tile"):
        t.check(isinstance(run.get(k), (int, float)), "GET /runs/ID %s is %r while running past an eval" % (k, run.get(k)))
    peak = run.get("peak_memory_bytes")
    t.check(isinstance(peak, dict) and isinstance(peak.get("max"), (int, float)) and peak["max"] > 0
            and isinstance(peak.get("devices"), dict) and peak["devices"],
            "GET /runs/ID peak_memory_bytes (per device and max): %r" % peak)

    steps = d.steps(rid)
    nums = [x["step"] for x in steps]
    t.check(nums[:1] == [1] and nums == list(range(1, len(nums) + 1)), "GET steps: not 1..N: %s" % short(str(nums)))
    if steps:
        miss = [k for k in ("step", "ts_ms", "loss", "ce", "kl", "cap", "acc", "lr", "grad_norm", "tokens",
                            "positions", "step_ms", "tokens_per_s", "positions_per_s", "peak_bytes", "chunk",
                            "vocab_tile") if k not in steps[0]]
        t.check(not miss, "GET steps: a record lacks %s" % miss)
    t.check([x["step"] for x in d.steps(rid, after=3, limit=2)] == [4, 5], "GET steps?after=3&limit=2 is not 4, 5")
    r = c.get("/runs/%s/steps?format=csv&after=3&limit=2" % rid)
    t.check(r.status == 200 and r.headers.get("content-type", "").startswith("text/csv"),
            "GET steps?format=csv: %d %s" % (r.status, r.headers.get("content-type")))
    lines = r.text.strip().splitlines()
    header = lines[0].split(",") if lines else []
    t.check(header[:1] == ["step"] and "loss" in header and "chunk" in header,
            "GET steps?format=csv: no header line: %s" % short(r.text))
    t.check([ln.split(",")[0] for ln in lines[1:]] == ["4", "5"],
            "GET steps?format=csv&after=3&limit=2: rows %s" % [ln.split(",")[0] for ln in lines[1:]])
    t.check(all(len(ln.split(",")) == len(header) for ln in lines[1:]), "CSV rows and header differ in width")
    # the web view's reads: the history thinned (every k-th step and the last), the evals, the config
    r = c.get("/runs/%s/steps?max_points=3" % rid)
    thin = [x["step"] for x in r.json().get("steps", [])] if r.status == 200 else []
    t.check(r.status == 200 and nums and 2 <= len(thin) <= 4 and thin[0] == 1 and thin[-1] >= nums[-1],
            "GET steps?max_points=3 of %d steps: %s" % (len(nums), thin))
    check_error(t, "GET steps?max_points=0", c.get("/runs/%s/steps?max_points=0" % rid), 400, "max_points")
    r = c.get("/runs/%s/evals" % rid)
    evals = r.json().get("evals", []) if r.status == 200 else []
    t.check(r.status == 200 and evals and evals[0].get("step") == 0 and "tau_chain" in evals[0]
            and isinstance(evals[0].get("tau_tree"), dict), "GET evals: %s" % short(r.text))
    r = c.get("/runs/%s/config" % rid)
    t.check(r.status == 200 and r.json().get("name") == "e2e", "GET config: %s" % short(r.text))
    # a browser's POST from elsewhere, and one without the pages' CSRF token, change nothing
    for what, headers, code in (("a foreign Origin", {"Origin": "http://evil.example"}, "cross_origin"),
                                ("a browser without the CSRF token", {"Sec-Fetch-Site": "same-origin"}, "csrf")):
        r = c.post("/runs/%s/pause" % rid, headers=headers)
        check_error(t, "POST pause with " + what, r, 403)
        t.check(r.status != 403 or r.json()["error"]["code"] == code, "POST pause with %s: %s" % (what, short(r.text)))

    events = d.events(rid)
    kinds = {e.get("kind") for e in events}
    t.check(any(e.get("kind") == "state" and (e.get("detail") or {}).get("state") == "running" for e in events),
            "GET events: no state event for running: %s" % short(json.dumps(events[:5])))
    t.check("checkpoint" in kinds, "GET events: no checkpoint event (kinds %s)" % kinds)
    t.check(all(isinstance(e.get("ts_ms"), int) for e in events), "GET events: an event without ts_ms")
    states = [e["detail"] for e in events if e.get("kind") == "state"]
    dups = [(a, b) for a, b in zip(states, states[1:]) if a.get("state") == b.get("state")]
    t.check(not dups, "GET events: a state event repeats the state before it (not a change): %s"
            % short(json.dumps(dups[:2])))

    r = c.post("/plan", run_config(LONG))
    t.check(r.status == 200, "POST /plan: %r" % r)
    if r.status == 200:
        p = r.json()
        t.check(isinstance(p.get("fits"), bool) and p["fits"], "POST /plan fits: %r" % p.get("fits"))
        t.check(isinstance(p.get("predicted_peak_bytes"), int) and p["predicted_peak_bytes"] > 0,
                "POST /plan predicted_peak_bytes: %r" % p.get("predicted_peak_bytes"))
        t.check(isinstance(p.get("bytes"), dict) and p["bytes"] and "chunk" in p and "vocab_tile" in p,
                "POST /plan: bytes per component, chunk, vocab_tile: %s" % short(r.text))
        t.check("card" not in p and p.get("budget_from") == "none", "POST /plan without a card: %s" % short(r.text))
    # memory.card: the card and its limits; on GPU ranks its memory is the budget (none given)
    r = c.post("/plan", dict(run_config(LONG), memory={"card": "rtx-pro-6000"}))
    t.check(r.status == 200, "POST /plan with memory.card: %r" % r)
    if r.status == 200:
        p, k = r.json(), r.json().get("card") or {}
        t.check(k.get("name") == "rtx-pro-6000" and k.get("memory_bytes", 0) > 0 and
                k.get("shared_memory_per_block_bytes", 0) > 0 and k.get("threads_per_sm", 0) > 0 and
                p.get("budget_from") == ("card" if k.get("applies") else "none") and
                (not k.get("applies") or p.get("budget_bytes") == k["memory_bytes"]),
                "POST /plan with memory.card: the card, its limits and the budget: %s" % short(r.text))

    check_nccl_unique_id(t, c)

    r = c.get("/metrics")
    t.check(r.status == 200 and "0.0.4" in r.headers.get("content-type", ""),
            "GET /metrics: %d Content-Type %r" % (r.status, r.headers.get("content-type")))
    types, samples = parse_metrics(t, r.text)
    t.check(find(samples, "ddtree_build_info", version=version) and
            find(samples, "ddtree_build_info")[0].value == 1, "ddtree_build_info{version=%r} 1 missing" % version)
    by_state = {s.labels.get("state"): s.value for s in find(samples, "ddtree_runs")}
    t.check(set(by_state) == set(STATES) and by_state.get("running") == 1,
            "ddtree_runs{state}: %s" % by_state)
    st = find(samples, "ddtree_run_step", run=rid)
    t.check(st and st[0].value > 0, "ddtree_run_step{run=%s} missing or 0" % rid)
    terms = {s.labels.get("term") for s in find(samples, "ddtree_run_loss", run=rid)}
    t.check(terms >= {"total", "ce", "kl", "cap"}, "ddtree_run_loss terms: %s" % terms)
    for name, labels in (("ddtree_run_tokens_total", {"run": rid}), ("ddtree_run_tokens_per_second", {"run": rid}),
                         ("ddtree_run_acceptance_length", {"run": rid, "kind": "chain"}),
                         ("ddtree_device_memory_peak_bytes", {}), ("ddtree_device_memory_used_bytes", {}),
                         ("ddtree_oom_recoveries_total", {"run": rid})):
        t.check(find(samples, name, **labels), "/metrics lacks %s%s" % (name, labels or ""))
    check_histogram(t, types, samples, "ddtree_step_duration_seconds")
    ok200 = find(samples, "ddtree_http_requests_total", code="200")
    t.check(ok200 and ok200[0].value > 0 and find(samples, "ddtree_http_requests_total", code="201"),
            "ddtree_http_requests_total{code=200|201} missing")
    t.check(types.get("ddtree_http_requests") == "counter", "ddtree_http_requests_total is not a counter")

    r = c.post("/runs/%s/checkpoint" % rid)
    t.check(r.status == 202, "POST checkpoint: %r" % r)
    r = c.post("/runs/%s/export" % rid)
    t.check(r.status in (200, 202) and isinstance(r.json().get("path"), str), "POST export: %r" % r)
    if r.status in (200, 202):
        path = r.json()["path"]
        t.check(wait_for(lambda: os.path.exists(os.path.join(path, "config.json")), 10),
                "POST export: %s/config.json never appeared" % path)

    r = c.post("/runs/%s/cancel" % rid)
    t.check(r.status == 202, "POST cancel: %r" % r)
    run = d.wait_state(rid, "cancelled")
    t.check(run["last_checkpoint_step"] == run["step"], "cancelled at step %s but the final checkpoint is %s"
            % (run["step"], run["last_checkpoint_step"]))
    t.check(run.get("finished_ms") is not None, "a cancelled run has no finished timestamp")
    s = c.get("/status").json()
    t.check(s["runs"].get("cancelled") == 1 and s["runs"].get("running") == 0, "GET /status runs: %s" % s["runs"])
    d.stop()


# ------------------------------------------------------------------------------------------
# 2. TCP with a token

def case_tcp_token(t, env):
    port = free_port()
    d = Daemon(env, t, config={"listen": "127.0.0.1:%d" % port, "token": TOKEN}).start()
    tcp = Client(("127.0.0.1", port))
    for path in ("/healthz", "/status", "/runs", "/metrics"):
        r = tcp.get(path)
        check_error(t, "GET %s over TCP without a token" % path, r, 401)
        if r.status == 401:
            t.check("bearer" in r.headers.get("www-authenticate", "").lower(),
                    "401 without WWW-Authenticate: Bearer (%r)" % r.headers.get("www-authenticate"))
        check_error(t, "GET %s over TCP with a wrong token" % path, tcp.get(path, token="wrong"), 401)
        check_error(t, "GET %s over TCP with the token as Basic" % path,
                    tcp.get(path, headers={"Authorization": "Basic " + TOKEN}), 401)
        r = tcp.get(path, token=TOKEN)
        t.check(r.status == 200, "GET %s over TCP with the token: %r" % (path, r))
    n_before = len(d.unix.get("/runs").json()["runs"])
    check_error(t, "POST /runs over TCP without a token", tcp.post("/runs", run_config(30)), 401)
    t.check(len(d.unix.get("/runs").json()["runs"]) == n_before, "an unauthorized POST /runs stored a run")
    t.check(db_query(d.db, "SELECT COUNT(*) FROM runs")[0][0] == n_before, "an unauthorized POST /runs is in the db")

    r = tcp.post("/runs", run_config(30), token=TOKEN)
    t.require(r.status == 201, "POST /runs over TCP with the token: %r" % r)
    rid = r.json()["id"]
    r = tcp.get("/runs/" + rid, token=TOKEN)
    t.check(r.status == 200 and r.json()["id"] == rid, "GET /runs/ID over TCP: %r" % r)
    t.check(d.unix.get("/status").status == 200, "the Unix socket wants a token too")
    d.wait_state(rid, "completed", min_step=30)

    if env.ddtreectl:
        url = "http://127.0.0.1:%d" % port
        res = env.ctl(["--url", url, "status"], token=TOKEN)
        t.check(res.returncode == 0, "ddtreectl --url status with DDTREE_TOKEN: exit %d %s" % (res.returncode, res.out))
        res = env.ctl(["--url", url, "runs"], token=TOKEN)
        t.check(res.returncode == 0 and rid in res.stdout, "ddtreectl --url runs: exit %d %s" % (res.returncode, res.out))
        res = env.ctl(["--url", url, "show", rid], token=TOKEN)
        t.check(res.returncode == 0 and rid in res.stdout, "ddtreectl --url show: exit %d %s" % (res.returncode, res.out))
        res = env.ctl(["--url", url, "status"])
        t.check(res.returncode == 1 and res.stderr.strip(),
                "ddtreectl --url status without DDTREE_TOKEN: exit %d (want 1 with the daemon's message) %s"
                % (res.returncode, res.out))
        res = env.ctl(["--url", url, "status"], token="wrong")
        t.check(res.returncode == 1, "ddtreectl --url status with a wrong token: exit %d %s" % (res.returncode, res.out))
        res = env.ctl(["--url", "http://127.0.0.1:%d" % free_port(), "status"], token=TOKEN)
        t.check(res.returncode == 3, "ddtreectl --url to a closed port: exit %d (want 3) %s" % (res.returncode, res.out))
    else:
        t.note("ddtreectl --url not checked: ddtreectl missing")
    d.stop()


# ------------------------------------------------------------------------------------------
# 2b. the web view's login: wrong tokens limited per client address (daemon/ui_login_limit.c)

def case_login_limit(t, env):
    port = free_port()
    d = Daemon(env, t, config={"listen": "127.0.0.1:%d" % port, "token": TOKEN}).start()
    form = {"Content-Type": "application/x-www-form-urlencoded"}

    def login(source, token):
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=30 * SLOW, source_address=(source, 0))
        try:
            c.request("POST", "/ui/login", body="token=" + token, headers=form)
            r = c.getresponse()
            r.read()
            return r.status, {k.lower(): v for k, v in r.getheaders()}
        finally:
            c.close()

    # wrong tokens from one address until it is told to wait: the first few are answered 401, then
    # 429 (each wait doubles, so one comes however slowly the requests go)
    statuses, headers = [], {}
    for _ in range(14):
        status, headers = login("127.0.0.2", "wrong")
        statuses.append(status)
        if status == 429:
            break
    t.check(statuses[:3] == [401, 401, 401], "the first three wrong tokens were not each a 401: %r" % statuses)
    t.require(statuses[-1] == 429, "wrong tokens from one address never got a 429: %r" % statuses)
    wait = headers.get("retry-after", "")
    t.require(wait.isdigit() and int(wait) >= 1, "429 without a Retry-After of whole seconds: %r" % headers)
    # meanwhile the right token from another address logs in
    status, h = login("127.0.0.1", TOKEN)
    t.check(status == 303 and "ddtree_session=" in h.get("set-cookie", ""),
            "the right token from another address while one waits: %d %r" % (status, h))
    text = d.unix.get("/metrics").body.decode()
    fails = re.search(r"^ddtree_ui_login_failures_total (\d+)$", text, re.M)
    refused = re.search(r"^ddtree_ui_login_refused_total (\d+)$", text, re.M)
    t.check(fails and int(fails.group(1)) == statuses.count(401) and refused and int(refused.group(1)) >= 1,
            "/metrics does not count the wrong tokens (%d) and the refusal: %r %r"
            % (statuses.count(401), fails and fails.group(0), refused and refused.group(0)))
    t.check("wrong token at the login client=127.0.0.2" in open(d.log_path, "rb").read().decode("utf-8", "replace"),
            "the daemon's log does not name the address of the wrong tokens:\n%s" % d.log_tail())
    # once the wait is over, the right token from the waiting address logs in, and clears its count
    time.sleep(int(wait) + 0.2)
    status, h = login("127.0.0.2", TOKEN)
    t.check(status == 303, "the right token after the wait: %d %r" % (status, h))
    status, _ = login("127.0.0.2", "wrong")
    t.check(status == 401, "a wrong token after a login counts from zero again: %d" % status)
    d.stop()


# ------------------------------------------------------------------------------------------
# 2c. slow and abusive clients: one address's share of the TCP listener, and a whole-request
# deadline that a header line every half second does not reset (daemon/server/http.c)

def case_slow_clients(t, env):
    port = free_port()
    d = Daemon(env, t, config={"listen": "127.0.0.1:%d" % port, "max_connections_per_address": 16,
                                "request_timeout_s": 3, "connection_timeout_s": 30}).start()
    import select
    trickling = []
    for _ in range(64):   # from 127.0.0.2: a request line, then a header line every 0.5 s, never the end
        c = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        c.bind(("127.0.0.2", 0))
        c.connect(("127.0.0.1", port))
        c.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        trickling.append(c)
    start = time.monotonic()
    open_at = {c: None for c in trickling}   # None: still open; else when the daemon closed it
    scrape = Client(("127.0.0.1", port))
    latencies, held_after_1s = [], None

    def tick():
        now = time.monotonic() - start
        for c in trickling:
            if open_at[c] is not None:
                continue
            gone = False
            try:
                readable, _, _ = select.select([c], [], [], 0)
                if readable and not c.recv(4096):
                    gone = True
                if not gone:
                    c.sendall(b"X-Slow: 1\r\n")
            except OSError:
                gone = True
            if gone:
                open_at[c] = now
        return sum(1 for c in trickling if open_at[c] is None)

    deadline = 20 * SLOW
    while time.monotonic() - start < deadline:
        still = tick()
        if held_after_1s is None and time.monotonic() - start >= 1.0:
            held_after_1s = still
        t0 = time.monotonic()   # a Prometheus-style scrape from another address, meanwhile
        r = scrape.get("/metrics")
        latencies.append(time.monotonic() - t0)
        t.check(r.status == 200, "a scrape from 127.0.0.1 while 127.0.0.2 trickles: %r" % r)
        if still == 0:
            break
        time.sleep(0.5)
    for c in trickling:
        c.close()
    t.check(held_after_1s is not None and 1 <= held_after_1s <= 16,
            "connections from one address still open after 1 s: %s (want 1 to 16, the per-address limit)"
            % held_after_1s)
    closed = [v for v in open_at.values() if v is not None]
    t.check(len(closed) == 64, "%d of 64 trickling connections still open after %.0f s: the whole-request "
            "deadline (3 s) did not close them" % (64 - len(closed), deadline))
    t.note("%d scrapes answered while 64 connections trickled from another address, the slowest in %.3f s"
           % (len(latencies), max(latencies)))
    log = open(d.log_path, "rb").read().decode("utf-8", "replace")
    t.check("its connection closed client=127.0.0.2" in log, "the deadline's closures are not logged with "
            "the client's address:\n%s" % d.log_tail())
    d.stop()


# ------------------------------------------------------------------------------------------
# 3. bad inputs: status, error body, nothing stored

def case_bad_inputs(t, env):
    d = Daemon(env, t).start()
    c = d.unix
    done = d.submit(run_config(10, name="done"))
    d.wait_state(done, "completed", min_step=10)
    a = d.submit(run_config(LONG, name="a"))
    d.wait_state(a, "running", min_step=3)
    b = d.submit(run_config(LONG, name="b"))
    t.check(d.run(b)["state"] == "queued", "a second run is not queued behind the first (max_parallel_runs 1)")

    def snapshot():
        api = sorted((x["id"], x["name"], x["max_steps"]) for x in c.get("/runs").json()["runs"])
        db = db_query(d.db, "SELECT id, name, config_json, created_ms, max_steps FROM runs ORDER BY id")
        ev = db_query(d.db, "SELECT COUNT(*) FROM events WHERE run_id = ?", (done,))[0][0]
        return api, db, ev

    before = snapshot()
    good = run_config(50)

    def variant(fn):
        cfg = json.loads(json.dumps(good))
        fn(cfg)
        return cfg

    big = json.dumps(variant(lambda x: x.update(name="n" * (2 << 20)))).encode()
    # runs that could not start, refused at submit (issue 27): an hf target whose files are
    # stat'ed only (a config.json of 100 ids, an empty weights file), a JSON Lines file
    model = os.path.join(os.path.dirname(d.state_dir), "files_model")
    os.makedirs(model, exist_ok=True)
    json.dump({"model_type": "qwen3", "hidden_size": 16, "num_hidden_layers": 12, "num_attention_heads": 2,
               "num_key_value_heads": 1, "head_dim": 8, "intermediate_size": 32, "vocab_size": 100,
               "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "max_position_embeddings": 4096},
              open(os.path.join(model, "config.json"), "w"))
    open(os.path.join(model, "model.safetensors"), "wb").close()
    chat = os.path.join(os.path.dirname(d.state_dir), "files_chat.jsonl")
    with open(chat, "w") as f:
        f.write('{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}\n')

    def hf(**target):
        return variant(lambda x: x.update(target=dict(dict(kind="hf", path=model), **target)))

    rows = [
        ("a relative target.path", "POST", "/runs", hf(path="models/x"), 400, "target.path"),
        ("a relative JSONL path", "POST", "/runs", hf(data={"files": ["chat.jsonl"]}), 400, "target.data.files[0]"),
        ("a misspelled JSONL path", "POST", "/runs", hf(data={"files": [chat, chat + "x"]}), 400,
         "target.data.files[1]"),
        ("a misspelled token file", "POST", "/runs", hf(tokens=chat + ".tokens"), 400, "target.tokens"),
        ("chat data without tokenizer.json", "POST", "/runs", hf(data={"files": [chat]}), 400, "target.path"),
        ("a misspelled target.path", "POST", "/runs", hf(path=model + "x"), 400, "target.path"),
        # what, method, path, body, status, field
        ("malformed JSON", "POST", "/runs", '{"name": "x", ', 400, None),
        ("empty body", "POST", "/runs", "", 400, None),
        ("a JSON array", "POST", "/runs", "[1, 2, 3]", 400, None),
        ("a JSON string", "POST", "/runs", '"run"', 400, None),
        ("trailing garbage", "POST", "/runs", json.dumps(good) + " x", 400, None),
        ("unknown top-level key", "POST", "/runs", variant(lambda x: x.update(bogus=1)), 400, "bogus"),
        ("unknown nested key", "POST", "/runs", variant(lambda x: x["drafter"].update(bogus=1)), 400,
         "drafter.bogus"),
        ("wrong type: steps a string", "POST", "/runs", variant(lambda x: x["train"].update(steps="10")), 400,
         "train.steps"),
        ("wrong type: name a number", "POST", "/runs", variant(lambda x: x.update(name=5)), 400, "name"),
        ("wrong type: train an array", "POST", "/runs", variant(lambda x: x.update(train=[])), 400, "train"),
        ("out of range: steps -5", "POST", "/runs", variant(lambda x: x["train"].update(steps=-5)), 400,
         "train.steps"),
        ("out of range: steps 0", "POST", "/runs", variant(lambda x: x["train"].update(steps=0)), 400,
         "train.steps"),
        ("out of range: steps 2.5", "POST", "/runs", variant(lambda x: x["train"].update(steps=2.5)), 400,
         "train.steps"),
        ("unknown target kind", "POST", "/runs", variant(lambda x: x["target"].update(kind="nope")), 400,
         "target.kind"),
        ("2 MiB body", "POST", "/runs", big, 413, None),
        ("2 MiB body, chunked", "POST", "/runs", ("chunked", big), 413, None),
        ("plan: unknown key", "POST", "/plan", variant(lambda x: x.update(bogus=1)), 400, "bogus"),
        ("plan: malformed", "POST", "/plan", "{", 400, None),
        ("plan: an unknown card", "POST", "/plan", variant(lambda x: x.update(memory={"card": "rtx6000"})), 400,
         "memory.card"),
        ("a budget beyond the card", "POST", "/runs",
         variant(lambda x: x.update(memory={"card": "h100", "budget_bytes": 10 ** 12})), 400, "memory.budget_bytes"),
        ("GET an unknown run", "GET", "/runs/r00000000-000000-dead", None, 404, None),
        ("pause an unknown run", "POST", "/runs/r00000000-000000-dead/pause", None, 404, None),
        ("steps of an unknown run", "GET", "/runs/r00000000-000000-dead/steps", None, 404, None),
        ("unknown action", "POST", "/runs/%s/explode" % a, None, 404, None),
        ("unknown path", "GET", "/nope", None, 404, None),
        ("unknown path under /runs", "GET", "/runs/%s/steps/1" % a, None, 404, None),
        ("DELETE /runs", "DELETE", "/runs", None, 405, None),
        ("POST /healthz", "POST", "/healthz", "{}", 405, None),
        ("PUT /metrics", "PUT", "/metrics", "{}", 405, None),
        ("GET /plan", "GET", "/plan", None, 405, None),
        ("GET /nccl/unique-id", "GET", "/nccl/unique-id", None, 405, None),
        ("GET pause", "GET", "/runs/%s/pause" % a, None, 405, None),
        ("POST steps", "POST", "/runs/%s/steps" % a, "{}", 405, None),
        ("?state=bogus", "GET", "/runs?state=bogus", None, 400, "state"),
        ("?limit=0", "GET", "/runs/%s/steps?limit=0" % a, None, 400, "limit"),
        ("?limit=abc", "GET", "/runs/%s/steps?limit=abc" % a, None, 400, "limit"),
        ("?limit=-1", "GET", "/runs/%s/events?limit=-1" % a, None, 400, "limit"),
        ("?limit=10000000", "GET", "/runs/%s/steps?limit=10000000" % a, None, 400, "limit"),
        ("?after=x", "GET", "/runs/%s/steps?after=x" % a, None, 400, "after"),
        ("?format=xml", "GET", "/runs/%s/steps?format=xml" % a, None, 400, "format"),
        # rechunk on the running run
        ("rechunk chunk 0", "POST", "/runs/%s/rechunk" % a, {"chunk": 0}, 400, "chunk"),
        ("rechunk chunk -3", "POST", "/runs/%s/rechunk" % a, {"chunk": -3}, 400, "chunk"),
        ("rechunk chunk 1.5", "POST", "/runs/%s/rechunk" % a, {"chunk": 1.5}, 400, "chunk"),
        ("rechunk chunk \"8\"", "POST", "/runs/%s/rechunk" % a, {"chunk": "8"}, 400, "chunk"),
        ("rechunk vocab_tile -1", "POST", "/runs/%s/rechunk" % a, {"vocab_tile": -1}, 400, "vocab_tile"),
        ("rechunk good chunk, bad vocab_tile", "POST", "/runs/%s/rechunk" % a, {"chunk": 8, "vocab_tile": -1},
         400, "vocab_tile"),
        ("rechunk unknown key", "POST", "/runs/%s/rechunk" % a, {"chunks": 8}, 400, "chunks"),
        ("rechunk empty object", "POST", "/runs/%s/rechunk" % a, {}, 400, None),
        ("rechunk an array", "POST", "/runs/%s/rechunk" % a, [8], 400, None),
        ("rechunk malformed", "POST", "/runs/%s/rechunk" % a, "{chunk: 8}", 400, None),
        # illegal transitions
        ("pause a queued run", "POST", "/runs/%s/pause" % b, None, 409, None),
        ("resume a running run", "POST", "/runs/%s/resume" % a, None, 409, None),
        ("resume a queued run", "POST", "/runs/%s/resume" % b, None, 409, None),
        ("pause a completed run", "POST", "/runs/%s/pause" % done, None, 409, None),
        ("resume a completed run", "POST", "/runs/%s/resume" % done, None, 409, None),
        ("cancel a completed run", "POST", "/runs/%s/cancel" % done, None, 409, None),
        ("rechunk a completed run", "POST", "/runs/%s/rechunk" % done, {"chunk": 8}, 409, None),
        ("checkpoint a completed run", "POST", "/runs/%s/checkpoint" % done, None, 409, None),
    ]
    for what, method, path, body, status, field in rows:
        chunked = isinstance(body, tuple)
        try:
            r = c.request(method, path, body=body[1] if chunked else body, chunked=chunked)
        except OSError as e:
            t.check(False, "%s: %s %s: the connection failed: %r" % (what, method, path, e))
            continue
        check_error(t, "%s (%s %s)" % (what, method, path.split("?")[0].replace(a, "A")), r, status, field)
    t.check(c.get("/healthz").status == 200, "the daemon stopped answering after the bad inputs")

    # a paused run cannot be paused again
    r = c.post("/runs/%s/pause" % a)
    t.check(r.status == 202, "pause the running run: %r" % r)
    d.wait_state(a, "paused")
    check_error(t, "pause a paused run", c.post("/runs/%s/pause" % a), 409)

    # nothing stored, nothing changed
    after = snapshot()
    t.check(after[0] == before[0], "GET /runs changed: %s -> %s" % (before[0], after[0]))
    t.check(after[1] == before[1], "the runs table changed: %d rows -> %d rows" % (len(before[1]), len(after[1])))
    t.check(after[2] == before[2], "refused requests on the completed run added %d events" % (after[2] - before[2]))
    t.check(d.run(b)["state"] == "queued", "run b is %s, want queued" % d.run(b)["state"])
    t.check(d.run(done)["state"] == "completed", "the completed run is %s" % d.run(done)["state"])
    chunks = {row[0] for row in db_query(d.db, "SELECT DISTINCT chunk FROM steps WHERE run_id = ?", (a,))}
    t.check(chunks == {4096}, "refused rechunks changed the chunk of run a: %s" % chunks)
    d.stop()


# ------------------------------------------------------------------------------------------
# 4. pause holds the step; rechunk shows in the records

def case_pause_rechunk(t, env):
    d = Daemon(env, t).start()
    c = d.unix
    cfg = run_config(LONG)
    cfg["target"]["vocab_size"] = 2048   # a loss workspace that a smaller chunk shrinks (the peak falls)
    rid = d.submit(cfg)
    d.wait_state(rid, "running", min_step=20)
    r = c.post("/runs/%s/pause" % rid)
    t.check(r.status == 202 and r.json().get("state") == "pausing", "POST pause: %r" % r)
    run = d.wait_state(rid, "paused")
    s1 = run["step"]
    t.check(run["last_checkpoint_step"] == s1, "paused at step %d, checkpoint at %s" % (s1, run["last_checkpoint_step"]))
    db1 = db_steps(d.db, rid)
    time.sleep(1.0)
    run2 = d.run(rid)
    t.check(run2["step"] == s1 and run2["state"] == "paused", "paused: step %d then %d a second later (%s)"
            % (s1, run2["step"], run2["state"]))
    db2 = db_steps(d.db, rid)
    t.check(db1 == db2 and (db2[-1] if db2 else 0) == s1, "paused: the steps table moved (%s -> %s, step %d)"
            % (db1[-1:] or None, db2[-1:] or None, s1))
    states = [e["detail"].get("state") for e in d.events(rid) if e["kind"] == "state"]
    t.check(states[-2:] == ["pausing", "paused"], "state events end with %s, want pausing, paused" % states[-4:])
    # a checkpoint asked of a paused run: written at the same step, the run stays paused
    n_ckpt = len([e for e in d.events(rid) if e["kind"] == "checkpoint"])
    r = c.post("/runs/%s/checkpoint" % rid)
    t.check(r.status == 202, "POST checkpoint of a paused run: %r" % r)
    t.check(wait_for(lambda: len([e for e in d.events(rid) if e["kind"] == "checkpoint"]) > n_ckpt, 10),
            "POST checkpoint of a paused run wrote no checkpoint event")
    run2 = d.run(rid)
    t.check(run2["state"] == "paused" and run2["step"] == s1, "after a checkpoint while paused: %s at step %d (paused at %d)"
            % (run2["state"], run2["step"], s1))
    states = [e["detail"] for e in d.events(rid) if e["kind"] == "state"]
    dups = [(a["state"], a.get("step")) for a, b in zip(states, states[1:]) if a.get("state") == b.get("state")]
    t.check(not dups, "state events repeat a state with no change between (checkpoint while paused?): %s; "
            "last: %s" % (dups, [(x["state"], x.get("step")) for x in states[-4:]]))

    r = c.post("/runs/%s/resume" % rid)
    t.check(r.status == 202, "POST resume: %r" % r)
    d.wait_run(rid, "running past step %d" % s1, lambda x: x["state"] == "running" and x["step"] > s1 + 5, 10)

    r = c.post("/runs/%s/rechunk" % rid, {"chunk": 8})
    t.require(r.status == 202 and isinstance(r.json().get("applies_from_step"), int), "POST rechunk: %r" % r)
    S = r.json()["applies_from_step"]
    d.wait_run(rid, "step %d" % (S + 5), lambda x: x["step"] >= S + 5, 20)
    recs = {x["step"]: x for x in d.steps(rid, after=S - 3, limit=8)}
    t.check(all(recs[s]["chunk"] == 8 for s in range(S, S + 5) if s in recs),
            "rechunk to 8 answered applies_from_step %d, but the records say %s"
            % (S, ", ".join("step %d chunk %d" % (s, recs[s]["chunk"]) for s in sorted(recs))))
    t.check(all(recs[s]["chunk"] == 4096 for s in range(S - 2, S) if s in recs and s > s1),
            "steps before applies_from_step %d already have chunk 8: %s" % (S, {s: recs[s]["chunk"] for s in recs}))
    t.check(d.run(rid)["chunk"] == 8, "GET /runs/ID chunk after rechunk: %r" % d.run(rid)["chunk"])
    # the run's peak is the largest of its steps' (the earlier chunk's), not the newest step's
    # smaller one; per device too; newest_step is the newest step's
    peak = d.run(rid)["peak_memory_bytes"]
    rows = db_query(d.db, "SELECT MAX(peak_bytes) FROM steps WHERE run_id = ?", (rid,))
    dev_rows = db_query(d.db, "SELECT device, MAX(peak_bytes) FROM step_devices WHERE run_id = ? GROUP BY device",
                        (rid,))
    newest = d.steps(rid, after=d.run(rid)["step"] - 1, limit=1)
    t.check(peak["max"] == rows[0][0] and peak["newest_step"] < peak["max"],
            "peak_memory_bytes after rechunk 4096 -> 8: %r; the steps' largest %r (the newest step's must be "
            "below it)" % (peak, rows[0][0]))
    t.check(all(peak["devices"].get("cpu:%d" % dv) == mx for dv, mx in dev_rows),
            "peak_memory_bytes.devices %r, the steps' largest per device %r" % (peak["devices"], dev_rows))
    t.check(not newest or newest[0]["peak_bytes"] <= peak["max"], "the newest step's peak %r above max %r"
            % (newest and newest[0]["peak_bytes"], peak["max"]))
    ev = [e for e in d.events(rid) if e["kind"] == "rechunk"]
    t.check(ev, "no event of kind rechunk")
    if ev:
        det = ev[-1].get("detail") or {}
        t.check(json.dumps(det).find("8") >= 0, "rechunk event detail lacks the new chunk: %s" % det)
        if "applies_from_step" in det and det["applies_from_step"] != S:
            t.check(False, "rechunk: the API answered applies_from_step %d, its event says %d"
                    % (S, det["applies_from_step"]))

    r = c.post("/runs/%s/rechunk" % rid, {"vocab_tile": 16})
    t.require(r.status == 202, "POST rechunk vocab_tile: %r" % r)
    S2 = r.json()["applies_from_step"]
    d.wait_run(rid, "step %d" % (S2 + 3), lambda x: x["step"] >= S2 + 3, 20)
    recs = d.steps(rid, after=S2 + 1, limit=2)
    t.check(recs and all(x["vocab_tile"] == 16 and x["chunk"] == 8 for x in recs),
            "after rechunk vocab_tile 16: %s" % [(x["step"], x["chunk"], x["vocab_tile"]) for x in recs])
    d.stop()


# ------------------------------------------------------------------------------------------
# 5. kill -9, restart: nothing committed is lost

def case_kill9_restart(t, env):
    d = Daemon(env, t).start()
    rid = d.submit(run_config(LONG))
    d.wait_run(rid, "a few checkpoints", lambda x: x["state"] == "running" and (x["last_checkpoint_step"] or 0) >= 10)
    time.sleep(0.2)
    committed = db_steps(d.db, rid)
    ckpt = d.run(rid)["last_checkpoint_step"]
    d.kill()
    after_kill = db_steps(d.db, rid)
    t.check(set(committed) <= set(after_kill), "steps committed before SIGKILL vanished: %s"
            % sorted(set(committed) - set(after_kill))[:10])
    old_max = after_kill[-1] if after_kill else 0
    row = db_query(d.db, "SELECT state, last_checkpoint_step FROM runs WHERE id = ?", (rid,))[0]
    t.check(row[0] == "running", "db state after SIGKILL: %s" % row[0])

    d2 = Daemon(env, t, state_dir=d.state_dir, socket_path=d.socket).start()  # a stale socket is there
    first = d2.run(rid)
    t.check(first["state"] in ("interrupted", "queued", "running"), "first state after restart: %s" % first["state"])
    d2.wait_run(rid, "running past step %d" % (old_max + 20),
                lambda x: x["state"] == "running" and x["step"] > old_max + 20, 30)
    states = [e["detail"] for e in d2.events(rid) if e["kind"] == "state"]
    names = [s.get("state") for s in states]
    t.check("interrupted" in names and names.index("interrupted") < len(names) - 1
            and "running" in names[names.index("interrupted"):],
            "state events do not show interrupted then running: %s" % names)
    resumed = [s for s in states[names.index("interrupted"):] if s.get("state") == "running"] if "interrupted" in names else []
    if resumed:
        t.check(resumed[0].get("step", -1) >= 10 and resumed[0]["step"] <= old_max and resumed[0]["step"] >= (row[1] or 0),
                "resumed at step %s; the db's last checkpoint was %s, the API's %s, steps went to %d"
                % (resumed[0].get("step"), row[1], ckpt, old_max))
    t.note("killed at step %d (API checkpoint %s, db checkpoint %s); resumed at step %s; %d steps before the kill kept"
           % (old_max, ckpt, row[1], resumed[0].get("step") if resumed else "?", len(after_kill)))
    now = db_steps(d2.db, rid)
    lost = sorted(set(after_kill) - set(now))
    t.check(not lost, "steps lost after the restart: %s" % lost[:10])
    t.check(now == list(range(1, len(now) + 1)), "the steps table has gaps after the restart")
    t.check(now and now[-1] > old_max, "no step past %d after the restart" % old_max)
    d2.stop()


def case_store_locked(t, env):
    """another process holds ddtree.db's write lock: the store says degraded (/healthz, /metrics,
    ddtreectl status, with the holder's pid and the path), the run pauses (held) instead of
    queueing steps it cannot record, and goes on by itself once the lock is gone; no step lost"""
    d = Daemon(env, t).start()
    rid = d.submit(run_config(LONG))
    d.wait_run(rid, "running past step 5", lambda x: x["state"] == "running" and x["step"] >= 5)
    lock = sqlite3.connect(d.db, timeout=30, isolation_level=None)
    lock.execute("BEGIN IMMEDIATE")
    try:
        held = d.wait_run(rid, "held by the lock", lambda x: x["state"] == "paused" and x.get("held"), 60)
        t.check("write lock" in (held.get("error") or ""), "the held run's error does not say why: %s" % held.get("error"))
        h = d.unix.get("/healthz")
        body = h.json()
        t.check(h.status == 200 and body["status"] == "degraded", "/healthz while locked: %s %s" % (h.status, body))
        cause = body["store"]["cause"] or ""
        t.check("pid %d" % os.getpid() in cause and d.db in cause,
                "the cause names neither the lock's holder (pid %d) nor the path: %s" % (os.getpid(), cause))
        t.check(body["runs_held"] == 1 and body["store"]["degraded"] is True, "/healthz: %s" % body)
        _, samples = parse_metrics(t, d.unix.get("/metrics").body.decode())
        value = {name: [x.value for x in find(samples, name)] for name in
                 ("ddtree_store_degraded", "ddtree_runs_held", "ddtree_store_lock_waits_total")}
        t.check(value["ddtree_store_degraded"] == [1.0] and value["ddtree_runs_held"] == [1.0] and
                value["ddtree_store_lock_waits_total"][0] >= 1, "/metrics does not say degraded, held and the waits: %s"
                % value)
        status = d.unix.get("/status").json()
        t.check(status["health"]["status"] == "degraded", "/status's health: %s" % status.get("health"))
        refused = d.unix.post("/runs", run_config(5, name="while-locked"))
        t.check(refused.status == 503 and refused.json()["error"]["code"] == "store_unavailable"
                and "write lock" in refused.json()["error"]["message"],
                "POST /runs while the store cannot write: %s %s" % (refused.status, short(refused.body)))
        if env.ddtreectl:
            res = env.ctl(["--socket", d.socket, "status"])
            t.check(res.returncode == 0 and "health: DEGRADED" in res.stdout and "pid %d" % os.getpid() in res.stdout,
                    "ddtreectl status while locked: %s" % res.out)
        step_held = d.run(rid)["step"]
        time.sleep(1.5)
        t.check(d.run(rid)["step"] == step_held, "the run stepped while held (%d -> %d)"
                % (step_held, d.run(rid)["step"]))
    finally:
        lock.execute("COMMIT")
        lock.close()
    d.wait_run(rid, "going on by itself past step %d" % (step_held + 10),
               lambda x: x["state"] == "running" and x["step"] > step_held + 10, 60)
    body = d.unix.get("/healthz").json()
    t.check(body["status"] == "ok" and body["runs_held"] == 0, "/healthz after the lock: %s" % body)
    d.unix.post("/runs/%s/cancel" % rid)
    d.wait_state(rid, "cancelled")
    steps = db_steps(d.db, rid)
    t.check(steps == list(range(1, len(steps) + 1)) and steps[-1] > step_held,
            "steps lost: %d rows, last %s, held at %d" % (len(steps), steps[-1] if steps else None, step_held))
    names = [(e["detail"].get("state"), e["detail"].get("error", "")) for e in d.events(rid) if e["kind"] == "state"]
    paused = [n for n, (st, err) in enumerate(names) if st == "paused" and "write lock" in err]
    t.check(paused and names[paused[0] + 1][0] == "running",
            "state events do not show the hold (paused, naming the lock) then running: %s" % names)
    t.check(not db_query(d.db, "SELECT id FROM runs WHERE name = 'while-locked'"), "the refused run was stored")
    t.note("held at step %d; %d steps recorded, none lost" % (step_held, len(steps)))
    d.stop()


def case_held_restart(t, env):
    """a run a fault held ("paused", error "held: ...") when the daemon died is resumed at the next
    start, as a run it stopped under; a run the user paused stays paused, also when the daemon died
    before its pause reached the boundary ("pausing" in the database)"""
    d = Daemon(env, t, config={"max_parallel_runs": 2}).start()
    held, mine = d.submit(run_config(LONG)), d.submit(run_config(LONG, name="mine"))
    for rid in (held, mine):
        d.wait_state(rid, "running", min_step=6)
        t.require(d.unix.post("/runs/%s/pause" % rid).status == 202, "pause")
        d.wait_state(rid, "paused")
    d.kill()
    # what a hold leaves in the row (its worker wrote it, then the daemon died): the fixture
    con = sqlite3.connect(d.db)
    con.execute("UPDATE runs SET error = 'held: the checkpoint at step 6 failed: no space' WHERE id = ?", (held,))
    # the user's pause committed, its boundary (checkpoint, PAUSED) not yet when the daemon died:
    # GET had shown "paused" already (the state is set, then committed outside the lock)
    con.execute("UPDATE runs SET state = 'pausing' WHERE id = ?", (mine,))
    con.commit()
    con.close()
    d2 = Daemon(env, t, state_dir=d.state_dir, socket_path=d.socket, config={"max_parallel_runs": 2}).start()
    step = d2.run(held)["step"]
    d2.wait_run(held, "the held run resumed past step %d" % (step + 3),
                lambda x: x["state"] == "running" and x["step"] > step + 3 and not x["error"])
    names = [e["detail"].get("state") for e in d2.events(held) if e["kind"] == "state"]
    t.check(names[-2:] == ["interrupted", "running"], "the held run's last state events: %s" % names[-4:])
    t.check(d2.run(mine)["state"] == "paused", "a run the user paused came back %s" % d2.run(mine)["state"])
    d2.stop()


# ------------------------------------------------------------------------------------------
# 6. SIGTERM: checkpoint at the exit step, no socket left, resumes

def case_sigterm(t, env):
    d = Daemon(env, t).start()
    rid = d.submit(run_config(LONG))
    d.wait_state(rid, "running", min_step=20)
    half_sent = []   # requests not yet in: closed by the stop, not waited for (the drain is for answers)
    for _ in range(8):
        c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        c.connect(d.socket)
        c.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        half_sent.append(c)
    t0 = time.monotonic()
    d.signal(signal.SIGTERM)
    rc = d.wait(20)
    took = time.monotonic() - t0
    for c in half_sent:
        c.close()
    if rc is None:
        d.kill()
    t.require(rc is not None, "the daemon did not exit within %ds of SIGTERM; log:\n%s" % (20 * SLOW, d.log_tail()))
    t.check(rc == 0, "exit status %d after SIGTERM; log:\n%s" % (rc, d.log_tail(25)))
    t.note("stopped %.2f s after SIGTERM, 8 requests half sent meanwhile" % took)
    t.check(not os.path.exists(d.socket), "the socket file %s is still there after SIGTERM" % d.socket)
    state, step, ckpt = db_query(d.db, "SELECT state, step, last_checkpoint_step FROM runs WHERE id = ?", (rid,))[0]
    t.check(state == "interrupted", "db state after SIGTERM: %s, want interrupted" % state)
    t.check(ckpt == step, "after SIGTERM the db has step %s, last checkpoint %s" % (step, ckpt))
    newest = db_query(d.db, "SELECT MAX(step), path FROM checkpoints WHERE run_id = ?", (rid,))[0]
    t.check(newest[0] == step, "the newest checkpoint row is step %s, the run's step %s" % (newest[0], step))
    t.check(newest[1] and os.path.exists(newest[1]), "the newest checkpoint %s is not on disk" % newest[1])
    recorded = db_steps(d.db, rid)
    t.check(recorded and recorded[-1] == step, "the steps table ends at %s, the run at %s" % (recorded[-1:], step))

    d2 = Daemon(env, t, state_dir=d.state_dir, socket_path=d.socket).start()
    d2.wait_run(rid, "running past step %d" % (step + 10), lambda x: x["state"] == "running" and x["step"] > step + 10)
    states = [e["detail"] for e in d2.events(rid) if e["kind"] == "state"]
    runs_after = [s for s in states if s.get("state") == "running" and s.get("step", 0) >= step]
    t.check(runs_after and runs_after[0].get("step") == step,
            "the restart did not resume at step %s: state events %s" % (step, short(json.dumps(states[-5:]))))
    now = db_steps(d2.db, rid)
    t.check(now == list(range(1, len(now) + 1)), "the steps table has gaps after the resume")

    # a run the user paused is still paused after a SIGTERM and a restart (the daemon did not
    # stop under it: it was not running)
    t.require(d2.unix.post("/runs/%s/pause" % rid).status == 202, "pause after the restart")
    paused = d2.wait_state(rid, "paused")["step"]
    t.require(d2.stop() == 0, "the second daemon did not stop cleanly")
    d3 = Daemon(env, t, state_dir=d.state_dir, socket_path=d.socket).start()
    time.sleep(0.5)
    run = d3.run(rid)
    t.check(run["state"] == "paused" and run["step"] == paused,
            "a run paused by the user before SIGTERM came back %s at step %d after the restart (paused at %d); "
            "its last state events: %s" % (run["state"], run["step"], paused,
                                          [e["detail"].get("state") for e in d3.events(rid) if e["kind"] == "state"][-4:]))
    d3.stop()


# ------------------------------------------------------------------------------------------
# 7. ddtreectl

def case_ddtreectl(t, env):
    d = Daemon(env, t).start()
    sock = ["--socket", d.socket]
    base = env.tmpdir(t.name)
    long_file = os.path.join(base, "long.json")
    short_file = os.path.join(base, "short.json")
    with open(long_file, "w") as f:
        json.dump(run_config(LONG), f)
    with open(short_file, "w") as f:
        json.dump(run_config(30, name="short"), f)

    def ctl(args, want, what=None, contains=None, timeout=30):
        res = env.ctl(sock + args, timeout=timeout)
        ok = want is None or t.check(res.returncode == want, "ddtreectl %s: exit %s, want %d %s"
                     % (" ".join(args), res.returncode, want, res.out))
        if ok and contains is not None:
            t.check(contains in res.stdout + res.stderr, "ddtreectl %s: output lacks %r: %s"
                    % (" ".join(args), contains, res.out))
        return res

    v = d.unix.get("/healthz").json()["version"]
    ctl(["status"], 0, contains=v)
    res = ctl(["start", long_file], 0)
    ids = [x["id"] for x in d.unix.get("/runs").json()["runs"]]
    t.require(len(ids) == 1 and ids[0] in res.stdout, "ddtreectl start printed %r; the daemon has %s" % (res.stdout, ids))
    rid = ids[0]
    d.wait_state(rid, "running", min_step=5)
    ctl(["show", rid], 0, contains=rid)
    ctl(["runs"], 0, contains=rid)
    ctl(["pause", rid], 0)
    d.wait_state(rid, "paused")
    msg = d.unix.post("/runs/%s/pause" % rid).json()["error"]["message"]
    ctl(["pause", rid], 1, contains=msg)
    ctl(["resume", rid], 0)
    d.wait_state(rid, "running")
    ctl(["rechunk", rid, "--chunk", "8"], 0)
    d.wait_run(rid, "chunk 8", lambda x: x["chunk"] == 8, 10)
    res = ctl(["rechunk", rid, "--chunk", "0"], None)
    t.check(res.returncode in (1, 2), "ddtreectl rechunk --chunk 0: exit %d, want 1 or 2" % res.returncode)
    ctl(["rechunk", rid], 2)
    res = ctl(["steps", rid, "--csv"], 0)
    t.check(res.stdout.startswith("step,"), "ddtreectl steps --csv: no header line: %s" % short(res.stdout))
    res = ctl(["events", rid], 0)
    t.check(res.stdout.strip(), "ddtreectl events printed nothing")
    ctl(["plan", long_file], 0, contains="fits")
    ctl(["export", rid], 0)
    ctl(["cancel", rid], 0)
    d.wait_state(rid, "cancelled")
    msg = d.unix.post("/runs/%s/cancel" % rid).json()["error"]["message"]
    ctl(["cancel", rid], 1, contains=msg)
    ctl(["resume", rid], 1)
    ctl(["show", "r00000000-000000-dead"], 1)
    ctl(["plan", os.path.join(base, "missing.json")], None)
    res = ctl(["start", short_file, "--quiet"], 0)
    sid = res.stdout.strip()
    t.require(re.match(r"^\S+$", sid) and d.unix.get("/runs/" + sid).status == 200,
              "ddtreectl start --quiet printed %r, not just an id" % res.stdout)
    t0 = time.monotonic()
    res = ctl(["watch", sid, "--interval", "0.2"], 0, timeout=60)
    t.note("watch of a 30-step run exited %d after %.1f s" % (res.returncode, time.monotonic() - t0))
    t.check(d.run(sid)["state"] == "completed", "watch exited but the run is %s" % d.run(sid)["state"])
    res = ctl(["nccl-id"], None)   # 0 with the id (NCCL built in), 1 with the daemon's 501 message
    t.check((res.returncode == 0 and re.match(r"^[0-9a-f]{256}$", res.stdout.strip())) or
            (res.returncode == 1 and "NCCL" in res.stderr + res.stdout),
            "ddtreectl nccl-id: exit %d %s" % (res.returncode, res.out))
    ctl(["frobnicate"], 2)
    ctl(["show"], 2)
    ctl([], 2)
    res = env.ctl(["--socket", os.path.join(base, "no-such.sock"), "status"])
    t.check(res.returncode == 3, "ddtreectl with a missing socket: exit %d, want 3 %s" % (res.returncode, res.out))
    stale = os.path.join(base, "stale.sock")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(stale)
    s.close()  # a socket file nobody listens on
    res = env.ctl(["--socket", stale, "status"])
    t.check(res.returncode == 3, "ddtreectl with a dead socket: exit %d, want 3 %s" % (res.returncode, res.out))
    d.stop()


# ------------------------------------------------------------------------------------------
# 8. concurrency

def case_concurrency(t, env):
    d = Daemon(env, t).start()
    cfg = run_config(LONG, name="bench")   # fixed; no checkpoint or eval in the measured windows
    cfg["checkpoint"]["every_steps"] = 100000
    cfg["eval"]["every_steps"] = 100000
    rid = d.submit(cfg)
    d.wait_state(rid, "running", min_step=50)
    errors, counts, lock = [], [0], threading.Lock()

    def worker(k):
        conn = d.unix.connection()   # one kept-alive connection per thread
        n = 0
        try:
            for j in range(100):
                path = "/metrics" if (j + k) % 2 == 0 else "/runs/" + rid
                try:
                    r = d.unix.get(path, conn=conn)
                except (OSError, http.client.HTTPException) as e:
                    with lock:
                        errors.append("thread %d request %d %s: %r" % (k, j, path, e))
                    conn.close()
                    conn = d.unix.connection()
                    continue
                n += 1
                bad = r.status != 200
                if not bad and path == "/metrics":
                    bad = not r.text.startswith("# HELP ddtree_build_info")
                    if not bad and j < 2:
                        try:
                            parse_metrics(t, r.text)
                        except Abort:
                            bad = True
                elif not bad:
                    bad = r.json().get("id") != rid
                if bad:
                    with lock:
                        errors.append("thread %d request %d %s: %r" % (k, j, path, r))
        finally:
            conn.close()
            with lock:
                counts[0] += n

    def heavy():   # 16 threads x 100 requests
        threads = [threading.Thread(target=worker, args=(k,)) for k in range(16)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()

    def light():   # one /metrics a 0.1 s for 0.6 s, like a Prometheus server with a short interval
        t0 = time.monotonic()
        for k in range(6):
            r = d.unix.get("/metrics")
            if r.status != 200:
                errors.append("10 Hz scrape %d: %r" % (k, r))
            time.sleep(max(0.0, t0 + 0.1 * (k + 1) - time.monotonic()))

    def window(kind, fn):
        s0 = d.run(rid)["step"]
        t0 = time.monotonic()
        fn()
        t1 = time.monotonic()
        s1 = d.run(rid)["step"]
        windows.append((kind, s0, s1, t1 - t0))

    # interleaved, as the step time of this tiny model drifts by itself (it flips between two
    # levels about 3x apart every second or so: scheduling, cores)
    windows = []
    rounds = 5
    for _ in range(rounds):
        window("quiet", lambda: time.sleep(0.6))
        window("heavy", heavy)
        window("light", light)
    total = 1600 * rounds
    t.check(not errors, "%d of %d requests failed: %s" % (len(errors), total + 6 * rounds, "; ".join(errors[:5])))
    t.check(counts[0] == total, "%d of %d requests answered" % (counts[0], total))

    def step_ms(s0, s1):
        out, after = [], s0
        while after < s1:
            page = d.steps(rid, after=after, limit=min(10000, s1 - after))
            if not page:
                break
            out += [x["step_ms"] for x in page if x["step"] <= s1]
            after = page[-1]["step"]
        return out

    ms = {"quiet": [], "heavy": [], "light": []}
    steps = {"quiet": 0, "heavy": 0, "light": 0}
    secs = {"quiet": 0.0, "heavy": 0.0, "light": 0.0}
    per_window = {"quiet": [], "heavy": [], "light": []}
    for kind, s0, s1, dt in windows:
        m = step_ms(s0, s1)
        ms[kind] += m
        steps[kind] += s1 - s0
        secs[kind] += dt
        if m:
            per_window[kind].append(statistics.median(m))
    if t.check(all(len(v) >= 5 for v in ms.values()), "too few steps to compare: %s"
               % {k: len(v) for k, v in ms.items()}):
        mq = statistics.median(ms["quiet"])
        for kind, what in (("heavy", "16 threads x 100 GET /metrics and /runs/ID"),
                           ("light", "one GET /metrics every 0.1 s")):
            mk = statistics.median(ms[kind])
            t.note("step time while scraped by %s: median step_ms %.3f ms vs %.3f ms quiet: slowdown %+.1f%% "
                   "(goal <= 5%%); %.0f vs %.0f steps/s" % (what, mk, mq, 100.0 * (mk / mq - 1),
                                                          steps[kind] / secs[kind], steps["quiet"] / secs["quiet"]))
        t.note("noise: per-window medians (ms) " + "; ".join("%s %s" % (k, " ".join("%.3f" % x for x in v))
                                                             for k, v in per_window.items()))
    t.note("scrape rate: %.0f requests/s (%d x 16 threads x 100 requests in %.2f s; half /metrics, half /runs/ID)"
           % (counts[0] / secs["heavy"], rounds, secs["heavy"]))
    t.check(d.run(rid)["state"] == "running", "the run is %s after the scraping" % d.run(rid)["state"])
    d.stop()


# ------------------------------------------------------------------------------------------
# 9. the daemon and `ddtreed train` write the same records for one config

EXAMPLES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples")


def run_records(db, rid):
    """what a run wrote, without its id, times, paths or speed: the steps (figures bit for bit),
    evals, checkpoints (step, bytes), the events in order (kind, detail), and its row"""
    def q(sql):
        return db_query(db, sql, (rid,))
    steps = q("SELECT step, loss, ce, kl, cap, acc, lr, grad_norm, tokens, positions, chunk, vocab_tile "
              "FROM steps WHERE run_id = ? ORDER BY step")
    evals = q("SELECT step, tau_chain, tau_tree_json, acc_json FROM evals WHERE run_id = ? ORDER BY step")
    ckpts = q("SELECT step, bytes FROM checkpoints WHERE run_id = ? ORDER BY step")
    events = [(k, {f: v for f, v in json.loads(d).items() if f != "path"})   # an export's path is where it ran
              for k, d in q("SELECT kind, detail_json FROM events WHERE run_id = ? ORDER BY id")]
    row = q("SELECT name, state, step, max_steps, last_checkpoint_step, error FROM runs WHERE id = ?")
    return {"steps": steps, "evals": evals, "checkpoints": ckpts, "events": events, "row": row}


def case_daemon_vs_foreground(t, env):
    with open(os.path.join(EXAMPLES, "tiny.json")) as f:
        cfg = json.load(f)
    # examples/tiny.json cut to 7 steps: evaluations at 0 (the baseline), 3, 6 and 7 (the end),
    # checkpoints at 3, 6 and 7 (the end), the export at the end
    cfg["name"] = "same"
    cfg["train"].update(steps=7, sequences_per_step=2, heldout=4)
    cfg["checkpoint"] = {"every_steps": 3, "keep": 2}
    cfg["eval"].update(every_steps=3, sequences=4)
    d = Daemon(env, t).start()
    rid = d.submit(cfg)
    d.wait_state(rid, "completed", timeout=60)
    d.stop()
    daemon = run_records(d.db, rid)

    base = env.tmpdir(t.name)
    path = os.path.join(base, "same.json")
    with open(path, "w") as f:
        json.dump(cfg, f)
    state = os.path.join(base, "foreground")
    p = subprocess.run([env.ddtreed, "train", path, "--state-dir", state], stdin=subprocess.DEVNULL,
                       capture_output=True, timeout=60 * SLOW)
    t.require(p.returncode == 0, "ddtreed train exited %s: %s" % (p.returncode, short(p.stderr.decode("utf-8", "replace"), 600)))
    db = os.path.join(state, "ddtree.db")
    fid = db_query(db, "SELECT id FROM runs")[0][0]
    fg = run_records(db, fid)

    t.check([s[0] for s in daemon["steps"]] == list(range(1, 8)), "daemon steps %s" % [s[0] for s in daemon["steps"]])
    t.check([e[0] for e in daemon["evals"]] == [0, 3, 6, 7], "daemon eval steps %s, want 0 3 6 7"
            % [e[0] for e in daemon["evals"]])
    t.check([c[0] for c in daemon["checkpoints"]] == [3, 6, 7], "daemon checkpoint steps %s, want 3 6 7"
            % [c[0] for c in daemon["checkpoints"]])
    kinds = [k for k, _ in daemon["events"]]
    t.check("export" in kinds, "the daemon wrote no export event: %s" % kinds)
    for what in ("steps", "evals", "checkpoints", "events", "row"):
        a, b = daemon[what], fg[what]
        if a != b:
            diff = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            t.check(False, "%s differ (daemon %d, foreground %d rows), first at #%d: daemon %r, foreground %r"
                    % (what, len(a), len(b), diff, a[diff] if diff < len(a) else None,
                       b[diff] if diff < len(b) else None))
    t.check(os.path.exists(os.path.join(state, "runs", fid, "export", "model.safetensors")),
            "the foreground run has no export")
    t.note("%d steps, %d evals, %d checkpoints, %d events: the same from the daemon and ddtreed train"
           % (len(fg["steps"]), len(fg["evals"]), len(fg["checkpoints"]), len(fg["events"])))

    # --stop-after is the daemon's pause (running -> pausing -> its checkpoint -> paused), and the
    # run resumed to its end has the uninterrupted run's steps and evaluations
    state = os.path.join(base, "stopped")
    for args in (["train", path, "--state-dir", state, "--stop-after", "4"], ["train", "--resume", state]):
        p = subprocess.run([env.ddtreed] + args, stdin=subprocess.DEVNULL, capture_output=True, timeout=60 * SLOW)
        t.require(p.returncode == 0, "ddtreed %s exited %s: %s" % (" ".join(args[:1] + args[2:]), p.returncode,
                                                                    short(p.stderr.decode("utf-8", "replace"), 600)))
    db = os.path.join(state, "ddtree.db")
    sid = db_query(db, "SELECT id FROM runs")[0][0]
    stopped = run_records(db, sid)
    t.check(stopped["steps"] == fg["steps"] and stopped["evals"] == fg["evals"],
            "stopped at 4 and resumed: steps or evals differ from the uninterrupted run")
    seq = [(k, e.get("state"), e.get("step")) for k, e in stopped["events"] if k in ("state", "checkpoint")]
    want = [("state", "running", 0), ("checkpoint", None, 3), ("state", "pausing", 4), ("checkpoint", None, 4),
            ("state", "paused", 4), ("state", "running", 4), ("checkpoint", None, 6), ("checkpoint", None, 7),
            ("state", "completed", 7)]
    t.check(seq == want, "--stop-after 4 then --resume: events %s, want %s" % (seq, want))


# ------------------------------------------------------------------------------------------
# 10. speculative decoding in training (SPEC.md section 7)

def case_speculate(t, env):
    d = Daemon(env, t).start()
    c = d.unix
    cfg = run_config(LONG, name="spec")
    cfg["eval"]["speculative"] = {"prompts": 2, "prompt_len": 8, "gen_len": 6, "tree_budgets": [3, 8]}
    rid = d.submit(cfg)
    run = d.wait_run(rid, "a speculative evaluation", lambda x: isinstance(x.get("tau_spec"), (int, float)), 30)
    B = cfg["drafter"]["block_size"]
    t.check(1 <= run["tau_spec"] <= B, "tau_spec %r outside [1, %d]" % (run["tau_spec"], B))
    tree = run.get("tau_spec_tree") or {}
    t.check(sorted(tree) == ["3", "8"] and all(v >= run["tau_spec"] - 1e-9 for v in tree.values()),
            "tau_spec_tree %r (budgets 3, 8 >= B-1: never below the chain)" % tree)
    spec = run.get("speculative") or {}
    t.check(spec.get("greedy_equal") is True and spec.get("prompts") == 2 and spec.get("seconds", 0) > 0,
            "speculative %r" % spec)
    r = c.get("/metrics")
    types, samples = parse_metrics(t, r.text)
    t.check(find(samples, "ddtree_run_acceptance_length", run=rid, kind="spec")
            and find(samples, "ddtree_run_acceptance_length", run=rid, kind="spec_tree", budget="8"),
            "/metrics lacks kind=spec / spec_tree for %s" % rid)
    rows = db_query(d.db, "SELECT step, tau_chain, tau_spec, spec_json FROM evals WHERE run_id = ? ORDER BY step",
                    (rid,))
    t.check(rows and rows[0][0] == 0 and rows[0][1] is not None and rows[0][2] is not None,
            "the step-0 evals row lacks tau_chain or tau_spec: %s" % rows[:2])

    # refusals: 400 naming the field, nothing queued
    d.wait_run(rid, "a checkpoint", lambda x: (x.get("last_checkpoint_step") or 0) >= 5, 30)
    for what, body, field in [("a budget above the planned cap", {"tree_budgets": [9]}, "tree_budgets"),
                              ("more prompts than planned", {"prompts": 3}, "prompts"),
                              ("a longer generation than planned", {"gen_len": 7}, "gen_len"),
                              ("an unknown key", {"prompt": 1}, "prompt"),
                              ("a step without a kept checkpoint", {"step": 3}, "step"),
                              ("a budget that is no integer", {"tree_budgets": ["8"]}, "tree_budgets")]:
        check_error(t, "POST speculate with %s" % what, c.post("/runs/%s/speculate" % rid, body), 400, field)
    check_error(t, "POST speculate with an array", c.post("/runs/%s/speculate" % rid, [1]), 400)

    # the live weights of a paused run, at its step
    c.post("/runs/%s/pause" % rid)
    run = d.wait_state(rid, "paused")
    s1 = run["step"]
    r = c.post("/runs/%s/speculate" % rid, {"prompts": 1, "gen_len": 4, "tree_budgets": [8]})
    t.check(r.status == 202 and r.json().get("weights") == "live" and r.json().get("step") == s1,
            "POST speculate (live, paused at %d): %r" % (s1, r))
    run = d.wait_run(rid, "the requested speculation", lambda x: (x.get("speculative") or {}).get("step") == s1
                     and x["speculative"].get("prompts") == 1, 20)
    t.check(run["state"] == "paused" and run["step"] == s1, "after a speculation while paused: %s at %d"
            % (run["state"], run["step"]))
    t.check(sorted(run.get("tau_spec_tree") or {}) == ["8"], "tau_spec_tree of the request: %r" % run.get("tau_spec_tree"))
    # a kept checkpoint's weights, through ddtreectl
    ckpt = [row[0] for row in db_query(d.db, "SELECT step FROM checkpoints WHERE run_id = ? ORDER BY step", (rid,))]
    k = [s for s in ckpt if s != s1 and os.path.isdir(os.path.join(d.state_dir, "runs", rid, "checkpoints",
                                                                      "step-%08d" % s))]
    if t.check(k, "no kept checkpoint apart from the paused step's: %s" % ckpt) and env.ddtreectl:
        res = env.ctl(["--socket", d.socket, "speculate", rid, "--step", str(k[0]), "--prompts", "2", "--tree", "3,8"])
        t.check(res.returncode == 0 and "checkpoint" in res.stdout, "ddtreectl speculate --step %d: exit %s %s"
                % (k[0], res.returncode, res.out))
        # (a step of the evaluations' cadence has the live weights' row first: wait for the request's)
        ok = wait_for(lambda: db_query(d.db, "SELECT spec_json FROM evals WHERE run_id = ? AND step = ? AND "
                                       "json_extract(spec_json, '$.weights') = 'checkpoint'", (rid, k[0])), 20)
        row = db_query(d.db, "SELECT tau_spec, spec_json FROM evals WHERE run_id = ? AND step = ?", (rid, k[0]))
        detail = json.loads(row[0][1]) if ok and row and row[0][1] else {}
        t.check(detail.get("weights") == "checkpoint" and detail.get("prompts") == 2 and 1 <= row[0][0] <= B,
                "the checkpoint's evals row at step %d: %s" % (k[0], row))
    lossless = [e for e in d.events(rid) if e["kind"] == "error"]
    t.check(not lossless, "error events: %s" % [e["detail"] for e in lossless])
    c.post("/runs/%s/cancel" % rid)
    d.wait_state(rid, "cancelled")
    check_error(t, "POST speculate on a cancelled run", c.post("/runs/%s/speculate" % rid, {}), 409)
    # a split (one CPU target rank beside the drafter's): its target is not beside rank 0
    split = run_config(LONG, name="split")
    split["devices"] = "cpu"
    split["target"]["devices"] = 1
    sid = d.submit(split)
    d.wait_state(sid, "running", min_step=1)
    r = c.post("/runs/%s/speculate" % sid, {})
    check_error(t, "POST speculate on a split run", r, 409)
    t.check("split" in r.text, "the refusal of a split run does not say why: %s" % short(r.text))
    c.post("/runs/%s/cancel" % sid)
    d.wait_state(sid, "cancelled")
    d.stop()


# ------------------------------------------------------------------------------------------
# 11. plan_fits: "fits" means the run as configured fits, alike in POST /plan, ddtreectl plan's
# exit status and its table, whose rows sum to the peak (issue 27)

def ctl_plan_rows(text):
    """the byte rows of ddtreectl plan's table (label -> value) and its predicted peak"""
    rows = {}
    for line in text.splitlines():
        m = re.match(r"^  (\S.*?)\s+([0-9.]+) (GB|MB)$", line)
        if m:
            rows[m.group(1)] = float(m.group(2)) * (1e9 if m.group(3) == "GB" else 1e6)
    peak = rows.pop("predicted peak", None)
    rows.pop("budget", None)
    rows.pop("budget (card memory)", None)
    return rows, peak


def case_plan_fits(t, env):
    d = Daemon(env, t).start()
    base = env.tmpdir(t.name)
    seed = json.load(open(os.path.join(EXAMPLES, "seed-ddtree.json")))
    seed["target"]["path"] = os.path.abspath(os.path.join(EXAMPLES, "qwen3.6-27b"))
    for budget, want_fits in ((149000000000, True), (95000000000, False)):
        cfg = dict(seed, memory={"budget_bytes": budget})
        path = os.path.join(base, "seed-%d.json" % budget)
        with open(path, "w") as f:
            json.dump(cfg, f)
        r = d.unix.post("/plan", cfg)
        t.require(r.status == 200, "POST /plan of the seed at %d: %r" % (budget, r))
        p = r.json()
        t.check(p["fits"] is want_fits, "POST /plan of the seed at %.0f GB: fits %r, want %r (%s)"
                % (budget / 1e9, p["fits"], want_fits, p.get("why")))
        t.check(sum(p["peak_parts"].values()) == p["predicted_peak_bytes"],
                "POST /plan peak_parts %r do not sum to predicted_peak_bytes %r" % (p["peak_parts"], p["predicted_peak_bytes"]))
        res = env.ctl(["--socket", d.socket, "plan", path])
        t.check(res.returncode == (0 if want_fits else 1), "ddtreectl plan of the seed at %.0f GB: exit %d, want %d %s"
                % (budget / 1e9, res.returncode, 0 if want_fits else 1, res.out))
        rows, peak = ctl_plan_rows(res.stdout)
        t.check(peak and abs(sum(rows.values()) - peak) <= 0.0005e9 * len(rows),
                "ddtreectl plan at %.0f GB: its rows %r sum to %.3f GB, not its peak %r" % (budget / 1e9, rows,
                sum(rows.values()) / 1e9, peak))
        if want_fits:
            t.check("target (co-located)" in rows and res.stdout.rstrip().endswith("fits"),
                    "ddtreectl plan of the seed at 149 GB: no target row or no verdict: %s" % res.stdout)
        else:
            prop = p.get("proposal") or {}
            t.check(p["target"]["proposed"] and prop.get("fits") is True and
                    prop.get("config") == {"devices": ["cuda:%d" % i for i in range(5)],
                                           "target": {"devices": ["cuda:5", "cuda:6", "cuda:7"]}},
                    "POST /plan at 95 GB: the split proposed and what to write: %r" % prop)
            t.check("does not fit as configured" in res.stdout and json.dumps(prop.get("config"), separators=(",", ":")) in res.stdout,
                    "ddtreectl plan at 95 GB does not say so and what to write: %s" % res.stdout)
    # the example as shipped (its target.path relative to examples/): ddtreectl resolves it against
    # the file's folder, so the plan is of the real config.json (the co-located target's row), as
    # ddtreed plan's; POST /plan itself refuses a relative path, as POST /runs does
    res = env.ctl(["--socket", d.socket, "plan", os.path.join(EXAMPLES, "seed-ddtree.json")])
    rows, peak = ctl_plan_rows(res.stdout)
    t.check(res.returncode == 0 and abs(rows.get("target (co-located)", 0) - 53.797e9) < 1e6,
            "ddtreectl plan of the shipped seed example did not plan its real target: %s" % res.out)
    check_error(t, "POST /plan with a relative target.path",
                d.unix.post("/plan", dict(seed, target=dict(seed["target"], path="qwen3.6-27b"))), 400, "target.path")
    d.stop()


# ------------------------------------------------------------------------------------------
# 12. export destinations

def file_bytes(path):
    with open(path, "rb") as f:
        return f.read()


def case_export_dest(t, env):
    """a manual export (POST, ddtreectl) goes to runs/ID/exports/step-N or --out DIR and survives
    the run's final export (runs/ID/export); a bad destination is a 400 naming out"""
    d = Daemon(env, t).start()
    base = env.tmpdir(t.name)
    STEPS = 2000
    rid = d.submit(run_config(STEPS))
    other = d.submit(run_config(LONG, name="other"))
    d.wait_state(rid, "running", min_step=5)
    t.require(d.unix.post("/runs/%s/pause" % rid).status == 202, "POST pause")
    paused = d.wait_state(rid, "paused")["step"]
    runs = os.path.join(os.path.realpath(d.state_dir), "runs")
    r = d.unix.post("/runs/%s/export" % rid)
    want = os.path.join(runs, rid, "exports", "step-%08d" % paused)
    t.require(r.status == 202 and r.json().get("path") == want and r.json().get("step") == paused,
              "POST export of a paused run: %r, want path %s step %d" % (r, want, paused))
    t.require(wait_for(lambda: any(e["kind"] == "export" and e["detail"].get("path") == want
                                   for e in d.events(rid)), 20),
              "no export event with path %s: %s" % (want, [e for e in d.events(rid) if e["kind"] == "export"]))
    manual = file_bytes(os.path.join(want, "model.safetensors"))

    # bad destinations: 400 naming out (or the unknown field), nothing written
    os.makedirs(os.path.join(base, "busy"))
    with open(os.path.join(base, "busy", "notes.txt"), "w") as f:
        f.write("mine\n")
    model = os.path.join(base, "a-model")   # a target's directory: replacing it would delete the model
    os.makedirs(model)
    for name, text in (("config.json", '{"model_type": "qwen3"}'), ("model.safetensors", "weights")):
        with open(os.path.join(model, name), "w") as f:
            f.write(text)
    bad = [("a relative path", {"out": "rel/dir"}, "out"),
           ("a model's directory", {"out": model}, "out"),
           ("not a string", {"out": 7}, "out"),
           ("a missing parent", {"out": os.path.join(base, "no", "such", "dir")}, "out"),
           ("another run's directory", {"out": os.path.join(runs, other)}, "out"),
           ("the run's final export", {"out": os.path.join(runs, rid, "export")}, "out"),
           ("the run's checkpoints", {"out": os.path.join(runs, rid, "checkpoints")}, "out"),
           ("a directory that is not an export", {"out": os.path.join(base, "busy")}, "out"),
           ("the state directory", {"out": d.state_dir}, "out"),
           ("an unknown field", {"where": "/tmp/x"}, "where"),
           ("replace_final not a bool", {"out": os.path.join(base, "x"), "replace_final": "yes"}, "replace_final")]
    for what, body, field in bad:
        check_error(t, "POST export with %s" % what, d.unix.post("/runs/%s/export" % rid, body), 400, field)
    t.check(os.listdir(os.path.join(base, "busy")) == ["notes.txt"], "a refused export touched busy/")
    t.check(sorted(os.listdir(model)) == ["config.json", "model.safetensors"], "a refused export touched the model")
    t.check(not os.path.exists(os.path.join(runs, rid, "export")), "a refused export wrote the final export")

    # --out through ddtreectl (relative: made absolute against its working directory)
    if env.ddtreectl:
        res = subprocess.run([os.path.abspath(env.ddtreectl), "--socket", d.socket, "export", rid, "--out", "by-ctl"], cwd=base,
                             capture_output=True, text=True, timeout=30 * SLOW)
        out_dir = os.path.join(os.path.realpath(base), "by-ctl")
        t.check(res.returncode == 0 and out_dir in res.stdout,
                "ddtreectl export --out by-ctl: exit %d %r, want %s" % (res.returncode, res.stdout + res.stderr, out_dir))
        t.check(wait_for(lambda: os.path.exists(os.path.join(out_dir, "model.safetensors")), 20),
                "ddtreectl export --out: %s/model.safetensors never appeared" % out_dir)
        res = env.ctl(["--socket", d.socket, "export", rid, "--out", "/no/such/parent/x"])
        t.check(res.returncode == 1 and "out" in res.stderr, "ddtreectl export --out into nothing: exit %s %s"
                % (res.returncode, res.out))

    # the run ends: its final export is runs/ID/export; the manual one is still there, unchanged
    t.require(d.unix.post("/runs/%s/resume" % rid).status == 202, "POST resume")
    d.wait_state(rid, "completed", timeout=120)
    final = os.path.join(runs, rid, "export", "model.safetensors")
    t.require(os.path.exists(final), "the run has no final export")
    t.check(file_bytes(os.path.join(want, "model.safetensors")) == manual,
            "the manual export of step %d changed when the run ended" % paused)
    t.check(file_bytes(final) != manual, "the final export holds the step-%d weights" % paused)

    # no worker (completed): from its newest checkpoint, now (200), kept beside the final export
    sid = rid
    r = d.unix.post("/runs/%s/export" % sid)
    want = os.path.join(runs, sid, "exports", "step-%08d" % STEPS)
    t.check(r.status == 200 and r.json().get("path") == want, "POST export of a completed run: %r, want %s" % (r, want))
    t.check(os.path.exists(os.path.join(want, "model.safetensors")), "%s has no model.safetensors" % want)
    # the event is committed by the store's writer after the answer: waited for, not raced
    exported = lambda: [e["detail"] for e in d.events(sid) if e["kind"] == "export"]
    wait_for(lambda: any(e.get("path") == want for e in exported()), 20)
    ev = exported()
    t.check(any(e.get("path") == want for e in ev) and any(e.get("path") == os.path.dirname(final) for e in ev),
            "the completed run's export events do not name %s and its final export: %s" % (want, ev))
    r = d.unix.post("/runs/%s/export" % sid, {"out": os.path.join(runs, sid, "export"), "replace_final": True})
    t.check(r.status == 200, "POST export onto the final export with replace_final: %r" % r)
    t.check(d.unix.post("/runs/%s/cancel" % other).status == 202, "POST cancel of the other run")
    d.stop()


# ------------------------------------------------------------------------------------------
# 13. a DFlash2 drafter's evaluation (SPEC.md 2.1): its path selector's figures, its unary head's beside

def case_dflash2(t, env):
    d = Daemon(env, t).start()
    c = d.unix
    cfg = run_config(LONG, name="dflash2")
    cfg["drafter"].update({"architecture": "dflash2", "selector_rank": 8, "selector_top_k": 4})
    rid = d.submit(cfg)
    run = d.wait_run(rid, "the step-0 evaluation", lambda x: isinstance(x.get("tau_chain"), (int, float)), 30)
    unary = run.get("unary") or {}
    t.check(isinstance(unary.get("tau_chain"), (int, float)) and isinstance(unary.get("tau_tree"), dict),
            "GET /runs/%s: unary %r (a DFlash2 run's unary head's figures)" % (rid, run.get("unary")))
    evals = c.get("/runs/%s/evals" % rid).json().get("evals") or []
    row = evals[0] if evals else {}
    u = row.get("unary") or {}
    # step 0: Bs = 0, so the selector picks the unary argmax (the chains agree; unary_json has 6 decimals)
    t.check(row.get("step") == 0 and isinstance(u.get("acc"), dict) and isinstance(u.get("tau_chain"), (int, float))
            and abs(u["tau_chain"] - row.get("tau_chain", -1)) < 1e-6, "the step-0 evals row of a DFlash2 run: %r" % row)
    if env.ddtreectl:
        res = env.ctl(["--socket", d.socket, "show", rid])
        t.check(res.returncode == 0 and "unary chain:" in res.stdout, "ddtreectl show of a DFlash2 run: %s" % res.out)
    c.post("/runs/%s/cancel" % rid)
    d.wait_state(rid, "cancelled")
    d.stop()


CASES = [
    ("unix_routes", case_unix_routes, False),
    ("tcp_token", case_tcp_token, False),
    ("login_limit", case_login_limit, False),
    ("slow_clients", case_slow_clients, False),
    ("bad_inputs", case_bad_inputs, False),
    ("pause_rechunk", case_pause_rechunk, False),
    ("kill9_restart", case_kill9_restart, False),
    ("store_locked", case_store_locked, False),
    ("held_restart", case_held_restart, False),
    ("sigterm", case_sigterm, False),
    ("ddtreectl", case_ddtreectl, True),
    ("concurrency", case_concurrency, False),
    ("daemon_vs_foreground", case_daemon_vs_foreground, False),
    ("speculate", case_speculate, False),
    ("plan_fits", case_plan_fits, False),
    ("export_dest", case_export_dest, False),
    ("dflash2", case_dflash2, False),
]


# ------------------------------------------------------------------------------------------

class CtlResult:
    def __init__(self, returncode, stdout, stderr):
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr
        self.out = "(stdout %s, stderr %s)" % (short(stdout.strip(), 200) or "empty", short(stderr.strip(), 300) or "empty")


class Env:
    def __init__(self, args):
        self.ddtreed = args.ddtreed
        self.ddtreectl = args.ddtreectl if args.ddtreectl and os.access(args.ddtreectl, os.X_OK) else None
        self.root = tempfile.mkdtemp(prefix="ddtree-e2e-")
        self.keep = args.keep

    def tmpdir(self, name):
        path = os.path.join(self.root, name)
        os.makedirs(path, exist_ok=True)
        return path

    def ctl(self, args, token=None, timeout=30):
        env = {k: v for k, v in os.environ.items() if k not in ("DDTREE_TOKEN", "DDTREE_SOCKET")}
        if token is not None:
            env["DDTREE_TOKEN"] = token
        try:
            p = subprocess.run([self.ddtreectl] + args, stdin=subprocess.DEVNULL, capture_output=True,
                               timeout=timeout * SLOW, env=env)
        except subprocess.TimeoutExpired as e:
            return CtlResult(None, (e.stdout or b"").decode("utf-8", "replace"),
                             "(timed out after %ds)" % (timeout * SLOW))
        return CtlResult(p.returncode, p.stdout.decode("utf-8", "replace"), p.stderr.decode("utf-8", "replace"))


def main():
    global SLOW
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ddtreed", required=True)
    ap.add_argument("--ddtreectl")
    ap.add_argument("--only", help="comma-separated case numbers or names")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory")
    ap.add_argument("--slow", type=float, default=float(os.environ.get("DDTREE_E2E_SLOW", "1")),
                    help="multiply every timeout (e.g. under valgrind)")
    args = ap.parse_args()
    SLOW = args.slow
    if not os.access(args.ddtreed, os.X_OK):
        print("skipped: ddtreed not found at %s (build it first)" % args.ddtreed)
        return 77
    try:
        import prometheus_client.parser  # noqa: F401
    except ImportError:
        print("skipped: python3-prometheus-client is not installed (apt-get install python3-prometheus-client)")
        return 77
    env = Env(args)
    only = set(args.only.split(",")) if args.only else None
    passed = failed = skipped = 0
    try:
        for n, (name, fn, needs_ctl) in enumerate(CASES, 1):
            if only and str(n) not in only and name not in only:
                continue
            if needs_ctl and not env.ddtreectl:
                print("skip %s (ddtreectl not found at %s)" % (name, args.ddtreectl))
                skipped += 1
                sys.stdout.flush()
                continue
            t = Case(name)
            started = time.monotonic()
            try:
                fn(t, env)
            except Abort:
                pass
            except Exception:
                t.errors.append("exception:\n" + "\n".join("      " + ln for ln in traceback.format_exc().splitlines()))
            finally:
                for dmn in t.daemons:
                    if dmn.proc and dmn.proc.poll() is None:
                        dmn.stop(check=False)
                        dmn.kill()
            took = time.monotonic() - started
            if t.errors:
                failed += 1
                print("FAIL %s (%.1f s)" % (name, took))
                for e in t.errors:
                    print("    " + e.replace("\n", "\n    "))
            else:
                passed += 1
                print("ok   %s (%.1f s)" % (name, took))
            for note in t.notes:
                print("    " + note)
            sys.stdout.flush()
    finally:
        if env.keep or failed:
            print("(state kept in %s)" % env.root)
        else:
            shutil.rmtree(env.root, ignore_errors=True)
    if skipped and not failed:
        print("skipped: %d case(s) need ddtreectl, not found at %s" % (skipped, args.ddtreectl))
    print("%d passed, %d failed" % (passed, failed) + (", %d skipped" % skipped if skipped else ""))
    if failed:
        return 1
    return 77 if skipped else 0


if __name__ == "__main__":
    sys.exit(main())
