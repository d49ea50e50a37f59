#!/usr/bin/python3
"""loss_torch_gpu.py: the seed's PyTorch approach to the loss on the GPU, beside bench_loss_cuda.

    python3 tests/gpu/loss_torch_gpu.py [--n 24576] [--hidden 5120] [--vocab 248320]
        [--lm-chunk 4096] [--kl-chunk 2048] [--kl-weight 0.15] [--reps 2] [--dtype fp32|bf16]

The approach of the seed documents: the lm_head chunked along positions (--lm-chunk rows of
student and teacher logits at a time), the KL and the CE per sub-chunk of --kl-chunk rows of
those logits, and one backward per lm_head chunk, so that one chunk's logits and one
sub-chunk's intermediates are alive at a time. W and the teacher are frozen; the gradient is
d loss / d hs only, so the products are 3 logit-sized ones (student and teacher logits,
d hs = g W), the count bench_loss_cuda gives its materialised mode. Labels are the teacher's
argmax, weights all 1, temperature 1: loss = sum_i ((1 - a) CE_i + a KL_i) / n (SPEC.md
section 1, as libddk computes it).

Inputs of the shape bench_loss_cuda uses, drawn on the GPU: hs, ht ~ N(0, 1) (n, H),
W ~ N(0, 1) * 2 / sqrt(H) (V, H). --dtype fp32 (the default: what libddk computes; TF32 is
turned off, so the products are true fp32 like cuBLAS's sgemm in libddk) or bf16 (inputs and
products in bf16, the softmax statistics in fp32: the seed's precision).

Time: torch.cuda.synchronize() and time.perf_counter() around each repetition (as the C side
does), one warm-up, then the median and minimum. Memory: torch.cuda.max_memory_allocated()
during the reps minus the allocated bytes before them (tensors only, not the caching
allocator's reserve), and the reserve's peak likewise.

Output: ONE JSON line on stdout. Exits 77 when torch cannot be imported or sees no CUDA GPU.
Not a test: it never fails on timing.
"""

import argparse
import json
import statistics
import sys
import time


