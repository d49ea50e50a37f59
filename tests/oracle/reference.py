"""reference.py: PyTorch implementations written straight from SPEC.md, for the oracle tests.

    import reference as R
    out = R.drafter_step(config, params, embed, lm_head, batch, loss_cfg)   # SPEC.md s.2 + s.1
    out = R.target_forward(hf_config, weights, token_ids, layer_ids)       # SPEC.md s.3

drafter_step: the DFlash drafter forward of SPEC.md section 2 over one batch (several
independent sequences), the loss of section 1 over all block slots of all sequences with one
global normalisation, and, by autograd, the gradient of every trainable parameter (the export
names of section 2). Attention uses an explicit dense boolean visibility mask per layer: that
is the clearest statement of the rules, not an efficient one.

target_forward: a Hugging Face llama / qwen3 decoder (section 3) run causally over one
sequence: the residual stream after each requested decoder layer, the final-normed last hidden
state and the logits.

Everything is computed in `dtype` (float64 for the oracle; float32 only to emulate an fp32
implementation when checking the harness and its tolerances). Read from the SPEC, never from
the C code. Used by tests/oracle/step_torch_check.py, tests/oracle/features_torch_check.py and (the loss
alone, loss_section1) tests/oracle/loss_torch_check.py, which say how they are run;
`python3 tests/oracle/reference.py` runs small self-checks (a finite difference of the drafter
loss, a causality check of the target).
Dimension legend: S context length, A anchors, B block size, H hidden, V vocabulary,
nh / nkv query / key-value heads, d head dim, I MLP width, L_t tapped layers.
"""

import math

import numpy as np
import torch
import torch.nn.functional as F

# ------------------------------------------------------------------------------------------
# Building blocks (SPEC.md section 2)


def rms_norm(x, g, eps):
    """x / sqrt(mean(x^2) + eps) * g over the last dimension."""
    return x / torch.sqrt((x * x).mean(dim=-1, keepdim=True) + eps) * g


def rope(x, pos, theta):
    """Rotate-half RoPE. x (n, heads, d), pos (n,) integer positions: the pair
    (x_i, x_{i+d/2}), i < d/2, is rotated by the angle pos * theta^(-2i/d)."""
    d = x.shape[-1]
    half = d // 2
    inv = theta ** (-2.0 * torch.arange(half, dtype=torch.float64) / d)         # (d/2)
    ang = pos.to(torch.float64)[:, None] * inv[None, :]                          # (n, d/2)
    cos = ang.cos().to(x.dtype)[:, None, :]
    sin = ang.sin().to(x.dtype)[:, None, :]
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def attention(q, k, v, visible, nkv):
    """q (nq, nh, d), k/v (nk, nkv, d), visible (nq, nk) bool -> (nq, nh*d). Query head h
    reads kv head h // (nh/nkv); scale 1/sqrt(d); every query row must see something."""
    nq, nh, d = q.shape
    group = nh // nkv
    kv_of = torch.arange(nh) // group                                             # (nh)
    kh = k[:, kv_of, :]                                                           # (nk, nh, d)
    vh = v[:, kv_of, :]
    scores = torch.einsum("qhd,khd->hqk", q, kh) / math.sqrt(d)                   # (nh, nq, nk)
    scores = scores.masked_fill(~visible[None, :, :], float("-inf"))
    p = torch.softmax(scores, dim=-1)
    out = torch.einsum("hqk,khd->qhd", p, vh)                                     # (nq, nh, d)
    return out.reshape(nq, nh * d)


# ------------------------------------------------------------------------------------------
# The loss (SPEC.md section 1), in the autograd graph


