#!/usr/bin/python3
"""step_torch_check.py: an independent PyTorch float64 oracle for `ddtreed step` (SPEC.md s.2 + s.1).

    /usr/bin/python3 tests/oracle/step_torch_check.py --ddtreed build/bin/ddtreed [--workdir DIR]

For a table of seeded random cases it writes the inputs of one training step in the file
formats of API.md ("ddtreed command line"): a drafter directory in the export format of SPEC.md
section 5 (config.json + model.safetensors, F32, one case BF16), a head file (embed_tokens.weight,
lm_head.weight), a batch file (input_ids, loss_mask, features, teacher_hidden when the case has
a teacher, anchors, keep) and a loss JSON; runs
`ddtreed step --drafter DIR --head FILE --batch FILE --loss FILE --out FILE [--chunk N]
[--vocab-tile M]`; and compares the loss, ce, kl, cap and weight_sum and the gradient of every
trainable parameter with tests/oracle/reference.py, which is SPEC.md written in float64 torch
autograd with a dense visibility mask, not the C code. The cases vary GQA ratios 1/2/4, head
dims 4/8/16 (nh*d != H too), block sizes 3/5/8, sliding windows below and above the block size,
full/sliding layer mixes, overlapping anchors, anchors whose block runs past the end, padded
anchors (keep 0), a sequence with no anchor at all, loss masks with zeros, ce_target data and
teacher, kl_weight 0 / 0.15 / 1, T 1 and 2, CAP on and off, chunk and vocab_tile. Labels are
partly aligned with the student's argmax (and teacher hidden states with the student's) so that
CAP's c_i = 1 occurs and is checked. A negative case: a batch without `anchors` must make
ddtreed exit non-zero naming the file and the tensor, and write no output.

--workdir DIR keeps every case's files under DIR (otherwise a temporary directory is removed).
--emulate runs the cases against a float32 torch emulation of `ddtreed step` that reads the same
files (a check of this harness and of the tolerances below, which fp32 arithmetic must meet);
it needs no ddtreed.

Exit status: 0 all passed, 1 a failure, 77 (ctest's "skipped") when ddtreed is not built or
torch is missing. Last line: `N passed, M failed`.
Dimension legend: nseq sequences, S context length, A anchors, B block size, H hidden,
V vocabulary, L_t tapped target layers.
"""

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

# Scalars: |C - ref| <= SCALAR_REL * |ref| + SCALAR_ABS. The C side is fp32 through a few
# layers: hs carries ~1e-6 relative error, logits (~2-6) ~1e-5 absolute at worst, and the
# loss is a weighted mean of log-sum-exps of those; 1e-5 relative is the bar of the issue.
# A wrong term (a weight, a mask, alpha, T^2, 1/Tc) moves a scalar by >= 1e-3 relative.
SCALAR_REL = 1e-5
# SCALAR_ABS: for a scalar near 0 (CAP when few c_i = 1, a small KL) the fp32 difference of
# log-sum-exps of magnitude ~5 is only good to ~1e-6 absolute.
SCALAR_ABS = 2e-6
# Gradients: per tensor, max |C - ref| <= GRAD_REL * max |ref| + GRAD_ABS: the bar.
# An fp32 emulation of this very math stays below ~1e-5 on these cases (run --emulate); any
# wrong visibility bit, position, weight or term moves some tensor by >= 1e-2.
GRAD_REL = 1e-3
# GRAD_ABS: the floor for a tensor that is all zero (no position left to learn from).
GRAD_ABS = 1e-7
# Fixtures: a counted position whose two largest float64 logits are closer than this is redrawn
# (student logits when CAP is on: its c_i could flip; teacher logits with ce_target "teacher":
# the label could flip). fp32 logits are good to ~1e-5 here, two orders below.
ARGMAX_GAP = 1e-3
# A ddtreed call taking longer than this is a failure (these cases take well under a second).
STEP_TIMEOUT_S = 120

SCALARS = ("loss", "ce", "kl", "cap", "weight_sum")

# ------------------------------------------------------------------------------------------
# Cases

# Every case: shapes, drafter config, loss config, fixture options and ddtreed options.
# rms_norm_eps (eps) is large in two cases so that reading it from config.json, and adding it
# inside the square root, is visible above fp32 rounding.
BASE = dict(eps=1e-6, theta=10000.0, gamma=4.0, kl=0.0, T=1.0, cap=0.0, Tc=1.0,
            ce_target="data", teacher=True, chunk=None, vocab_tile=None, dtype="F32",
            anchors="uniform", pad=0, pad_value="last", mask_zeros=0.0, masked_seqs=0,
            align=True)

