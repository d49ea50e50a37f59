#!/usr/bin/python3
"""qwen35_reference_check.py: checks the float64 Qwen3.5/3.6 reference, oracle/qwen35.py (SPEC 3.1).

    /usr/bin/python3 tests/oracle/qwen35_reference_check.py [--model-dir ../shared/models/qwen35-tiny]

The reference is what the C target (CPU fp32 and CUDA bf16 paths) will be compared against, so
this script checks it against itself and against the facts of the toy checkpoint, never against
the C code:
(1) the three variants bf16/ (Qwen3.6 style, sharded), bf16-q35/ (A_log and the DeltaNet norm
    in F32) and text-only/ (model.* names, top-level config, F32) hold the same values and give
    the same taps, final and logits;
(2) the chunked DeltaNet equals the per-token recurrence, at every layer, for chunk sizes 1, 3,
    16, 64 and one larger than T, from a zero and from a non-zero entering state;
(3) prefill of T tokens equals token-by-token decode of them (taps and logits at every
    position), and a prefill in two pieces (the second chunked from the cache) equals one;
(4) verify a block of B tokens after a prefix, roll back to an accepted length a, decode the
    next token: equals a fresh prefill of prefix + accepted + next (and the rolled-back cache
    equals the fresh one), twice in a row;
(5) sanity: logits std near the README's ~3, DeltaNet decays exp(g) and betas inside (0, 1),
    no NaN or Inf anywhere;
(6) broken copies written to a temporary directory (a missing tensor, a wrong shape, a 2-D
    conv1d, Qwen3-Next's fused in_proj_qkvz, a missing config field) are refused with an error
    naming the tensor or field; an unbroken copy written the same way loads and agrees.
Exit status: 0 all passed, 1 a failure, 77 (skipped) when the model directory or numpy is
missing. One line per case, the last `N passed, M failed`. Errors are max |d| / max |ref| (per
layer where it says so), SPEC.md s.3.1's measure. Token ids from a fixed numpy RNG in [0, 512).
Pure numpy (no torch); runs in a few seconds.
"""

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SKIPPED = 77

try:
    import numpy as np
except ImportError as exc:
    print(f"skipped: numpy not available ({exc})")
    sys.exit(SKIPPED)

sys.path.insert(0, HERE)
import qwen35 as Q   # noqa: E402
from cases import Cases   # noqa: E402
import st            # noqa: E402

VARIANTS = ("bf16", "bf16-q35", "text-only")

# ------------------------------------------------------------------------------------------
# Tolerances (each with the reason it is what it is)

# (1) The variants hold the same values (on the bf16 grid, decoded exactly to float64) and the
# reference runs the same operations in the same order on them: the outputs are bit-identical.
# 1e-13 only leaves room for a BLAS that splits a reduction differently from call to call; a
# value decoded wrongly (a bf16 rounding, F16 for BF16) moves the logits by >= 1e-3.
VARIANT_REL = 1e-13
# (2) The chunked form reorders the sums and solves a unit lower-triangular system per chunk;
# in float64 through 8 layers that costs ~1e-14 relative. A wrong decay sign, a missing
# diagonal of E, a wrong key head for a value head or a dropped entering state is >= 1e-3.
CHUNK_REL = 1e-10
# (3), (4) Decode and verify reuse the same formulas with different operand grouping (one row
# at a time, K/V from the cache): rounding only, ~1e-15. An off-by-one RoPE position, a conv
# window shifted by a token or a state restored one position late is >= 1e-3.
DECODE_REL = 1e-10
# (5) The README: logits std ~3, decays in [0.06, 0.9997], betas in [0.04, 0.96] (over its own
# inputs: ours may reach slightly further, so only the open interval (0, 1) is a rule, plus a
# generous band for the logits std that a wrong norm (no 1 +, say) leaves).
LOGIT_STD_RANGE = (1.5, 6.0)

T_TOKENS = 48        # tokens per sequence (3 chunks of 16, less than one of 64)
SEED = 20240531


