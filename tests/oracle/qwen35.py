"""qwen35.py: a float64 numpy reference of the Qwen3.5 / Qwen3.6 hybrid target (SPEC.md s.3.1).

    import qwen35 as Q
    m = Q.load("../shared/models/qwen35-tiny/bf16")      # config.json + safetensors -> float64
    out = m.forward(tokens)                               # dict: taps, final, logits
    taps, final, logits, cache = m.prefill(tokens)        # chunked DeltaNet, returns a cache
    taps, final, logits = m.decode(cache, token)          # one token: taps [L x (H)], (H), (V)
    taps, final, logits = m.verify(cache, block)          # B tokens: [L x (B, H)], (B, H), (B, V)
    m.rollback(cache, accepted)                           # keep the first `accepted` of them
    o, S = Q.deltanet_recurrent(qh, kh, v, g, beta, S0)   # the two forms of the DeltaNet core
    o, S = Q.deltanet_chunked(qh, kh, v, g, beta, S0, chunk)

What it is: the text model of a `qwen3_5` directory (a `Qwen3_5ForConditionalGeneration`
checkpoint with its nested `text_config`, or a text-only `Qwen3_5ForCausalLM` one) run causally
in float64, written from SPEC.md section 3.1 alone, never from the C code nor from Hugging Face
transformers (not installed here): zero-centred RMSNorm (1 + w) everywhere except the DeltaNet
output's RMSNormGated (plain w, norm before the silu(z) gate); gated full attention with
q_norm/k_norm before a partial rotate-half RoPE; Gated DeltaNet (causal depthwise conv + silu,
l2-normed q/k, the delta-rule recurrence with decay exp(g)); the SwiGLU MLP. Its outputs per
token: the residual stream after every decoder layer (the taps), the final-normed hidden state
and the logits.

The DeltaNet core exists twice, the per-token recurrence and the chunked form of SPEC.md s.3.1,
as separate functions that share nothing but their inputs; the model runs either (`deltanet=`).
The cache API follows SPEC.md's "Decoding with a cache": per DeltaNet layer the last K-1
pre-convolution qkv rows and the state S (nv, dk, dv), per attention layer K (after k_norm and
RoPE) and V. verify() feeds a block through the recurrence and keeps the state and conv window
after every block position; rollback() then restores the ones of the accepted length and
truncates K/V, leaving the cache exactly as if the rejected tokens had never been fed.

Loading is strict: a missing tensor, a wrong shape, a dtype other than BF16/F16/F32, a tensor
under the text prefix that the model does not use (e.g. a layer_types mismatch) and Qwen3-Next's
fused `in_proj_qkvz` / `in_proj_ba` names raise ModelError naming the tensor; `mtp.*` and
`model.visual.*` are ignored. M-RoPE fields (`mrope_section`, `mrope_interleaved`) are ignored:
for text every section carries the same position, so M-RoPE is plain 1-D RoPE.

Deliberately not here: batching, speed, vision, MTP, fp32/bf16 emulation. Tested by
tests/oracle/qwen35_reference_check.py (the three qwen35-tiny variants agree, chunked == recurrent,
prefill == token-by-token decode, verify + rollback == a fresh prefill, sanity ranges, broken
checkpoints refused), which says how it is run. Pure numpy; no torch.
Dimension legend: T tokens, P cached positions, B verified block, H hidden, V vocabulary,
L layers, I MLP width; attention nh / nkv heads of hd dims, rd rotated dims; DeltaNet nk key
heads of dk dims, nv value heads of dv dims, r = nv / nk, K conv taps, Ck = nk*dk, Cv = nv*dv,
Cc = 2*Ck + Cv; C chunk length.
"""

import json
import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import st  # noqa: E402

LINEAR, FULL = "linear_attention", "full_attention"
L2NORM_EPS = 1e-6          # SPEC.md s.3.1: the l2norm of q and k uses 1e-6, not rms_norm_eps
SOFTPLUS_THRESHOLD = 20.0  # softplus(x) = x for x > 20 (torch's default threshold)
TEXT_PREFIXES = ("model.language_model.", "model.")
IGNORED_PREFIXES = ("mtp.", "model.visual.")
STORED_DTYPES = ("BF16", "F16", "F32")


