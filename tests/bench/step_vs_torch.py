#!/usr/bin/python3
"""step_vs_torch.py: one drafter training step, ddtree's CPU engine beside PyTorch float32
autograd, same shapes and thread count, one invocation (each side in its own process).

    step_vs_torch.py --bin BUILD/bin/bench_step [--threads 1] [--reps 3] [shape options]

Shape options are bench_step's (default: H 256, 2 layers, 8 heads of 32, I 768, block 16,
64 anchors, S 512, V 8192). Prints positions per second of each and the ratio against the
goal (>= 1.5x PyTorch). A figure, never a test.
"""
import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from bench_run import run_json  # noqa: E402



def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bin", required=True)
    shape = {}
    for name, default in (("hidden", 256), ("layers", 2), ("heads", 8), ("kv-heads", 8),
                          ("head-dim", 32), ("intermediate", 768), ("block", 16),
                          ("anchors", 64), ("seq", 512), ("vocab", 8192), ("nseq", 1),
                          ("taps", 2), ("window", 0), ("threads", 1), ("reps", 3)):
        ap.add_argument("--" + name, type=int, default=default)
        shape[name] = default
    a = vars(ap.parse_args())
    args = [x for name in shape for x in ("--" + name, str(a[name.replace("-", "_")]))]
    env = dict(os.environ, OPENBLAS_NUM_THREADS=str(a["threads"]), OMP_NUM_THREADS=str(a["threads"]))
    ours, _ = run_json("step_vs_torch", [a["bin"], *args, "--json"], env)
    torch, _ = run_json("step_vs_torch", [sys.executable, os.path.join(HERE, "step_torch_peer.py"), *args], env)
    print(f"drafter step: H {a['hidden']}, {a['layers']} layers, {a['heads']} heads of {a['head_dim']} "
          f"({a['kv_heads']} kv), I {a['intermediate']}, block {a['block']}, {a['anchors']} anchors, "
          f"S {a['seq']}, V {a['vocab']}, {a['nseq']} sequence(s), {a['threads']} thread(s), median of {a['reps']}")
    print(f"  {'implementation':40s} {'step s':>8s} {'positions/s':>12s}")
    print(f"  {'ddtree (CPU engine)':40s} {ours['seconds_median']:8.3f} {ours['positions_per_s']:12.0f}"
          f"   peak workspace {ours['peak_workspace_bytes'] / 1e6:.1f} MB")
    if torch:
        print(f"  {'PyTorch ' + torch['torch_version'] + ' float32 autograd':40s} "
              f"{torch['seconds_median']:8.3f} {torch['positions_per_s']:12.0f}")
        ratio = ours["positions_per_s"] / torch["positions_per_s"]
        print(f"  [{'met ' if ratio >= 1.5 else 'MISS'}] throughput >= 1.5 x PyTorch: {ratio:.2f} x")
    else:
        print("  PyTorch: not run (torch missing)")


if __name__ == "__main__":
    main()
