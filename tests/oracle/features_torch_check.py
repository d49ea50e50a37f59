#!/usr/bin/python3
"""features_torch_check.py: an independent PyTorch float64 oracle for `ddtreed features` (SPEC.md s.3, s.4).

    /usr/bin/python3 tests/oracle/features_torch_check.py --ddtreed build/bin/ddtreed \\
        [--model-dir ../shared/models/stories260k] [--workdir DIR]

(a) Random small Hugging Face directories (llama and qwen3; F32, BF16 and F16 weights; tied and
untied lm_head; head_dim given or defaulted, nh*d != H; one sharded with
model.safetensors.index.json) and a tokens file (input_ids I32 [Ttot], offsets I64 [nseq+1],
sequences of different lengths, one of length 1). It runs
`ddtreed features --model DIR --tokens FILE --layers L1,L2 --dtype f32|bf16 --out FILE` and
compares the feature shard (SPEC.md s.4: input_ids, loss_mask all 1, offsets, features
[Ttot, L_t*H] = the residual stream after each requested decoder layer, concatenated in the
order of --layers, teacher_hidden [Ttot, H] after the final norm, __metadata__ format, version,
hidden_size, target_layer_ids, vocab_size) with tests/oracle/reference.py's float64 forward,
run per sequence from position 0. One case taps the last decoder layer (its output is the
residual stream, NOT the final-normed state HF's output_hidden_states reports there).
(b) The real model at --model-dir (stories260K; skipped with a note when absent): features and
teacher_hidden for the default target_layer_ids of a 2-layer drafter and for 0,3,4, and the
logits teacher_hidden @ lm_head^T (tied: embed_tokens) against the reference logits.
A negative case: a tokens file without `offsets` must make ddtreed exit non-zero naming the
file and the tensor, and write no shard.

--workdir DIR keeps the files; --emulate checks this harness against a float32 torch emulation
of `ddtreed features` (no ddtreed needed).
Exit status: 0 all passed, 1 a failure, 77 (skipped) when ddtreed is not built or torch is
missing. Last line: `N passed, M failed`. Prints the worst relative errors of each case.
Dimension legend: Ttot tokens of all sequences, H hidden, V vocabulary, L_t tapped layers.
"""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness          # noqa: E402

harness.require_torch()   # ctest reports 77 as skipped, never as passed
import numpy as np      # noqa: E402
import torch            # noqa: E402

import reference as R   # noqa: E402
import st               # noqa: E402

# ------------------------------------------------------------------------------------------
# Tolerances (each with the reason it is what it is)

# f32 output: per tapped layer (and for teacher_hidden, logits), max |C - ref| <= FEAT_REL *
# max |ref| + FEAT_ABS. fp32 compute through a few layers of width <= 64 is good to ~1e-6
# relative (an fp32 emulation shows ~3e-7 on the random models, ~3e-6 on stories260K, whose
# residual stream and logits are larger); 1e-4 is the bar. A wrong RoPE pairing,
# position, GQA mapping, norm or layer index is off by >= 1e-2.
FEAT_REL = 1e-4
FEAT_ABS = 1e-6
# bf16 output: each value is its fp32 value rounded to bf16, half an ulp = 2^-8 relative at
# most, plus the fp32 error (which can also flip a rounding: FEAT_REL * max |ref| covers it).
BF16_REL = 2.0 ** -8
# A ddtreed call taking longer than this is a failure (these models take well under a second).
FEATURES_TIMEOUT_S = 300

# ------------------------------------------------------------------------------------------
# Random HF directories

