#!/usr/bin/python3
"""faults.py: the fault-injection suite (issue 26, item 7; tests/faults/README.md): ddtreed's runs
under a crash at each durable write, a data file that fails to read, a full disk at each durable
write and a database locked by another process; each case injected, recovered, its records
counted, and one table row printed for it.

Every case drives the real binary on a tiny CPU run: a synthetic target, or a tiny llama target
written here with its token file and its feature shard (`ddtreed features`), through `ddtreed
train` in the foreground or `ddtreed serve` over its Unix socket. A crash is a kill point armed
by DDTREE_FAULT (daemon/engine/base/fault.h: the process SIGKILLs itself there); a data fault is
the hook's EIO (data.read) or a file truncated under the running process; a full disk is a tmpfs
(root only: else the case is skipped) filled by a file; a lock is this process's BEGIN IMMEDIATE
on ddtree.db. A full disk or a lock holds the run (paused, in place); the recovery frees the
space or lets the lock go and the run must go on by itself.

Per case (the table's columns):
  final state  the runs row's state at the end (the expected one in brackets when it differs)
  lost         records lost, which must be 0: step rows of 1..N missing (N the runs row's final
               step), step rows recorded before the fault and gone after the recovery, checkpoints
               complete on disk after the fault or at the end without a checkpoints row, the
               runs row missing
  redone       steps trained twice: the last step recorded before the fault less the step the
               recovery resumed from (its "state" event into running; a held run's: the step
               it was held at), 0 at least
  recover      wall seconds from the restart (a held run's: from the space freed or the lock let
               go) to the run's final state: a figure, never asserted
A case fails when a record is lost, the run does not end in its expected state, the fault did
not fire, a process died of a signal nobody sent (a crash), or one of the case's own checks fails
(the error names the file; the steps redone have the losses of their first time, bit for bit).

Usage: faults.py --ddtreed BIN [--only NAME,...] [--keep] [--table FILE]
  --table FILE  the table written to FILE too (scripts/test prints it after ctest)
Exit 0 all passed, 1 a failure, 77 skipped (no ddtreed).
"""
import argparse
import errno
import http.client
import json
import os
import random
import shutil
import signal
import socket
import sqlite3
import struct
import subprocess
import sys
import tempfile
import time
import traceback

# The synthetic run of the kill cases: 12 steps (~30 ms a process), a checkpoint every 3 (two
# kept), evaluations at 6 and 12.
SYNTHETIC = {
    "name": "faults",
    "target": {"kind": "synthetic", "hidden_size": 32, "num_hidden_layers": 3, "num_attention_heads": 4,
               "num_key_value_heads": 2, "head_dim": 8, "intermediate_size": 48, "vocab_size": 64},
    "drafter": {"num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
                "intermediate_size": 48, "block_size": 4},
    "train": {"steps": 12, "sequences_per_step": 2, "seq_len": 24, "max_anchors": 3, "heldout": 2},
    "checkpoint": {"every_steps": 3, "keep": 2},
    "eval": {"every_steps": 6, "sequences": 2},
}
VOCAB, SEQUENCES, SEQ_TOKENS = 64, 64, 20   # the llama fixture's vocabulary, its token file's sequences


# ------------------------------------------------------------------------------------------
# Fixtures: a tiny llama target, its token file and feature shard (written once, copied per case)

def write_safetensors(path, tensors, metadata=None):
    """tensors: [(name, dtype, shape, bytes)], in data order"""
    header, offset = {}, 0
    for name, dtype, shape, data in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
    if metadata:
        header["__metadata__"] = metadata
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(t[3] for t in tensors))


def write_llama(directory, H=32, layers=3, heads=4, kv_heads=2, head_dim=8, inter=48, seed=11):
    """random F32 weights, N(0, 1/fan_in); norms 1; lm_head wide enough for peaked predictions"""
    rng = random.Random(seed)

    def weight(name, rows, cols=None, std=None):
        n = rows * (cols or 1)
        values = [1.0] * n if std is None else [rng.gauss(0.0, std) for _ in range(n)]
        return (name, "F32", [rows] if cols is None else [rows, cols], struct.pack("<%df" % n, *values))

    q, kv = heads * head_dim, kv_heads * head_dim
    t = [weight("model.embed_tokens.weight", VOCAB, H, 1.0)]
    for i in range(layers):
        p = "model.layers.%d." % i
        t += [weight(p + "input_layernorm.weight", H),
              weight(p + "self_attn.q_proj.weight", q, H, H ** -0.5),
              weight(p + "self_attn.k_proj.weight", kv, H, H ** -0.5),
              weight(p + "self_attn.v_proj.weight", kv, H, H ** -0.5),
              weight(p + "self_attn.o_proj.weight", H, q, q ** -0.5),
              weight(p + "post_attention_layernorm.weight", H),
              weight(p + "mlp.gate_proj.weight", inter, H, H ** -0.5),
              weight(p + "mlp.up_proj.weight", inter, H, H ** -0.5),
              weight(p + "mlp.down_proj.weight", H, inter, inter ** -0.5)]
    t += [weight("model.norm.weight", H), weight("lm_head.weight", VOCAB, H, 4.0 * H ** -0.5)]
    os.makedirs(directory)
    write_safetensors(os.path.join(directory, "model.safetensors"), t, {"format": "pt"})
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": H,
              "intermediate_size": inter, "num_hidden_layers": layers, "num_attention_heads": heads,
              "num_key_value_heads": kv_heads, "head_dim": head_dim, "vocab_size": VOCAB,
              "max_position_embeddings": 96, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "hidden_act": "silu",
              "tie_word_embeddings": False, "torch_dtype": "float32"}
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(config, f, indent=1)


def write_tokens(path, seed=3):
    rng = random.Random(seed)
    ids = [rng.randrange(VOCAB) for _ in range(SEQUENCES * SEQ_TOKENS)]
    offsets = list(range(0, len(ids) + 1, SEQ_TOKENS))
    write_safetensors(path, [("input_ids", "I32", [len(ids)], struct.pack("<%di" % len(ids), *ids)),
                             ("offsets", "I64", [len(offsets)], struct.pack("<%dq" % len(offsets), *offsets))])


class Fixtures:
    """the llama target, its token file and its shard (layers 0 and 2), made on first use"""

    def __init__(self, env):
        self.env, self.made = env, False

    def make(self):
        if self.made:
            return self
        d = os.path.join(self.env.root, "fixtures")
        self.target, self.tokens, self.shard = d + "/llama", d + "/tokens.safetensors", d + "/shard.safetensors"
        write_llama(self.target)
        write_tokens(self.tokens)
        p = subprocess.run([self.env.ddtreed, "features", "--model", self.target, "--tokens", self.tokens,
                            "--layers", "0,2", "--out", self.shard], capture_output=True, text=True, timeout=120)
        if p.returncode != 0:
            raise RuntimeError("ddtreed features failed: %s" % p.stderr[-2000:])
        self.made = True
        return self


