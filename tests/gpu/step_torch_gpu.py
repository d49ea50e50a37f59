#!/usr/bin/python3
"""step_torch_gpu.py: the seed's PyTorch approach to one drafter training step on the GPU, beside bench_step_cuda.

    python3 tests/gpu/step_torch_gpu.py [--hidden 5120 --layers 5 --heads 32 --kv-heads 8 --head-dim 128
        --intermediate 17408 --window 2048 --block 24 --anchors 1024 --seq 4096 --vocab 248320 --taps 5]
        [--lm-chunk 4096] [--kl-chunk 2048] [--reps 2] [--dtype bf16|fp32] [--device cuda|cpu] [--seed 0]

The step of tests/bench/step_torch_peer.py (SPEC.md section 2; 4 sliding layers then 1 full when
--window > 0; labels the teacher's argmax, weights exp(-(k-1)/10), loss
sum_i w_i (0.85 CE_i + 0.15 KL_i) / sum w) at bench_step_cuda's shape, one sequence, the way the
seed's user writes it: parameters and activations in --dtype (bf16, the seed's; RMSNorm statistics
in fp32 as Hugging Face's), attention by F.scaled_dot_product_attention with one boolean
(A*B, S + A*B) mask per layer kind built once (a mask rules out flash: the memory-efficient kernel
runs; K/V are repeat_interleave'd to the query heads, since enable_gqa with a mask falls back to
the math kernel and its dense (heads, AB, SAB) scores). Torch without SDPA (< 2.0: Debian's CPU
build) gets the same mask in a plain softmax. The loss is the seed's chunking inside the real
graph: hs detached, per --lm-chunk rows the student and (no grad) teacher logits, CE and KL per
--kl-chunk rows in fp32, one backward per lm chunk into d hs; then hs.backward(d hs) through the
drafter. embed and lm_head W (V, H) are frozen. torch.optim.AdamW (lr 1e-4, betas 0.9/0.95, weight
decay 0.01; fused on CUDA where the torch has it). Inputs drawn on the device: matrices
0.02 N(0, 1), gains 1, embed N(0, 1), W N(0, 1)/sqrt(H), features and teacher N(0, 1), ids uniform.
TF32 is off.

Time: one warm-up step, then --reps steps (zero_grad outside; forward, loss, backward, the
gradient clipped at norm 1, AdamW inside), each between torch.cuda.synchronize() calls; the median. Memory: the absolute peak of
torch.cuda.max_memory_allocated() over the timed steps (weights and optimizer state included, as
bench_step_cuda's peak_bytes), and of the reserve.

Output: ONE JSON line on stdout; out of memory is a figure, not a failure ("failed", exit 0).
Exits 77 when torch cannot be imported or (--device cuda) sees no CUDA GPU. Not a test.
"""

import argparse
import json
import math
import statistics
import sys
import time

from loss_torch_gpu import chunked_loss   # the seed's loss, as loss_torch_gpu.py times it alone

try:
    import torch
    import torch.nn.functional as F
except ImportError as exc:   # reported in main()
    torch, TORCH_ERROR = None, exc

HAS_SDPA = torch is not None and hasattr(F, "scaled_dot_product_attention")


def rms_norm(x, g, eps=1e-6):   # Hugging Face's Qwen3 RMSNorm: the statistics in fp32
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * g


def rope_tables(pos, d, dtype, theta=1e7):   # bench_step_cuda's rope_theta
    inv = theta ** (-torch.arange(0, d, 2, dtype=torch.float64, device=pos.device) / d)
    ang = pos.to(torch.float64)[:, None] * inv[None, :]                  # (n, d/2)
    return ang.cos().to(dtype)[:, None, :], ang.sin().to(dtype)[:, None, :]


