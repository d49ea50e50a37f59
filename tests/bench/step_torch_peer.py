#!/usr/bin/python3
"""step_torch_peer.py: the PyTorch peer of bench_step: one drafter training step (forward +
loss + backward) of the same shapes, float32, autograd, on the CPU. Prints one JSON line.

    step_torch_peer.py [--hidden 256 --layers 2 --heads 8 --kv-heads 8 --head-dim 32
                        --intermediate 768 --block 16 --anchors 64 --seq 512 --vocab 8192
                        --nseq 1 --taps 2 --window 0 --threads 1 --reps 3]

SPEC.md section 2 written the way a PyTorch user writes it when speed matters: visibility
masks as additive -inf biases and RoPE tables built once (outside the timing), F.linear for
every projection, batched matmuls over heads, the full-vocabulary logits for CE + KL (the
KL under the teacher's softmax), one backward. The same loss as bench_step: ce_target
"teacher", kl_weight 0.15, gamma 10, anchors spread evenly, loss mask all ones.
Exits 77 when torch is missing.
"""
import argparse
import json
import math
import statistics
import sys
import time

try:
    import torch
    import torch.nn.functional as F
except ImportError as exc:
    print(f"skipped: {exc}", file=sys.stderr)
    sys.exit(77)


def rms_norm(x, g, eps=1e-6):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * g


def rope_tables(pos, d, theta=10000.0):
    inv = theta ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    ang = pos.to(torch.float64)[:, None] * inv[None, :]                 # (n, d/2)
    return ang.cos().float()[:, None, :], ang.sin().float()[:, None, :]