CASES = [
    dict(name="llama_f32_tied_default_head_dim_last_layer", seed=1, model_type="llama", N=3,
         H=32, nh=4, nkv=2, d=None, I=48, V=97, layers=[0, 2], dtype="F32", tied=True,
         shards=1, lengths=[17, 1, 30], out="f32"),
    dict(name="qwen3_bf16_untied_nh_d_ne_H", seed=2, model_type="qwen3", N=4, H=24, nh=4,
         nkv=1, d=12, I=40, V=150, layers=[1, 2], dtype="BF16", tied=False, shards=1,
         lengths=[25, 9], out="f32", theta=1e6, eps=1e-5),
    dict(name="llama_f32_untied_sharded_one_layer", seed=3, model_type="llama", N=5, H=16, nh=2,
         nkv=2, d=8, I=24, V=64, layers=[2], dtype="F32", tied=False, shards=3,
         lengths=[40], out="f32"),
    dict(name="qwen3_f32_tied_gqa4", seed=4, model_type="qwen3", N=2, H=40, nh=8, nkv=2, d=8,
         I=56, V=120, layers=[0, 1], dtype="F32", tied=True, shards=1, lengths=[12, 33, 5],
         out="f32", theta=5e5),
    dict(name="llama_f16_untied_bf16_out", seed=5, model_type="llama", N=3, H=32, nh=4, nkv=4,
         d=8, I=40, V=80, layers=[0, 1, 2], dtype="F16", tied=False, shards=2,
         lengths=[20, 14], out="bf16"),
    dict(name="qwen3_bf16_tied_sharded_three_layers", seed=6, model_type="qwen3", N=4, H=16,
         nh=2, nkv=1, d=16, I=32, V=70, layers=[1, 2, 3], dtype="BF16", tied=True, shards=2,
         lengths=[3, 28], out="f32", eps=1e-5),
]


def make_model_dir(directory, c):
    """Writes a random HF llama/qwen3 directory for case c (config.json + safetensors)."""
    g = np.random.default_rng(c["seed"])
    H, nh, nkv, I, V, N = c["H"], c["nh"], c["nkv"], c["I"], c["V"], c["N"]
    d = c["d"] or H // nh
    cfg = {"architectures": ["LlamaForCausalLM" if c["model_type"] == "llama"
                             else "Qwen3ForCausalLM"],
           "model_type": c["model_type"], "hidden_size": H, "intermediate_size": I,
           "num_hidden_layers": N, "num_attention_heads": nh, "num_key_value_heads": nkv,
           "vocab_size": V, "max_position_embeddings": 256,
           "rms_norm_eps": c.get("eps", 1e-6), "rope_theta": c.get("theta", 10000.0),
           "hidden_act": "silu", "tie_word_embeddings": c["tied"], "attention_bias": False,
           "rope_scaling": None, "bos_token_id": 1, "eos_token_id": 2,
           "torch_dtype": {"F32": "float32", "BF16": "bfloat16", "F16": "float16"}[c["dtype"]]}
    if c["d"] is not None:
        cfg["head_dim"] = d
    lin = lambda o, i: (g.standard_normal((o, i)) / np.sqrt(i)).astype(np.float32)
    gain = lambda n: (1.0 + 0.2 * g.standard_normal(n)).astype(np.float32)
    w = {"model.embed_tokens.weight": g.standard_normal((V, H)).astype(np.float32)}
    for i in range(N):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = gain(H)
        w[p + "self_attn.q_proj.weight"] = lin(nh * d, H)
        w[p + "self_attn.k_proj.weight"] = lin(nkv * d, H)
        w[p + "self_attn.v_proj.weight"] = lin(nkv * d, H)
        w[p + "self_attn.o_proj.weight"] = lin(H, nh * d)
        if c["model_type"] == "qwen3":
            w[p + "self_attn.q_norm.weight"] = gain(d)
            w[p + "self_attn.k_norm.weight"] = gain(d)
        w[p + "post_attention_layernorm.weight"] = gain(H)
        w[p + "mlp.gate_proj.weight"] = lin(I, H)
        w[p + "mlp.up_proj.weight"] = lin(I, H)
        w[p + "mlp.down_proj.weight"] = lin(H, I)
    w["model.norm.weight"] = gain(H)
    if not c["tied"]:
        w["lm_head.weight"] = (g.standard_normal((V, H)) * (2.0 / np.sqrt(H))).astype(np.float32)
    os.makedirs(directory, exist_ok=True)
    harness.write_json(os.path.join(directory, "config.json"), cfg)
    st.write_model_dir(directory, w, {k: c["dtype"] for k in w}, shards=c["shards"])