def rel(a, b):
    """max |a - b| / max |b| (b the reference), 0 when both are 0."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a.shape != b.shape:
        return float("inf")
    den = float(np.max(np.abs(b))) if b.size else 0.0
    num = float(np.max(np.abs(a - b))) if a.size else 0.0
    return num / den if den > 0 else num


def outputs_rel(got, ref):
    """(per-layer tap errors [L], final error, logits error) of two (taps, final, logits)."""
    taps = [rel(g, r) for g, r in zip(got[0], ref[0])]
    return taps, rel(got[1], ref[1]), rel(got[2], ref[2])


def fmt(x):
    return f"{x:.1e}"


# ------------------------------------------------------------------------------------------
# (1) the three variants


def case_variant_weights(models):
    errors, worst = [], 0.0
    base = models["bf16"]
    for name in VARIANTS[1:]:
        m = models[name]
        if set(m.W) != set(base.W):
            errors.append(f"{name}: tensor set differs from bf16/")
            continue
        for k in base.W:
            d = float(np.max(np.abs(m.W[k] - base.W[k])))
            worst = max(worst, d)
            if d != 0.0:
                errors.append(f"{name}: {k} differs by {d:.3e}")
    grid = all(np.array_equal(st.bf16_round(w.astype(np.float32)).astype(np.float64), w)
               for w in base.W.values())
    if not grid:
        errors.append("bf16/ values are not on the bf16 grid")
    stored = sorted({base.dtypes[k] for k in base.dtypes if not k.startswith("mtp.")})
    q35 = sorted({models["bf16-q35"].dtypes[k] for k in models["bf16-q35"].dtypes
                  if k.endswith(("A_log", "linear_attn.norm.weight"))})
    if q35 != ["F32"]:
        errors.append(f"bf16-q35/ stores A_log/norm as {q35}, the README says F32")
    return errors[:4], (f"max |dW| {worst:.1e} over {len(base.W)} tensors; bf16/ dtypes "
                        f"{stored}, bf16-q35/ A_log+norm {q35}, text-only/ prefix "
                        f"{models['text-only'].prefix!r}")


def case_variant_outputs(models, tokens):
    ref = models["bf16"].forward(tokens)
    errors, parts = [], []
    for name in VARIANTS[1:]:
        out = models[name].forward(tokens)
        taps, fin, lg = outputs_rel((out["taps"], out["final"], out["logits"]),
                                    (ref["taps"], ref["final"], ref["logits"]))
        worst = max(taps + [fin, lg])
        parts.append(f"{name} vs bf16: taps {fmt(max(taps))} final {fmt(fin)} logits {fmt(lg)}")
        if not worst <= VARIANT_REL:
            errors.append(f"{name}: {fmt(worst)} > {VARIANT_REL}")
    return errors, f"T={len(tokens)}; " + "; ".join(parts)


# ------------------------------------------------------------------------------------------
# (2) chunked == recurrent


def case_chunked_model(m, tokens, chunk):
    """The whole model with chunked DeltaNet against the recurrent one, per layer."""
    tr_r, tr_c = {}, {}
    ref = m.forward(tokens, deltanet="recurrent", trace=tr_r)
    out = m.forward(tokens, deltanet="chunked", chunk=chunk, trace=tr_c)
    taps, fin, lg = outputs_rel((out["taps"], out["final"], out["logits"]),
                                (ref["taps"], ref["final"], ref["logits"]))
    core = {i: rel(tr_c[i]["o"], tr_r[i]["o"]) for i in tr_r}
    state = {i: rel(tr_c[i]["S_out"], tr_r[i]["S_out"]) for i in tr_r}
    worst = max(taps + [fin, lg] + list(core.values()) + list(state.values()))
    errors = [] if worst <= CHUNK_REL else [f"worst {fmt(worst)} > {CHUNK_REL}"]
    per_layer = " ".join(fmt(e) for e in taps)
    return errors, (f"C={chunk} T={len(tokens)}: taps per layer [{per_layer}]; DeltaNet o "
                    f"{fmt(max(core.values()))}, final S {fmt(max(state.values()))}, logits "
                    f"{fmt(lg)}")


def case_chunked_core(m, tokens):
    """The two core functions alone on one layer's real inputs, from a non-zero entering state
    (the state after a prefix), for several chunk sizes; and T = 1."""
    trace = {}
    _, _, _, cache = m.prefill(tokens[:20])
    m.run(cache, tokens[20:], deltanet="recurrent", trace=trace)
    errors, parts = [], []
    for i, t in sorted(trace.items()):
        args = (t["qh"], t["kh"], t["v"], t["g"], t["beta"], t["S_in"])
        o_r, S_r = Q.deltanet_recurrent(*args)
        if not np.any(t["S_in"]):
            errors.append(f"layer {i}: entering state is zero")
        worst = 0.0
        for C in (1, 2, 5, 7, 28, 29, 100):
            o_c, S_c = Q.deltanet_chunked(*args, chunk=C)
            worst = max(worst, rel(o_c, o_r), rel(S_c, S_r))
        o1, S1 = Q.deltanet_recurrent(*(a[:1] for a in args[:5]), args[5])
        o1c, S1c = Q.deltanet_chunked(*(a[:1] for a in args[:5]), args[5], chunk=4)
        worst = max(worst, rel(o1c, o1), rel(S1c, S1))
        parts.append(f"L{i} {fmt(worst)}")
        if not worst <= CHUNK_REL:
            errors.append(f"layer {i}: {fmt(worst)} > {CHUNK_REL}")
    return errors, ("entering state from a 20-token prefix, T=28, C in 1,2,5,7,28,29,100 and "
                    "T=1: " + " ".join(parts))


# ------------------------------------------------------------------------------------------
# (3) prefill == decode


def case_prefill_decode(m, tokens, chunk):
    ref = m.prefill(tokens, chunk=chunk)
    cache = m.new_cache()
    steps = [m.decode(cache, t) for t in tokens]
    got = ([np.stack([s[0][i] for s in steps]) for i in range(m.c["L"])],
           np.stack([s[1] for s in steps]), np.stack([s[2] for s in steps]))
    taps, fin, lg = outputs_rel(got, ref[:3])
    cache_err = cache_rel(cache, ref[3])
    worst = max(taps + [fin, lg, cache_err])
    errors = [] if worst <= DECODE_REL else [f"worst {fmt(worst)} > {DECODE_REL}"]
    return errors, (f"T={len(tokens)}, prefill C={chunk}: taps {fmt(max(taps))} (worst layer "
                    f"{int(np.argmax(taps))}), final {fmt(fin)}, logits {fmt(lg)}, caches "
                    f"{fmt(cache_err)}")


def case_prefill_pieces(m, tokens, split, chunk):
    ref = m.prefill(tokens, chunk=chunk)
    first = m.prefill(tokens[:split], chunk=chunk)
    second = m.extend(first[3], tokens[split:], chunk=chunk)
    got = ([np.concatenate([a, b]) for a, b in zip(first[0], second[0])],
           np.concatenate([first[1], second[1]]), np.concatenate([first[2], second[2]]))
    taps, fin, lg = outputs_rel(got, ref[:3])
    cache_err = cache_rel(first[3], ref[3])
    worst = max(taps + [fin, lg, cache_err])
    errors = [] if worst <= DECODE_REL else [f"worst {fmt(worst)} > {DECODE_REL}"]
    return errors, (f"{split} + {len(tokens) - split} tokens, C={chunk}: taps {fmt(max(taps))}, "
                    f"logits {fmt(lg)}, caches {fmt(cache_err)}")


def cache_rel(a, b):
    """The worst relative difference of two caches (inf when their shapes or positions differ)."""
    if a.pos != b.pos:
        return float("inf")
    return max(rel(x[k], y[k]) for x, y in zip(a.layers, b.layers) for k in x)


# ------------------------------------------------------------------------------------------
# (4) verify + rollback


def case_verify_rollback(m, rng, P, B, accepted_list):
    """Rounds of: verify B tokens, roll back to a, decode a correction token; after each round
    the outputs and the cache must equal a fresh prefill of everything kept."""
    V = m.c["V"]
    stream = list(rng.integers(0, V, P))
    _, _, _, cache = m.prefill(stream, chunk=16)
    errors, parts = [], []
    for a in accepted_list:
        block = list(rng.integers(0, V, B))
        v_taps, v_final, v_logits = m.verify(cache, block)
        fresh = m.prefill(stream + block, chunk=16)
        n = len(stream)
        vt, vf, vl = outputs_rel((v_taps, v_final, v_logits),
                                 ([t[n:] for t in fresh[0]], fresh[1][n:], fresh[2][n:]))
        m.rollback(cache, a)
        kept = stream + block[:a]
        cache_err = cache_rel(cache, m.prefill(kept, chunk=16)[3])
        nxt = int(rng.integers(0, V))
        while a < B and nxt == block[a]:     # the target's correction differs from the draft
            nxt = int(rng.integers(0, V))
        d_taps, d_final, d_logits = m.decode(cache, nxt)
        stream = kept + [nxt]
        fresh = m.prefill(stream, chunk=16)
        dt, df, dl = outputs_rel((d_taps, d_final, d_logits),
                                 ([t[-1] for t in fresh[0]], fresh[1][-1], fresh[2][-1]))
        after = cache_rel(cache, fresh[3])
        worst = max(vt + [vf, vl, cache_err] + dt + [df, dl, after])
        parts.append(f"a={a}/{B}: verify {fmt(max(vt + [vf, vl]))}, rolled-back cache "
                     f"{fmt(cache_err)}, next-token taps {fmt(max(dt))} logits {fmt(dl)}")
        if not worst <= DECODE_REL:
            errors.append(f"a={a}: worst {fmt(worst)} > {DECODE_REL}")
    return errors, f"prefix {P}, B={B}; " + "; ".join(parts)


def case_rollback_misuse(m, tokens):
    """rollback() without verify(), or past the block, is refused; decode after verify keeps
    all B tokens."""
    errors = []
    _, _, _, cache = m.prefill(tokens[:10])
    try:
        m.rollback(cache, 0)
        errors.append("rollback without verify accepted")
    except ValueError:
        pass
    m.verify(cache, tokens[10:14])
    try:
        m.rollback(cache, 5)
        errors.append("rollback past the block accepted")
    except ValueError:
        pass
    got = m.decode(cache, tokens[14])
    ref = m.prefill(tokens[:15])
    e = rel(got[2], ref[2][-1])
    if not e <= DECODE_REL:
        errors.append(f"decode after verify without rollback: {fmt(e)}")
    return errors, f"decode after a full accept: logits {fmt(e)}"


# ------------------------------------------------------------------------------------------
# (5) sanity, and the pieces against their formulas written another way


def case_primitives(m, rng):
    """The conv against numpy's convolve (a flipped kernel: conv1d is a correlation), RoPE
    against its formula for unit vectors plus its relative-position property, softplus's
    threshold, l2norm's 1e-6."""
    errors = []
    K, Cc, T = m.c["K"], 6, 11
    hist = rng.standard_normal((K - 1 + T, Cc))
    hist[:K - 1] = 0.0                                                    # zero history
    w = rng.standard_normal((Cc, 1, K))
    y = Q.causal_conv(hist, w)
    y_np = np.stack([np.convolve(hist[K - 1:, ch], w[ch, 0, ::-1])[:T] for ch in range(Cc)], 1)
    e_conv = rel(y, y_np)
    if not e_conv <= 1e-14:
        errors.append(f"conv vs np.convolve {fmt(e_conv)}")
    hd, rd, theta = m.c["hd"], m.c["rd"], m.c["theta"]
    worst = 0.0
    for j in range(rd // 2):
        x = np.zeros((1, 1, hd))
        x[0, 0, j] = 1.0
        p = 7
        out = Q.rope_partial(x, np.array([p]), theta, rd)[0, 0]
        ang = p * theta ** (-2.0 * j / rd)
        want = np.zeros(hd)
        want[j], want[j + rd // 2] = np.cos(ang), np.sin(ang)
        worst = max(worst, float(np.max(np.abs(out - want))))
    x = rng.standard_normal((1, 1, hd))
    if not np.array_equal(Q.rope_partial(x, np.array([5]), theta, rd)[..., rd:], x[..., rd:]):
        errors.append("RoPE touches dims >= rd")
    q, k = rng.standard_normal((1, 1, hd)), rng.standard_normal((1, 1, hd))
    dots = [float(np.sum(Q.rope_partial(q, np.array([a + 9]), theta, rd)
                         * Q.rope_partial(k, np.array([a]), theta, rd))) for a in (0, 13, 400)]
    e_rel = max(abs(d - dots[0]) for d in dots) / abs(dots[0])
    if not (worst <= 1e-15 and e_rel <= 1e-12):
        errors.append(f"RoPE formula {fmt(worst)}, relative-position property {fmt(e_rel)}")
    sp = Q.softplus(np.array([20.5, 0.0, -30.0]))
    if not (sp[0] == 20.5 and abs(sp[1] - np.log(2.0)) < 1e-16 and 0 < sp[2] < 1e-12):
        errors.append(f"softplus {sp}")
    n = Q.l2norm(np.array([[3.0, 4.0], [0.0, 0.0]]))
    if not (np.allclose(n[0], np.array([3.0, 4.0]) / np.sqrt(25.0 + 1e-6), rtol=0, atol=1e-16)
            and not np.any(n[1])):
        errors.append(f"l2norm {n}")
    return errors, (f"conv vs np.convolve {fmt(e_conv)}; RoPE unit vectors {fmt(worst)}, "
                    f"relative-position {fmt(e_rel)} (rd={rd} of hd={hd}, theta {theta:g})")


def case_config_fallbacks(model_dir):
    """parse_config's fallbacks (SPEC.md s.3.1): layer_types from full_attention_interval
    (default 4), theta and factor from rope_parameters, then the top of text_config, then
    10000 / 0.25; text-only configs at the top level."""
    errors = []
    with open(os.path.join(model_dir, "bf16", "config.json")) as fh:
        nested = json.load(fh)
    with open(os.path.join(model_dir, "text-only", "config.json")) as fh:
        flat = json.load(fh)
    base = Q.parse_config(nested)
    if Q.parse_config(flat) != base:
        errors.append("the text-only config parses differently from the nested one")
    if base["layer_types"][3] != Q.FULL or base["rd"] != 8 or base["theta"] != 1e7:
        errors.append(f"nested: layer_types {base['layer_types']}, rd {base['rd']}, "
                      f"theta {base['theta']}")

    def variant(edit):
        cfg = json.loads(json.dumps(nested))
        edit(cfg["text_config"])
        return Q.parse_config(cfg)

    c = variant(lambda t: t.pop("layer_types"))
    if c["layer_types"] != base["layer_types"]:
        errors.append("layer_types from full_attention_interval 4 differ")
    c = variant(lambda t: (t.pop("layer_types"), t.pop("full_attention_interval")))
    if c["layer_types"] != base["layer_types"]:
        errors.append("layer_types from the default interval differ")
    c = variant(lambda t: (t.pop("layer_types"), t.update(full_attention_interval=2)))
    if c["layer_types"] != [Q.LINEAR, Q.FULL] * 4:
        errors.append(f"interval 2: {c['layer_types']}")
    c = variant(lambda t: (t.pop("rope_parameters"), t.update(rope_theta=5e5,
                                                              partial_rotary_factor=0.5)))
    if (c["theta"], c["rd"]) != (5e5, 16):
        errors.append(f"top-level rope fields: theta {c['theta']}, rd {c['rd']}")
    c = variant(lambda t: (t.pop("rope_parameters"), t.pop("partial_rotary_factor")))
    if (c["theta"], c["factor"], c["rd"]) != (10000.0, 0.25, 8):
        errors.append(f"defaults: theta {c['theta']}, factor {c['factor']}")
    c = variant(lambda t: t["rope_parameters"].pop("rope_theta"))
    if c["theta"] != 10000.0:
        errors.append(f"rope_parameters without rope_theta: {c['theta']}")
    for name, edit in (("qwen3_next", lambda t: t.update(model_type="qwen3_next")),
                       ("yarn", lambda t: t["rope_parameters"].update(rope_type="yarn"))):
        try:
            variant(edit)
            errors.append(f"accepted a {name} config")
        except Q.ModelError:
            pass
    return errors, ("text-only == nested; layer_types from interval 4 / default / 2; rope from "
                    "rope_parameters, text_config top, defaults 10000 / 0.25; qwen3_next and "
                    "yarn refused")


def case_tied(src, tmp, tokens):
    """tie_word_embeddings without lm_head.weight: the logits use embed_tokens."""
    def drop_head(t, d):
        t.pop("lm_head.weight")

    def tie(cfg):
        cfg["tie_word_embeddings"] = cfg["text_config"]["tie_word_embeddings"] = True
    m = Q.load(broken_copy(src, tmp, "tied", drop_head, tie))
    out = m.forward(tokens)
    e = rel(out["logits"], out["final"] @ m.W["embed_tokens.weight"].T)
    return ([] if e == 0.0 else [f"logits {fmt(e)}"]), f"logits vs final @ embed^T {fmt(e)}"



def case_sanity(m, tokens):
    trace = {}
    out = m.forward(tokens, trace=trace)
    errors = []
    arrays = out["taps"] + [out["final"], out["logits"]]
    if not all(np.all(np.isfinite(a)) for a in arrays):
        errors.append("NaN or Inf in the outputs")
    std = float(out["logits"].std())
    if not LOGIT_STD_RANGE[0] <= std <= LOGIT_STD_RANGE[1]:
        errors.append(f"logits std {std:.3f} outside {LOGIT_STD_RANGE}")
    decay = np.concatenate([np.exp(t["g"]).ravel() for t in trace.values()])
    beta = np.concatenate([t["beta"].ravel() for t in trace.values()])
    if not (decay.min() > 0 and decay.max() < 1):
        errors.append(f"decays exp(g) [{decay.min()}, {decay.max()}] not inside (0, 1)")
    if not (beta.min() > 0 and beta.max() < 1):
        errors.append(f"betas [{beta.min()}, {beta.max()}] not inside (0, 1)")
    if not all(np.all(np.isfinite(t[k])) for t in trace.values() for k in t):
        errors.append("NaN or Inf inside a DeltaNet layer")
    tap_rms = [float(np.sqrt(np.mean(t * t))) for t in out["taps"]]
    return errors, (f"logits std {std:.3f} (README ~3), mean {out['logits'].mean():+.3f}; "
                    f"decays exp(g) in [{decay.min():.4f}, {decay.max():.4f}] (README 0.06 .. "
                    f"0.9997); betas in [{beta.min():.3f}, {beta.max():.3f}] (README 0.04 .. "
                    f"0.96); tap rms per layer [" + " ".join(f"{r:.2f}" for r in tap_rms) + "]")


# ------------------------------------------------------------------------------------------
# (6) broken copies


def broken_copy(src, tmp, name, edit_tensors=None, edit_config=None):
    """A copy of src (config.json + weights, dtypes kept) in tmp/name with edits applied."""
    tensors, dtypes = st.read_model_dir(src)
    with open(os.path.join(src, "config.json")) as fh:
        cfg = json.load(fh)
    if edit_tensors:
        edit_tensors(tensors, dtypes)
    if edit_config:
        edit_config(cfg)
    d = os.path.join(tmp, name)
    st.write_model_dir(d, tensors, {k: dtypes[k] for k in tensors if k in dtypes})
    with open(os.path.join(d, "config.json"), "w") as fh:
        json.dump(cfg, fh, indent=1)
    return d


def case_broken(src, tmp, name, must_name, edit_tensors=None, edit_config=None):
    d = broken_copy(src, tmp, name, edit_tensors, edit_config)
    try:
        Q.load(d)
    except Q.ModelError as exc:
        msg = str(exc)
        if must_name not in msg:
            return [f"the error does not name {must_name!r}: {msg}"], ""
        return [], "refused: " + (msg[len(d):].lstrip(os.sep + ": ") if msg.startswith(d) else msg)
    return [f"loaded a copy with {name.replace('_', ' ')}"], ""


def case_unbroken_copy(src, tmp, tokens, ref_model):
    d = broken_copy(src, tmp, "unbroken")
    out = Q.load(d).forward(tokens)
    e = rel(out["logits"], ref_model.forward(tokens)["logits"])
    return ([] if e <= VARIANT_REL else [f"logits {fmt(e)}"]), f"logits {fmt(e)}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model-dir", default=os.path.join(HERE, "..", "..", "shared", "models",
                                                        "qwen35-tiny"))
    args = ap.parse_args()
    missing = [v for v in VARIANTS if not os.path.isfile(os.path.join(args.model_dir, v,
                                                                      "config.json"))]
    if missing:
        print(f"skipped: {args.model_dir} lacks {', '.join(v + '/' for v in missing)} "
              f"(the qwen35-tiny checkpoint from ../shared)")
        return SKIPPED
    start = time.time()
    models = {v: Q.load(os.path.join(args.model_dir, v)) for v in VARIANTS}
    m = models["bf16"]
    rng = np.random.default_rng(SEED)
    tokens = rng.integers(0, m.c["V"], T_TOKENS)
    cases = Cases()
    # (1)
    cases.run("variants_same_weights", case_variant_weights, models)
    cases.run("variants_same_outputs", case_variant_outputs, models, tokens)
    # (2)
    for C in (1, 3, 16, 64, T_TOKENS + 5):
        cases.run(f"chunked_eq_recurrent_C{C}", case_chunked_model, m, tokens, C)
    cases.run("chunked_eq_recurrent_core_nonzero_state", case_chunked_core, m, tokens)
    # (3)
    cases.run("prefill_eq_decode", case_prefill_decode, m, tokens, 16)
    cases.run("prefill_eq_decode_text_only", case_prefill_decode, models["text-only"],
              tokens[:24], 64)
    cases.run("prefill_in_pieces", case_prefill_pieces, m, tokens, 21, 8)
    # (4)
    cases.run("verify_rollback", case_verify_rollback, m, np.random.default_rng(SEED + 1),
              21, 8, [3, 0, 8, 7, 1])
    cases.run("rollback_misuse", case_rollback_misuse, m, tokens)
    # (5)
    cases.run("sanity", case_sanity, m, tokens)
    cases.run("primitives", case_primitives, m, np.random.default_rng(SEED + 2))
    cases.run("config_fallbacks", case_config_fallbacks, args.model_dir)
    # (6)
    src = os.path.join(args.model_dir, "bf16-q35")
    pre = "model.language_model.layers."
    tmp = tempfile.mkdtemp(prefix="qwen35_check_")
    try:
        cases.run("broken_control_unbroken_copy", case_unbroken_copy, src, tmp, tokens[:16], m)
        cases.run("tied_lm_head", case_tied, src, tmp, tokens[:16])
        cases.run("broken_missing_tensor", case_broken, src, tmp, "missing_k_norm",
                  pre + "3.self_attn.k_norm.weight",
                  lambda t, d: t.pop(pre + "3.self_attn.k_norm.weight"))

        def short_a(t, d):
            name = pre + "5.linear_attn.in_proj_a.weight"
            t[name] = t[name][:-1]
        cases.run("broken_wrong_shape", case_broken, src, tmp, "wrong_shape",
                  pre + "5.linear_attn.in_proj_a.weight", short_a)

        def conv_2d(t, d):
            w = t[pre + "1.linear_attn.conv1d.weight"]
            t[pre + "1.linear_attn.conv1d.weight"] = w.reshape(w.shape[0], w.shape[2])
        cases.run("broken_conv1d_2d", case_broken, src, tmp, "conv1d_2d",
                  pre + "1.linear_attn.conv1d.weight", conv_2d)

        def fused(t, d):
            p = pre + "0.linear_attn."
            t[p + "in_proj_qkvz.weight"] = np.concatenate(
                [t.pop(p + "in_proj_qkv.weight"), t.pop(p + "in_proj_z.weight")])
            d[p + "in_proj_qkvz.weight"] = "BF16"
        cases.run("broken_qwen3_next_fused_qkvz", case_broken, src, tmp, "fused_qkvz",
                  pre + "0.linear_attn.in_proj_qkvz.weight", fused)

        def no_field(cfg):
            del cfg["text_config"]["linear_num_value_heads"]
        cases.run("broken_missing_config_field", case_broken, src, tmp, "missing_field",
                  "linear_num_value_heads", None, no_field)

        def wrong_types(cfg):   # layer 2 declared full attention: its DeltaNet tensors are unused
            cfg["text_config"]["layer_types"][2] = "full_attention"
        cases.run("broken_layer_types", case_broken, src, tmp, "layer_types",
                  pre + "2.self_attn.", None, wrong_types)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"runtime {time.time() - start:.1f} s")
    return cases.summary()


if __name__ == "__main__":
    sys.exit(main())
