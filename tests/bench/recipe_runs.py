"""recipe_runs.py: what tests/bench's comparisons of training recipes share (dflash_vs_dflash2.py,
recipes.py): the base run configs (examples/stories260k.json on ../shared/models/stories260k, the
structured tiny Qwen3.5), a run of `ddtreed train`, the calibration of a config's step time and
the steps it reaches in a wall time, one run per seed with its final evaluation, the figures of a
run's SQLite database and their spread over the seeds.

Not a test and not a script: exercised by the scripts that import it.
"""
import argparse
import contextlib
import json
import os
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SHARED = os.path.join(os.path.dirname(ROOT), "shared")
CALIBRATE = 24


def stories_config():
    with open(os.path.join(ROOT, "examples", "stories260k.json")) as f:
        c = json.load(f)
    c["target"]["path"] = os.path.join(SHARED, "models", "stories260k")
    return c


def qwen35_config(workdir):
    """the structured tiny Qwen3.5 target (tests/daemon/train_qwen35_test.sh's), a drafter of 2
    layers at block 8"""
    src = os.path.join(SHARED, "models", "qwen35-tiny", "text-only")
    dst = os.path.join(workdir, "qwen35-structured")
    if not os.path.isdir(dst):
        subprocess.run([sys.executable, os.path.join(ROOT, "tests", "daemon", "qwen35_structured.py"), src, dst],
                       check=True)
    return {"name": "qwen35-structured",
            "target": {"kind": "hf", "path": dst, "temperature": 0.3, "top_p": 0.95},
            "drafter": {"num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                        "head_dim": 16, "intermediate_size": 128, "block_size": 8, "target_layer_ids": "auto"},
            "train": {"steps": 300, "sequences_per_step": 4, "seq_len": 96, "max_anchors": 16, "heldout": 16,
                      "lr": 1e-2, "seed": 0},
            "checkpoint": {"every_steps": 100000, "keep": 1},
            "eval": {"every_steps": 100000, "sequences": 16, "tree_budgets": [8, 32],
                     "speculative": {"prompts": 16, "prompt_len": 16, "gen_len": 64, "tree_budgets": [8, 32]}}}


def run_config(base, name, seed, steps, evaluate):
    """a copy of base named name: steps steps of seed, no checkpoint before the end, its only
    evaluation at the last step (evaluate) or none, speculative decoding's included"""
    c = json.loads(json.dumps(base))
    c["name"] = name
    c["train"]["steps"] = steps
    c["train"]["seed"] = seed
    c.setdefault("checkpoint", {})["every_steps"] = steps + 1
    ev = c.setdefault("eval", {})
    ev["every_steps"] = steps if evaluate else steps + 1
    if not evaluate:
        ev.pop("speculative", None)
    return c


def train(ddtreed, config, workdir, timeout):
    """runs `ddtreed train`; returns the state dir's database path"""
    os.makedirs(workdir, exist_ok=True)
    path = os.path.join(workdir, "run.json")
    with open(path, "w") as f:
        json.dump(config, f)
    state = os.path.join(workdir, "state")
    p = subprocess.run([ddtreed, "train", path, "--state-dir", state], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, timeout=timeout, env=dict(os.environ, OPENBLAS_NUM_THREADS="2"))
    if p.returncode != 0:
        raise RuntimeError(f"ddtreed train {config['name']} exited {p.returncode}:\n" +
                           p.stdout.decode("utf-8", "replace")[-2000:])
    return os.path.join(state, "ddtree.db")


def step_figures(db):
    with sqlite3.connect(db) as con:
        rows = con.execute("SELECT step_ms, peak_bytes FROM steps ORDER BY step").fetchall()
    times = [r[0] for r in rows[2:]] or [r[0] for r in rows]   # the first steps warm caches up
    return statistics.median(times), max(r[1] for r in rows)


def eval_figures(db):
    with sqlite3.connect(db) as con:
        row = con.execute("SELECT step, tau_chain, tau_tree_json, tau_spec, tau_spec_tree_json FROM evals "
                          "ORDER BY step DESC LIMIT 1").fetchone()
    step, tau_chain, tree, spec, spec_tree = row
    tree, spec_tree = json.loads(tree or "{}"), json.loads(spec_tree or "{}")
    return {"steps": step, "tau_chain": tau_chain, "tau_tree32": tree.get("32"), "tau_spec": spec,
            "tau_spec_tree32": spec_tree.get("32"), "tau_tree8": tree.get("8"), "tau_spec_tree8": spec_tree.get("8")}


def hidden_of(base):
    """the target's hidden size, for DFlash2's group size (its config.json)"""
    with open(os.path.join(base["target"]["path"], "config.json")) as f:
        c = json.load(f)
    return int(c.get("text_config", c)["hidden_size"])


def spread(values, signed=False):
    """mean (min..max) of the values given, signs written when signed"""
    v = [x for x in values if x is not None]
    if not v:
        return "-"
    f = "+.3f" if signed else ".3f"
    return f"{statistics.mean(v):{f}} ({min(v):{f}}..{max(v):{f}})"


def calibrate(ddtreed, make, workdir):
    """the median step ms and the peak bytes of make(seed 0, CALIBRATE steps, no evaluation)'s run"""
    return step_figures(train(ddtreed, make(0, CALIBRATE, False), workdir, 600))


def steps_for(seconds, step_ms):
    """the steps trained in seconds at step_ms a step (10 at least)"""
    return max(10, int(seconds * 1000.0 / step_ms))


def seed_runs(ddtreed, make, steps, seeds, seconds, workdir, label):
    """make(seed, steps, evaluate)'s run for each seed, its final figures (eval_figures and its
    wall_s) printed as it finishes"""
    runs = []
    for seed in range(seeds):
        t0 = time.monotonic()
        db = train(ddtreed, make(seed, steps, True), os.path.join(workdir, f"seed{seed}"), 20 * seconds + 600)
        figures = eval_figures(db)
        figures["wall_s"] = time.monotonic() - t0
        runs.append(figures)
        print(f"# {label} seed {seed}: {json.dumps(figures)}", flush=True)
    return runs


def arguments(description, seconds, targets):
    """the options the comparisons share: --ddtreed, --seconds, --qwen35-seconds, --seeds, --targets, --keep"""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--ddtreed", required=True)
    ap.add_argument("--seconds", type=float, default=seconds, help="training wall time of each stories260k run")
    ap.add_argument("--qwen35-seconds", type=float, default=12.0, help="training wall time of each Qwen3.5 run")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--targets", default=targets)
    ap.add_argument("--keep", help="a directory to keep the runs in")
    return ap


def models_absent():
    """True (and says so) when ../shared's models are absent"""
    if os.path.isdir(os.path.join(SHARED, "models")):
        return False
    print(f"skipped: {SHARED}/models is absent")
    return True


@contextlib.contextmanager
def workdir(keep, prefix):
    """keep, or a temporary directory removed afterwards"""
    work = keep or tempfile.mkdtemp(prefix=prefix)
    try:
        yield work
    finally:
        if not keep:
            shutil.rmtree(work, ignore_errors=True)