# ------------------------------------------------------------------------------------------
# The store, read-only

class Snapshot:
    """what ddtree.db and the run directory hold at one moment"""

    def __init__(self, state_dir):
        self.steps, self.ckpt_rows, self.ckpt_dirs, self.run = {}, set(), set(), None
        self.running = []   # (ts_ms, step) of each "state" event into running
        self.states = []    # (ts_ms, state, step, error) of each "state" event, in order
        db = os.path.join(state_dir, "ddtree.db")
        if os.path.exists(db):
            con = sqlite3.connect("file:%s?mode=ro" % db, uri=True, timeout=10)
            try:
                self.steps = {s: (loss, ts) for s, loss, ts in con.execute("SELECT step, loss, ts_ms FROM steps")}
                self.ckpt_rows = {s for (s,) in con.execute("SELECT step FROM checkpoints")}
                for ts, detail in con.execute("SELECT ts_ms, detail_json FROM events WHERE kind = 'state' ORDER BY id"):
                    d = json.loads(detail or "{}")
                    self.states.append((ts, d.get("state"), d.get("step"), d.get("error") or ""))
                    if d.get("state") == "running":
                        self.running.append((ts, d.get("step")))
                rows = con.execute("SELECT id, state, step, error FROM runs").fetchall()
                self.run = dict(zip(("id", "state", "step", "error"), rows[0])) if rows else None
            finally:
                con.close()
        runs = os.path.join(state_dir, "runs")
        for rid in os.listdir(runs) if os.path.isdir(runs) else []:
            ckdir = os.path.join(runs, rid, "checkpoints")
            for name in os.listdir(ckdir) if os.path.isdir(ckdir) else []:
                whole = all(os.path.isfile(os.path.join(ckdir, name, f)) for f in ("state.json", "state.safetensors"))
                if name.startswith("step-") and whole:
                    self.ckpt_dirs.add(int(name[5:]))

    @property
    def last_step(self):
        return max(self.steps) if self.steps else 0


def step_of(state_dir, timeout):
    """the newest step row, polled until it is there (None after timeout seconds)"""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            s = Snapshot(state_dir)
            if s.steps:
                return s
        except sqlite3.Error:
            pass
        time.sleep(0.02)
    return None


def fault_env(fault):
    """the environment of a process: DDTREE_FAULT=fault, or none"""
    env = dict(os.environ)
    env.pop("DDTREE_FAULT", None)
    if fault:
        env["DDTREE_FAULT"] = fault
    return env


# ------------------------------------------------------------------------------------------
# One case's context: its directory, its processes, its checks

class Skip(Exception):
    """a case that cannot run here: the reason is its table row's result"""


class Ctx:
    def __init__(self, env, case):
        self.env, self.case = env, case
        self.dir = os.path.join(env.root, "".join(c if c.isalnum() else "-" for c in case.name))
        self.state = os.path.join(self.dir, "state")
        self.config = os.path.join(self.dir, "run.json")
        os.makedirs(self.dir)
        self.errors, self.notes, self.logs = [], [], []
        self.crashes = []          # "LABEL: signal N" for every process a signal nobody sent ended
        self.data_file = None      # the file a data case breaks
        self.data_whole = None     # a whole copy of it, to put back
        self.flipped = None        # the checkpoint a flip case damaged
        self.mounts = []           # tmpfs mounts, unmounted when the case ends
        self.on_end = []           # what the case leaves to undo (processes, a lock), done before the unmount
        self.started = 0           # the processes started (each log's number)
        self.bg = None             # a hold case's `ddtreed train` (Background), or its daemon
        self.daemon = None
        self.disk = None           # the tmpfs a full-disk case fills, its fill file, a lock case's connection
        self.fill = None
        self.lock = None

    def check(self, cond, msg):
        if not cond:
            self.errors.append(msg)
        return bool(cond)

    def write_config(self, cfg):
        with open(self.config, "w") as f:
            json.dump(cfg, f)

    def log_path(self, label):
        self.started += 1
        return os.path.join(self.dir, "%s-%d.log" % (label, self.started))

    def finished(self, label, rc, log, killed_by_fault=False):
        """a process's end: a death by a signal is a crash unless the armed kill point sent it"""
        self.logs.append((label, log))
        if rc is not None and rc < 0 and not (killed_by_fault and rc == -signal.SIGKILL):
            self.crashes.append("%s: killed by signal %d (%s)" % (label, -rc, signal.Signals(-rc).name))
        return rc

    def train(self, args, fault=None, label="train", timeout=120):
        """ddtreed train ARGS in the foreground: (exit status, its log)"""
        path = self.log_path(label)
        with open(path, "w") as out:
            try:
                rc = subprocess.run([self.env.ddtreed, "train"] + args, stdin=subprocess.DEVNULL, stdout=out,
                                    stderr=subprocess.STDOUT, env=fault_env(fault), timeout=timeout).returncode
            except subprocess.TimeoutExpired:
                rc = None
                self.check(False, "%s did not end within %d s" % (label, timeout))
        with open(path) as f:
            log = f.read()
        return self.finished(label, rc, log, killed_by_fault=fault is not None), log

    def tmpfs(self, megabytes, name="tmpfs", at=None):
        """a tmpfs of that size mounted at the case's dir/name, or at the empty directory at (a disk
        that fills up), unmounted when the case ends; Skip when this process cannot mount one (not
        root, or refused)"""
        path = at or os.path.join(self.dir, name)
        os.makedirs(path, exist_ok=at is not None)
        if os.geteuid() != 0:
            raise Skip("a tmpfs needs root (or use a write-failure point of base/fault.h)")
        p = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=%dm,mode=0700" % megabytes, "tmpfs", path],
                           capture_output=True, text=True)
        if p.returncode != 0:
            raise Skip("mount -t tmpfs refused: %s" % (p.stderr.strip() or "exit %d" % p.returncode))
        self.mounts.append(path)
        return path

    def end(self):
        """the processes left running killed, the lock released, the mounts undone"""
        for undo in reversed(self.on_end):
            try:
                undo()
            except Exception:
                self.errors.append("at the case's end:\n" + traceback.format_exc())
        self.on_end = []
        self.unmount()

    def unmount(self):
        for path in reversed(self.mounts):
            subprocess.run(["umount", "-l", path], capture_output=True)
        self.mounts = []

    def log_text(self):
        return "\n".join("--- %s\n%s" % (label, log[-3000:]) for label, log in self.logs)


# ------------------------------------------------------------------------------------------
# Injections, recoveries and checks the cases are made of

def synthetic(ctx):
    ctx.write_config(SYNTHETIC)


