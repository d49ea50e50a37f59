#!/usr/bin/python3
"""dflash_vs_dflash2.py: DFlash against DFlash2 (SPEC.md 2 and 2.1) on the same work, side by side.

    /usr/bin/python3 tests/bench/dflash_vs_dflash2.py --ddtreed build-simt/bin/ddtreed \\
        [--seconds 60] [--qwen35-seconds 12] [--seeds 3] [--targets stories260k,qwen35] [--keep DIR]

For each target (examples/stories260k.json on ../shared/models/stories260k; the structured tiny
Qwen3.5 of tests/daemon/qwen35_structured.py, made from ../shared/models/qwen35-tiny) and each
architecture, the same wall time of training: a calibration run (CALIBRATE steps, no evaluation)
measures the median step time from the run's own SQLite steps table, then a run of
floor(seconds / step time) steps (its full warm-up and cosine schedule) is trained with its
final evaluation's speculative decoding (SPEC.md 7: tau_spec and tau_spec_tree(32) on held-out
prompts, greedy and lossless), once per seed. The structured Qwen3.5 target is a nearly
deterministic bigram chain that both drafters learn to the block's limit within a minute, so it
gets a shorter budget (--qwen35-seconds) where they are still apart. Run it on a quiet machine:
the step time is measured, not assumed. The drafters are alike but for the architecture
(DFlash2's convolutions and selector at their defaults: taps 2, group 16 or the hidden size when
smaller, rank 256, top-K 16), with the same seed the same backbone at step 0.

Prints, per target and architecture: steps reached, the step time and peak memory of the
calibration (one shape), the teacher-forced tau_chain and tau_tree(32) of the last evaluation
and tau_spec, tau_spec_tree(32), each as the mean and the spread (min..max) over the seeds.
Not a test (its figures are measurements); not in ctest. Exit 77 when ../shared's models are
absent. Needs numpy for the Qwen3.5 target (the structured checkpoint).
"""
import argparse
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
CALIBRATE = 12


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


def arch_config(base, arch, seed, steps, evaluate, hidden):
    c = json.loads(json.dumps(base))
    c["name"] = f"{base.get('name', 'run')}-{arch}-s{seed}"
    c["drafter"]["architecture"] = arch
    if arch == "dflash2" and hidden % 16:
        c["drafter"]["conv_group_size"] = hidden
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
    return {"steps": step, "tau_chain": tau_chain, "tau_tree32": json.loads(tree or "{}").get("32"),
            "tau_spec": spec, "tau_spec_tree32": json.loads(spec_tree or "{}").get("32")}


def hidden_of(base):
    """the target's hidden size, for DFlash2's group size (its config.json)"""
    with open(os.path.join(base["target"]["path"], "config.json")) as f:
        c = json.load(f)
    return int(c.get("text_config", c)["hidden_size"])


def spread(values):
    v = [x for x in values if x is not None]
    if not v:
        return "-"
    return f"{statistics.mean(v):.3f} ({min(v):.3f}..{max(v):.3f})"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ddtreed", required=True)
    ap.add_argument("--seconds", type=float, default=60.0, help="training wall time of each stories260k run")
    ap.add_argument("--qwen35-seconds", type=float, default=12.0, help="training wall time of each Qwen3.5 run")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--targets", default="stories260k,qwen35")
    ap.add_argument("--keep", help="a directory to keep the runs in")
    args = ap.parse_args()
    if not os.path.isdir(os.path.join(SHARED, "models")):
        print(f"skipped: {SHARED}/models is absent")
        return 77
    work = args.keep or tempfile.mkdtemp(prefix="ddtree_dflash2_")
    table = []   # (target, arch, seconds, steps, step ms, peak bytes, runs)
    try:
        for target in args.targets.split(","):
            base = stories_config() if target == "stories260k" else qwen35_config(work)
            H = hidden_of(base)
            seconds = args.seconds if target == "stories260k" else args.qwen35_seconds
            for arch in ("dflash", "dflash2"):
                cal = train(args.ddtreed, arch_config(base, arch, 0, CALIBRATE, False, H),
                            os.path.join(work, target, arch, "calibrate"), 600)
                step_ms, peak = step_figures(cal)
                steps = max(10, int(seconds * 1000.0 / step_ms))
                runs = []
                for seed in range(args.seeds):
                    t0 = time.monotonic()
                    db = train(args.ddtreed, arch_config(base, arch, seed, steps, True, H),
                               os.path.join(work, target, arch, f"seed{seed}"), 20 * seconds + 600)
                    figures = eval_figures(db)
                    figures["wall_s"] = time.monotonic() - t0
                    runs.append(figures)
                    print(f"# {target} {arch} seed {seed}: {json.dumps(figures)}", flush=True)
                table.append((target, arch, seconds, steps, step_ms, peak, runs))
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    print(f"\nDFlash against DFlash2, the same training time, {args.seeds} seeds: mean (min..max)")
    print(f"{'target':12} {'arch':8} {'s':>4} {'steps':>6} {'step ms':>8} {'peak MB':>8}  {'tau_chain':>20} "
          f"{'tau_tree(32)':>20} {'tau_spec':>20} {'tau_spec_tree(32)':>20}")
    for target, arch, seconds, steps, step_ms, peak, runs in table:
        print(f"{target:12} {arch:8} {seconds:4.0f} {steps:6d} {step_ms:8.1f} {peak / 1e6:8.1f}  "
              f"{spread([r['tau_chain'] for r in runs]):>20} {spread([r['tau_tree32'] for r in runs]):>20} "
              f"{spread([r['tau_spec'] for r in runs]):>20} {spread([r['tau_spec_tree32'] for r in runs]):>20}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