def write_tokens(path, seqs, drop_offsets=False):
    offsets = np.concatenate([[0], np.cumsum([len(s) for s in seqs])]).astype(np.int64)
    tensors = {"input_ids": np.concatenate(seqs).astype(np.int32)}
    if not drop_offsets:
        tensors["offsets"] = offsets
    st.write(path, tensors)


# ------------------------------------------------------------------------------------------
# The reference shard and the comparison


def reference_shard(model_dir, seqs, layers):
    """{features (Ttot, L_t*H), teacher_hidden (Ttot, H), logits (Ttot, V)} in float64, each
    sequence run from position 0, reading the directory through st.py."""
    cfg = harness.read_json(os.path.join(model_dir, "config.json"))
    weights, _ = st.read_model_dir(model_dir)
    feats, final, logits = [], [], []
    for s in seqs:
        out = R.target_forward(cfg, weights, s, layers)
        feats.append(torch.cat(out["layers"], dim=1))
        final.append(out["final"])
        logits.append(out["logits"])
    return {"features": torch.cat(feats).numpy(), "teacher_hidden": torch.cat(final).numpy(),
            "logits": torch.cat(logits).numpy(), "cfg": cfg,
            "head": R.target_head(cfg, weights).astype(np.float64)}


def rel_err(got, ref, what, errors, bf16=False):
    """Appends to errors when got is off; returns max |got - ref| / max |ref|."""
    got = np.asarray(got, dtype=np.float64)
    if got.shape != ref.shape:
        errors.append(f"{what}: shape {list(got.shape)}, expected {list(ref.shape)}")
        return float("inf")
    if not np.all(np.isfinite(got)):
        errors.append(f"{what}: not finite")
        return float("inf")
    scale = float(np.max(np.abs(ref))) if ref.size else 0.0
    diff = np.abs(got - ref)
    tol = FEAT_REL * scale + FEAT_ABS + (BF16_REL * np.abs(ref) if bf16 else 0.0)
    if not np.all(diff <= tol):
        i = np.unravel_index(int(np.argmax(diff - tol)), diff.shape)
        errors.append(f"{what}: |diff| {diff[i]:.3e} > tol {np.broadcast_to(tol, diff.shape)[i]:.3e}"
                      f" at {tuple(int(x) for x in i)} (max|ref| {scale:.3e})")
    return float(np.max(diff)) / scale if scale > 0 else float(np.max(diff, initial=0.0))


def compare_shard(path, seqs, layers, ref, out_dtype, check_logits=False):
    """(errors, info) of the shard at path against the reference."""
    errors = []
    try:
        f = st.read(path)
    except (OSError, st.StError) as exc:
        return [f"shard unreadable: {exc}"], ""
    cfg = ref["cfg"]
    H = cfg["hidden_size"]
    Ttot = sum(len(s) for s in seqs)
    want_dtype = {"f32": "F32", "bf16": "BF16"}[out_dtype]
    for name in ("input_ids", "loss_mask", "offsets", "features", "teacher_hidden"):
        if name not in f:
            errors.append(f"shard lacks {name}")
    if errors:
        return errors, ""
    ids = np.concatenate(seqs).astype(np.int32)
    offsets = np.concatenate([[0], np.cumsum([len(s) for s in seqs])]).astype(np.int64)
    checks = [("input_ids", "I32", ids), ("loss_mask", "U8", np.ones(Ttot, np.uint8)),
              ("offsets", "I64", offsets)]
    for name, dt, want in checks:
        if f.dtypes[name] != dt or not np.array_equal(f[name], want):
            errors.append(f"{name}: {f.dtypes[name]} {list(f[name].shape)} differs from the "
                          f"expected {dt} {list(want.shape)}")
    for name in ("features", "teacher_hidden"):
        if f.dtypes[name] != want_dtype:
            errors.append(f"{name}: dtype {f.dtypes[name]}, expected {want_dtype}")
    bf16 = out_dtype == "bf16"
    worst = {}
    feats = f["features"]
    if feats.shape != (Ttot, len(layers) * H):
        errors.append(f"features: shape {list(feats.shape)}, expected {[Ttot, len(layers) * H]}")
    else:
        for li, layer in enumerate(layers):
            sl = slice(li * H, (li + 1) * H)
            worst[f"layer{layer}"] = rel_err(feats[:, sl], ref["features"][:, sl],
                                             f"features of layer {layer}", errors, bf16)
    worst["teacher_hidden"] = rel_err(f["teacher_hidden"], ref["teacher_hidden"],
                                      "teacher_hidden", errors, bf16)
    if check_logits and f["teacher_hidden"].shape == ref["teacher_hidden"].shape:
        logits = f["teacher_hidden"].astype(np.float64) @ ref["head"].T          # (Ttot, V)
        worst["logits"] = rel_err(logits, ref["logits"], "logits", errors, bf16)
    meta = f.metadata or {}
    want_meta = {"format": "ddtree-features", "version": "1", "hidden_size": str(H),
                 "vocab_size": str(cfg["vocab_size"])}
    for k, v in want_meta.items():
        if meta.get(k) != v:
            errors.append(f"metadata {k}: {meta.get(k)!r}, expected {v!r}")
    try:
        tl = json.loads(meta.get("target_layer_ids", "null"))
    except json.JSONDecodeError:
        tl = meta.get("target_layer_ids")
    if tl != list(layers):
        errors.append(f"metadata target_layer_ids: {meta.get('target_layer_ids')!r}, "
                      f"expected {json.dumps(list(layers))!r}")
    info = "worst rel err " + " ".join(f"{k}={v:.2e}" for k, v in worst.items())
    return errors, info