def killed_at(point, stop_after=None):
    """inject: `ddtreed train` with DDTREE_FAULT=point, which must kill it (after a clean pause at
    step stop_after and a resume, when given: a kill point whose count is then safe from the
    timing of the run's first commits)"""
    def inject(ctx):
        args = [ctx.config, "--state-dir", ctx.state]
        if stop_after:
            rc, log = ctx.train(args + ["--stop-after", str(stop_after)], label="paused")
            ctx.check(rc == 0, "the run did not pause at step %d (exit %s)" % (stop_after, rc))
            args = ["--resume", ctx.state]
        rc, log = ctx.train(args, fault=point, label="faulty")
        name = point.split("@")[0]
        ctx.check(rc == -signal.SIGKILL and "fault: DDTREE_FAULT point=%s" % name in log,
                  "the fault point %s did not kill the run (exit %s)" % (point, rc))
    return inject


def resume(ctx):
    """recover: `ddtreed train --resume`, which must complete the run"""
    rc, log = ctx.train(["--resume", ctx.state], label="resume")
    ctx.check(rc == 0 and "completed at step" in log, "the resume did not complete the run (exit %s)" % rc)


def train_with(fault):
    """inject: `ddtreed train` with DDTREE_FAULT=fault (a data read's EIO; None: nothing armed, the
    fault is the case's setup, a full disk say), which must end it cleanly"""
    def inject(ctx):
        rc, log = ctx.train([ctx.config, "--state-dir", ctx.state], fault=fault, label="faulty")
        ctx.check(rc in (0, 1), "ddtreed train ended with %s, not an exit status" % rc)
        if fault:
            ctx.check("fault: DDTREE_FAULT point=%s" % fault.split("@")[0] in log, "the fault %s never fired" % fault)
    return inject


def truncated_while_training(fraction=0.5, at_step=3, then_steps=0):
    """inject: the case's data file cut to fraction of its size once the run has recorded
    at_step; then the run left to end (then_steps: how many more steps must be recorded after the
    cut, for a run that must go on)"""
    def inject(ctx):
        path = ctx.log_path("faulty")
        with open(path, "w") as out:
            p = subprocess.Popen([ctx.env.ddtreed, "train", ctx.config, "--state-dir", ctx.state],
                                 stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=fault_env(None))
            try:
                deadline, cut = time.monotonic() + 60, None
                while time.monotonic() < deadline and p.poll() is None and cut is None:
                    s = step_of(ctx.state, 0.05)
                    if s and s.last_step >= at_step:
                        size = os.path.getsize(ctx.data_file)
                        os.truncate(ctx.data_file, int(size * fraction))
                        cut = s.last_step
                ctx.check(cut is not None, "the run ended (exit %s) or never reached step %d before the cut"
                          % (p.poll(), at_step))
                ctx.notes.append("%s cut to %d%% at step %s" % (os.path.basename(ctx.data_file), fraction * 100, cut))
                rc = p.wait(timeout=120)
            except subprocess.TimeoutExpired:
                p.kill()
                rc = p.wait()
                ctx.check(False, "the run did not end within 120 s of the cut")
        with open(path) as f:
            log = f.read()
        ctx.finished("faulty", rc, log)
        ctx.check(rc in (0, 1), "ddtreed train ended with %s, not an exit status" % rc)
        if cut is not None and then_steps:
            ctx.check(Snapshot(ctx.state).last_step >= cut + then_steps, "fewer than %d steps after the cut"
                      % then_steps)
    return inject


def fixed_and_resumed(*words):
    """recover: the run left paused by its data file, its error (runs row) and the process's log
    naming the file and words; the file put back whole; then `ddtreed train --resume`, which
    must complete the run from its newest checkpoint"""
    def recover(ctx):
        run = Snapshot(ctx.state).run or {}
        error, log = run.get("error") or "", ctx.log_text()
        ctx.check(run.get("state") == "paused", "the run is %s after its data failed, not paused" % run.get("state"))
        for want in (ctx.data_file,) + words:
            ctx.check(want in error and want in log, "the error does not say %r: runs.error %r" % (want, error))
        ctx.notes.append("error: " + error)
        shutil.copyfile(ctx.data_whole, ctx.data_file)
        resume(ctx)
    return recover


def export_whole(ctx):
    """check: the export is in place, both files, after a crash inside it"""
    snap = Snapshot(ctx.state)
    export = os.path.join(ctx.state, "runs", snap.run["id"], "export") if snap.run else ""
    ctx.check(all(os.path.isfile(os.path.join(export, f)) for f in ("config.json", "model.safetensors")),
              "the export is not whole after the recovery")
    left = [n for n in os.listdir(os.path.dirname(export)) if n.startswith("export.tmp-")] if export else []
    if left:
        ctx.notes.append("left beside the export by the crash: %s (never removed by pattern: export.c)" % left[0])


# ---- the daemon

class Daemon:
    def __init__(self, ctx, fault=None):
        self.ctx, self.fault = ctx, fault
        self.socket = os.path.join(ctx.dir, "api.sock")
        self.log_path = ctx.log_path("serve")
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen([ctx.env.ddtreed, "serve", "--state-dir", ctx.state, "--socket", self.socket],
                                     stdin=subprocess.DEVNULL, stdout=self.log, stderr=subprocess.STDOUT,
                                     env=fault_env(fault), start_new_session=True)
        deadline = time.monotonic() + 20
        while self.request("GET", "/healthz")[0] != 200:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("ddtreed serve did not answer /healthz: %s" % self.end())
            time.sleep(0.05)

    def request(self, method, path, body=None):
        conn = http.client.HTTPConnection("localhost", timeout=10)
        try:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.settimeout(10)
            s.connect(self.socket)
            conn.sock = s
            conn.request(method, path, body=json.dumps(body) if body is not None else None,
                         headers={"Content-Type": "application/json"} if body is not None else {})
            r = conn.getresponse()
            return r.status, r.read()
        except OSError:
            return None, b""
        finally:
            conn.close()

    def kill(self):
        """SIGKILL, when it still runs (a case that failed midway: its end)"""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
            with open(self.log_path) as f:
                self.ctx.logs.append(("serve (killed at the case's end)", f.read()))
        self.log.close()

    def get(self, path):
        """GET path's JSON (None when it does not answer 200)"""
        status, body = self.request("GET", path)
        return json.loads(body) if status == 200 else None

    def end(self, stop=True, timeout=30):
        """SIGTERM when stop (else it must end by itself), then its exit status; its log kept"""
        if stop and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = self.proc.wait()
            self.ctx.check(False, "ddtreed serve did not end within %d s" % timeout)
        self.log.close()
        with open(self.log_path) as f:
            log = f.read()
        return self.ctx.finished("serve", rc, log, killed_by_fault=self.fault is not None)


def daemon_killed_at(point):
    """inject: the run submitted to `ddtreed serve` armed with point, which must kill the daemon"""
    def inject(ctx):
        d = Daemon(ctx, fault=point)
        status, body = d.request("POST", "/runs", SYNTHETIC)
        ctx.check(status == 201, "POST /runs: %s %s" % (status, body[:300]))
        rc = d.end(stop=False, timeout=60)   # it must die by itself, at the point
        ctx.check(rc == -signal.SIGKILL and "point=%s" % point.split("@")[0] in ctx.logs[-1][1],
                  "the fault point %s did not kill the daemon (exit %s)" % (point, rc))
    return inject