class ModelError(ValueError):
    """A directory the reference refuses: the message names the file, field or tensor."""


# ------------------------------------------------------------------------------------------
# Elementwise pieces (float64 throughout)


def sigmoid(x):
    """1 / (1 + exp(-x)) without overflow for large |x|."""
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


def silu(x):
    return x * sigmoid(x)


def softplus(x):
    """log(1 + exp(x)), and x itself for x > 20 (SPEC.md s.3.1)."""
    return np.where(x > SOFTPLUS_THRESHOLD, x, np.log1p(np.exp(np.minimum(x, SOFTPLUS_THRESHOLD))))


def rms_norm_1p(x, w, eps):
    """Zero-centred RMSNorm over the last dim: x / sqrt(mean(x^2) + eps) * (1 + w)."""
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * (1.0 + w)


def rms_norm_gated(x, z, w, eps):
    """The DeltaNet output norm: x / sqrt(mean(x^2) + eps) * w * silu(z) (plain w; the norm
    comes before the gate)."""
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w * silu(z)


def l2norm(x):
    """x / sqrt(sum(x^2) + 1e-6) over the last dim."""
    return x / np.sqrt(np.sum(x * x, axis=-1, keepdims=True) + L2NORM_EPS)


def rope_partial(x, pos, theta, rd):
    """Rotate-half RoPE on the first rd dims of each head. x (T, heads, hd), pos (T,) absolute
    positions: dim j pairs with j + rd/2 (j < rd/2), rotated by pos * theta^(-2j/rd); dims >= rd
    pass through."""
    half = rd // 2
    inv = theta ** (-2.0 * np.arange(half, dtype=np.float64) / rd)                 # (rd/2)
    ang = np.asarray(pos, dtype=np.float64)[:, None] * inv[None, :]               # (T, rd/2)
    cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]                   # (T, 1, rd/2)
    x1, x2 = x[..., :half], x[..., half:rd]
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin, x[..., rd:]], axis=-1)


def causal_conv(hist, w):
    """The depthwise causal conv of SPEC.md s.3.1. hist (K-1+T, Cc): the K-1 cached
    pre-convolution rows (zeros before position 0), then the T new ones; w (Cc, 1, K).
    Returns y (T, Cc), y[t, ch] = sum_m w[ch, 0, m] * qkv[t-(K-1)+m, ch] (hist row t+m)."""
    K = w.shape[2]
    T = hist.shape[0] - (K - 1)
    return sum(w[:, 0, m][None, :] * hist[m:m + T] for m in range(K))


# ------------------------------------------------------------------------------------------
# The Gated DeltaNet core, twice: the per-token recurrence and the chunked form