def loss_section1(hs, ht, W, labels, weights, alpha, T, lam, Tc):
    """hs (n, H) student hidden (in the graph), ht (n, H) teacher hidden or None, W (V, H),
    labels (n,) long or None (teacher argmax), weights (n,). Returns a dict of tensors:
    loss (in the graph), ce / kl / cap weighted means, weight_sum, correct, counted, the
    per-position loss l_i (0 where not counted), and the per-position labels, student and
    teacher logits (for the fixtures' near-tie checks)."""
    n = hs.shape[0]
    zs = hs @ W.T                                                                 # (n, V)
    zt = None if ht is None else (ht @ W.T).detach()                              # (n, V)
    if labels is None:
        if zt is None:
            raise ValueError("labels from the teacher argmax need a teacher")
        y = torch.argmax(zt, dim=1)          # torch.argmax returns the first maximum
    else:
        y = labels
    w = weights
    keep = (y >= 0) & (w > 0)
    y_safe = torch.where(keep, y, torch.zeros_like(y))
    ce = torch.logsumexp(zs, dim=1) - zs.gather(1, y_safe[:, None])[:, 0]
    if alpha > 0 and zt is not None:
        log_pt = F.log_softmax(zt / T, dim=1)
        log_ps = F.log_softmax(zs / T, dim=1)
        kl = T * T * (log_pt.exp() * (log_pt - log_ps)).sum(dim=1)
    else:
        kl = torch.zeros(n, dtype=hs.dtype)
    with torch.no_grad():                    # c_i is a constant (no gradient through argmax)
        c = (torch.argmax(zs, dim=1) == y_safe).to(hs.dtype)
    log_pc = F.log_softmax(zs / Tc, dim=1)
    cap = c * -(log_pc.exp() * log_pc).sum(dim=1)
    l = (1.0 - alpha) * ce + alpha * kl + lam * cap
    wk = torch.where(keep, w, torch.zeros_like(w))
    wsum = wk.sum()
    counted = int(keep.sum())
    if counted > 0:
        loss = (wk * l).sum() / wsum
        means = [float((wk * t.detach()).sum() / wsum) for t in (ce, kl, cap)]
    else:
        loss = (hs * 0.0).sum()              # 0, still in the graph: every gradient 0
        means = [0.0, 0.0, 0.0]
    return {"loss_t": loss, "loss": float(loss), "ce": means[0], "kl": means[1],
            "cap": means[2], "weight_sum": float(wsum), "counted": counted,
            "correct": int(((c > 0) & keep).sum()),
            "per_position": torch.where(keep, l, torch.zeros_like(l)).detach(),
            "labels": y.detach(), "keep": keep, "zs": zs.detach(), "zt": zt}


# ------------------------------------------------------------------------------------------
# The drafter (SPEC.md section 2)