def daemon_restart(ctx):
    """recover: `ddtreed serve` again; the run it finds interrupted must resume and complete"""
    d = Daemon(ctx)
    deadline, run = time.monotonic() + 60, None
    while time.monotonic() < deadline:
        run = Snapshot(ctx.state).run
        if run and run["state"] in ("completed", "failed", "cancelled"):
            break
        time.sleep(0.05)
    ctx.check(d.end() == 0, "ddtreed serve did not exit 0 on SIGTERM")
    ctx.check(run and run["state"] == "completed", "the restarted daemon did not complete the run: %s" % run)


# ---- a flipped byte (checksums: docs/formats.md)

def flip_middle(path):
    """one byte in the middle of path, its lowest bit flipped"""
    at = os.path.getsize(path) // 2
    with open(path, "r+b") as f:
        f.seek(at)
        byte = f.read(1)[0]
        f.seek(at)
        f.write(bytes([byte ^ 1]))


def run_dir(ctx):
    snap = Snapshot(ctx.state)
    return os.path.join(ctx.state, "runs", snap.run["id"]) if snap.run else ""


def checkpoint_flipped(name):
    """inject: the run paused at step 7 (checkpoints at 3, 6 and 7, two kept), then one byte
    flipped in the middle of the newest checkpoint's NAME"""
    def inject(ctx):
        rc, _ = ctx.train([ctx.config, "--state-dir", ctx.state, "--stop-after", "7"], label="paused")
        ctx.check(rc == 0, "the run did not pause at step 7 (exit %s)" % rc)
        ckdir = os.path.join(run_dir(ctx), "checkpoints")
        ctx.flipped = os.path.join(ckdir, sorted(n for n in os.listdir(ckdir) if n.startswith("step-"))[-1])
        flip_middle(os.path.join(ctx.flipped, name))
        ctx.notes.append("flipped: %s/%s" % (os.path.basename(ctx.flipped), name))
    return inject


def resumed_past_corrupt(name):
    """recover: `ddtreed train --resume` passes over the corrupt checkpoint (named, with its file,
    in the log and a checkpoint_corrupt event, moved aside) and completes from the one before"""
    def recover(ctx):
        rc, log = ctx.train(["--resume", ctx.state], label="resume")
        ctx.check(rc == 0 and "completed at step" in log, "the resume did not complete the run (exit %s)" % rc)
        ctx.check("checkpoint passed over at resume path=\"%s\"" % ctx.flipped in log and name in log,
                  "the log does not name the corrupt checkpoint and its file %s" % name)
        con = sqlite3.connect("file:%s?mode=ro" % os.path.join(ctx.state, "ddtree.db"), uri=True)
        events = [json.loads(d) for (d,) in con.execute("SELECT detail_json FROM events WHERE kind = 'checkpoint_corrupt'")]
        con.close()
        ctx.check(len(events) == 1 and events[0]["file"] == name and events[0]["checkpoint"] == ctx.flipped,
                  "the checkpoint_corrupt event: %s" % events)
        aside = os.path.join(os.path.dirname(ctx.flipped), "corrupt-" + os.path.basename(ctx.flipped))
        ctx.check(os.path.isfile(os.path.join(aside, name)), "the corrupt checkpoint was not moved aside to %s" % aside)
    return recover


def verify(ctx, directory):
    p = subprocess.run([ctx.env.ddtreed, "verify", directory], capture_output=True, text=True, timeout=60)
    return p.returncode, p.stdout + p.stderr


def export_flipped(name):
    """inject: the run completed, then one byte flipped in the middle of its export's NAME:
    `ddtreed verify` must find the export corrupt"""
    def inject(ctx):
        rc, _ = ctx.train([ctx.config, "--state-dir", ctx.state], label="run")
        ctx.check(rc == 0, "the run did not complete (exit %s)" % rc)
        export = os.path.join(run_dir(ctx), "export")
        flip_middle(os.path.join(export, name))
        rc, out = verify(ctx, export)
        ctx.check(rc == 1 and "%s: corrupt: " % export in out, "ddtreed verify of the flipped export: exit %s, %s"
                  % (rc, out.strip()))
        ctx.notes.append("flipped: export/%s; verify: %s" % (name, out.strip().split(": ", 1)[-1]))
    return inject


def export_written_again(ctx):
    """recover: `ddtreed export RUN_DIR --out RUN_DIR/export` from the newest checkpoint (the
    final one), after which the export verifies"""
    run, t0 = run_dir(ctx), time.monotonic()
    p = subprocess.run([ctx.env.ddtreed, "export", run, "--out", os.path.join(run, "export")], capture_output=True,
                       text=True, timeout=120)
    ctx.check(p.returncode == 0, "ddtreed export failed: %s" % (p.stdout + p.stderr)[-1000:])
    rc, out = verify(ctx, os.path.join(run, "export"))
    ctx.check(rc == 0 and out.strip().endswith(": good"), "the export written again does not verify: %s" % out)

# ---- holds: a full disk, a locked database (the run waits in place and goes on by itself)

def run_config(steps, every=None, keep=1, eval_every=None, speed="fast"):
    """the synthetic run of steps steps, a checkpoint every `every` (default: only the final one),
    keep of them kept, an evaluation every eval_every (default: the baseline and the end); speed:
    "fast" ~0.7 ms a step here (SYNTHETIC's model), "medium" ~5 ms, "slow" ~9 ms"""
    cfg = json.loads(json.dumps(SYNTHETIC))
    cfg["train"]["steps"] = steps
    cfg["checkpoint"] = {"every_steps": every or steps, "keep": keep}
    cfg["eval"]["every_steps"] = eval_every or steps
    if speed != "fast":
        cfg["target"]["hidden_size"] = 64
        cfg["train"].update(seq_len=96 if speed == "medium" else 128, sequences_per_step=4)
    return cfg


class Background:
    """a ddtreed process the case works on while it runs (its log: the case's LABEL-N.log),
    killed at the case's end if it still runs"""

    def __init__(self, ctx, args, label):
        self.ctx, self.label = ctx, label
        self.path = ctx.log_path(label)
        self.out = open(self.path, "w")
        self.proc = subprocess.Popen([ctx.env.ddtreed] + args, stdin=subprocess.DEVNULL, stdout=self.out,
                                     stderr=subprocess.STDOUT, env=fault_env(None), start_new_session=True)
        ctx.on_end.append(self.kill)

    def log(self):
        with open(self.path) as f:
            return f.read()

    def wait_log(self, text, timeout):
        """its log once it says text; None after timeout seconds, or when it ended without"""
        deadline = time.monotonic() + timeout
        while True:
            ended = self.proc.poll() is not None
            log = self.log()
            if text in log:
                return log
            if ended or time.monotonic() > deadline:
                return None
            time.sleep(0.05)

    def wait(self, timeout):
        """(its exit status, its log) once it ends by itself; killed after timeout seconds (None)"""
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            rc = None
            self.ctx.check(False, "%s did not end within %d s" % (self.label, timeout))
        self.out.close()
        log = self.log()
        return self.ctx.finished(self.label, rc, log), log

    def kill(self):
        """SIGKILL, when it still runs (a case that failed midway: its end), its log kept"""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            self.ctx.logs.append((self.label + " (killed at the case's end)", self.log()))
        self.out.close()