def _value_heads(x, nv):
    """x (T, nk, d) -> (T, nv, d): value head j takes key head j // (nv/nk)."""
    nk = x.shape[1]
    return x[:, np.arange(nv) // (nv // nk), :]


def deltanet_recurrent(qh, kh, v, g, beta, S0, keep_states=False):
    """The delta rule token by token (SPEC.md s.3.1).
    qh, kh (T, nk, dk): l2-normed (qh also / sqrt(dk)); v (T, nv, dv); g, beta (T, nv); S0
    (nv, dk, dv) the entering state. Per t and value head j (key head j // r):
        S = exp(g_t) S;  u_t = beta_t (v_t - S^T kh_t);  S = S + kh_t u_t^T;  o_t = S^T qh_t
    Returns o (T, nv, dv), the final S (nv, dk, dv) and, with keep_states, states (T+1, nv, dk,
    dv): states[0] = S0, states[t+1] the state after token t."""
    T, nv = v.shape[0], v.shape[1]
    qv, kv = _value_heads(qh, nv), _value_heads(kh, nv)                           # (T, nv, dk)
    S = np.array(S0, dtype=np.float64, copy=True)                                 # (nv, dk, dv)
    o = np.zeros(v.shape, dtype=np.float64)                                       # (T, nv, dv)
    states = [S.copy()] if keep_states else None
    for t in range(T):
        S = np.exp(g[t])[:, None, None] * S
        u = beta[t][:, None] * (v[t] - np.einsum("jkd,jk->jd", S, kv[t]))         # (nv, dv)
        S = S + kv[t][:, :, None] * u[:, None, :]
        o[t] = np.einsum("jkd,jk->jd", S, qv[t])
        if keep_states:
            states.append(S.copy())
    return (o, S, np.stack(states)) if keep_states else (o, S)


def deltanet_chunked(qh, kh, v, g, beta, S0, chunk=64):
    """The chunked form of SPEC.md s.3.1, the same inputs and outputs as deltanet_recurrent
    (without the per-token states). The tail is padded with q = k = v = beta = g = 0 (no decay,
    no update). Inside a chunk of C rows with cumulative log decay c_i = g_0 + ... + g_i and
    entering state S, per value head:
        E[i,j] = exp(c_i - c_j) for j <= i, else 0;   A[i,j] = beta_i (kh_i . kh_j) E[i,j], j < i
        (I + A) U = diag(beta) V;   (I + A) W = diag(beta exp(c)) Kh;   Un = U - W S
        O = diag(exp(c)) Qh S + (E * (Qh Kh^T)) Un            (diagonal included)
        S_next = exp(c_last) S + (diag(exp(c_last - c)) Kh)^T Un"""
    if chunk < 1:
        raise ValueError(f"chunk {chunk} < 1")
    T, nv, dv = v.shape
    n_chunks = -(-T // chunk)
    Tp = n_chunks * chunk

    def pad(x):
        return np.concatenate([x, np.zeros((Tp - T,) + x.shape[1:])], axis=0) if Tp > T else x

    qv, kv = pad(_value_heads(qh, nv)), pad(_value_heads(kh, nv))                 # (Tp, nv, dk)
    vp, gp, bp = pad(v), pad(g), pad(beta)                                        # (Tp, nv, ..)
    S = np.array(S0, dtype=np.float64, copy=True)                                 # (nv, dk, dv)
    o = np.zeros((Tp, nv, dv), dtype=np.float64)
    lower = np.tril(np.ones((chunk, chunk), dtype=bool))                          # j <= i
    strict = np.tril(np.ones((chunk, chunk), dtype=bool), -1)                     # j < i
    eye = np.eye(chunk)
    for n in range(n_chunks):
        rows = slice(n * chunk, (n + 1) * chunk)
        # per value head j: everything below is (nv, C, ...), head-major
        Qc = qv[rows].transpose(1, 0, 2)                                          # (nv, C, dk)
        Kc = kv[rows].transpose(1, 0, 2)                                          # (nv, C, dk)
        Vc = vp[rows].transpose(1, 0, 2)                                          # (nv, C, dv)
        bc = bp[rows].T                                                           # (nv, C)
        c = np.cumsum(gp[rows].T, axis=1)                                         # (nv, C)
        diff = c[:, :, None] - c[:, None, :]                                      # (nv, C, C)
        E = np.where(lower, np.exp(np.where(lower, diff, 0.0)), 0.0)              # (nv, C, C)
        KK = Kc @ Kc.transpose(0, 2, 1)                                           # (nv, C, C)
        A = np.where(strict, bc[:, :, None] * KK * E, 0.0)                        # (nv, C, C)
        M = eye[None] + A
        U = np.linalg.solve(M, bc[:, :, None] * Vc)                               # (nv, C, dv)
        W = np.linalg.solve(M, (bc * np.exp(c))[:, :, None] * Kc)                 # (nv, C, dk)
        Un = U - W @ S                                                            # (nv, C, dv)
        Oc = np.exp(c)[:, :, None] * (Qc @ S) + (E * (Qc @ Kc.transpose(0, 2, 1))) @ Un
        c_last = c[:, -1]                                                         # (nv)
        S = (np.exp(c_last)[:, None, None] * S
             + (np.exp(c_last[:, None] - c)[:, :, None] * Kc).transpose(0, 2, 1) @ Un)
        o[rows] = Oc.transpose(1, 0, 2)
    return o[:T], S


# ------------------------------------------------------------------------------------------
# The configuration (SPEC.md s.3.1 field list and fallbacks)


def _read_json(path):
    try:
        with open(path) as fh:
            return json.load(fh)
    except (OSError, json.JSONDecodeError) as exc:
        raise ModelError(f"{path}: cannot read the config ({exc})") from exc


def parse_config(cfg, where="config.json"):
    """The text model's fields: from `text_config` when present (a Qwen3_5ForConditionalGeneration
    directory), else from the top level (a text-only Qwen3_5ForCausalLM one). Returns a dict of
    the dimensions, eps, theta, factor, rd, layer_types and tied."""
    top_type = cfg.get("model_type")
    t = cfg.get("text_config")
    if t is None:
        t = cfg
    text_type = t.get("model_type", top_type)
    if top_type == "qwen3_next" or text_type == "qwen3_next":
        raise ModelError(f"{where}: model_type qwen3_next is Qwen3-Next (fused in_proj_qkvz), "
                         f"not qwen3_5 (SPEC.md s.3.1)")
    if top_type not in ("qwen3_5", "qwen3_5_text") or text_type not in ("qwen3_5", "qwen3_5_text"):
        raise ModelError(f"{where}: model_type {top_type!r} (text {text_type!r}) is not qwen3_5")
    if t.get("hidden_act", "silu") != "silu":
        raise ModelError(f"{where}: hidden_act {t.get('hidden_act')!r} is not silu")

    def need(key):
        if key not in t or t[key] is None:
            raise ModelError(f"{where}: field {key!r} is missing")
        v = t[key]
        if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
            raise ModelError(f"{where}: field {key!r} = {v!r} is not a positive integer")
        return v

    c = {k: need(f) for k, f in (
        ("H", "hidden_size"), ("L", "num_hidden_layers"), ("I", "intermediate_size"),
        ("V", "vocab_size"), ("nh", "num_attention_heads"), ("nkv", "num_key_value_heads"),
        ("hd", "head_dim"), ("nk", "linear_num_key_heads"), ("nv", "linear_num_value_heads"),
        ("dk", "linear_key_head_dim"), ("dv", "linear_value_head_dim"),
        ("K", "linear_conv_kernel_dim"))}
    c["eps"] = float(t.get("rms_norm_eps", 1e-6))
    rp = t.get("rope_parameters") or {}
    if rp.get("rope_type", "default") != "default":
        raise ModelError(f"{where}: rope_type {rp.get('rope_type')!r} is not in SPEC.md s.3.1")
    c["theta"] = float(rp.get("rope_theta", t.get("rope_theta", 10000.0)))
    c["factor"] = float(rp.get("partial_rotary_factor", t.get("partial_rotary_factor", 0.25)))
    c["rd"] = int(c["hd"] * c["factor"])
    if c["rd"] % 2 or not 0 <= c["rd"] <= c["hd"]:
        raise ModelError(f"{where}: rotated dims int({c['hd']} * {c['factor']}) = {c['rd']} "
                         f"is not an even number <= head_dim")
    if c["nh"] % c["nkv"]:
        raise ModelError(f"{where}: num_attention_heads {c['nh']} is not a multiple of "
                         f"num_key_value_heads {c['nkv']}")
    if c["nv"] % c["nk"]:
        raise ModelError(f"{where}: linear_num_value_heads {c['nv']} is not a multiple of "
                         f"linear_num_key_heads {c['nk']}")
    lt = t.get("layer_types")
    if lt is None:
        interval = t.get("full_attention_interval", 4)
        lt = [FULL if (i + 1) % interval == 0 else LINEAR for i in range(c["L"])]
    if len(lt) != c["L"] or any(x not in (LINEAR, FULL) for x in lt):
        raise ModelError(f"{where}: layer_types must be {c['L']} of {LINEAR!r}/{FULL!r}")
    c["layer_types"] = list(lt)
    c["tied"] = bool(cfg.get("tie_word_embeddings", t.get("tie_word_embeddings", False)))
    c["r"] = c["nv"] // c["nk"]
    c["Ck"], c["Cv"] = c["nk"] * c["dk"], c["nv"] * c["dv"]
    c["Cc"] = 2 * c["Ck"] + c["Cv"]
    return c


def weight_shapes(c):
    """{name without the text prefix: shape} of every tensor the text model uses (lm_head.weight
    is listed under its top-level name, absent when tied)."""
    H, I, V = c["H"], c["I"], c["V"]
    shapes = {"embed_tokens.weight": (V, H), "norm.weight": (H,)}
    for i, kind in enumerate(c["layer_types"]):
        p = f"layers.{i}."
        shapes.update({p + "input_layernorm.weight": (H,),
                       p + "post_attention_layernorm.weight": (H,),
                       p + "mlp.gate_proj.weight": (I, H), p + "mlp.up_proj.weight": (I, H),
                       p + "mlp.down_proj.weight": (H, I)})
        if kind == LINEAR:
            a = p + "linear_attn."
            shapes.update({a + "in_proj_qkv.weight": (c["Cc"], H),
                           a + "in_proj_z.weight": (c["Cv"], H),
                           a + "in_proj_b.weight": (c["nv"], H),
                           a + "in_proj_a.weight": (c["nv"], H),
                           a + "conv1d.weight": (c["Cc"], 1, c["K"]),
                           a + "A_log": (c["nv"],), a + "dt_bias": (c["nv"],),
                           a + "norm.weight": (c["dv"],), a + "out_proj.weight": (H, c["Cv"])})
        else:
            a = p + "self_attn."
            shapes.update({a + "q_proj.weight": (2 * c["nh"] * c["hd"], H),
                           a + "k_proj.weight": (c["nkv"] * c["hd"], H),
                           a + "v_proj.weight": (c["nkv"] * c["hd"], H),
                           a + "o_proj.weight": (H, c["nh"] * c["hd"]),
                           a + "q_norm.weight": (c["hd"],), a + "k_norm.weight": (c["hd"],)})
    return shapes


# ------------------------------------------------------------------------------------------
# The cache (SPEC.md s.3.1 "Decoding with a cache")


class Cache:
    """pos: tokens fed so far. layers[i]: a DeltaNet layer {"conv": (K-1, Cc) the last K-1
    pre-convolution qkv rows (zeros before position 0), "S": (nv, dk, dv)}, an attention layer
    {"K": (P, nkv, hd) after k_norm and RoPE, "V": (P, nkv, hd)}. pending: after verify(), the
    block's per-position DeltaNet snapshots for rollback(), else None."""

    def __init__(self, c):
        self.pos = 0
        self.pending = None
        self.layers = []
        for kind in c["layer_types"]:
            if kind == LINEAR:
                self.layers.append({"conv": np.zeros((c["K"] - 1, c["Cc"])),
                                    "S": np.zeros((c["nv"], c["dk"], c["dv"]))})
            else:
                self.layers.append({"K": np.zeros((0, c["nkv"], c["hd"])),
                                    "V": np.zeros((0, c["nkv"], c["hd"]))})

    def copy(self):
        other = Cache.__new__(Cache)
        other.pos = self.pos
        other.pending = None if self.pending is None else {
            "base": self.pending["base"], "n": self.pending["n"],
            "conv": {i: a.copy() for i, a in self.pending["conv"].items()},
            "S": {i: a.copy() for i, a in self.pending["S"].items()}}
        other.layers = [{k: a.copy() for k, a in layer.items()} for layer in self.layers]
        return other


# ------------------------------------------------------------------------------------------
# The model


class Model:
    """A loaded qwen3_5 text model: c (parse_config's dict), W {name without prefix: float64
    array} (lm_head.weight under its own name; the embedding when tied), dtypes {stored name:
    dtype}, prefix (the text prefix found)."""

    def __init__(self, c, W, dtypes, prefix):
        self.c, self.W, self.dtypes, self.prefix = c, W, dtypes, prefix

    # --- the mixers ------------------------------------------------------------------------

    def gated_attention(self, i, x, pos0, layer):
        """x (T, H) the input-normed stream at positions pos0..pos0+T-1; layer the cache entry
        (K, V get the T new rows appended). Returns (T, H)."""
        c, W, p = self.c, self.W, f"layers.{i}.self_attn."
        T, nh, nkv, hd = x.shape[0], c["nh"], c["nkv"], c["hd"]
        G = (x @ W[p + "q_proj.weight"].T).reshape(T, nh, 2 * hd)                # (T, nh, 2hd)
        Q, gate = G[..., :hd], G[..., hd:]                                        # (T, nh, hd)
        Kn = (x @ W[p + "k_proj.weight"].T).reshape(T, nkv, hd)
        Vn = (x @ W[p + "v_proj.weight"].T).reshape(T, nkv, hd)
        pos = pos0 + np.arange(T)                                                 # (T)
        Q = rope_partial(rms_norm_1p(Q, W[p + "q_norm.weight"], c["eps"]), pos, c["theta"], c["rd"])
        Kn = rope_partial(rms_norm_1p(Kn, W[p + "k_norm.weight"], c["eps"]), pos, c["theta"],
                          c["rd"])
        layer["K"] = np.concatenate([layer["K"], Kn], axis=0)                     # (P+T, nkv, hd)
        layer["V"] = np.concatenate([layer["V"], Vn], axis=0)
        kv_of = np.arange(nh) // (nh // nkv)                                      # (nh)
        Ka, Va = layer["K"][:, kv_of, :], layer["V"][:, kv_of, :]                 # (P+T, nh, hd)
        scores = np.einsum("thd,shd->hts", Q, Ka) / math.sqrt(hd)                 # (nh, T, P+T)
        visible = np.arange(Ka.shape[0])[None, :] <= pos[:, None]                 # (T, P+T)
        scores = np.where(visible[None], scores, -np.inf)
        prob = np.exp(scores - scores.max(axis=-1, keepdims=True))
        prob /= prob.sum(axis=-1, keepdims=True)
        O = np.einsum("hts,shd->thd", prob, Va).reshape(T, nh * hd)               # (T, nh*hd)
        return (O * sigmoid(gate.reshape(T, nh * hd))) @ W[p + "o_proj.weight"].T

    def deltanet(self, i, x, layer, form, chunk, trace=None, keep=None):
        """x (T, H) the input-normed stream; layer the cache entry (conv, S updated). form
        "chunked" or "recurrent"; keep: a dict that receives this layer's per-position conv
        windows (T+1, K-1, Cc) and states (T+1, nv, dk, dv) (forces the recurrence). Returns
        (T, H)."""
        c, W, p = self.c, self.W, f"layers.{i}.linear_attn."
        T, K, Ck, nk, nv, dk, dv = x.shape[0], c["K"], c["Ck"], c["nk"], c["nv"], c["dk"], c["dv"]
        qkv = x @ W[p + "in_proj_qkv.weight"].T                                   # (T, Cc)
        z = (x @ W[p + "in_proj_z.weight"].T).reshape(T, nv, dv)                  # (T, nv, dv)
        b = x @ W[p + "in_proj_b.weight"].T                                       # (T, nv)
        a = x @ W[p + "in_proj_a.weight"].T                                       # (T, nv)
        hist = np.concatenate([layer["conv"], qkv], axis=0)                       # (K-1+T, Cc)
        layer["conv"] = hist[hist.shape[0] - (K - 1):].copy()                     # (K-1, Cc)
        act = silu(causal_conv(hist, W[p + "conv1d.weight"]))                     # (T, Cc)
        q = act[:, :Ck].reshape(T, nk, dk)
        k = act[:, Ck:2 * Ck].reshape(T, nk, dk)
        v = act[:, 2 * Ck:].reshape(T, nv, dv)
        beta = sigmoid(b)                                                         # (T, nv)
        g = -np.exp(W[p + "A_log"]) * softplus(a + W[p + "dt_bias"])              # (T, nv)
        qh, kh = l2norm(q) / math.sqrt(dk), l2norm(k)
        if keep is not None:
            o, S, states = deltanet_recurrent(qh, kh, v, g, beta, layer["S"], keep_states=True)
            keep["conv"] = np.stack([hist[n:n + K - 1] for n in range(T + 1)])  # (T+1, K-1, Cc)
            keep["S"] = states                                  # (T+1, nv, dk, dv)
        elif form == "recurrent":
            o, S = deltanet_recurrent(qh, kh, v, g, beta, layer["S"])
        elif form == "chunked":
            o, S = deltanet_chunked(qh, kh, v, g, beta, layer["S"], chunk)
        else:
            raise ValueError(f"deltanet form {form!r}")
        if trace is not None:
            trace[i] = {"g": g, "beta": beta, "qh": qh, "kh": kh, "v": v, "z": z, "o": o,
                        "S_in": layer["S"].copy(), "S_out": S.copy()}
        layer["S"] = S
        o = rms_norm_gated(o, z, W[p + "norm.weight"], c["eps"])                  # (T, nv, dv)
        return o.reshape(T, c["Cv"]) @ W[p + "out_proj.weight"].T

    # --- the stack -------------------------------------------------------------------------

    def run(self, cache, tokens, deltanet="chunked", chunk=64, trace=None, keep=None):
        """Feeds tokens (T,) after the cache (advancing it). Returns (taps [L x (T, H)], final
        (T, H), logits (T, V)). trace: a dict receiving each DeltaNet layer's internals; keep: a
        dict receiving per-position snapshots {layer: {"conv", "S"}} (the recurrence)."""
        c, W = self.c, self.W
        tokens = np.asarray(tokens, dtype=np.int64).reshape(-1)
        if tokens.size == 0:
            raise ValueError("no tokens")
        if tokens.min() < 0 or tokens.max() >= c["V"]:
            raise ValueError(f"token ids must lie in [0, {c['V']})")
        cache.pending = None
        x = W["embed_tokens.weight"][tokens]                                      # (T, H)
        taps = []
        for i, kind in enumerate(c["layer_types"]):
            p = f"layers.{i}."
            u = rms_norm_1p(x, W[p + "input_layernorm.weight"], c["eps"])
            if kind == LINEAR:
                kd = None
                if keep is not None:
                    kd = keep[i] = {}
                x = x + self.deltanet(i, u, cache.layers[i], deltanet, chunk, trace, kd)
            else:
                x = x + self.gated_attention(i, u, cache.pos, cache.layers[i])
            u = rms_norm_1p(x, W[p + "post_attention_layernorm.weight"], c["eps"])
            x = x + (silu(u @ W[p + "mlp.gate_proj.weight"].T)
                     * (u @ W[p + "mlp.up_proj.weight"].T)) @ W[p + "mlp.down_proj.weight"].T
            taps.append(x)                                                        # (T, H)
        cache.pos += tokens.size
        final = rms_norm_1p(x, W["norm.weight"], c["eps"])                        # (T, H)
        return taps, final, final @ W["lm_head.weight"].T                         # (T, V)

    def forward(self, tokens, deltanet="chunked", chunk=64, trace=None):
        """One sequence from position 0: {"taps": [L x (T, H)], "final": (T, H), "logits":
        (T, V)}."""
        taps, final, logits = self.run(Cache(self.c), tokens, deltanet, chunk, trace)
        return {"taps": taps, "final": final, "logits": logits}

    def new_cache(self):
        return Cache(self.c)

    def prefill(self, tokens, chunk=64, deltanet="chunked"):
        """(taps [L x (T, H)], final (T, H), logits (T, V), cache) of tokens from position 0."""
        cache = Cache(self.c)
        taps, final, logits = self.run(cache, tokens, deltanet, chunk)
        return taps, final, logits, cache

    def extend(self, cache, tokens, chunk=64, deltanet="chunked"):
        """A chunked prefill continuing from the cache: (taps, final, logits) of tokens (T,)."""
        return self.run(cache, tokens, deltanet, chunk)

    def decode(self, cache, token):
        """One token after the cache (recurrence): (taps [L x (H)], final (H), logits (V))."""
        taps, final, logits = self.run(cache, [int(token)], "recurrent")
        return [t[0] for t in taps], final[0], logits[0]

    def verify(self, cache, block_tokens):
        """Feeds the B block tokens (the recurrence), appending their K/V to the cache and
        keeping each DeltaNet layer's conv window and state after every block position, so that
        rollback() can keep any accepted prefix. Returns (taps [L x (B, H)], final (B, H),
        logits (B, V)). Without a rollback the cache holds all B tokens."""
        base = cache.pos
        keep = {}
        taps, final, logits = self.run(cache, block_tokens, "recurrent", keep=keep)
        cache.pending = {"base": base, "n": final.shape[0],
                         "conv": {i: d["conv"] for i, d in keep.items()},
                         "S": {i: d["S"] for i, d in keep.items()}}
        return taps, final, logits

    def rollback(self, cache, accepted):
        """After verify(): keeps the first `accepted` (0..B) block tokens, as if the others had
        never been fed: attention K/V truncated, DeltaNet conv window and state of that
        position restored."""
        pend = cache.pending
        if pend is None:
            raise ValueError("rollback() without a preceding verify()")
        if not 0 <= accepted <= pend["n"]:
            raise ValueError(f"accepted {accepted} outside 0..{pend['n']}")
        keep_len = pend["base"] + accepted
        for i, layer in enumerate(cache.layers):
            if self.c["layer_types"][i] == LINEAR:
                layer["conv"] = pend["conv"][i][accepted].copy()
                layer["S"] = pend["S"][i][accepted].copy()
            else:
                layer["K"] = layer["K"][:keep_len].copy()
                layer["V"] = layer["V"][:keep_len].copy()
        cache.pos = keep_len
        cache.pending = None


# ------------------------------------------------------------------------------------------
# Loading


def load_weights(c, tensors, dtypes, where):
    """(W {name without prefix: float64}, prefix): the text model's tensors, every one checked
    for presence, shape and dtype; refuses Qwen3-Next names and unused tensors."""
    names = list(tensors)
    prefix = next((p for p in TEXT_PREFIXES if any(n.startswith(p + "layers.") or
                                                   n == p + "embed_tokens.weight" for n in names)),
                  None)
    if prefix is None:
        raise ModelError(f"{where}: no tensor named model.language_model.* or model.* "
                         f"(missing tensor model.language_model.embed_tokens.weight)")
    for n in names:
        if n.startswith(prefix) and (".linear_attn.in_proj_qkvz." in n or
                                     ".linear_attn.in_proj_ba." in n):
            raise ModelError(f"{where}: tensor {n!r} is Qwen3-Next's fused layout (q,k,v,z "
                             f"interleaved per key head); qwen3_5 has in_proj_qkv, in_proj_z, "
                             f"in_proj_b, in_proj_a (SPEC.md s.3.1)")
    want = {prefix + k: s for k, s in weight_shapes(c).items()}
    if not c["tied"]:
        want["lm_head.weight"] = (c["V"], c["H"])
    for full, shape in want.items():
        if full not in tensors:
            raise ModelError(f"{where}: missing tensor {full!r} (shape {list(shape)})")
        got = tuple(np.shape(tensors[full]))
        if got != tuple(shape):
            raise ModelError(f"{where}: tensor {full!r} has shape {list(got)}, SPEC.md s.3.1 "
                             f"wants {list(shape)}")
        if dtypes.get(full) not in STORED_DTYPES:
            raise ModelError(f"{where}: tensor {full!r} is {dtypes.get(full)}, not one of "
                             f"{'/'.join(STORED_DTYPES)}")
    unused = sorted(n for n in names if n.startswith(prefix) and n not in want
                    and not n.startswith(IGNORED_PREFIXES))
    if unused:
        raise ModelError(f"{where}: tensor {unused[0]!r} is not part of the qwen3_5 text model "
                         f"(layer_types {c['layer_types']}); {len(unused)} such tensor(s)")
    W = {full[len(prefix):] if full.startswith(prefix) else full:
         np.asarray(tensors[full], dtype=np.float64) for full in want}
    if c["tied"]:
        W["lm_head.weight"] = W["embed_tokens.weight"]
    return W, prefix


def load(model_dir):
    """A Model from a qwen3_5 Hugging Face directory (config.json + model.safetensors or the
    index and its shards). Raises ModelError naming the field or tensor on any mismatch."""
    cfg_path = os.path.join(model_dir, "config.json")
    c = parse_config(_read_json(cfg_path), cfg_path)
    try:
        tensors, dtypes = st.read_model_dir(model_dir)
    except (OSError, KeyError, json.JSONDecodeError, st.StError) as exc:
        raise ModelError(f"{model_dir}: cannot read the weights ({exc!r})") from exc
    W, prefix = load_weights(c, tensors, dtypes, model_dir)
    return Model(c, W, dtypes, prefix)


if __name__ == "__main__":
    d = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "shared", "models",
        "qwen35-tiny", "bf16")
    m = load(d)
    toks = np.random.default_rng(0).integers(0, m.c["V"], 16)
    out = m.forward(toks)
    print(f"{d}: {m.c['L']} layers {m.c['layer_types']}, logits std {out['logits'].std():.3f}")