def rope(x, cos, sin):                                                   # x (n, heads, d)
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def visibility_bias(S, anchors, B, window):
    """(A*B, S + A*B) additive bias: 0 where visible, -inf elsewhere (SPEC.md s.2)."""
    A = anchors.shape[0]
    o = torch.arange(B)
    a = anchors[:, None, None]                                           # (A, 1, 1)
    t = torch.arange(S)[None, None, :]                                   # (1, 1, S)
    ctx = t < a
    if window:
        ctx = ctx & (t >= a + o[None, :, None] - (window - 1))
    ctx = ctx.expand(A, B, S).reshape(A * B, S)
    own = torch.ones(B, B, dtype=torch.bool) if not window else o[None, :] <= o[:, None]
    blk = torch.block_diag(*([own] * A))                                 # (A*B, A*B)
    vis = torch.cat([ctx, blk], dim=1)
    return torch.zeros(vis.shape).masked_fill(~vis, float("-inf"))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name, default in (("hidden", 256), ("layers", 2), ("heads", 8), ("kv-heads", 8),
                          ("head-dim", 32), ("intermediate", 768), ("block", 16),
                          ("anchors", 64), ("seq", 512), ("vocab", 8192), ("nseq", 1),
                          ("taps", 2), ("window", 0), ("threads", 1), ("reps", 3)):
        ap.add_argument("--" + name, type=int, default=default)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    H, S, A, B, V = a.hidden, a.seq, a.anchors, a.block, a.vocab
    nh, nkv, d, I, L = a.heads, a.kv_heads, a.head_dim, a.intermediate, a.layers

    def matrix(rows, cols):
        return (0.02 * torch.randn(rows, cols)).requires_grad_()

    def gain(n):
        return torch.ones(n, requires_grad=True)

    P = {"fc": matrix(H, a.taps * H), "hidden_norm": gain(H), "norm": gain(H)}
    layers = [{"in": gain(H), "post": gain(H), "q": matrix(nh * d, H), "k": matrix(nkv * d, H),
               "v": matrix(nkv * d, H), "o": matrix(H, nh * d), "qn": gain(d), "kn": gain(d),
               "g": matrix(I, H), "u": matrix(I, H), "dn": matrix(H, I)} for _ in range(L)]
    embed = torch.randn(V, H)
    W = torch.randn(V, H) / math.sqrt(H)
    ids = torch.randint(0, V, (a.nseq, S))
    feats = torch.randn(a.nseq, S, a.taps * H)
    teacher = torch.randn(a.nseq, S, H)
    anchors = torch.arange(A) * (S - 1) // A
    # built once, outside the timing: masks, RoPE tables, slot indices, weights
    kinds = ["sliding" if a.window and l + 1 < L else "full" for l in range(L)]
    bias = {k: visibility_bias(S, anchors, B, a.window if k == "sliding" else 0) for k in set(kinds)}
    pos_blk = (anchors[:, None] + torch.arange(B)[None, :]).reshape(-1)
    cos_q, sin_q = rope_tables(pos_blk, d)
    cos_k, sin_k = rope_tables(torch.cat([torch.arange(S), pos_blk]), d)
    k_slot = torch.arange(B).repeat(A)
    target = anchors.repeat_interleave(B) + k_slot
    valid = (k_slot >= 1) & (target < S)
    weights = torch.where(valid, torch.exp(-(k_slot - 1).float() / 10.0), torch.zeros(()))
    t_row = (target - 1).clamp(0, S - 1)
    group = nh // nkv
    scale = 1.0 / math.sqrt(d)   # on q (AB x d) rather than on the scores (AB x SAB)

    def step():
        hs_all, ht_all, w_all = [], [], []
        for s in range(a.nseq):
            C = rms_norm(F.linear(feats[s], P["fc"]), P["hidden_norm"])             # (S, H)
            tokens = torch.full((A, B), V - 1)
            tokens[:, 0] = ids[s, anchors]
            h = embed[tokens.reshape(-1)]                                           # (AB, H)
            for l, Lw in enumerate(layers):
                u = rms_norm(h, Lw["in"])
                q = rope(rms_norm(F.linear(u, Lw["q"]).view(-1, nh, d), Lw["qn"]), cos_q, sin_q) * scale
                cu = torch.cat([C, u])
                k = rope(rms_norm(F.linear(cu, Lw["k"]).view(-1, nkv, d), Lw["kn"]), cos_k, sin_k)
                v = F.linear(cu, Lw["v"]).view(-1, nkv, d)
                if group > 1:
                    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
                scores = torch.matmul(q.transpose(0, 1), k.permute(1, 2, 0))                # (nh, AB, SAB)
                p = torch.softmax(scores + bias[kinds[l]], dim=-1)
                att = torch.matmul(p, v.transpose(0, 1)).transpose(0, 1).reshape(-1, nh * d)
                h = h + F.linear(att, Lw["o"])
                m = rms_norm(h, Lw["post"])
                h = h + F.linear(F.silu(F.linear(m, Lw["g"])) * F.linear(m, Lw["u"]), Lw["dn"])
            hs_all.append(rms_norm(h, P["norm"]))
            ht_all.append(teacher[s, t_row])
            w_all.append(weights)
        hs, ht, w = torch.cat(hs_all), torch.cat(ht_all), torch.cat(w_all)
        zs = F.linear(hs, W)                                                        # (n, V)
        with torch.no_grad():
            zt = F.linear(ht, W)
            labels = zt.argmax(dim=1)
            log_pt = F.log_softmax(zt, dim=1)
        log_ps = F.log_softmax(zs, dim=1)
        ce = F.nll_loss(log_ps, labels, reduction="none")
        kl = (log_pt.exp() * (log_pt - log_ps)).sum(dim=1)
        loss = ((w * (0.85 * ce + 0.15 * kl)).sum()) / w.sum()
        loss.backward()
        return float(loss)

    seconds, loss = [], None
    for rep in range(a.reps + 1):   # the first is a warm-up
        for t in list(P.values()) + [x for Lw in layers for x in Lw.values()]:
            t.grad = None
        t0 = time.perf_counter()
        loss = step()
        if rep:
            seconds.append(time.perf_counter() - t0)
    med = statistics.median(seconds)
    positions = a.nseq * A * B
    print(json.dumps({"impl": "torch", "torch_version": torch.__version__, "seconds_median": med,
                      "positions": positions, "positions_per_s": positions / med, "loss": loss,
                      "threads": a.threads}))


if __name__ == "__main__":
    main()