def wait_until(what, timeout, every=0.05):
    """what()'s first true value, polled (a read error counts as not yet); None after timeout s"""
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = what()
        except (sqlite3.Error, OSError, ValueError, TypeError, KeyError):   # not there yet
            value = None
        if value or time.monotonic() > deadline:
            return value or None
        time.sleep(every)


def fill(directory, leave=0):
    """directory's file system filled by the file directory/fill: written until ENOSPC (leave 0:
    not a byte left), or to leave bytes free (rounded up to a block); its path"""
    path = os.path.join(directory, "fill")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        if leave:
            fs = os.statvfs(directory)
            size = fs.f_bavail * fs.f_frsize - leave
            size -= size % fs.f_frsize
            block = b"\0" * (1 << 20)
            while size > 0:
                size -= os.write(fd, block[:min(size, len(block))])
        else:
            chunk = 1 << 20
            while chunk:
                try:
                    os.write(fd, b"\0" * chunk)
                except OSError as e:
                    if e.errno != errno.ENOSPC:
                        raise
                    chunk //= 16   # 1 MiB, 64 KiB, 4 KiB, 256, 16, 1: the last block's bytes too
    finally:
        os.close(fd)
    return path


def run_dir_of(ctx):
    return os.path.join(ctx.state, "runs", Snapshot(ctx.state).run["id"])


def copy_into(src, dst):
    """src's entries copied into the directory dst"""
    for name in os.listdir(src):
        (shutil.copytree if os.path.isdir(os.path.join(src, name)) else shutil.copy2)(
            os.path.join(src, name), os.path.join(dst, name))


def wait_held(ctx, seconds=60):
    """the hold, in the log of ctx.bg (`ddtreed train` prints "run ID paused at step N: WHY"):
    that line, or a failed check"""
    log = ctx.bg.wait_log("paused at step", seconds)
    ctx.check(log, "the run was not held within %d s of the fault (exit %s)" % (seconds, ctx.bg.proc.poll()))
    line = [x for x in (log or "").splitlines() if "paused at step" in x]
    if line:
        ctx.notes.append("the log: " + line[0].strip()[:300])
    return line[0] if line else ""


def store_on_tmpfs(megabytes, config):
    """setup: the state directory (ddtree.db, the run's checkpoints and export) on a tmpfs"""
    def setup(ctx):
        ctx.disk = ctx.tmpfs(megabytes)
        ctx.state = os.path.join(ctx.disk, "state")
        ctx.write_config(config)
    return setup


def config(cfg):
    """setup: the run config cfg (the state directory on the case's disk)"""
    return lambda ctx: ctx.write_config(cfg)


def daemon_on_tmpfs(megabytes, cfg):
    """setup: the daemon's state directory on a tmpfs; cfg the run it is given"""
    def setup(ctx):
        ctx.disk = ctx.tmpfs(megabytes)
        ctx.state = os.path.join(ctx.disk, "state")
        ctx.daemon_config = cfg
    return setup


def filled_while_training(ctx):
    """inject: `ddtreed train` in the background; once it has recorded a step, the state
    directory's file system filled to the last byte: the store's next commit fails (SQLITE_FULL)
    and the run is held at its next step boundary"""
    ctx.bg = Background(ctx, ["train", ctx.config, "--state-dir", ctx.state], "faulty")
    step = wait_until(lambda: Snapshot(ctx.state).last_step, 60)
    if not ctx.check(step, "the run recorded no step within 60 s"):
        return
    ctx.fill = fill(ctx.disk)
    ctx.notes.append("the disk filled at step %d" % step)
    line = wait_held(ctx)
    ctx.check(not line or "the store cannot write" in line, "held, but not by the store: %s" % line)


def checkpoint_dir_filled(ctx):
    """inject: the run paused at step 10 (with its checkpoint); its checkpoints directory put on
    a 1 MB tmpfs, the checkpoint copied back in, the rest filled; `ddtreed train --resume` in the
    background: the checkpoint of step 20 fails (ENOSPC: the free space is checked on the run's
    directory, on the big disk) and the run is held, the database unaffected"""
    rc, log = ctx.train([ctx.config, "--state-dir", ctx.state, "--stop-after", "10"], label="paused")
    if not ctx.check(rc == 0, "the run did not pause at step 10 (exit %s)" % rc):
        return
    ckdir = os.path.join(run_dir_of(ctx), "checkpoints")
    aside = os.path.join(ctx.dir, "checkpoints-aside")
    os.rename(ckdir, aside)
    ctx.tmpfs(1, at=ckdir)
    copy_into(aside, ckdir)
    ctx.fill = fill(ckdir)
    ctx.bg = Background(ctx, ["train", "--resume", ctx.state], "resume")
    wait_held(ctx)


def safetensors_data_bytes(path):
    with open(path, "rb") as f:
        header = struct.unpack("<Q", f.read(8))[0]
    return os.path.getsize(path) - 8 - header


def export_room_short(ctx):
    """inject: the run paused at step 11 of 12; its directory put on a tmpfs (its content copied
    back in) filled to leave room for the final checkpoint (what ddt_trainer_checkpoint's statvfs
    asks: its tensors and 64 KiB) and no more; `ddtreed train --resume` in the background: it
    trains step 12, writes the final checkpoint, and the export (4 bytes a parameter and 64 KiB)
    is refused for space: the run is held at step 12 with its checkpoint written. keep is 2, so
    that the checkpoint of step 11 stays (its pruning would make room for the export)."""
    rc, log = ctx.train([ctx.config, "--state-dir", ctx.state, "--stop-after", "11"], label="paused")
    if not ctx.check(rc == 0, "the run did not pause at step 11 (exit %s)" % rc):
        return
    run_dir = run_dir_of(ctx)
    aside = os.path.join(ctx.dir, "run-aside")
    os.rename(run_dir, aside)
    ctx.tmpfs(4, at=run_dir)
    copy_into(aside, run_dir)
    tensors = safetensors_data_bytes(os.path.join(run_dir, "checkpoints", "step-00000011", "state.safetensors"))
    ctx.fill = fill(run_dir, leave=tensors + (64 << 10) + 4096)
    ctx.bg = Background(ctx, ["train", "--resume", ctx.state], "resume")
    line = wait_held(ctx)
    ctx.check(not line or "the export" in line, "held, but not by the export: %s" % line)