def chunked_loss(hs, ht, W, w, lm_chunk, kl_chunk, kl_weight, grad):
    """The seed's chunked CE + KL of hs (n, H) against the teacher ht (n, H) under the frozen head
    W (V, H): lm_chunk rows of student and teacher logits at a time, the softmaxes per sub-chunk of
    kl_chunk rows in fp32, one backward per lm chunk. w: (n,) weights, or None for all 1 (the
    loss is then sum_i l_i / n). d loss / d hs goes into grad (n, H); returns the loss as a
    float64 tensor. step_torch_gpu.py calls it too."""
    import torch
    import torch.nn.functional as F
    n = hs.shape[0]
    wsum = w.sum() if w is not None else n
    total = torch.zeros((), device=hs.device, dtype=torch.float64)
    for r0 in range(0, n, lm_chunk):
        r1 = min(n, r0 + lm_chunk)
        hs_c = hs[r0:r1].detach().requires_grad_(True)                    # (c, H)
        with torch.no_grad():
            zt = F.linear(ht[r0:r1], W)                                   # (c, V) teacher logits
        zs = F.linear(hs_c, W)                                            # (c, V) student logits
        zs_leaf = zs.detach().requires_grad_(True)
        for k0 in range(0, r1 - r0, kl_chunk):
            k1 = min(r1 - r0, k0 + kl_chunk)
            log_ps = F.log_softmax(zs_leaf[k0:k1].float(), dim=1)          # (k, V) fp32
            with torch.no_grad():
                log_pt = F.log_softmax(zt[k0:k1].float(), dim=1)
                labels = log_pt.argmax(dim=1)
            if w is None:
                ce = F.nll_loss(log_ps, labels, reduction="sum")
                kl = F.kl_div(log_ps, log_pt, log_target=True, reduction="sum")
                part = ((1.0 - kl_weight) * ce + kl_weight * kl) / n
            else:
                ce = F.nll_loss(log_ps, labels, reduction="none")         # (k,)
                kl = F.kl_div(log_ps, log_pt, log_target=True, reduction="none").sum(dim=1)
                part = (w[r0 + k0:r0 + k1] * ((1 - kl_weight) * ce + kl_weight * kl)).sum() / wsum
            part.backward()                                               # into zs_leaf.grad
            total += part.detach().double()
            del log_ps, log_pt, labels, ce, kl, part
        del zt
        zs.backward(zs_leaf.grad)                                         # d hs_c = g W
        grad[r0:r1] = hs_c.grad
        del zs, zs_leaf, hs_c
    return total


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=24576)
    ap.add_argument("--hidden", type=int, default=5120)
    ap.add_argument("--vocab", type=int, default=248320)
    ap.add_argument("--lm-chunk", type=int, default=4096)
    ap.add_argument("--kl-chunk", type=int, default=2048)
    ap.add_argument("--kl-weight", type=float, default=0.15)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    if min(a.n, a.hidden, a.vocab, a.lm_chunk, a.kl_chunk, a.reps) < 1 or not 0 <= a.kl_weight <= 1:
        ap.error("sizes, chunks and reps must be >= 1, kl-weight in [0, 1]")
    try:
        import torch
        import torch.nn.functional as F
    except ImportError as exc:
        print(json.dumps({"impl": "torch-gpu", "skipped": f"torch not available ({exc})"}))
        return 77
    if not torch.cuda.is_available():
        print(json.dumps({"impl": "torch-gpu", "skipped": "torch sees no CUDA GPU",
                          "torch_version": torch.__version__}))
        return 77

    dev = torch.device("cuda", 0)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dtype = torch.float32 if a.dtype == "fp32" else torch.bfloat16
    g = torch.Generator(device=dev)
    g.manual_seed(a.seed)
    n, H, V, alpha = a.n, a.hidden, a.vocab, a.kl_weight
    hs = torch.randn(n, H, device=dev, generator=g).to(dtype)                      # (n, H)
    ht = torch.randn(n, H, device=dev, generator=g).to(dtype)                      # (n, H)
    W = (torch.randn(V, H, device=dev, generator=g) * (2.0 / H ** 0.5)).to(dtype)  # (V, H)
    grad = torch.zeros(n, H, device=dev, dtype=dtype)                              # (n, H)

    def one_rep():
        return chunked_loss(hs, ht, W, None, a.lm_chunk, a.kl_chunk, alpha, grad)

    one_rep()                                                    # warm-up
    torch.cuda.synchronize(dev)
    base_alloc = torch.cuda.memory_allocated(dev)
    base_reserved = torch.cuda.memory_reserved(dev)
    torch.cuda.reset_peak_memory_stats(dev)
    seconds = []
    loss = None
    for _ in range(a.reps):
        torch.cuda.synchronize(dev)
        t0 = time.perf_counter()
        loss = one_rep()
        torch.cuda.synchronize(dev)
        seconds.append(time.perf_counter() - t0)
    peak_alloc = torch.cuda.max_memory_allocated(dev) - base_alloc
    peak_reserved = torch.cuda.max_memory_reserved(dev) - base_reserved
    med = statistics.median(seconds)
    flop = 3 * 2.0 * n * V * H
    print(json.dumps({
        "impl": "torch-gpu", "dtype": a.dtype, "tf32": False, "device": torch.cuda.get_device_name(dev),
        "n": n, "hidden": H, "vocab": V, "lm_chunk": a.lm_chunk, "kl_chunk": a.kl_chunk,
        "kl_weight": alpha, "reps": a.reps, "seconds_median": med, "seconds_min": min(seconds),
        "seconds_all": seconds, "products": 3, "tflops": flop / med / 1e12,
        "workspace_bytes": peak_alloc, "workspace_reserved_bytes": peak_reserved,
        "loss": float(loss), "torch_version": torch.__version__, "seed": a.seed,
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
