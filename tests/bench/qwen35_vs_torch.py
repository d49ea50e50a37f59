#!/usr/bin/python3
"""qwen35_vs_torch.py: the qwen3_5 target's CPU prefill and decode step, ddtree (bench_qwen35)
beside PyTorch float32 (qwen35_torch_peer.py), same shape, for each thread count, one
invocation (each side in its own process).

    qwen35_vs_torch.py --bin BUILD/bin/bench_qwen35 [--threads 1,2] [--tokens 2048] [--reps 3]
                       [--decode-steps 16]

Shape: H 1024, 8 layers (every 4th full attention), nh 8 / nkv 2 / hd 128, DeltaNet nk 4 /
nv 8 / dk 128 / dv 128, K 4, I 3072, V 32000 (bench_qwen35's defaults). Prints tokens/s,
decode ms, the ratios against the goals (>= 2x PyTorch on both) and ddtree's prefill shares
(gated_delta, matmul, attention). A figure, never a test.
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
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--decode-steps", type=int, default=16)
    a = ap.parse_args()
    args = ["--tokens", str(a.tokens), "--reps", str(a.reps), "--decode-steps", str(a.decode_steps)]
    rows = []
    for n in [int(x) for x in a.threads.split(",")]:
        env = dict(os.environ, OPENBLAS_NUM_THREADS=str(n), OMP_NUM_THREADS=str(n))
        ours, _ = run_json("qwen35_vs_torch", [a.bin, *args, "--threads", str(n), "--json"], env)
        torch, _ = run_json("qwen35_vs_torch", [sys.executable, os.path.join(HERE, "qwen35_torch_peer.py"), *args, "--threads", str(n)], env)
        rows.append((n, ours, torch))
    print(f"qwen3_5 CPU prefill of {a.tokens} tokens: H 1024, 8 layers (3, 7 full), nh 8 / nkv 2 / hd 128, "
          f"DeltaNet 4 / 8 heads of 128, I 3072; prefill median of {a.reps}, decode median of {a.decode_steps} "
          f"steps after it (no logits)")
    tv = next((t["torch_version"] for _, _, t in rows if t), None)
    print(f"  {'thr':>3s} {'ddtree tok/s':>12s} {'torch tok/s':>11s} {'ratio':>6s}  {'ddtree dec ms':>13s} "
          f"{'torch dec ms':>12s} {'ratio':>6s}  {'delta':>6s} {'matmul':>6s} {'attn':>5s} {'rest':>5s}")
    for n, o, t in rows:
        rest = 1 - o["delta_share"] - o["matmul_share"] - o["attention_share"]
        shares = (f"{100 * o['delta_share']:5.1f}% {100 * o['matmul_share']:5.1f}% "
                  f"{100 * o['attention_share']:4.1f}% {100 * rest:4.1f}%")
        if t:
            print(f"  {n:3d} {o['tokens_per_s']:12.1f} {t['tokens_per_s']:11.1f} "
                  f"{o['tokens_per_s'] / t['tokens_per_s']:5.2f}x  {o['decode_ms']:13.2f} {t['decode_ms']:12.2f} "
                  f"{t['decode_ms'] / o['decode_ms']:5.2f}x  {shares}")
        else:
            print(f"  {n:3d} {o['tokens_per_s']:12.1f} {'-':>11s} {'-':>6s}  {o['decode_ms']:13.2f} {'-':>12s} "
                  f"{'-':>6s}  {shares}")
    if tv:
        print(f"  PyTorch {tv} float32 ({'SDPA' if rows[0][2]['sdpa'] else 'masked softmax'} attention, "
              f"chunked DeltaNet of chunk 64)")
        for n, o, t in rows:
            if t:
                p, d = o["tokens_per_s"] / t["tokens_per_s"], t["decode_ms"] / o["decode_ms"]
                print(f"  [{'met ' if p >= 2 else 'MISS'}] {n} thread(s): prefill >= 2 x PyTorch: {p:.2f} x;  "
                      f"[{'met ' if d >= 2 else 'MISS'}] decode >= 2 x PyTorch: {d:.2f} x")
    else:
        print("  PyTorch: not run (torch missing)")


if __name__ == "__main__":
    main()
