#!/usr/bin/python3
"""loss_vs_torch.py: the fused, chunked loss beside the PyTorch approach, in one invocation.

    loss_vs_torch.py --bin BUILD/bin/bench_loss [--before OTHER/bin/bench_loss]
                     [--n 2048 --hidden 256 --vocab 16000 --chunk 512 --tile 2048
                     --threads 1 --reps 3] [--seed-arithmetic]

Runs bench_loss (both memory modes and the floor: the three logit-sized products alone) and
loss_torch_peer.py (per chunk: logits, CE + KL, backward, gradient accumulated: the seed's
approach) with the same shape and thread count, one after the other, each in its own process
so that neither's peak memory hides the other's. Prints one table with the ratios the issue
sets as goals. --before runs a second bench_loss first (one built from an earlier commit, e.g.
in a `git worktree`) and puts its figures beside --bin's: before and after in one invocation.
"x floor" is each binary's time over the floor it measured in the same process; "cpu x floor"
the same in process CPU time, the steadier ratio when other work shares the machine.
A figure, never a test: it exits 0 whatever the ratios are.
"""
import argparse
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from bench_run import run_json  # noqa: E402



def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bin", required=True, help="path to bench_loss")
    ap.add_argument("--before", help="path to an earlier bench_loss, shown beside --bin's")
    for name, default in (("n", 2048), ("hidden", 256), ("vocab", 16000), ("chunk", 512),
                          ("tile", 2048), ("threads", 1), ("reps", 3)):
        ap.add_argument("--" + name, type=int, default=default)
    ap.add_argument("--kl-weight", type=float, default=0.15)
    ap.add_argument("--seed-arithmetic", action="store_true")
    a = ap.parse_args()

    env = dict(os.environ, OPENBLAS_NUM_THREADS=str(a.threads), OMP_NUM_THREADS=str(a.threads))
    shape = ["--n", str(a.n), "--hidden", str(a.hidden), "--vocab", str(a.vocab),
             "--chunk", str(a.chunk), "--threads", str(a.threads), "--reps", str(a.reps),
             "--kl-weight", str(a.kl_weight)]
    before = run_json("loss_vs_torch", [a.before, *shape, "--tile", str(a.tile), "--json"], env)[0] \
        if a.before else None
    ours, _ = run_json("loss_vs_torch", [a.bin, *shape, "--tile", str(a.tile), "--json"], env)
    torch, why = run_json("loss_vs_torch", [sys.executable, os.path.join(HERE, "loss_torch_peer.py"), *shape], env)

    MB = 1e6
    full, tiled, floor = ours["full"], ours["tiled"], ours["floor_seconds"]
    print(f"loss: n {a.n}, H {a.hidden}, V {a.vocab}, chunk {a.chunk}, {a.threads} thread(s), "
          f"CE + KL (alpha {a.kl_weight}), median of {a.reps}")
    print(f"  {'implementation':44s} {'time s':>8s} {'x floor':>8s} {'cpu x floor':>12s} "
          f"{'workspace MB':>13s} {'RSS growth MB':>14s}")

    def row(name, figs, side):
        m = figs[side] if side else None
        t = m["seconds_median"] if m else figs["floor_seconds"]
        c = m["cpu_seconds_median"] if m else figs["floor_cpu_seconds"]
        mem = f"{m['workspace_bytes'] / MB:13.1f} {m['workspace_rss_bytes'] / MB:14.1f}" if m \
            else f"{'-':>13s} {'-':>14s}"
        print(f"  {name:44s} {t:8.3f} {t / figs['floor_seconds']:8.2f} "
              f"{c / figs['floor_cpu_seconds']:12.2f} {mem}")
    for label, figs in (("before: ", before), ("", ours)) if before else (("", ours),):
        row(label + "3 logit-sized products (floor)", figs, None)
        row(label + "ddtree, vocab_tile 0", figs, "full")
        row(label + "ddtree, vocab_tile %d" % a.tile, figs, "tiled")
    if torch:
        print(f"  {'PyTorch %s, chunked (seed approach)' % torch['torch_version']:44s} {torch['seconds_median']:8.3f} "
              f"{torch['seconds_median'] / floor:8.2f} {'-':>12s} {torch['workspace_analytic_bytes'] / MB:13.1f} "
              f"{torch['workspace_rss_bytes'] / MB:14.1f}")
        print("  (PyTorch's workspace column counts the chunk x V tensors it keeps alive at once)")
        print(f"  losses: ddtree {full['loss']:.6f}, PyTorch {torch['loss']:.6f} "
              "(different random inputs of the same distribution; equality is tests/oracle/loss_torch_check.py's job)")
    else:
        print(f"  PyTorch: not run ({why.strip()})")

    if before:
        print(f"  after / before: vocab_tile 0 {full['seconds_median'] / before['full']['seconds_median']:.2f} x "
              f"(cpu {full['cpu_seconds_median'] / before['full']['cpu_seconds_median']:.2f} x), "
              f"vocab_tile {a.tile} {tiled['seconds_median'] / before['tiled']['seconds_median']:.2f} x "
              f"(cpu {tiled['cpu_seconds_median'] / before['tiled']['cpu_seconds_median']:.2f} x)")

    def goal(text, ok):
        print(f"  [{'met ' if ok else 'MISS'}] {text}")
    print("goals:")
    if torch:
        goal(f"time <= 0.7 x PyTorch: {full['seconds_median'] / torch['seconds_median']:.2f} x",
             full["seconds_median"] <= 0.7 * torch["seconds_median"])
        goal(f"workspace <= 0.3 x PyTorch's (RSS growth, same measure both): "
             f"{full['workspace_rss_bytes'] / max(torch['workspace_rss_bytes'], 1):.2f} x",
             full["workspace_rss_bytes"] <= 0.3 * torch["workspace_rss_bytes"])
    goal(f"time <= 1.3 x the floor: {full['seconds_median'] / floor:.2f} x "
         f"(cpu {full['cpu_seconds_median'] / ours['floor_cpu_seconds']:.2f} x)",
         full["seconds_median"] <= 1.3 * floor)
    goal(f"tiled workspace <= 48 MB: {tiled['workspace_bytes'] / MB:.1f} MB", tiled["workspace_bytes"] <= 48e6)
    goal(f"tiled time <= 2 x materialised: {tiled['seconds_median'] / full['seconds_median']:.2f} x "
         f"(cpu {tiled['cpu_seconds_median'] / full['cpu_seconds_median']:.2f} x)",
         tiled["seconds_median"] <= 2 * full["seconds_median"])
    if a.seed_arithmetic:
        done = subprocess.run([a.bin, "--n", "1", "--hidden", "1", "--vocab", "2", "--chunk", "1",
                               "--tile", "1", "--reps", "1", "--seed-arithmetic"],
                              env=env, capture_output=True, text=True, check=True)
        print(done.stdout[done.stdout.index("\nThe seed"):].rstrip())


if __name__ == "__main__":
    main()