CASES = [
    dict(name="mha_d4_full_B3_no_teacher", seed=1, H=16, nh=4, nkv=4, d=4, I=24,
         layers=["full_attention"], Wn=4, B=3, V=50, S=12, nseq=2, A=3, Lt=1,
         teacher=False, gamma=7.0),
    dict(name="gqa2_d8_sliding_Wn2_B5_overlap", seed=2, H=24, nh=4, nkv=2, d=8, I=40,
         layers=["sliding_attention", "full_attention"], Wn=2, B=5, V=101, S=20, nseq=2, A=4,
         Lt=2, kl=0.15, cap=0.1, Tc=0.7, anchors="overlap", chunk=7, theta=1e6, eps=1e-3),
    dict(name="gqa4_d16_B8_Wn9_teacher_T2_near_end_padded", seed=3, H=32, nh=8, nkv=2, d=16,
         I=48, layers=["sliding_attention", "sliding_attention", "full_attention"], Wn=9, B=8,
         V=200, S=40, nseq=3, A=6, Lt=3, ce_target="teacher", kl=1.0, T=2.0,
         anchors="near_end", pad=2, chunk=16, vocab_tile=64, gamma=10.0),
    dict(name="gqa2_H48_teacher_cap_masks_tiled", seed=4, H=48, nh=6, nkv=3, d=8, I=64,
         layers=["full_attention", "sliding_attention"], Wn=3, B=5, V=150, S=30, nseq=2, A=5,
         Lt=2, ce_target="teacher", kl=0.15, cap=0.2, Tc=0.5, mask_zeros=0.2, vocab_tile=37,
         eps=1e-5),
    dict(name="bf16_drafter_one_sliding_layer_dense_anchors", seed=5, H=16, nh=2, nkv=1, d=8,
         I=32, layers=["sliding_attention"], Wn=4, B=3, V=64, S=16, nseq=1, A=6, Lt=1,
         kl=0.15, T=2.0, cap=0.3, Tc=1.0, anchors="overlap", chunk=5, dtype="BF16"),
    dict(name="short_seq_B8_past_end_padded_no_teacher_cap", seed=6, H=24, nh=4, nkv=1, d=4,
         I=36, layers=["full_attention", "full_attention"], Wn=8, B=8, V=80, S=14, nseq=2, A=4,
         Lt=2, teacher=False, cap=0.1, Tc=0.7, anchors="near_end", pad=1, pad_value="zero",
         chunk=1),
    dict(name="masked_sequence_mixed_layers_B3_Wn2", seed=7, H=20, nh=4, nkv=2, d=8, I=28,
         layers=["sliding_attention", "full_attention", "sliding_attention"], Wn=2, B=3, V=90,
         S=18, nseq=3, A=4, Lt=2, kl=0.15, T=2.0, mask_zeros=0.25, masked_seqs=1,
         vocab_tile=16, chunk=9, eps=0.05),
    dict(name="kl_only_teacher_labels_cap_B5_Wn7", seed=8, H=32, nh=4, nkv=4, d=16, I=40,
         layers=["sliding_attention", "full_attention"], Wn=7, B=5, V=120, S=24, nseq=2, A=5,
         Lt=3, ce_target="teacher", kl=1.0, T=1.0, cap=0.5, Tc=0.7, anchors="overlap",
         pad=1, gamma=2.5),
    dict(name="data_T1_kl015_cap_all_near_end", seed=9, H=16, nh=4, nkv=2, d=4, I=20,
         layers=["full_attention"], Wn=4, B=5, V=60, S=12, nseq=2, A=3, Lt=1, kl=0.15,
         cap=0.2, Tc=0.7, anchors="near_end", mask_zeros=0.15),
    dict(name="no_kept_anchor_zero_loss", seed=10, H=16, nh=2, nkv=2, d=8, I=16,
         layers=["sliding_attention"], Wn=3, B=3, V=40, S=10, nseq=2, A=2, Lt=1, kl=0.15,
         masked_seqs=2),
]


