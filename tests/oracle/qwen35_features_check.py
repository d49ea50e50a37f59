#!/usr/bin/python3
"""qwen35_features_check.py: `ddtreed features` on Qwen3.5 / Qwen3.6 targets against the float64 reference (SPEC.md s.3.1, s.4).

    /usr/bin/python3 tests/oracle/qwen35_features_check.py --ddtreed build/bin/ddtreed \\
        [--model-dir ../shared/models/qwen35-tiny] [--workdir DIR]

For each of the three qwen35-tiny variants (bf16/: Qwen3.6 style, sharded; bf16-q35/: A_log and
the DeltaNet norm in F32; text-only/: a Qwen3_5ForCausalLM directory with model.* names) it
writes a token file (input_ids I32 [Ttot], offsets I64 [nseq+1]: sequences of ~40 tokens, one
of 1 token and one of 70, which crosses the DeltaNet core's 64-token chunk), runs
`ddtreed features --layers ...` with a DeltaNet layer, a full-attention layer and the last
layer among the taps (in an order that is not ascending), and compares the shard's features
(the residual stream after each tapped layer) and teacher_hidden (final-normed), and the logits
teacher_hidden @ lm_head^T, with tests/oracle/qwen35.py's float64 forward of each sequence from
position 0. Prints max |d| / max |ref| per tap. Then the same with `--weights bf16` (weights
held and products made in bf16, the GPU's precision, run on the CPU) at REL_TOL_BF16.

Exit status: 0 all passed, 1 a failure, 77 (skipped) when ddtreed is not built, the checkpoint
is absent or numpy is missing. Last line: `N passed, M failed`.
Dimension legend: Ttot tokens of all sequences, H hidden, V vocabulary, L_t tapped layers.
"""

import argparse
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
SKIPPED = 77

try:
    import numpy as np
except ImportError:
    print("skipped: numpy is missing")
    sys.exit(SKIPPED)

import qwen35 as Q                              # noqa: E402
from cases import Cases                         # noqa: E402
from features_run import ddtree_features, rel   # noqa: E402

# SPEC.md s.3.1's precision paragraph: the fp32 CPU path against float64 at 1e-4 (max |d| /
# max |ref| per tap); an fp32 forward from bf16 weights agrees to about 1e-6, while a wrong
# split, norm, RoPE pairing, decay or layer index is off by >= 1e-2.
REL_TOL = 1e-4
# `--weights bf16` (the GPU's precision, here on the CPU): matrices and the embedding held in
# bf16 and every product's activations rounded to bf16 (matmul_w16): the rounding of ~8
# bits of mantissa through 8 layers, measured 8.1e-3 on every variant; a wrong weight or
# split is off by far more than this (~1)
REL_TOL_BF16 = 2e-2
FEATURES_TIMEOUT_S = 300   # these models take well under a second

# variant -> the taps (qwen35-tiny: 8 layers, full attention at 3 and 7, DeltaNet elsewhere)
VARIANTS = [("bf16", [1, 3, 7]), ("bf16-q35", [7, 0, 3]), ("text-only", [2, 6, 7, 4])]
LENGTHS = [40, 1, 70, 37]


def case_variant(tool, model_dir, layers, workdir, extra=(), tol=REL_TOL):
    m = Q.load(model_dir)
    V = m.c["V"]
    rng = np.random.default_rng(len(layers))
    seqs = [rng.integers(0, V, n).astype(np.int32) for n in LENGTHS]
    try:
        got = ddtree_features(tool, model_dir, layers, seqs, workdir, FEATURES_TIMEOUT_S, extra)
    except RuntimeError as exc:
        return [str(exc)], ""
    errors = []
    ref = [m.forward(s) for s in seqs]
    worst = {}
    for layer in layers:
        want = np.concatenate([r["taps"][layer] for r in ref])                  # (Ttot, H)
        worst[f"layer{layer}{'F' if m.c['layer_types'][layer] == Q.FULL else 'D'}"] = rel(got["taps"][layer], want)
    worst["teacher_hidden"] = rel(got["final"], np.concatenate([r["final"] for r in ref]))
    worst["logits"] = rel(got["logits"], np.concatenate([r["logits"] for r in ref]))
    for k, v in worst.items():
        if not v <= tol:   # NaN fails too
            errors.append(f"{k}: max |d| / max |ref| = {v:.3e} > {tol:g}")
    return errors, "max|d|/max|ref| " + " ".join(f"{k}={v:.2e}" for k, v in worst.items())


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ddtreed", help="path to the ddtreed binary")
    ap.add_argument("--model-dir", default=os.path.join(HERE, "..", "..", "shared", "models", "qwen35-tiny"))
    ap.add_argument("--workdir", help="keep the files here (default: a temporary dir)")
    args = ap.parse_args()
    if not args.ddtreed or not os.path.exists(args.ddtreed):
        print(f"skipped: ddtreed not built ({args.ddtreed})")
        return SKIPPED
    if not os.path.isdir(args.model_dir):
        print(f"skipped: {args.model_dir} is absent (the qwen35-tiny checkpoint from ../shared)")
        return SKIPPED
    workdir = args.workdir or tempfile.mkdtemp(prefix="qwen35_features_")
    os.makedirs(workdir, exist_ok=True)
    cases = Cases()
    for variant, layers in VARIANTS:
        cases.run(f"features_{variant}", case_variant, os.path.abspath(args.ddtreed),
                  os.path.join(args.model_dir, variant), layers, workdir)
    for variant, layers in VARIANTS:
        cases.run(f"features_{variant}_weights_bf16", case_variant, os.path.abspath(args.ddtreed),
                  os.path.join(args.model_dir, variant), layers, workdir, ("--weights", "bf16"), REL_TOL_BF16)
    if not args.workdir:
        for name in os.listdir(workdir):
            os.remove(os.path.join(workdir, name))
        os.rmdir(workdir)
    return cases.summary()


if __name__ == "__main__":
    sys.exit(main())