def drafter_param_shapes(cfg):
    """{export name: shape} of every trainable parameter, in the order of SPEC.md s.2."""
    H, nh, nkv, d, I = (cfg["hidden_size"], cfg["num_attention_heads"],
                        cfg["num_key_value_heads"], cfg["head_dim"], cfg["intermediate_size"])
    Lt = len(cfg["dflash_config"]["target_layer_ids"])
    shapes = {"fc.weight": (H, Lt * H), "hidden_norm.weight": (H,)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"layers.{i}."
        shapes.update({
            p + "input_layernorm.weight": (H,),
            p + "post_attention_layernorm.weight": (H,),
            p + "self_attn.q_proj.weight": (nh * d, H),
            p + "self_attn.k_proj.weight": (nkv * d, H),
            p + "self_attn.v_proj.weight": (nkv * d, H),
            p + "self_attn.o_proj.weight": (H, nh * d),
            p + "self_attn.q_norm.weight": (d,),
            p + "self_attn.k_norm.weight": (d,),
            p + "mlp.gate_proj.weight": (I, H),
            p + "mlp.up_proj.weight": (I, H),
            p + "mlp.down_proj.weight": (H, I),
        })
    shapes["norm.weight"] = (H,)
    return shapes


def block_visibility(layer_type, window, S, anchors, keep, B):
    """(A*B, S + A*B) bool: what block row (j, o) sees among [context ; block rows].
    Context row t: t < a_j, and in a sliding layer also t >= a_j + o - (window - 1).
    Block rows: same block only; all slots (full) or slots o' <= o (sliding).
    A block with keep = 0 is skipped: its rows see only themselves (no NaN, no effect)."""
    A = len(anchors)
    n = A * B
    vis = torch.zeros(n, S + n, dtype=torch.bool)
    t = torch.arange(S)
    o = torch.arange(B)
    sliding = layer_type == "sliding_attention"
    for j in range(A):
        rows = slice(j * B, (j + 1) * B)
        if not keep[j]:
            vis[rows, S + j * B:S + (j + 1) * B] = torch.eye(B, dtype=torch.bool)
            continue
        a = int(anchors[j])
        ctx = (t[None, :] < a).expand(B, S).clone()                               # (B, S)
        if sliding:
            ctx &= t[None, :] >= (a + o[:, None] - (window - 1))
        vis[rows, :S] = ctx
        own = torch.ones(B, B, dtype=torch.bool) if not sliding else (o[None, :] <= o[:, None])
        vis[rows, S + j * B:S + (j + 1) * B] = own
    return vis


def drafter_hidden(cfg, P, embed, x, X, anchors, keep):
    """One sequence. x (S,) long tokens, X (S, L_t*H) features, anchors (A,), keep (A,) bool.
    Returns hs (A*B, H): the final-normed block hidden states, row j*B + o."""
    nh, nkv, d = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    eps, theta, B = cfg["rms_norm_eps"], float(cfg["rope_theta"]), cfg["block_size"]
    window = cfg.get("sliding_window")
    mask_id = cfg["dflash_config"]["mask_token_id"]
    S, A = x.shape[0], anchors.shape[0]
    # 1. context
    C = rms_norm(X @ P["fc.weight"].T, P["hidden_norm.weight"], eps)               # (S, H)
    # 2. block inputs: x[a_j] at slot 0, the mask token elsewhere (a kept-0 block's anchor
    #    may be any padding value: it is clamped into range, its rows influence nothing)
    a_safe = torch.where(keep, anchors, torch.zeros_like(anchors)).clamp(0, S - 1)
    tokens = torch.full((A, B), mask_id, dtype=torch.long)
    tokens[:, 0] = x[a_safe]
    h = embed[tokens.reshape(-1)]                                                  # (A*B, H)
    # 3. positions
    pos_blk = (anchors[:, None] + torch.arange(B)[None, :]).reshape(-1)            # (A*B)
    pos_kv = torch.cat([torch.arange(S), pos_blk])                                 # (S + A*B)
    for i, layer_type in enumerate(cfg["layer_types"]):
        p = f"layers.{i}."
        u = rms_norm(h, P[p + "input_layernorm.weight"], eps)                      # (A*B, H)
        q = (u @ P[p + "self_attn.q_proj.weight"].T).reshape(-1, nh, d)
        q = rope(rms_norm(q, P[p + "self_attn.q_norm.weight"], eps), pos_blk, theta)
        ckv = torch.cat([C, u], dim=0)                                             # (S+A*B, H)
        k = (ckv @ P[p + "self_attn.k_proj.weight"].T).reshape(-1, nkv, d)
        k = rope(rms_norm(k, P[p + "self_attn.k_norm.weight"], eps), pos_kv, theta)
        v = (ckv @ P[p + "self_attn.v_proj.weight"].T).reshape(-1, nkv, d)
        vis = block_visibility(layer_type, window, S, anchors, keep, B)
        att = attention(q, k, v, vis, nkv)                                         # (A*B, nh*d)
        h = h + att @ P[p + "self_attn.o_proj.weight"].T
        vv = rms_norm(h, P[p + "post_attention_layernorm.weight"], eps)
        mlp = F.silu(vv @ P[p + "mlp.gate_proj.weight"].T) * (vv @ P[p + "mlp.up_proj.weight"].T)
        h = h + mlp @ P[p + "mlp.down_proj.weight"].T
    return rms_norm(h, P["norm.weight"], eps)


def slot_targets(cfg, x, m, th, anchors, keep, gamma, ce_target):
    """One sequence: per slot (j, k), row j*B + k, the teacher hidden th[a_j + k - 1] (or
    None), the label x[a_j + k] ("data"; -1 for k = 0, past the end or a kept-0 block) and
    the weight keep_j * [k >= 1] * [a_j + k < S] * m[a_j + k] * exp(-(k-1)/gamma)."""
    B = cfg["block_size"]
    S = x.shape[0]
    k = torch.arange(B)
    p = anchors[:, None] + k[None, :]                                              # (A, B)
    inside = (k[None, :] >= 1) & (p < S) & keep[:, None]
    p_safe = torch.where(inside, p, torch.zeros_like(p))
    decay = torch.exp(-(k.to(torch.float64) - 1.0) / gamma)                         # (B)
    w = inside.to(torch.float64) * m[p_safe].to(torch.float64) * decay[None, :]
    labels = torch.where(inside, x[p_safe], torch.full_like(p, -1)).reshape(-1)
    t_row = (p - 1).clamp(0, S - 1)                # th[a_j + k - 1]; only weighted rows count
    ht = None if th is None else th[t_row.reshape(-1)]
    return ht, (labels if ce_target == "data" else None), w.reshape(-1)


def drafter_step(cfg, params, embed, lm_head, batch, loss_cfg, dtype=torch.float64,
                 want_grads=True):
    """SPEC.md s.2 + s.1 over a batch.

    cfg: the drafter's config.json dict; params {export name: array}; embed, lm_head (V, H);
    batch {input_ids (nseq, S), loss_mask (nseq, S), features (nseq, S, L_t*H),
    teacher_hidden (nseq, S, H) or absent/None, anchors (nseq, A), keep (nseq, A)};
    loss_cfg {gamma, kl_weight, kl_temperature, cap_weight, cap_temperature, ce_target}.
    Returns {loss, ce, kl, cap, weight_sum, counted, correct, grads {name: ndarray}, plus
    per-slot zs, zt, labels, keep, hs for the fixtures}."""
    tt = lambda a: torch.as_tensor(np.asarray(a)).to(dtype)
    P = {k: tt(v).requires_grad_(want_grads) for k, v in params.items()}
    missing = set(drafter_param_shapes(cfg)) - set(P)
    if missing:
        raise ValueError(f"missing drafter parameters: {sorted(missing)}")
    E, W = tt(embed), tt(lm_head)
    ids = torch.as_tensor(np.asarray(batch["input_ids"]).astype(np.int64))
    mask = torch.as_tensor(np.asarray(batch["loss_mask"]).astype(np.int64))
    feats = tt(batch["features"])
    teacher = batch.get("teacher_hidden")
    teacher = None if teacher is None else tt(teacher)
    anchors = torch.as_tensor(np.asarray(batch["anchors"]).astype(np.int64))
    keep = torch.as_tensor(np.asarray(batch["keep"]).astype(np.int64)) != 0
    ce_target = loss_cfg.get("ce_target", "data")
    if ce_target not in ("data", "teacher"):
        raise ValueError(f"ce_target {ce_target!r}")
    if ce_target == "teacher" and teacher is None:
        raise ValueError('ce_target "teacher" needs teacher_hidden')
    hs_all, ht_all, y_all, w_all = [], [], [], []
    with torch.set_grad_enabled(want_grads):
        for s in range(ids.shape[0]):
            hs_all.append(drafter_hidden(cfg, P, E, ids[s], feats[s], anchors[s], keep[s]))
            ht, y, w = slot_targets(cfg, ids[s], mask[s], None if teacher is None else teacher[s],
                                    anchors[s], keep[s], float(loss_cfg["gamma"]), ce_target)
            ht_all.append(ht)
            y_all.append(y)
            w_all.append(w.to(dtype))
        hs = torch.cat(hs_all)                                                     # (n, H)
        ht = None if teacher is None else torch.cat(ht_all)
        y = None if ce_target == "teacher" else torch.cat(y_all)
        out = loss_section1(hs, ht, W, y, torch.cat(w_all), float(loss_cfg["kl_weight"]),
                            float(loss_cfg["kl_temperature"]), float(loss_cfg["cap_weight"]),
                            float(loss_cfg["cap_temperature"]))
    out["hs"] = hs.detach()
    out["weights"] = torch.cat(w_all)
    if want_grads:
        names = list(P)
        grads = torch.autograd.grad(out["loss_t"], [P[k] for k in names], allow_unused=True)
        out["grads"] = {k: (np.zeros(P[k].shape) if g is None else g.detach().double().numpy())
                        for k, g in zip(names, grads)}
    return out


# ------------------------------------------------------------------------------------------
# The target (SPEC.md section 3): Hugging Face llama / qwen3, forward only, causal


def target_config(cfg):
    """The fields of a HF config.json the forward needs, with the HF defaults."""
    mt = cfg.get("model_type")
    if mt not in ("llama", "qwen3"):
        raise ValueError(f"model_type {mt!r} is neither llama nor qwen3")
    if cfg.get("hidden_act", "silu") != "silu":
        raise ValueError(f"hidden_act {cfg.get('hidden_act')!r}")
    rs = cfg.get("rope_scaling")
    if rs not in (None, {}) and rs.get("rope_type", rs.get("type")) not in (None, "default"):
        raise ValueError(f"rope_scaling {rs!r} is not in SPEC.md s.3")
    H, nh = cfg["hidden_size"], cfg["num_attention_heads"]
    return {
        "qk_norm": mt == "qwen3", "H": H, "nh": nh,
        "nkv": cfg.get("num_key_value_heads") or nh,
        "d": cfg.get("head_dim") or H // nh, "N": cfg["num_hidden_layers"],
        "eps": cfg.get("rms_norm_eps", 1e-6), "theta": float(cfg.get("rope_theta", 10000.0)),
        "tied": bool(cfg.get("tie_word_embeddings", False)),
        "bias": bool(cfg.get("attention_bias", False)), "V": cfg["vocab_size"],
    }


def target_forward(cfg, weights, token_ids, layer_ids, dtype=torch.float64):
    """One sequence. cfg: the HF config.json dict; weights {HF name: array} (model.* and
    lm_head.weight when untied); token_ids (S,). Returns {"layers": [(S, H) per id of
    layer_ids: the residual stream after that decoder layer], "final": (S, H) after the final
    norm, "logits": (S, V)} as tensors of dtype."""
    c = target_config(cfg)
    Wt = lambda name: torch.as_tensor(np.asarray(weights[name])).to(dtype)
    x = torch.as_tensor(np.asarray(token_ids).astype(np.int64))
    S = x.shape[0]
    pos = torch.arange(S)
    causal = torch.tril(torch.ones(S, S, dtype=torch.bool))                       # (S, S)
    h = Wt("model.embed_tokens.weight")[x]                                          # (S, H)
    taps = {}
    want = set(int(i) for i in layer_ids)
    for i in range(c["N"]):
        p = f"model.layers.{i}."
        u = rms_norm(h, Wt(p + "input_layernorm.weight"), c["eps"])
        proj = lambda n: u @ Wt(p + f"self_attn.{n}.weight").T + (
            Wt(p + f"self_attn.{n}.bias") if c["bias"] else 0.0)
        q = proj("q_proj").reshape(S, c["nh"], c["d"])
        k = proj("k_proj").reshape(S, c["nkv"], c["d"])
        v = proj("v_proj").reshape(S, c["nkv"], c["d"])
        if c["qk_norm"]:
            q = rms_norm(q, Wt(p + "self_attn.q_norm.weight"), c["eps"])
            k = rms_norm(k, Wt(p + "self_attn.k_norm.weight"), c["eps"])
        q, k = rope(q, pos, c["theta"]), rope(k, pos, c["theta"])
        att = attention(q, k, v, causal, c["nkv"])
        h = h + att @ Wt(p + "self_attn.o_proj.weight").T
        vv = rms_norm(h, Wt(p + "post_attention_layernorm.weight"), c["eps"])
        h = h + (F.silu(vv @ Wt(p + "mlp.gate_proj.weight").T)
                 * (vv @ Wt(p + "mlp.up_proj.weight").T)) @ Wt(p + "mlp.down_proj.weight").T
        if i in want:
            taps[i] = h
    final = rms_norm(h, Wt("model.norm.weight"), c["eps"])
    head = Wt("model.embed_tokens.weight") if c["tied"] else Wt("lm_head.weight")
    return {"layers": [taps[int(i)] for i in layer_ids], "final": final,
            "logits": final @ head.T}


def target_head(cfg, weights):
    """(V, H) array: lm_head.weight, or the embedding when tie_word_embeddings."""
    c = target_config(cfg)
    return np.asarray(weights["model.embed_tokens.weight" if c["tied"] else "lm_head.weight"])


def default_target_layer_ids(N, n):
    """SPEC.md s.3: round(1 + i*(N-4)/(n-1)), i < n; n = 1: [N/2] (integer division).
    round() is Python's (half to even); exact halves do not arise for the usual N, n."""
    if n == 1:
        return [N // 2]
    return [int(round(1 + i * (N - 4) / (n - 1))) for i in range(n)]


# ------------------------------------------------------------------------------------------
# Self-checks: python3 tests/oracle/reference.py


def _self_check():
    torch.manual_seed(0)
    g = np.random.default_rng(0)
    ok = True
    # (1) the drafter loss gradient against central finite differences (float64)
    cfg = {"hidden_size": 8, "num_hidden_layers": 2, "num_attention_heads": 4,
           "num_key_value_heads": 2, "head_dim": 4, "intermediate_size": 12,
           "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "block_size": 3, "sliding_window": 2,
           "layer_types": ["sliding_attention", "full_attention"],
           "dflash_config": {"mask_token_id": 1, "target_layer_ids": [0, 2]}}
    V, S = 11, 9
    params = {k: g.standard_normal(s) * (0.5 if len(s) == 2 else 0.1) + (1.0 if len(s) == 1 else 0)
              for k, s in drafter_param_shapes(cfg).items()}
    batch = {"input_ids": g.integers(0, V, (2, S)), "loss_mask": np.ones((2, S), np.uint8),
             "features": g.standard_normal((2, S, 16)), "teacher_hidden": g.standard_normal((2, S, 8)),
             "anchors": np.array([[0, 2, 7], [3, 5, 5]]), "keep": np.array([[1, 1, 1], [1, 0, 0]])}
    lc = {"gamma": 4.0, "kl_weight": 0.3, "kl_temperature": 2.0, "cap_weight": 0.0,
          "cap_temperature": 1.0, "ce_target": "data"}
    emb, head = g.standard_normal((V, 8)), g.standard_normal((V, 8))
    out = drafter_step(cfg, params, emb, head, batch, lc)
    worst = 0.0
    for name in ("fc.weight", "layers.0.self_attn.k_norm.weight", "layers.1.mlp.up_proj.weight",
                 "hidden_norm.weight", "layers.0.self_attn.q_proj.weight"):
        for _ in range(3):
            idx = tuple(g.integers(0, s) for s in params[name].shape)
            eps = 1e-6
            vals = []
            for sgn in (1, -1):
                pp = dict(params)
                pp[name] = params[name].copy()
                pp[name][idx] += sgn * eps
                vals.append(drafter_step(cfg, pp, emb, head, batch, lc, want_grads=False)["loss"])
            fd = (vals[0] - vals[1]) / (2 * eps)
            worst = max(worst, abs(fd - out["grads"][name][idx]) / (abs(fd) + 1e-8))
    print(f"drafter finite differences: worst relative error {worst:.2e}")
    ok &= worst < 1e-5
    # (2) target causality: the prefix's outputs do not depend on later tokens
    tc = {"model_type": "qwen3", "hidden_size": 8, "num_attention_heads": 4,
          "num_key_value_heads": 2, "head_dim": 6, "num_hidden_layers": 2, "vocab_size": 13,
          "rms_norm_eps": 1e-6, "tie_word_embeddings": True}
    tw = {"model.embed_tokens.weight": g.standard_normal((13, 8)),
          "model.norm.weight": 1 + 0.1 * g.standard_normal(8)}
    for i in range(2):
        p = f"model.layers.{i}."
        tw.update({p + "input_layernorm.weight": 1 + 0.1 * g.standard_normal(8),
                   p + "post_attention_layernorm.weight": 1 + 0.1 * g.standard_normal(8),
                   p + "self_attn.q_proj.weight": g.standard_normal((24, 8)) * 0.3,
                   p + "self_attn.k_proj.weight": g.standard_normal((12, 8)) * 0.3,
                   p + "self_attn.v_proj.weight": g.standard_normal((12, 8)) * 0.3,
                   p + "self_attn.o_proj.weight": g.standard_normal((8, 24)) * 0.3,
                   p + "self_attn.q_norm.weight": 1 + 0.1 * g.standard_normal(6),
                   p + "self_attn.k_norm.weight": 1 + 0.1 * g.standard_normal(6),
                   p + "mlp.gate_proj.weight": g.standard_normal((10, 8)) * 0.3,
                   p + "mlp.up_proj.weight": g.standard_normal((10, 8)) * 0.3,
                   p + "mlp.down_proj.weight": g.standard_normal((8, 10)) * 0.3})
    ids = g.integers(0, 13, 12)
    full = target_forward(tc, tw, ids, [0, 1])
    pre = target_forward(tc, tw, ids[:7], [0, 1])
    err = max(float((full["layers"][0][:7] - pre["layers"][0]).abs().max()),
              float((full["logits"][:7] - pre["logits"]).abs().max()))
    print(f"target causality: max prefix difference {err:.2e}")
    ok &= err < 1e-12
    ok &= default_target_layer_ids(64, 5) == [1, 16, 31, 46, 61]
    print("reference.py self-check:", "ok" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    import sys
    sys.exit(_self_check())
