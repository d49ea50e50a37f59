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
loss costs the machine, allocator slack included. workspace_analytic_bytes is the count of
chunk x V float32 tensors the approach keeps alive at once (see ANALYTIC_LOGIT_TENSORS).

Not a test: it never fails on timing. Exits 77 when torch cannot be imported.
Dimension legend: n positions, H hidden size, V vocabulary, C chunk.
"""

import argparse
import json
import math
import resource
import statistics
import sys
import time

try:
    import torch
    import torch.nn.functional as F
except ImportError as exc:
    print(f"skipped: torch not available ({exc})", file=sys.stderr)
    sys.exit(77)


# ------------------------------------------------------------------------------------------
# The approach, and its analytic memory

def analytic_logit_tensors(kl_weight, kl_temperature, cap_weight):
    """Peak count of C x V float32 tensors alive at once in loss_chunk() (forward or backward).

    Teacher, under no_grad: logits_t (1), log_pt = log_softmax(logits_t / T) (+1; logits_t
    is then dropped, the division is in place). Student, forward: logits_s (1),
    log_ps = log_softmax(logits_s [/ T]) (+1, saved by autograd); with T = 1 CE reuses log_ps
    through nll_loss (cross_entropy is exactly log_softmax + nll_loss); with T != 1 CE has its
    own log_softmax(logits_s) (+1) and logits_s / T (+1, transient). kl_div(log_target=True)
    forms exp(log_pt) and log_pt - log_ps before their product (+3 transient). CAP adds
    log_softmax(logits_s / Tc) (+1 saved, +1 transient division) and its exp (+1 saved by the
    product). Backward: the gradients of the terms w.r.t. log_ps (1 each) and their sum, then
    d/d logits_s (1), while the saved tensors still live.
    The forward peak dominates: at T = 1 without CAP, log_pt + logits_s + log_ps + 3 kl_div
    transients = 6 (5 when alpha = 0: no log_pt there but no kl_div either, so logits_t +
    logits_s + log_ps + nll's one-hot-free gradient path: 3).
    """
    if kl_weight > 0:
        count = 6 if kl_temperature == 1.0 else 8
    else:
        count = 3
    if cap_weight > 0:
        count += 3
    return count


def loss_chunk(hs_c, ht_c, W, n, alpha, T, lam, Tc):
    """Forward and backward of one chunk; returns its share of the loss (a float)."""
    with torch.no_grad():                           # W and the teacher are frozen
        logits_t = ht_c @ W.T                                   # (C, V)
        labels = logits_t.argmax(dim=1)                         # (C) ce_target = "teacher"
        log_pt = F.log_softmax(logits_t.div_(T), dim=1) if alpha > 0 else None
        del logits_t
    logits_s = hs_c @ W.T                                       # (C, V)
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

    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    # In place throughout, so that no temporary raises the peak RSS before it is read.
    hs = torch.randn(a.n, a.hidden, dtype=torch.float32)                    # (n, H)
    ht = torch.randn(a.n, a.hidden, dtype=torch.float32)                    # (n, H)
    W = torch.randn(a.vocab, a.hidden, dtype=torch.float32)                 # (V, H)
    W.mul_(2.0 / math.sqrt(a.hidden))
    hs.requires_grad_(True)
    hs.grad = torch.zeros_like(hs)                                          # (n, H), touched
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