# ------------------------------------------------------------------------------------------
# Running ddtreed (or its emulation)


def run_features(tool, model_dir, tokens, layers, out_dtype, out):
    """(exit status, stdout + stderr) of one `ddtreed features` (or of the emulation)."""
    args = ["features", "--model", model_dir, "--tokens", tokens,
            "--layers", ",".join(str(x) for x in layers), "--dtype", out_dtype, "--out", out]
    return harness.run_ddtreed(tool, args, out, FEATURES_TIMEOUT_S,
                               lambda: emulate_features(model_dir, tokens, layers, out_dtype, out))


def emulate_features(model_dir, tokens, layers, out_dtype, out):
    """`ddtreed features` in float32 torch, reading and writing the same files (--emulate)."""
    cfg = harness.read_json(os.path.join(model_dir, "config.json"))
    weights, _ = st.read_model_dir(model_dir)
    tf = st.read(tokens)
    harness.require_tensors(tf, tokens, ("input_ids", "offsets"))
    ids, offsets = tf["input_ids"], tf["offsets"]
    feats, final = [], []
    for s in range(len(offsets) - 1):
        o = R.target_forward(cfg, weights, ids[offsets[s]:offsets[s + 1]], layers,
                             dtype=torch.float32)
        feats.append(torch.cat(o["layers"], dim=1))
        final.append(o["final"])
    dt = {"f32": "F32", "bf16": "BF16"}[out_dtype]
    st.write(out, {"input_ids": ids.astype(np.int32),
                   "loss_mask": np.ones(len(ids), np.uint8), "offsets": offsets,
                   "features": torch.cat(feats).numpy(), "teacher_hidden": torch.cat(final).numpy()},
             dtypes={"features": dt, "teacher_hidden": dt},
             metadata={"format": "ddtree-features", "version": "1",
                       "hidden_size": cfg["hidden_size"], "target_layer_ids": json.dumps(layers),
                       "vocab_size": cfg["vocab_size"], "target": "emulation"})


# ------------------------------------------------------------------------------------------
# Cases


def random_sequences(g, V, lengths):
    return [g.integers(0, V, size=n).astype(np.int32) for n in lengths]


def run_random_case(tool, workdir, c):
    case_dir = os.path.join(workdir, c["name"])
    model_dir = os.path.join(case_dir, "model")
    make_model_dir(model_dir, c)
    seqs = random_sequences(np.random.default_rng(c["seed"] + 100), c["V"], c["lengths"])
    tokens = os.path.join(case_dir, "tokens.safetensors")
    write_tokens(tokens, seqs)
    out = os.path.join(case_dir, "shard.safetensors")
    ref = reference_shard(model_dir, seqs, c["layers"])
    rc, text = run_features(tool, model_dir, tokens, c["layers"], c["out"], out)
    if rc != 0:
        return [f"ddtreed features exited {rc}: {text.strip()[-600:]}"], ""
    return compare_shard(out, seqs, c["layers"], ref, c["out"])