def wal_restarts(db):
    """how many times ddtree.db's WAL was restarted from its start (the WAL header's checkpoint
    sequence number; 0: never, every commit so far appended to it)"""
    with open(db + "-wal", "rb") as f:
        header = f.read(32)
    return struct.unpack(">I", header[12:16])[0] if len(header) == 32 else 0


def daemon_resumed_on_full_disk(ctx):
    """inject: `ddtreed serve` on a tmpfs; a run paused by the user (POST pause); the disk filled;
    POST resume: the running state change cannot be committed (SQLITE_FULL), the store is
    degraded and the run held at its next step boundary.
    SQLite reuses its WAL file from its start once a checkpoint has copied it all into ddtree.db
    (after 1000 pages), and a commit that fits in the WAL's old length needs no new block: the
    disk filled then, the resume's commit could pass and a later one fail. This run is too short
    for that (250 steps, about 2.5 frames each, and the pause comes early), so every commit
    appends to the WAL and needs a new block: checked before the fill (the WAL's restarts: 0)."""
    d = ctx.daemon = Daemon(ctx)
    ctx.on_end.append(d.kill)
    status, body = d.request("POST", "/runs", ctx.daemon_config)
    if not ctx.check(status == 201, "POST /runs: %s %s" % (status, body[:300])):
        return
    rid = json.loads(body)["id"]
    ctx.check(wait_until(lambda: d.get("/runs/" + rid)["step"] >= 1, 60), "the run did not step within 60 s")
    status, body = d.request("POST", "/runs/%s/pause" % rid)
    ctx.check(status == 202, "POST pause: %s %s" % (status, body[:300]))
    ctx.check(wait_until(lambda: Snapshot(ctx.state).run["state"] == "paused", 60), "the run did not pause")
    paused_at = Snapshot(ctx.state).run["step"]
    db = os.path.join(ctx.state, "ddtree.db")
    if not ctx.check(wal_restarts(db) == 0 and paused_at < 250, "the WAL was restarted before the fill (paused "
                     "at step %d): the resume's commit could pass on the full disk" % paused_at):
        return
    ctx.fill = fill(ctx.disk)
    status, body = d.request("POST", "/runs/%s/resume" % rid)
    ctx.check(status == 202, "POST resume: %s %s" % (status, body[:300]))
    health = wait_until(lambda: (lambda h: h if h["status"] == "degraded" else None)(d.get("/healthz")), 60)
    cause = ((health or {}).get("store") or {}).get("cause") or ""
    ctx.check("file system is full" in cause, "/healthz did not say the store is degraded by the full disk: %s"
              % health)
    held = wait_until(lambda: (lambda r: r if r["held"] else None)(d.get("/runs/" + rid)), 60)
    ctx.check(held and held["state"] == "paused" and "the store cannot write" in (held["error"] or ""),
              "GET /runs/%s did not show the run held by the store: %s" % (rid, held))
    with open(d.log_path) as f:
        log = f.read()
    ctx.check("state change from=paused to=running kept in the store's queue" in log,
              "the resume's state change was not kept in the store's queue (it did not meet the full disk)")
    ctx.notes.append("paused by the user at step %d; /healthz: %s" % (paused_at, cause[:120]))


def daemon_freed(ctx):
    """recover: the fill deleted; the held run must go on and complete"""
    d = ctx.daemon
    if not (d and ctx.fill):   # the injection failed before it filled the disk
        return
    os.unlink(ctx.fill)
    run = wait_until(lambda: (lambda r: r if r["state"] in ("completed", "failed", "cancelled") else None)(
        Snapshot(ctx.state).run), 120)
    health = d.get("/healthz") or {}
    ctx.check(health.get("status") == "ok", "/healthz after the recovery: %s" % health)
    ctx.check(d.end() == 0, "ddtreed serve did not exit 0 on SIGTERM")
    ctx.check(run and run["state"] == "completed", "the run did not complete: %s" % run)


def locked_while_training(seconds):
    """inject: `ddtreed train` in the background; once it has recorded a step, this process (not
    ddtreed) takes ddtree.db's write lock (BEGIN IMMEDIATE) and keeps it `seconds`: the store's
    commit waits out its 5 s busy timeout and the store is degraded, naming this process's pid;
    the run is held (at the latest when the store's queue is half full: LOCKED_RUN)"""
    def inject(ctx):
        ctx.bg = Background(ctx, ["train", ctx.config, "--state-dir", ctx.state], "faulty")
        step = wait_until(lambda: Snapshot(ctx.state).last_step, 60)
        if not ctx.check(step, "the run recorded no step within 60 s"):
            return
        ctx.lock = sqlite3.connect(os.path.join(ctx.state, "ddtree.db"), isolation_level=None, timeout=30)
        ctx.on_end.append(ctx.lock.close)
        ctx.lock.execute("BEGIN IMMEDIATE")
        locked = time.monotonic()
        ctx.notes.append("locked at step %d for %d s by pid %d" % (step, seconds, os.getpid()))
        wait_held(ctx, seconds)
        cause = "another process (pid %d) holds the write lock" % os.getpid()
        ctx.check(ctx.bg.wait_log(cause, max(1, locked + seconds - time.monotonic())),
                  "the store did not log %r while the lock was held" % cause)
        time.sleep(max(0.0, locked + seconds - time.monotonic()))
    return inject


def freed(ctx):
    """recover: the fill deleted, or the lock let go (COMMIT); the held run must go on by itself
    and complete"""
    if ctx.lock:
        ctx.lock.execute("COMMIT")
    elif ctx.fill:
        os.unlink(ctx.fill)
    if not ctx.bg:   # the injection failed before it started the run
        return
    rc, log = ctx.bg.wait(180)
    ctx.check(rc == 0 and "completed at step" in log, "the held run did not complete (exit %s)" % rc)


def hold_recorded(*causes):
    """check: the run was held and went on: a "paused" state event whose error says each word of
    one of causes (tuples of words; the first the one expected, another noted), a "running" one
    after it, and the log saying both ("paused at step", "goes on: what held it is over")"""
    def check(ctx):
        states = Snapshot(ctx.state).states
        for n, words in enumerate(causes):
            held = [i for i, (ts, state, step, error) in enumerate(states)
                    if state == "paused" and all(w in error for w in words)]
            if held:
                break
        if not ctx.check(held, "no paused event saying %s; the state events: %s"
                         % (" or ".join(repr(w) for w in causes), [(s, step, e[:100]) for _, s, step, e in states])):
            return
        ts, state, step, error = states[held[0]]
        if n:
            ctx.notes.append("held by %s, not %s: %s" % (words, causes[0], error[:200]))
        ctx.check(any(s == "running" for _, s, _, _ in states[held[0] + 1:]),
                  "no running event after the hold at step %d: %s" % (step, [s for _, s, _, _ in states]))
        log = "\n".join(text for label, text in ctx.logs)
        ctx.check(all(w in log for w in words) and "goes on: what held it is over" in log,
                  "the log does not say the hold (%s) and its end" % (words,))
    return check