def rope(x, cos, sin):                                                    # x (n, heads, d)
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def visibility_mask(S, anchors, B, window):
    """(A*B, S + A*B) bool, True where visible: step_torch_peer.visibility_bias's rule."""
    dev, A = anchors.device, anchors.shape[0]
    o = torch.arange(B, device=dev)
    a = anchors[:, None, None]                                            # (A, 1, 1)
    t = torch.arange(S, device=dev)[None, None, :]                        # (1, 1, S)
    ctx = t < a
    if window:
        ctx = ctx & (t >= a + o[None, :, None] - (window - 1))
    ctx = ctx.expand(A, B, S).reshape(A * B, S)                           # (AB, S)
    i = torch.arange(A * B, device=dev)
    blk = (i // B)[:, None] == (i // B)[None, :]                          # (AB, AB) own block
    if window:
        blk = blk & ((i % B)[None, :] <= (i % B)[:, None])
    return torch.cat([ctx, blk], dim=1)                                   # (AB, S + AB)


def attend(q, k, v, mask):   # q (AB, nh, d), k v (SAB, nkv, d), mask (AB, SAB) -> (AB, nh*d)
    group = q.shape[1] // k.shape[1]
    if group > 1:
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)   # (SAB, nh, d)
    q, k, v = (x.transpose(0, 1).unsqueeze(0) for x in (q, k, v))        # (1, nh, L, d)
    if HAS_SDPA:
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    else:
        s = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(q.shape[-1])   # (1, nh, AB, SAB)
        p = torch.softmax(s.float().masked_fill(~mask, float("-inf")), dim=-1).to(q.dtype)
        out = torch.matmul(p, v)
    return out[0].transpose(0, 1).reshape(q.shape[2], -1)

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    for name, default in (("hidden", 5120), ("layers", 5), ("heads", 32), ("kv-heads", 8), ("head-dim", 128),
                          ("intermediate", 17408), ("window", 2048), ("block", 24), ("anchors", 1024),
                          ("seq", 4096), ("vocab", 248320), ("taps", 5), ("reps", 2), ("lm-chunk", 4096),
                          ("kl-chunk", 2048), ("seed", 0)):
        ap.add_argument("--" + name, type=int, default=default)
    ap.add_argument("--dtype", choices=("bf16", "fp32"), default="bf16")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    a = ap.parse_args()
    for name in ("hidden", "layers", "heads", "kv_heads", "head_dim", "intermediate", "block", "anchors",
                 "seq", "vocab", "taps", "reps", "lm_chunk", "kl_chunk"):
        if getattr(a, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1")
    if a.heads % a.kv_heads:
        ap.error("--heads must be a multiple of --kv-heads")
    if a.head_dim % 2:
        ap.error("--head-dim must be even (RoPE rotates pairs)")
    if a.window < 0:
        ap.error("--window must be >= 0 (0: every layer full)")
    if a.block < 2:
        ap.error("--block must be >= 2 (slot 0 is the anchor and carries no loss)")
    if a.anchors > a.seq:
        ap.error("--anchors must be in [1, --seq]")
    if a.vocab < 2:
        ap.error("--vocab must be >= 2 (V-1 is the mask token)")
    if torch is None:
        print(json.dumps({"impl": "torch-gpu-step", "skipped": f"torch not available ({TORCH_ERROR})"}))
        return 77
    if a.device == "cuda" and not torch.cuda.is_available():
        print(json.dumps({"impl": "torch-gpu-step", "skipped": "torch sees no CUDA GPU",
                          "torch_version": torch.__version__}))
        return 77

    H, S, A, B, V, L = a.hidden, a.seq, a.anchors, a.block, a.vocab, a.layers
    nh, nkv, d, I, AB = a.heads, a.kv_heads, a.head_dim, a.intermediate, a.anchors * a.block
    cuda = a.device == "cuda"
    dev = torch.device("cuda", 0) if cuda else torch.device("cpu")
    shape = {"impl": "torch-gpu-step", "dtype": a.dtype,
             "device": torch.cuda.get_device_name(dev) if cuda else "cpu",
             "hidden": H, "layers": L, "heads": nh, "kv_heads": nkv, "head_dim": d, "intermediate": I,
             "window": a.window, "block": B, "anchors": A, "seq": S, "vocab": V, "taps": a.taps,
             "lm_chunk": a.lm_chunk, "kl_chunk": a.kl_chunk, "reps": a.reps,
             "attention": "sdpa" if HAS_SDPA else "softmax (torch without SDPA)",
             "torch_version": torch.__version__, "seed": a.seed}
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dtype = torch.bfloat16 if a.dtype == "bf16" else torch.float32
    oom = tuple(e for e in (getattr(torch, "OutOfMemoryError", None),
                            getattr(torch.cuda, "OutOfMemoryError", None)) if e is not None)
    try:
        g = torch.Generator(device=dev)
        g.manual_seed(a.seed)

        def randn(*size, scale=1.0):
            return (torch.randn(*size, device=dev, generator=g) * scale).to(dtype)

        def matrix(rows, cols):
            return randn(rows, cols, scale=0.02).requires_grad_()

        def gain(n):
            return torch.ones(n, device=dev, dtype=dtype, requires_grad=True)

        P = {"fc": matrix(H, a.taps * H), "hidden_norm": gain(H), "norm": gain(H)}
        layers = [{"in": gain(H), "post": gain(H), "q": matrix(nh * d, H), "k": matrix(nkv * d, H),
                   "v": matrix(nkv * d, H), "o": matrix(H, nh * d), "qn": gain(d), "kn": gain(d),
                   "g": matrix(I, H), "u": matrix(I, H), "dn": matrix(H, I)} for _ in range(L)]
        params = list(P.values()) + [x for Lw in layers for x in Lw.values()]
        embed = randn(V, H)                                               # (V, H) frozen
        W = randn(V, H, scale=1.0 / math.sqrt(H))                         # (V, H) frozen lm_head
        feats = randn(S, a.taps * H)                                      # (S, taps*H)
        teacher = randn(S, H)                                             # (S, H)
        ids = torch.randint(0, V, (S,), device=dev, generator=g)          # (S,)
        anchors = torch.arange(A, device=dev) * (S - 1) // A              # (A,)
        # built once, outside the timing: masks, RoPE tables, block tokens, rows, weights
        kinds = ["sliding" if a.window and l + 1 < L else "full" for l in range(L)]
        masks = {k: visibility_mask(S, anchors, B, a.window if k == "sliding" else 0) for k in set(kinds)}
        pos_blk = (anchors[:, None] + torch.arange(B, device=dev)[None, :]).reshape(-1)   # (AB,)
        cos_q, sin_q = rope_tables(pos_blk, d, dtype)
        cos_k, sin_k = rope_tables(torch.cat([torch.arange(S, device=dev), pos_blk]), d, dtype)
        tokens = torch.full((A, B), V - 1, device=dev)
        tokens[:, 0] = ids[anchors]
        tokens = tokens.reshape(-1)                                       # (AB,)
        k_slot = torch.arange(B, device=dev).repeat(A)                    # (AB,)
        target = anchors.repeat_interleave(B) + k_slot
        valid = (k_slot >= 1) & (target < S)
        w = torch.where(valid, torch.exp(-(k_slot - 1).float() / 10.0), torch.zeros((), device=dev))   # (AB,)
        ht = teacher[(target - 1).clamp(0, S - 1)]                        # (AB, H)

        def drafter():
            C = rms_norm(F.linear(feats, P["fc"]), P["hidden_norm"])      # (S, H)
            h = embed[tokens]                                             # (AB, H)
            for l, Lw in enumerate(layers):
                u = rms_norm(h, Lw["in"])                                 # (AB, H)
                q = rope(rms_norm(F.linear(u, Lw["q"]).view(AB, nh, d), Lw["qn"]), cos_q, sin_q)   # (AB, nh, d)
                cu = torch.cat([C, u])                                    # (S+AB, H)
                k = rope(rms_norm(F.linear(cu, Lw["k"]).view(-1, nkv, d), Lw["kn"]), cos_k, sin_k)
                v = F.linear(cu, Lw["v"]).view(-1, nkv, d)                # (S+AB, nkv, d)
                h = h + F.linear(attend(q, k, v, masks[kinds[l]]), Lw["o"])
                m = rms_norm(h, Lw["post"])
                h = h + F.linear(F.silu(F.linear(m, Lw["g"])) * F.linear(m, Lw["u"]), Lw["dn"])
            return rms_norm(h, P["norm"])                                 # (AB, H)

        try:
            opt = torch.optim.AdamW(params, lr=1e-4, betas=(0.9, 0.95), weight_decay=0.01, fused=cuda)
        except (TypeError, RuntimeError):
            opt = torch.optim.AdamW(params, lr=1e-4, betas=(0.9, 0.95), weight_decay=0.01)

        dhs = torch.empty(A * B, H, device=dev, dtype=dtype)                   # (AB, H) d loss / d hs

        def step():
            hs = drafter()
            loss = chunked_loss(hs.detach(), ht, W, w, a.lm_chunk, a.kl_chunk, 0.15, dhs)
            hs.backward(dhs)
            torch.nn.utils.clip_grad_norm_(params, 1.0)   # bench_step_cuda clips at 1.0 too
            opt.step()
            return loss

        def sync():
            if cuda:
                torch.cuda.synchronize(dev)

        seconds, loss = [], None
        for rep in range(a.reps + 1):   # rep 0: the warm-up
            opt.zero_grad(set_to_none=True)
            sync()
            if rep == 1 and cuda:
                torch.cuda.reset_peak_memory_stats(dev)
            t0 = time.perf_counter()
            loss = float(step())
            sync()
            if rep:
                seconds.append(time.perf_counter() - t0)
    except oom as exc:
        print(json.dumps({**shape, "failed": "out of memory: " + str(exc).split("\n")[0]}))
        return 0
    med = statistics.median(seconds)
    print(json.dumps({**shape, "step_s": med, "step_s_all": seconds, "positions": AB,
                      "positions_per_s": AB / med,
                      "peak_bytes": torch.cuda.max_memory_allocated(dev) if cuda else None,
                      "peak_reserved_bytes": torch.cuda.max_memory_reserved(dev) if cuda else None,
                      "loss": loss}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