def draw_anchors(g, m, A, pad, mode, pad_value):
    """SPEC.md s.2 anchors for one sequence: candidates p in [0, S-2] with m[p] = m[p+1] = 1,
    min(A - pad, #candidates) of them without replacement, sorted; the rest padding (keep 0)
    whose anchor value is the last kept anchor (pad_value "last": the row stays sorted) or 0
    ("zero"; a block with keep 0 is skipped entirely, so its anchor value must not matter).
    mode: "uniform" (SPEC's draw), "overlap" (a run of close candidates: a_j + B > a_{j+1}),
    "near_end" (the last candidates included, so blocks run past the end)."""
    S = len(m)
    cand = [p for p in range(S - 1) if m[p] and m[p + 1]]
    n = min(A - pad, len(cand))
    if n <= 0:
        chosen = []
    elif mode == "uniform":
        chosen = sorted(g.choice(cand, size=n, replace=False).tolist())
    elif mode == "overlap":
        start = int(g.integers(0, len(cand) - n + 1))
        chosen = cand[start:start + n]
    elif mode == "near_end":
        tail = cand[-max(1, n // 2):]
        rest = [p for p in cand if p not in tail]
        pick = g.choice(rest, size=n - len(tail), replace=False).tolist() if n > len(tail) else []
        chosen = sorted(pick + tail)
    else:
        raise ValueError(mode)
    anchors = np.zeros(A, dtype=np.int32)
    keep = np.zeros(A, dtype=np.uint8)
    anchors[:len(chosen)] = chosen
    keep[:len(chosen)] = 1
    if 0 < len(chosen) < A and pad_value == "last":
        anchors[len(chosen):] = chosen[-1]
    return anchors, keep


def drafter_config(c, target_layer_ids, num_target_layers):
    """config.json in the export format of SPEC.md section 5."""
    return {
        "architectures": ["DFlashDraftModel"], "model_type": "qwen3",
        "hidden_size": c["H"], "num_hidden_layers": len(c["layers"]),
        "num_attention_heads": c["nh"], "num_key_value_heads": c["nkv"], "head_dim": c["d"],
        "intermediate_size": c["I"], "rms_norm_eps": c["eps"], "rope_theta": c["theta"],
        "layer_types": list(c["layers"]), "sliding_window": c["Wn"], "block_size": c["B"],
        "num_target_layers": num_target_layers,
        "dflash_config": {"mask_token_id": c["V"] - 1, "target_layer_ids": target_layer_ids},
        "rope_scaling": None, "tie_word_embeddings": False, "attention_bias": False,
        "hidden_act": "silu", "vocab_size": c["V"],
    }


def make_inputs(c, seed):
    """Random inputs of case c from seed: (cfg, params, embed, lm_head, batch, loss_cfg)."""
    g = np.random.default_rng(seed)
    H, V, S, nseq, A, Lt = c["H"], c["V"], c["S"], c["nseq"], c["A"], c["Lt"]
    num_target = Lt * 2 + 2
    tl_ids = sorted(g.choice(num_target - 1, size=Lt, replace=False).tolist())
    cfg = drafter_config(c, tl_ids, num_target)
    params = {}
    for name, shape in R.drafter_param_shapes(cfg).items():
        if len(shape) == 1:     # norm gains around 1
            w = 1.0 + 0.2 * g.standard_normal(shape)
        else:                   # [out, in]: unit-variance outputs for unit-variance inputs
            w = g.standard_normal(shape) / np.sqrt(shape[1])
        w = w.astype(np.float32)
        params[name] = st.bf16_round(w) if c["dtype"] == "BF16" else w
    embed = g.standard_normal((V, H)).astype(np.float32)                          # (V, H)
    lm_head = (g.standard_normal((V, H)) * (2.0 / np.sqrt(H))).astype(np.float32)  # (V, H)
    ids = g.integers(0, V - 1, size=(nseq, S)).astype(np.int32)   # the mask token is V - 1
    mask = (g.random((nseq, S)) >= c["mask_zeros"]).astype(np.uint8)
    for s in range(c["masked_seqs"]):
        mask[nseq - 1 - s] = 0
    anchors = np.zeros((nseq, A), dtype=np.int32)
    keep = np.zeros((nseq, A), dtype=np.uint8)
    for s in range(nseq):
        anchors[s], keep[s] = draw_anchors(g, mask[s], A, c["pad"], c["anchors"],
                                            c["pad_value"])
    batch = {"input_ids": ids, "loss_mask": mask,
             "features": g.standard_normal((nseq, S, Lt * H)).astype(np.float32),
             "anchors": anchors, "keep": keep}
    if c["teacher"]:
        batch["teacher_hidden"] = g.standard_normal((nseq, S, H)).astype(np.float32)
    loss_cfg = {"gamma": c["gamma"], "kl_weight": c["kl"], "kl_temperature": c["T"],
                "cap_weight": c["cap"], "cap_temperature": c["Tc"], "ce_target": c["ce_target"]}
    if c["align"]:
        align_with_student(g, cfg, params, embed, lm_head, batch, loss_cfg)
    return cfg, params, embed, lm_head, batch, loss_cfg


def align_with_student(g, cfg, params, embed, lm_head, batch, loss_cfg):
    """Makes c_i = 1 (CAP) and agreeing teachers occur: for about half the weighted slots
    (j, k), the data label x[a_j + k] becomes the student's argmax there (only positions that
    are no anchor: the student reads x only at anchors, so it does not change), and the teacher
    hidden th[a_j + k - 1] becomes the student's hidden plus noise."""
    out = R.drafter_step(cfg, params, embed, lm_head, batch, loss_cfg, want_grads=False)
    B = cfg["block_size"]
    nseq, S = batch["input_ids"].shape
    A = batch["anchors"].shape[1]
    zs, hs, w = out["zs"].numpy(), out["hs"].numpy(), out["weights"].numpy()
    for s in range(nseq):
        kept = set(int(a) for a, k in zip(batch["anchors"][s], batch["keep"][s]) if k)
        for j in range(A):
            for k in range(1, B):
                row = (s * A + j) * B + k
                p = int(batch["anchors"][s, j]) + k
                if w[row] <= 0 or g.random() < 0.5:
                    continue
                if p not in kept and p != 0:
                    batch["input_ids"][s, p] = int(np.argmax(zs[row]))
                if "teacher_hidden" in batch:
                    batch["teacher_hidden"][s, p - 1] = (
                        hs[row] + 0.5 * g.standard_normal(hs.shape[1])).astype(np.float32)


def near_tie(out, loss_cfg):
    """True when a counted position's argmax could legitimately differ in fp32."""
    keep = out["keep"]
    if loss_cfg["cap_weight"] > 0 and \
            bool((harness.top2_gap(out["zs"])[keep] < ARGMAX_GAP).any()):
        return True
    if loss_cfg["ce_target"] == "teacher" and \
            bool((harness.top2_gap(out["zt"])[keep] < ARGMAX_GAP).any()):
        return True
    return False


# ------------------------------------------------------------------------------------------
# Files (API.md "ddtreed command line")


def write_inputs(case_dir, cfg, params, embed, lm_head, batch, loss_cfg, dtype,
                 drop_anchors=False):
    os.makedirs(case_dir, exist_ok=True)
    ddir = os.path.join(case_dir, "drafter")
    os.makedirs(ddir, exist_ok=True)
    harness.write_json(os.path.join(ddir, "config.json"), cfg)
    st.write(os.path.join(ddir, "model.safetensors"), params,
             dtypes={k: dtype for k in params}, metadata={"format": "pt"})
    head = os.path.join(case_dir, "head.safetensors")
    st.write(head, {"embed_tokens.weight": embed, "lm_head.weight": lm_head})
    bfile = os.path.join(case_dir, "batch.safetensors")
    tensors = {k: batch[k] for k in ("input_ids", "loss_mask", "features", "teacher_hidden",
                                     "anchors", "keep") if k in batch}
    if drop_anchors:
        del tensors["anchors"]
    st.write(bfile, tensors)
    lfile = os.path.join(case_dir, "loss.json")
    harness.write_json(lfile, loss_cfg)
    return ddir, head, bfile, lfile


def run_step(tool, ddir, head, bfile, lfile, out, chunk, vocab_tile):
    """(exit status, stdout + stderr) of one `ddtreed step` (or of the emulation)."""
    args = ["step", "--drafter", ddir, "--head", head, "--batch", bfile, "--loss", lfile,
            "--out", out]
    if chunk is not None:
        args += ["--chunk", str(chunk)]
    if vocab_tile is not None:
        args += ["--vocab-tile", str(vocab_tile)]
    return harness.run_ddtreed(tool, args, out, STEP_TIMEOUT_S,
                               lambda: emulate_step(ddir, head, bfile, lfile, out))


def emulate_step(ddir, head, bfile, lfile, out):
    """`ddtreed step` in float32 torch, reading and writing the API.md files (--emulate)."""
    cfg = harness.read_json(os.path.join(ddir, "config.json"))
    params = st.read(os.path.join(ddir, "model.safetensors")).tensors
    hf = st.read(head)
    bf = st.read(bfile)
    harness.require_tensors(bf, bfile, ("input_ids", "loss_mask", "features", "anchors", "keep"))
    res = R.drafter_step(cfg, params, hf["embed_tokens.weight"], hf["lm_head.weight"],
                         bf.tensors, harness.read_json(lfile), dtype=torch.float32)
    tensors = {k: np.array(res[k], dtype=np.float64) for k in SCALARS}
    tensors.update({f"grad.{k}": v.astype(np.float32) for k, v in res["grads"].items()})
    st.write(out, tensors)


# ------------------------------------------------------------------------------------------
# Checks


def compare(res_file, ref, param_shapes):
    """(errors, worst relative gradient error, its tensor) of ddtreed's output against ref."""
    errors = []
    try:
        f = st.read(res_file)
    except (OSError, st.StError) as exc:
        return [f"output unreadable: {exc}"], float("nan"), ""
    for k in SCALARS:
        if k not in f:
            errors.append(f"output lacks {k}")
            continue
        if f.dtypes[k] != "F64" or f[k].size != 1:
            errors.append(f"{k}: {f.dtypes[k]} {list(f[k].shape)}, expected an F64 scalar")
        cv, rv = float(f[k].reshape(-1)[0]), ref[k]
        if not abs(cv - rv) <= SCALAR_REL * abs(rv) + SCALAR_ABS:
            errors.append(f"{k}: ddtreed {cv!r} ref {rv!r}")
    worst, worst_name = 0.0, ""
    for name, shape in param_shapes.items():
        key = "grad." + name
        if key not in f:
            errors.append(f"output lacks {key}")
            continue
        got = f[key]
        if f.dtypes[key] != "F32" or tuple(got.shape) != tuple(shape):
            errors.append(f"{key}: {f.dtypes[key]} {list(got.shape)}, expected F32 {list(shape)}")
            continue
        r = ref["grads"][name]
        if not np.all(np.isfinite(got)):
            errors.append(f"{key}: not finite")
            continue
        gmax = float(np.max(np.abs(r)))
        err = float(np.max(np.abs(got.astype(np.float64) - r)))
        rel = err / gmax if gmax > 0 else err
        if rel > worst or not worst_name:
            worst, worst_name = rel, name
        if not err <= GRAD_REL * gmax + GRAD_ABS:
            errors.append(f"{key}: max|diff| {err:.3e} > {GRAD_REL:g} * max|ref| {gmax:.3e}")
    extra = [k for k in f.tensors if k.startswith("grad.") and k[5:] not in param_shapes]
    if extra:
        errors.append(f"output has gradients of unknown parameters: {extra}")
    return errors, worst, worst_name


def run_case(tool, workdir, case):
    c = dict(BASE, **case)
    seed = c["seed"]
    for attempt in range(50):   # redraw fixtures with an fp32-fragile argmax (ARGMAX_GAP)
        cfg, params, embed, lm_head, batch, loss_cfg = make_inputs(c, seed * 1000 + attempt)
        ref = R.drafter_step(cfg, params, embed, lm_head, batch, loss_cfg)
        if not near_tie(ref, loss_cfg):
            break
    else:
        return ["fixture: could not avoid argmax near-ties"], ""
    case_dir = os.path.join(workdir, c["name"])
    files = write_inputs(case_dir, cfg, params, embed, lm_head, batch, loss_cfg, c["dtype"])
    out = os.path.join(case_dir, "out.safetensors")
    rc, text = run_step(tool, *files, out, c["chunk"], c["vocab_tile"])
    if rc != 0:
        return [f"ddtreed step exited {rc}: {text.strip()[-600:]}"], ""
    errors, worst, worst_name = compare(out, ref, R.drafter_param_shapes(cfg))
    info = (f"loss={ref['loss']:.6g} weight_sum={ref['weight_sum']:.4g} "
            f"counted={ref['counted']} c_i=1:{ref['correct']} "
            f"worst grad rel err {worst:.2e} ({worst_name})")
    return errors, info


def run_missing_anchors(tool, workdir):
    """A batch file without `anchors`: non-zero exit, a message naming the file and the
    tensor, no output file."""
    c = dict(BASE, **CASES[1])
    cfg, params, embed, lm_head, batch, loss_cfg = make_inputs(c, 4242)
    case_dir = os.path.join(workdir, "missing_anchors")
    files = write_inputs(case_dir, cfg, params, embed, lm_head, batch, loss_cfg, "F32",
                         drop_anchors=True)
    out = os.path.join(case_dir, "out.safetensors")
    rc, text = run_step(tool, *files, out, None, None)
    return harness.refusal_errors(rc, text, files[2], "anchors", out, "an output file")


def run_all(tool, workdir, cases):
    for case in CASES:
        cases.run(case["name"], run_case, tool, workdir, case)
    cases.run("batch_without_anchors_rejected", run_missing_anchors, tool, workdir)


def main():
    args = harness.ddtreed_options(__doc__).parse_args()
    return harness.ddtreed_main(args, "step_torch_check.", run_all)


if __name__ == "__main__":
    sys.exit(main())