def states_in_order(*wanted):
    """check: the run's state events hold wanted in this order (others may come between)"""
    def check(ctx):
        got = [s for _, s, _, _ in Snapshot(ctx.state).states]
        it = iter(got)
        ctx.check(all(w in it for w in wanted), "the state events %s do not go %s" % (got, " -> ".join(wanted)))
    return check


def no_error(*whats):
    """check: no "error" event of what (e.g. "the checkpoint"): only the fault's write failed"""
    def check(ctx):
        con = sqlite3.connect("file:%s?mode=ro" % os.path.join(ctx.state, "ddtree.db"), uri=True)
        try:
            messages = [json.loads(d).get("message", "") for (d,) in
                        con.execute("SELECT detail_json FROM events WHERE kind = 'error'")]
        finally:
            con.close()
        for what in whats:
            bad = [m for m in messages if m.startswith(what)]
            ctx.check(not bad, "%s failed too: %s" % (what, bad[:2]))
    return check


# ------------------------------------------------------------------------------------------
# The cases

class Case:
    """name; setup(ctx) writes the run config (and sets ctx.data_file); inject(ctx) runs the fault;
    recover(ctx) restarts or resumes (None: the run is left as the fault left it); state: the
    runs row's expected final state; checks: more check(ctx) after the recovery; requires(env):
    None, or why the case cannot run here (it is then reported skipped); in_place: the fault
    holds the run and the recovery frees what held it (a full disk, a lock): the run goes on by
    itself where it waited, from no checkpoint; resumes: the recovery resumes the run (False: it
    mends a file of a finished run, no step is trained again)"""

    def __init__(self, name, setup, inject, recover, state, checks=(), requires=None, in_place=False, resumes=True):
        self.name, self.setup, self.inject, self.recover = name, setup, inject, recover
        self.state, self.checks, self.requires, self.in_place = state, checks, requires, in_place
        self.resumes = resumes


def shards_run(steps=12, every=3, eval_every=12):
    """setup: a run on a copy of the feature shard (a shards target: no target at train time);
    evaluations only at the start and the end by default, so that a counted data.read falls on
    a training read"""
    def setup(ctx):
        fx = ctx.env.fixtures.make()
        ctx.data_file, ctx.data_whole = os.path.join(ctx.dir, "shard.safetensors"), fx.shard
        shutil.copyfile(fx.shard, ctx.data_file)
        cfg = json.loads(json.dumps(SYNTHETIC))
        cfg["target"] = {"kind": "shards", "path": fx.target, "shards": [ctx.data_file]}
        cfg["drafter"]["target_layer_ids"] = [0, 2]
        cfg["train"].update(steps=steps, seq_len=16)
        cfg["checkpoint"]["every_steps"] = every
        cfg["eval"]["every_steps"] = eval_every
        ctx.write_config(cfg)
    return setup


def tokens_run(steps):
    """setup: a run of the llama target on a copy of its token file"""
    def setup(ctx):
        fx = ctx.env.fixtures.make()
        ctx.data_file, ctx.data_whole = os.path.join(ctx.dir, "tokens.safetensors"), fx.tokens
        shutil.copyfile(fx.tokens, ctx.data_file)
        cfg = json.loads(json.dumps(SYNTHETIC))
        cfg["target"] = {"kind": "hf", "path": fx.target, "tokens": ctx.data_file}
        cfg["train"].update(steps=steps, seq_len=16)
        cfg["checkpoint"]["every_steps"] = steps // 4
        cfg["eval"]["every_steps"] = steps
        ctx.write_config(cfg)
    return setup


# the locked cases' run: ~5 ms a step here, so that the store's 5 s busy timeout ends (the store
# degraded, naming the lock) long before its queue is half full (2,048 records, a step one: that
# holds the run too, "the store is behind", on a machine twice as fast); 2,600 steps, so that it
# is held either way before it ends
LOCKED_RUN = run_config(2600, speed="medium")
LOCK_CAUSES = (("the store cannot write", "another process (pid %d) holds the write lock" % os.getpid()),
               ("the store is behind",))

SHARD_STEPS = 3000   # a shard run still training when its file is cut (a few seconds)

CASES = [
    # a crash at each durable write: the run resumes from a good checkpoint and completes
    Case("kill: checkpoint written, not renamed", synthetic, killed_at("checkpoint.tensors_written@2"), resume,
         "completed"),
    Case("kill: checkpoint renamed, dir not synced", synthetic, killed_at("dir.renamed@2"), resume, "completed"),
    Case("kill: mid-export", synthetic, killed_at("export.config_written"), resume, "completed",
         checks=[export_whole]),
    Case("kill: store mid-commit", synthetic, killed_at("store.mid_commit@2", stop_after=4), resume, "completed"),
    Case("kill: daemon, checkpoint renamed", synthetic, daemon_killed_at("dir.renamed@2"), daemon_restart,
         "completed"),
    # a data file that fails to read: a clean error naming the file, no crash, no record lost
    # data that cannot be read pauses the run, naming the file; put back, the run resumes from
    # its newest checkpoint and completes
    Case("shard: EIO midway", shards_run(), train_with("data.read@15"),
         fixed_and_resumed("offset", "Input/output error"), "completed"),
    Case("shard: truncated while open", shards_run(steps=SHARD_STEPS, eval_every=6), truncated_while_training(),
         fixed_and_resumed("truncated while in use"), "completed"),
    # a token file is read whole when the run opens it: a cut afterwards does not reach the run
    Case("token file: truncated while open", tokens_run(2000), truncated_while_training(then_steps=5), None,
         "completed"),
    # a full disk at each durable write, the database locked by another process: the run is held
    # (paused, where it is) and goes on by itself once the space or the lock is back
    Case("disk full: step records", store_on_tmpfs(16, run_config(4000)), filled_while_training, freed, "completed",
         checks=[hold_recorded(("the store cannot write", "file system is full"))], in_place=True),
    Case("disk full: a checkpoint", config(run_config(60, every=20, eval_every=30)), checkpoint_dir_filled, freed,
         "completed", checks=[hold_recorded(("the checkpoint at step 20 failed", "the checkpoint needs", "KB free"))],
         in_place=True),
    Case("disk full: the export", config(run_config(12, keep=2)), export_room_short, freed, "completed",
         checks=[hold_recorded(("the export at step 12 failed", "the export needs", "KB free")),
                 no_error("the checkpoint"), export_whole], in_place=True),
    Case("disk full: the runs row", daemon_on_tmpfs(16, run_config(250, speed="slow")), daemon_resumed_on_full_disk,
         daemon_freed, "completed",
         checks=[hold_recorded(("the store cannot write", "file system is full")),
                 states_in_order("paused", "running", "paused", "running", "completed")], in_place=True),
    Case("db locked 15 s", config(LOCKED_RUN), locked_while_training(15), freed, "completed",
         checks=[hold_recorded(*LOCK_CAUSES)], in_place=True),
    Case("db locked 120 s", config(LOCKED_RUN), locked_while_training(120), freed, "completed",
         checks=[hold_recorded(*LOCK_CAUSES)], in_place=True),
] + [
    # one flipped byte in each file of a checkpoint: the resume passes over it, from the one before
    Case("flipped: checkpoint %s" % name, synthetic, checkpoint_flipped(name), resumed_past_corrupt(name), "completed")
    for name in ("state.safetensors", "state.json")
] + [
    # one flipped byte in each file of an export: verify finds it, an export from the checkpoint mends it
    Case("flipped: export %s" % name, synthetic, export_flipped(name), export_written_again, "completed",
         resumes=False)
    for name in ("config.json", "model.safetensors", "ddtree-manifest.json")
]


