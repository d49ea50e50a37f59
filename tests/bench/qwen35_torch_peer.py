#!/usr/bin/python3
"""qwen35_torch_peer.py: the PyTorch peer of bench_qwen35: the qwen3_5 target's prefill and one
decode step after it, float32 on the CPU, random weights of the same shape. Prints one JSON line.

    qwen35_torch_peer.py [--hidden 1024 --layers 8 --interval 4 --heads 8 --kv-heads 2
                          --head-dim 128 --key-heads 4 --value-heads 8 --key-dim 128
                          --value-dim 128 --conv 4 --intermediate 3072 --vocab 32000
                          --tokens 2048 --threads 1 --reps 3 --decode-steps 16]

The math of tests/oracle/qwen35.py (SPEC.md s.3.1) written the way a PyTorch user writes it:
F.linear for every projection, the causal conv as F.conv1d with groups = channels, the chunked
DeltaNet (chunk 64) with the intra-chunk systems solved for all chunks at once
(torch.linalg.solve_triangular) and a Python loop over chunks only for the state,
F.scaled_dot_product_attention when torch has it (else a masked softmax, torch 1.13), the
RoPE tables built once outside the timing. The decode step: the same layers on one token, the
delta-rule recurrence on the cached state, attention over the cached keys and values (no
logits, as bench_qwen35). torch.set_num_threads(--threads). Exits 77 when torch is missing.
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

CHUNK = 64
EPS = 1e-6
SDPA = getattr(F, "scaled_dot_product_attention", None)


def rms_norm(x, w):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * w


def l2norm(x):
    return x * torch.rsqrt(x.pow(2).sum(-1, keepdim=True) + 1e-6)


def rope(x, cos, sin, rd):                        # x (T, heads, hd); cos, sin (T, 1, rd/2)
    half = rd // 2
    x1, x2, rest = x[..., :half], x[..., half:rd], x[..., rd:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin, rest], dim=-1)


class Model:
    def __init__(self, a):
        g = torch.Generator().manual_seed(1)
        self.a = a
        H, I = a.hidden, a.intermediate
        self.Ck, self.Cv = a.key_heads * a.key_dim, a.value_heads * a.value_dim
        self.Cc = 2 * self.Ck + self.Cv
        self.rd = int(a.head_dim * 0.25)

        def mat(rows, cols):
            return torch.randn(rows, cols, generator=g) / math.sqrt(cols)

        self.embed = torch.randn(a.vocab, H, generator=g)
        self.final_norm = torch.ones(H)
        self.layers = []
        for i in range(a.layers):
            L = {"full": (i + 1) % a.interval == 0, "in_norm": torch.ones(H), "post_norm": torch.ones(H),
                 "gate": mat(I, H), "up": mat(I, H), "down": mat(H, I)}
            if L["full"]:
                qd, kvd = a.heads * a.head_dim, a.kv_heads * a.head_dim
                L.update(q=mat(2 * qd, H), k=mat(kvd, H), v=mat(kvd, H), o=mat(H, qd),
                         q_norm=torch.ones(a.head_dim), k_norm=torch.ones(a.head_dim))
            else:
                L.update(qkv=mat(self.Cc, H), z=mat(self.Cv, H), b=mat(a.value_heads, H),
                         a=mat(a.value_heads, H), conv=torch.randn(self.Cc, 1, a.conv, generator=g) / math.sqrt(a.conv),
                         A_log=torch.zeros(a.value_heads), dt_bias=torch.zeros(a.value_heads),
                         norm=torch.ones(a.value_dim), out=mat(H, self.Cv))
            self.layers.append(L)

    def rope_tables(self, pos):
        half = self.rd // 2
        inv = 1e7 ** (-2.0 * torch.arange(half, dtype=torch.float64) / self.rd)
        ang = pos.to(torch.float64)[:, None] * inv[None, :]
        return ang.cos().float()[:, None, :], ang.sin().float()[:, None, :]

    # --- the mixers ---------------------------------------------------------------------------

    def attention(self, L, u, cos, sin, cache, p0):
        a = self.a
        T, nh, nkv, hd = u.shape[0], a.heads, a.kv_heads, a.head_dim
        G = F.linear(u, L["q"]).view(T, nh, 2 * hd)
        q, gate = G[..., :hd], G[..., hd:]
        k = F.linear(u, L["k"]).view(T, nkv, hd)
        v = F.linear(u, L["v"]).view(T, nkv, hd)
        q = rope(rms_norm(q, L["q_norm"]), cos, sin, self.rd)
        k = rope(rms_norm(k, L["k_norm"]), cos, sin, self.rd)
        if cache is not None:
            cache["K"][p0:p0 + T], cache["V"][p0:p0 + T] = k, v
            k, v = cache["K"][:p0 + T], cache["V"][:p0 + T]
        rep = nh // nkv
        qh = q.transpose(0, 1)                                            # (nh, T, hd)
        kh = k.transpose(0, 1).repeat_interleave(rep, 0)                  # (nh, P, hd)
        vh = v.transpose(0, 1).repeat_interleave(rep, 0)
        if SDPA is not None:
            o = SDPA(qh, kh, vh, is_causal=cache is None or T > 1)
        else:
            s = qh @ kh.transpose(1, 2) / math.sqrt(hd)                   # (nh, T, P)
            if T > 1:
                s = s + self.mask[:T, :kh.shape[1]]
            o = torch.softmax(s, -1) @ vh
        o = o.transpose(0, 1).reshape(T, nh * hd) * torch.sigmoid(gate.reshape(T, nh * hd))
        return F.linear(o, L["o"])

    def delta_inputs(self, L, u, window):
        a = self.a
        T = u.shape[0]
        qkv = F.linear(u, L["qkv"])                                       # (T, Cc)
        z = F.linear(u, L["z"]).view(T, a.value_heads, a.value_dim)
        beta = torch.sigmoid(F.linear(u, L["b"]))                         # (T, nv)
        g = -L["A_log"].exp() * F.softplus(F.linear(u, L["a"]) + L["dt_bias"])
        hist = torch.cat([window, qkv], 0) if window is not None else F.pad(qkv, (0, 0, a.conv - 1, 0))
        act = F.silu(F.conv1d(hist.t()[None], L["conv"], groups=self.Cc))[0].t()   # (T, Cc)
        r = a.value_heads // a.key_heads
        q = l2norm(act[:, :self.Ck].view(T, a.key_heads, a.key_dim)) / math.sqrt(a.key_dim)
        k = l2norm(act[:, self.Ck:2 * self.Ck].view(T, a.key_heads, a.key_dim))
        v = act[:, 2 * self.Ck:].view(T, a.value_heads, a.value_dim)
        q, k = q.repeat_interleave(r, 1), k.repeat_interleave(r, 1)      # (T, nv, dk)
        return qkv, q, k, v, beta, g, z

    def deltanet(self, L, u, state):
        a = self.a
        T, nv, C = u.shape[0], a.value_heads, CHUNK
        qkv, q, k, v, beta, g, z = self.delta_inputs(L, u, None)
        N = -(-T // C)
        pad = N * C - T

        def chunks(x):                                                    # (T, nv, ..) -> (nv, N, C, ..)
            x = F.pad(x, (0, 0) * (x.dim() - 1) + (0, pad)) if pad else x
            return x.view(N, C, *x.shape[1:]).movedim(2, 0)

        Q, Kc, Vc = chunks(q), chunks(k), chunks(v)                       # (nv, N, C, d)
        b, c = chunks(beta[..., None])[..., 0], chunks(g[..., None])[..., 0].cumsum(-1)   # (nv, N, C)
        diff = c[..., :, None] - c[..., None, :]
        E = torch.exp(diff.masked_fill(~self.lower, 0.0)).masked_fill(~self.lower, 0.0)   # (nv, N, C, C)
        KK = Kc @ Kc.transpose(-1, -2)
        M = torch.eye(C) + (b[..., None] * KK * E).masked_fill(~self.strict, 0.0)
        U = torch.linalg.solve_triangular(M, b[..., None] * Vc, upper=False, unitriangular=True)
        W = torch.linalg.solve_triangular(M, (b * c.exp())[..., None] * Kc, upper=False, unitriangular=True)
        QKE = (Q @ Kc.transpose(-1, -2)) * E
        ec, decay = c.exp()[..., None], torch.exp(c[..., -1:] - c)[..., None]
        O = torch.empty_like(Vc)
        for n in range(N):                                                # the chunk loop: the state
            Un = U[:, n] - W[:, n] @ state
            O[:, n] = ec[:, n] * (Q[:, n] @ state) + QKE[:, n] @ Un
            state = c[:, n, -1].exp()[:, None, None] * state + (decay[:, n] * Kc[:, n]).transpose(1, 2) @ Un
        o = O.movedim(0, 2).reshape(N * C, nv, a.value_dim)[:T]
        o = rms_norm(o, L["norm"]) * F.silu(z)
        return F.linear(o.reshape(T, self.Cv), L["out"]), state, qkv[-(a.conv - 1):]

    def deltanet_step(self, L, u, cache):                                 # one token, the recurrence
        a = self.a
        qkv, q, k, v, beta, g, z = self.delta_inputs(L, u, cache["conv"])
        cache["conv"] = torch.cat([cache["conv"][1:], qkv], 0)
        S = cache["S"] * g[0].exp()[:, None, None]                        # (nv, dk, dv)
        delta = beta[0][:, None] * (v[0] - (k[0][:, :, None] * S).sum(1))  # (nv, dv)
        S = S + k[0][:, :, None] * delta[:, None, :]
        cache["S"] = S
        o = (q[0][:, :, None] * S).sum(1)[None]                           # (1, nv, dv)
        o = rms_norm(o, L["norm"]) * F.silu(z)
        return F.linear(o.reshape(1, self.Cv), L["out"])

    # --- the stack ----------------------------------------------------------------------------

    def run(self, tokens, caches=None, p0=0):
        T = tokens.shape[0]
        cos, sin = self.tables[0][p0:p0 + T], self.tables[1][p0:p0 + T]
        x = F.embedding(tokens, self.embed)
        for i, L in enumerate(self.layers):
            u = rms_norm(x, L["in_norm"])
            cache = caches[i] if caches is not None else None
            if L["full"]:
                x = x + self.attention(L, u, cos, sin, cache, p0)
            elif cache is not None and T == 1:
                x = x + self.deltanet_step(L, u, cache)
            else:
                S0 = torch.zeros(self.a.value_heads, self.a.key_dim, self.a.value_dim)
                y, S, window = self.deltanet(L, u, S0)
                x = x + y
                if cache is not None:
                    cache["S"], cache["conv"] = S, window
            u = rms_norm(x, L["post_norm"])
            x = x + F.linear(F.silu(F.linear(u, L["gate"])) * F.linear(u, L["up"]), L["down"])
        return rms_norm(x, self.final_norm)

    def new_caches(self, max_len):
        a = self.a
        return [{"K": torch.zeros(max_len, a.kv_heads, a.head_dim), "V": torch.zeros(max_len, a.kv_heads, a.head_dim)}
                if L["full"] else {} for L in self.layers]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name, default in (("hidden", 1024), ("layers", 8), ("interval", 4), ("heads", 8), ("kv-heads", 2),
                          ("head-dim", 128), ("key-heads", 4), ("value-heads", 8), ("key-dim", 128),
                          ("value-dim", 128), ("conv", 4), ("intermediate", 3072), ("vocab", 32000),
                          ("tokens", 2048), ("threads", 1), ("reps", 3), ("decode-steps", 16)):
        ap.add_argument("--" + name, type=int, default=default)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.set_grad_enabled(False)
    m = Model(a)
    T, steps = a.tokens, a.decode_steps
    m.tables = m.rope_tables(torch.arange(T + steps))
    m.lower = torch.tril(torch.ones(CHUNK, CHUNK, dtype=torch.bool))
    m.strict = torch.tril(torch.ones(CHUNK, CHUNK, dtype=torch.bool), -1)
    m.mask = torch.zeros(T, T).masked_fill(~torch.tril(torch.ones(T, T, dtype=torch.bool)), float("-inf"))
    tokens = torch.randint(0, a.vocab, (T + steps,), generator=torch.Generator().manual_seed(2))
    times = []
    for k in range(-1, a.reps):
        t0 = time.perf_counter()
        final = m.run(tokens[:T])
        if k >= 0:
            times.append(time.perf_counter() - t0)
    caches = m.new_caches(T + steps)
    m.run(tokens[:T], caches)
    dts = []
    for s in range(steps):
        t0 = time.perf_counter()
        m.run(tokens[T + s:T + s + 1], caches, T + s)
        dts.append(time.perf_counter() - t0)
    med = statistics.median(times)
    print(json.dumps({"impl": "torch", "torch_version": torch.__version__, "tokens": T, "threads": a.threads,
                      "prefill_s": med, "tokens_per_s": T / med, "decode_ms": statistics.median(dts) * 1e3,
                      "sdpa": SDPA is not None, "final_sumsq": float(final.double().pow(2).sum())}))


if __name__ == "__main__":
    main()
