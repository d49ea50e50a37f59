#!/usr/bin/python3
"""loss_torch_peer.py: the PyTorch peer of the loss benchmark (SPEC.md section 1, CPU, float32).

    /usr/bin/python3 tests/bench/loss_torch_peer.py --n 4096 --hidden 256 --vocab 32000 \
        --chunk 512 --threads 4 --reps 5 [--kl-weight 0.15] [--kl-temperature 1] \
        [--cap-weight 0] [--cap-temperature 1] [--seed 0]

It times "the strongest simple PyTorch approach" of the seed documents: the lm_head, the CE and
the KL chunked along positions, with one backward per chunk so that only one chunk's graph (and
its chunk x V tensors) is alive at a time; the gradient of the student hidden states accumulates
in hs.grad. Labels are the teacher's argmax (ce_target = "teacher", labels = NULL in SPEC.md),
weights are all 1, so the loss is sum_i l_i / n exactly as libddk computes it.

Output: ONE JSON line on stdout (the bench driver compares it with libddk's figures):
    impl, n, hidden, vocab, chunk, threads, seconds_median, seconds_all, workspace_rss_bytes,
    workspace_analytic_bytes, loss, torch_version (+ the loss parameters, reps and seed).
`loss` is the value of the last rep, so the driver can check both sides computed the same thing.
Inputs, in this order from torch.manual_seed(seed), all float32: hs = randn(n, H),
ht = randn(n, H), W = randn(V, H) * 2/sqrt(H) (logits with std ~2).

Memory: workspace_rss_bytes is the growth of the process's peak RSS (getrusage ru_maxrss)
from just after the inputs and hs.grad exist and are touched to the end of the reps: what the
loss costs the machine, allocator slack included. It is only meaningful when the workspace is
well above ~20 MB (allocator arenas, BLAS buffers and the peak of `import torch` are of that
order); tensors of 32 MB and more are mmapped by glibc one by one, and freed at once, so there
RSS follows the live set closely. workspace_analytic_bytes is the peak count of chunk x V
float32 tensors the approach keeps alive at once, times C x V x 4 (analytic_logit_tensors()).
Threads: --threads sets torch's pool and, through the environment before torch is imported,
OpenBLAS's (torch's matrix products here), which torch.set_num_threads() does not reach.

Not a test: it never fails on timing. Exits 77 when torch cannot be imported.
Dimension legend: n positions, H hidden size, V vocabulary, C chunk.
"""

import argparse
import json
import math
import os
import resource
import statistics
import sys
import time

torch = F = None   # imported in main(), after the thread count is in the environment


# ------------------------------------------------------------------------------------------
# The approach, and its analytic memory

def analytic_logit_tensors(kl_weight, kl_temperature, cap_weight):
    """Peak count of C x V float32 tensors alive at once in loss_chunk(), forward or backward.

    alpha = 0, no CAP: 3. Backward: log_ps (saved by log_softmax), d loss/d log_ps (from
    nll_loss), d loss/d logits_s (from log_softmax's backward). The forward holds only 2
    (logits_t is dropped after its argmax, before logits_s exists).
    alpha > 0, T = 1: 6. Forward, inside kl_div(log_target=True) = sum exp(log_pt) *
    (log_pt - log_ps): log_pt, logits_s, log_ps, exp(log_pt), log_pt - log_ps, their product.
    alpha > 0, T != 1: 7. The same plus CE's own log_softmax(logits_s) (cross_entropy), as
    log_ps is then log_softmax(logits_s / T) and cannot be shared.
    CAP: +3 without KL, +2 with it. Backward of -sum exp(log_pc) log_pc: log_pc and exp(log_pc)
    (saved), the gradients of the product's two factors and of the exp, while log_ps (and
    log_pt) are still saved; with KL, the forward peak inside kl_div is the larger one otherwise.
    Checked against workspace_rss_bytes at C x V x 4 = 41 MB per tensor (each one its own mmap,
    so RSS follows the live set): 3.16, 6.20, 7.20, 6.20 (CAP, no KL), 8.22 (CAP, KL),
    9.21 (CAP, KL, T = 2) tensors; the 0.2 is thread stacks and BLAS buffers.
    """
    if kl_weight > 0:
        count = 6 if kl_temperature == 1.0 else 7
        count += 2 if cap_weight > 0 else 0
    else:
        count = 3 + (3 if cap_weight > 0 else 0)
    return count