# ------------------------------------------------------------------------------------------
# The runner: each case, its measures, the table

class Row:
    def __init__(self, case):
        self.case, self.result = case, "ok"
        self.state, self.lost, self.redone, self.recover_s = "-", "-", "-", None


def measure(ctx, before, after, restart_ms, row):
    """the records lost and the steps redone, from the snapshots after the fault and at the end"""
    run = after.run
    row.state = run["state"] if run else "(no run)"
    n = run["step"] if run else 0
    missing = [s for s in range(1, n + 1) if s not in after.steps]
    gone = sorted(set(before.steps) - set(after.steps))
    unrecorded = sorted((before.ckpt_dirs | after.ckpt_dirs) - after.ckpt_rows)
    row.lost = len(missing) + len(gone) + len(unrecorded) + (0 if run else 1)
    for what, steps in (("step rows missing", missing), ("step rows gone after the recovery", gone),
                        ("checkpoints without a row", unrecorded)):
        ctx.check(not steps, "%s: %s" % (what, steps[:20]))
    ctx.check(run is not None, "no runs row")
    if restart_ms is None:
        return
    resumes = [step for ts, step in after.running if ts >= restart_ms]
    ctx.check(resumes, "no state event says where the run resumed after the restart")
    if not resumes:
        return
    resumed_from = resumes[0]
    row.redone = max(0, before.last_step - resumed_from)   # rows still queued at the fault: none redone
    if ctx.case.in_place:   # a hold: the run went on where it waited, its state in memory
        held = [step for ts, state, step, error in after.states if state == "paused" and error]
        ctx.notes.append("went on at step %d, where it was held; %d step(s) recorded before the resource was freed"
                         % (resumed_from, before.last_step))
        ctx.check(resumed_from in held, "went on at step %d, not at a step it was held at (%s)" % (resumed_from, held))
    else:
        ctx.notes.append("resumed from step %d; %d step(s) recorded before the fault" % (resumed_from, before.last_step))
        ctx.check(resumed_from in before.ckpt_dirs or resumed_from in after.ckpt_rows,
                  "resumed from step %d, not a checkpoint that was on disk" % resumed_from)
    differ = [s for s in sorted(before.steps) if s > resumed_from and s in after.steps and
              after.steps[s][0] != before.steps[s][0]]
    ctx.check(not differ, "steps redone with other losses than the first time (not resumed exactly): %s" % differ[:10])


def run_case(env, case):
    row = Row(case)
    why = case.requires(env) if case.requires else None
    if why:
        row.result = "skipped: " + why
        return row, None
    ctx = Ctx(env, case)
    try:
        case.setup(ctx)
        case.inject(ctx)
        before = Snapshot(ctx.state)
        restart_ms = None
        if case.recover:
            restart_ms = int(time.time() * 1000) if case.resumes else None
            t0 = time.monotonic()
            case.recover(ctx)
            row.recover_s = time.monotonic() - t0
        after = Snapshot(ctx.state)
        measure(ctx, before, after, restart_ms, row)
        ctx.check(row.state == case.state, "final state %s, expected %s" % (row.state, case.state))
        for check in case.checks:
            check(ctx)
    except Skip as why:
        row.result = "skipped: %s" % why
        return row, ctx
    except Exception:
        ctx.errors.append("exception:\n" + traceback.format_exc())
    finally:
        ctx.end()
    for crash in ctx.crashes:
        ctx.errors.append("a crash: " + crash)
    if ctx.errors:
        row.result = "FAIL"
    return row, ctx


def table(rows):
    head = ("case", "final state", "lost", "redone", "recover", "result")
    lines = []
    for r in rows:
        state = r.state if r.state in ("-", r.case.state) else "%s [%s]" % (r.state, r.case.state)
        lines.append((r.case.name, state, str(r.lost), str(r.redone),
                      "-" if r.recover_s is None else "%.2f s" % r.recover_s, r.result))
    widths = [max(len(x[i]) for x in [head] + lines) for i in range(len(head))]
    fmt = lambda x: "  ".join(c.ljust(w) for c, w in zip(x, widths)).rstrip()
    return "\n".join([fmt(head), fmt(["-" * w for w in widths])] + [fmt(x) for x in lines])


class Env:
    def __init__(self, args):
        self.ddtreed = os.path.abspath(args.ddtreed)
        self.root = tempfile.mkdtemp(prefix="ddtree-faults-")
        self.fixtures = Fixtures(self)


def report(row, ctx, took):
    """a case's line, its notes and, when it failed, why and the tail of its processes' logs"""
    word = row.result if row.result in ("ok", "FAIL") else "skip"
    print("%-4s %s (%.1f s)%s" % (word, row.case.name, took, ": " + row.result if word == "skip" else ""))
    lines = list(ctx.notes) if ctx else []
    if row.result == "FAIL":
        lines += ctx.errors + ["logs:"] + ["  | " + x for x in ctx.log_text().splitlines()[-40:]]
    for line in lines:
        print("    " + line.replace("\n", "\n    "))
    sys.stdout.flush()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ddtreed", required=True)
    ap.add_argument("--only", help="comma-separated case names (or their numbers, from 1)")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory")
    ap.add_argument("--table", help="write the table to this file too")
    args = ap.parse_args()
    if not os.access(args.ddtreed, os.X_OK):
        print("skipped: ddtreed not found at %s (build it first)" % args.ddtreed)
        return 77
    env = Env(args)
    only = set(args.only.split(",")) if args.only else None
    rows, started = [], time.monotonic()
    try:
        for n, case in enumerate(CASES, 1):
            if not only or str(n) in only or case.name in only:
                t0 = time.monotonic()
                row, ctx = run_case(env, case)
                rows.append(row)
                report(row, ctx, time.monotonic() - t0)
    finally:
        failed = sum(r.result == "FAIL" for r in rows)
        if args.keep or failed:
            print("(state kept in %s)" % env.root)
        else:
            shutil.rmtree(env.root, ignore_errors=True)
    text = table(rows) + "\n%d case(s), %d failed, %.1f s\n" % (len(rows), failed, time.monotonic() - started)
    print("\n" + text, end="")
    if args.table:
        with open(args.table, "w") as f:
            f.write(text)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