def sample_sequences(model_dir, lengths, seed):
    """Text the real model generates itself (temperature 1, seeded), each starting at BOS."""
    cfg = harness.read_json(os.path.join(model_dir, "config.json"))
    weights, _ = st.read_model_dir(model_dir)
    g = np.random.default_rng(seed)
    bos = int(cfg.get("bos_token_id", 1) or 1)
    seqs = []
    for n in lengths:
        ids = [bos]
        while len(ids) < n:
            logits = R.target_forward(cfg, weights, np.array(ids), [])["logits"][-1]
            p = torch.softmax(logits, dim=0).numpy()
            ids.append(int(g.choice(len(p), p=p / p.sum())))
        seqs.append(np.array(ids, dtype=np.int32))
    return seqs


def run_real_model(tool, workdir, model_dir):
    """[(name, errors, info)] for the real model, layers default (2-layer drafter) and 0,3,4."""
    N = harness.read_json(os.path.join(model_dir, "config.json"))["num_hidden_layers"]
    seqs = sample_sequences(model_dir, [48, 17, 64], seed=7)
    case_dir = os.path.join(workdir, "real_model")
    os.makedirs(case_dir, exist_ok=True)
    tokens = os.path.join(case_dir, "tokens.safetensors")
    write_tokens(tokens, seqs)
    results = []
    last = sorted({0, max(0, N - 2), N - 1})
    for layers, tag in ((R.default_target_layer_ids(N, 2), "default_layers"), (last, "first_last")):
        name = f"real_model_{tag}_{'_'.join(str(x) for x in layers)}"
        out = os.path.join(case_dir, f"{tag}.safetensors")
        ref = reference_shard(model_dir, seqs, layers)
        rc, text = run_features(tool, model_dir, tokens, layers, "f32", out)
        if rc != 0:
            results.append((name, [f"ddtreed features exited {rc}: {text.strip()[-600:]}"], ""))
            continue
        errors, info = compare_shard(out, seqs, layers, ref, "f32", check_logits=True)
        results.append((name, errors, info))
    return results


def run_missing_offsets(tool, workdir):
    """A tokens file without `offsets`: non-zero exit, a message naming the file and the
    tensor, no shard written."""
    c = CASES[0]
    case_dir = os.path.join(workdir, "missing_offsets")
    model_dir = os.path.join(case_dir, "model")
    make_model_dir(model_dir, c)
    tokens = os.path.join(case_dir, "tokens.safetensors")
    write_tokens(tokens, random_sequences(np.random.default_rng(9), c["V"], [6, 4]),
                 drop_offsets=True)
    out = os.path.join(case_dir, "shard.safetensors")
    rc, text = run_features(tool, model_dir, tokens, c["layers"], "f32", out)
    return harness.refusal_errors(rc, text, tokens, "offsets", out, "a shard")


def main():
    ap = harness.ddtreed_options(__doc__)
    ap.add_argument("--model-dir", default=os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "shared", "models",
        "stories260k"), help="a real HF llama/qwen3 directory (default ../shared/models/"
                             "stories260k beside the repository)")
    args = ap.parse_args()
    model_dir = os.path.abspath(args.model_dir)

    def run_all(tool, workdir, cases):
        for c in CASES:
            cases.run(c["name"], run_random_case, tool, workdir, c)
        if os.path.exists(os.path.join(model_dir, "config.json")):
            try:
                for name, errors, info in run_real_model(tool, workdir, model_dir):
                    cases.report(name, errors, info)
            except Exception as exc:
                cases.report("real_model", [f"exception: {exc!r}"])
        else:
            print(f"skipped real model: {model_dir} not found")
        cases.run("tokens_without_offsets_rejected", run_missing_offsets, tool, workdir)

    return harness.ddtreed_main(args, "features_torch_check.", run_all)


if __name__ == "__main__":
    sys.exit(main())