def loss_chunk(hs_c, ht_c, W, n, alpha, T, lam, Tc):
    """Forward and backward of one chunk; returns its share of the loss (a float)."""
    with torch.no_grad():                           # W and the teacher are frozen
        logits_t = F.linear(ht_c, W)                            # (C, V)
        labels = logits_t.argmax(dim=1)                         # (C) ce_target = "teacher"
        log_pt = F.log_softmax(logits_t.div_(T), dim=1) if alpha > 0 else None
        del logits_t
    logits_s = F.linear(hs_c, W)                                # (C, V): the lm_head
    if T == 1.0 or alpha == 0:
        log_ps = F.log_softmax(logits_s, dim=1)                 # (C, V), shared by CE and KL
        ce = F.nll_loss(log_ps, labels, reduction="sum")        # == cross_entropy(logits_s)
    else:
        ce = F.cross_entropy(logits_s, labels, reduction="sum")
        log_ps = F.log_softmax(logits_s / T, dim=1)             # (C, V)
    loss = (1.0 - alpha) * ce
    if alpha > 0:
        loss = loss + alpha * T * T * F.kl_div(log_ps, log_pt, log_target=True, reduction="sum")
    if lam > 0:
        log_pc = F.log_softmax(logits_s / Tc, dim=1)            # (C, V)
        confident = (logits_s.detach().argmax(dim=1) == labels).to(logits_s.dtype)   # (C)
        entropy = -(log_pc.exp() * log_pc).sum(dim=1)           # (C)
        loss = loss + lam * (confident * entropy).sum()
    del logits_s, log_ps
    loss = loss / n
    loss.backward()                                 # frees this chunk's graph
    return loss.item()


def one_rep(hs, ht, W, chunk, alpha, T, lam, Tc):
    n = hs.shape[0]
    hs.grad.zero_()      # libddk overwrites its gradient; here it accumulates over the chunks
    total = 0.0
    for a in range(0, n, chunk):
        total += loss_chunk(hs[a:a + chunk], ht[a:a + chunk], W, n, alpha, T, lam, Tc)
    return total


# ------------------------------------------------------------------------------------------

def max_rss_bytes():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024   # Linux: kB


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, required=True, help="positions")
    ap.add_argument("--hidden", type=int, required=True, help="H")
    ap.add_argument("--vocab", type=int, required=True, help="V")
    ap.add_argument("--chunk", type=int, required=True, help="positions per chunk")
    ap.add_argument("--threads", type=int, required=True, help="torch.set_num_threads")
    ap.add_argument("--reps", type=int, required=True, help="timed repetitions (after 1 warm-up)")
    ap.add_argument("--kl-weight", type=float, default=0.15)
    ap.add_argument("--kl-temperature", type=float, default=1.0)
    ap.add_argument("--cap-weight", type=float, default=0.0)
    ap.add_argument("--cap-temperature", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    if min(a.n, a.hidden, a.vocab, a.chunk, a.threads, a.reps) < 1 or not 0 <= a.kl_weight <= 1 \
            or a.kl_temperature <= 0 or a.cap_weight < 0 or a.cap_temperature <= 0:
        ap.error("sizes, chunk, threads and reps must be >= 1, kl-weight in [0, 1], "
                 "temperatures > 0, cap-weight >= 0")

    # OpenBLAS (torch's matrix products here) sizes its own thread pool from the environment
    # when it loads, and torch.set_num_threads() does not reach it: set both before the import.
    os.environ["OPENBLAS_NUM_THREADS"] = str(a.threads)
    os.environ["OMP_NUM_THREADS"] = str(a.threads)
    global torch, F
    try:
        import torch
        import torch.nn.functional as F
    except ImportError as exc:
        print(f"skipped: torch not available ({exc})", file=sys.stderr)
        return 77
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    # In place throughout, so that no temporary raises the peak RSS before it is read.
    hs = torch.randn(a.n, a.hidden, dtype=torch.float32)                    # (n, H)
    ht = torch.randn(a.n, a.hidden, dtype=torch.float32)                    # (n, H)
    W = torch.randn(a.vocab, a.hidden, dtype=torch.float32)                 # (V, H)
    W.mul_(2.0 / math.sqrt(a.hidden))
    hs.requires_grad_(True)
    # One tiny forward/backward (8 positions) allocates and touches hs.grad and starts what the
    # libraries set up once (thread pools, the BLAS's packing buffers, the autograd engine), so
    # that the RSS growth below is the loss's workspace, not one-time start-up.
    (F.log_softmax(F.linear(hs[:8], W), dim=1)[:, 0].sum() / a.n).backward()
    hs.grad.zero_()                                                         # (n, H)
    rss_before = max_rss_bytes()

    args = (a.chunk, a.kl_weight, a.kl_temperature, a.cap_weight, a.cap_temperature)
    loss = one_rep(hs, ht, W, *args)                                        # warm-up
    seconds = []
    for _ in range(a.reps):
        t0 = time.perf_counter()
        loss = one_rep(hs, ht, W, *args)
        seconds.append(time.perf_counter() - t0)
    rss_after = max_rss_bytes()

    c = min(a.chunk, a.n)
    analytic = analytic_logit_tensors(a.kl_weight, a.kl_temperature, a.cap_weight) * c * a.vocab * 4
    print(json.dumps({
        "impl": "torch", "n": a.n, "hidden": a.hidden, "vocab": a.vocab, "chunk": a.chunk,
        "threads": a.threads, "seconds_median": statistics.median(seconds),
        "seconds_all": seconds, "workspace_rss_bytes": rss_after - rss_before,
        "workspace_analytic_bytes": analytic, "loss": loss,
        "torch_version": torch.__version__,
        "kl_weight": a.kl_weight, "kl_temperature": a.kl_temperature,
        "cap_weight": a.cap_weight, "cap_temperature": a.cap_temperature,
        "reps": a.reps, "seed": a.seed,
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
