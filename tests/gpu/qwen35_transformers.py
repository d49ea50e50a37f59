#!/usr/bin/python3
"""qwen35_transformers.py: `ddtreed features` on the qwen35-tiny variants against Hugging Face
transformers' own Qwen3.5 model in float32 (a step of the GPU check; tests/gpu/README.md).

    python3 qwen35_transformers.py --ddtreed BIN --model-dir DIR [--devices cpu,cuda]
                                   [--only-ddtree] [--workdir DIR]

For each variant directory of DIR (bf16/, bf16-q35/, text-only/; ../shared/models/qwen35-tiny)
it writes a token file (sequences of 40, 1, 70, 37 and 130 tokens: one of a single token, two
that cross the DeltaNet core's 64-token chunk), runs `ddtreed features --dtype f32` with a
DeltaNet layer, a full-attention layer and the last layer among the taps (not in ascending
order), reads the shard back through st.py (the one reader of the format, tests/oracle/st.py)
and compares, per tap, the residual stream after that layer, teacher_hidden (final-normed) and
the logits teacher_hidden @ lm_head^T with:
  transformers-cpu   the directory loaded by transformers (the class its config.json names:
                     Qwen3_5ForConditionalGeneration, or Qwen3_5ForCausalLM for text-only/),
                     float32, eager attention, the torch Gated DeltaNet (never the fla /
                     causal-conv1d kernels), each sequence alone from position 0, on the CPU;
  transformers-cuda  the same model moved to the GPU (float32, TF32 off), where torch sees one
                     and --devices names cuda;
  oracle-f64         tests/oracle/qwen35.py's float64 forward (SPEC.md s.3.1), where it can be
                     imported (the bundle carries it).
Each comparison prints one line, `ok   VARIANT QUANTITY vs REFERENCE: max|d|/max|ref| = X`
(or FAIL), then `N passed, M failed` and, last, one JSON line for check.sh's results.jsonl
(impl "qwen35-vs-transformers": the figures per variant and reference, the worst, the
versions; or {"skipped": why}), which summary.py renders.

--only-ddtree: no transformers; ddtree against oracle-f64 only. This is how the plumbing (token
file, ddtreed, shard reading, per-tap slicing, comparison, JSON line) is tested where
transformers is absent (tests/gpu/bundle_check.sh runs it from the bundle).

Deliberately not here: bf16 (both sides run float32 here: the figure is the implementations'
difference, not rounding), the fla / causal-conv1d kernels, transformers' cached decoding,
vision input. Tested by tests/gpu/bundle_check.sh (--only-ddtree, and the skip without
transformers, from the bundle); the transformers side runs only where transformers is.

Exit status: 0 every comparison within tolerance; 1 one is not (the last FAIL line names the
worst figure); 77 (skipped) when transformers (or torch) is not importable or has no Qwen3.5
classes (not with --only-ddtree), numpy is missing, ddtreed is not built or DIR is absent.
Needs no GPU: on the device machine it runs on its CPU, and on its GPU as a second reference.

What this relies on in transformers (src/transformers/models/qwen3_5/modeling_qwen3_5.py at
commit d8c1e2844cbf, read for this script; transformers 5.x):
  - Qwen3_5GatedDeltaNet.__init__ takes causal_conv1d_fn / chunk_gated_delta_rule /
    fused_recurrent_gated_delta_rule / FusedRMSNormGated from the module's globals (None when
    causal-conv1d / flash-linear-attention are not installed) and falls back to
    torch_causal_conv1d_update, torch_chunk_gated_delta_rule, torch_recurrent_gated_delta_rule
    and Qwen3_5RMSNormGated; with fla installed it builds FusedRMSNormGated on
    torch.cuda.current_device(). force_torch_path() sets those globals to None before the model
    is built and then the attributes of every Qwen3_5GatedDeltaNet, so the CPU and CUDA runs both
    take the float32 torch path whatever is installed;
  - Qwen3_5TextModel.forward: decoder layers, then self.norm; the decoder layer returns a
    tensor. output_hidden_states (utils/output_capturing.py, capture_outputs with
    tie_last_hidden_states=True) gives hidden_states[0] = the embeddings, [l+1] = after layer
    l, but its LAST entry is replaced by last_hidden_state (after the final norm), so the
    residual stream after the last layer is not in it: the taps here come from forward hooks
    on the decoder layers and teacher_hidden from a hook on the final norm instead;
  - from_pretrained(dir, dtype=torch.float32, attn_implementation="eager",
    output_loading_info=True) (`dtype=`, not 4.x's `torch_dtype=`); mtp.* is ignored on load
    (_keys_to_ignore_on_load_unexpected); the vision tower of the ConditionalGeneration
    variants is absent from the checkpoint and unused by text input.
Dimension legend: Ttot tokens of all sequences, H hidden, V vocabulary, L_t tapped layers.
"""

import argparse
import importlib.util
import json
import math
import os
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
# st.py, cases.py, qwen35.py: beside this file in the bundle (py/), in tests/oracle in the tree
sys.path[:0] = [HERE, os.path.join(HERE, "..", "oracle")]
SKIPPED = 77
IMPL = "qwen35-vs-transformers"

# float32 against float32 (transformers) or float64 (the oracle): both forwards agree with
# float64 to ~2e-6 on this model (tests/oracle/qwen35_features_check.py), while a wrong split, norm,
# RoPE pairing, decay or layer index is off by >= 1e-2 (SPEC.md s.3.1's precision paragraph).
REL_TOL = 1e-4
FEATURES_TIMEOUT_S = 120   # these models take well under a second
LENGTHS = [40, 1, 70, 37, 130]
# variant -> taps (qwen35-tiny: 8 layers, full attention at 3 and 7, Gated DeltaNet elsewhere)
VARIANTS = [("bf16", [7, 0, 3, 5]), ("bf16-q35", [3, 6, 1, 7]), ("text-only", [2, 7, 4, 3])]
# token ids below the ConditionalGeneration config's vision ids (506..509), so that no version
# of transformers can take a token for an image placeholder: the comparison is of the text model
TOKEN_LIMIT = 506


def fail_json(key, why):
    print(json.dumps({"impl": IMPL, key: why}))


try:
    import numpy as np
    from cases import Cases                         # noqa: E402
    from features_run import ddtree_features, rel   # noqa: E402
except ImportError as exc:
    print(f"skipped: {exc}")
    fail_json("skipped", f"numpy or tests/oracle/features_run.py missing ({exc})")
    sys.exit(SKIPPED)


# ------------------------------------------------------------------------------------------
# The references: transformers (float32, CPU and CUDA) and the float64 oracle


def oracle_reference(model_dir, layers, seqs):
    import qwen35 as Q
    m = Q.load(model_dir)
    ref = [m.forward(s) for s in seqs]
    return {"taps": {layer: np.concatenate([r["taps"][layer] for r in ref]) for layer in layers},
            "final": np.concatenate([r["final"] for r in ref]),
            "logits": np.concatenate([r["logits"] for r in ref])}


class Transformers:
    """transformers and torch, imported once; run() loads one directory and returns its
    reference on each device."""

    def __init__(self):
        os.environ.setdefault("HF_HUB_OFFLINE", "1")        # the device machine has no network
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        import torch
        import transformers
        from transformers.models.qwen3_5 import modeling_qwen3_5 as mq
        self.torch, self.transformers, self.mq = torch, transformers, mq
        for name in ("Qwen3_5ForConditionalGeneration", "Qwen3_5ForCausalLM"):
            if not hasattr(transformers, name):
                raise ImportError(f"transformers {transformers.__version__} has no {name}")
        self.fast_libs = {"fla": getattr(mq, "chunk_gated_delta_rule", None) is not None,
                          "causal_conv1d": getattr(mq, "causal_conv1d_fn", None) is not None}
        self.versions = {"transformers": transformers.__version__, "torch": torch.__version__}

    def force_torch_path(self, model=None):
        """Before the model is built (model None): the module's kernel globals to None; after:
        every Gated DeltaNet's kernel attributes to the torch functions and its output norm to
        Qwen3_5RMSNormGated. Returns what could not be forced (empty when all was)."""
        mq = self.mq
        if model is None:
            for name in ("causal_conv1d_fn", "causal_conv1d_update", "chunk_gated_delta_rule",
                         "fused_recurrent_gated_delta_rule", "FusedRMSNormGated"):
                if hasattr(mq, name):
                    setattr(mq, name, None)
            return []
        missing = [n for n in ("Qwen3_5GatedDeltaNet", "Qwen3_5RMSNormGated", "torch_causal_conv1d_update",
                               "torch_chunk_gated_delta_rule", "torch_recurrent_gated_delta_rule")
                   if not hasattr(mq, n)]
        if missing:
            return [f"modeling_qwen3_5 has no {', '.join(missing)}: the Gated DeltaNet path is transformers' choice"]
        for mod in model.modules():
            if not isinstance(mod, mq.Qwen3_5GatedDeltaNet):
                continue
            mod.causal_conv1d_fn = None
            mod.causal_conv1d_update = mq.torch_causal_conv1d_update
            mod.chunk_gated_delta_rule = mq.torch_chunk_gated_delta_rule
            mod.recurrent_gated_delta_rule = mq.torch_recurrent_gated_delta_rule
            if not isinstance(mod.norm, mq.Qwen3_5RMSNormGated):   # fla's fused norm, on the GPU
                norm = mq.Qwen3_5RMSNormGated(mod.head_v_dim, eps=mod.layer_norm_epsilon)
                with self.torch.no_grad():
                    norm.weight.copy_(mod.norm.weight.detach().float().cpu())
                mod.norm = norm
        return []

    def run(self, model_dir, layers, seqs, devices):
        """{device: {"taps", "final", "logits"}} (float64 numpy) for each device of devices."""
        torch = self.torch
        with open(os.path.join(model_dir, "config.json")) as fh:   # the class transformers would pick
            arch = (json.load(fh).get("architectures") or ["?"])[0]
        cls = getattr(self.transformers, arch, None)
        if cls is None:
            raise RuntimeError(f"config.json names {arch}, which transformers does not have")
        self.force_torch_path()
        model, info = cls.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="eager",
                                          local_files_only=True, output_loading_info=True)
        info = info if isinstance(info, dict) else vars(info)
        missing = [k for k in info.get("missing_keys", []) if not k.startswith("model.visual.")]
        if missing or info.get("mismatched_keys"):
            raise RuntimeError(f"{arch}: weights not loaded: missing {missing[:6]}, "
                               f"mismatched {list(info.get('mismatched_keys', []))[:6]}")
        problems = self.force_torch_path(model)
        if problems:
            raise RuntimeError("; ".join(problems))
        model.eval()
        inner = model.model
        text = getattr(inner, "language_model", inner)      # ConditionalGeneration / CausalLM
        if not hasattr(text, "layers") or not hasattr(text, "norm"):
            raise RuntimeError(f"{arch}: no text model with .layers and .norm")
        seen = {}

        def keep(key):
            def hook(_module, _args, output):
                out = output[0] if isinstance(output, tuple) else output
                seen[key] = out.detach().to("cpu", torch.float64).numpy()[0]   # (T, H)
            return hook

        handles = [text.layers[layer].register_forward_hook(keep(layer)) for layer in set(layers)]
        handles.append(text.norm.register_forward_hook(keep("final")))
        results = {}
        try:
            for device in devices:
                model.to(device)
                parts = []
                for s in seqs:
                    seen.clear()
                    ids = torch.tensor(np.asarray(s, dtype=np.int64)[None, :], device=device)
                    with torch.no_grad():
                        out = model(input_ids=ids, use_cache=False)
                    logits = out.logits.detach().to("cpu", torch.float64).numpy()[0]   # (T, V)
                    parts.append((dict(seen), logits))
                results[device] = {
                    "taps": {layer: np.concatenate([p[layer] for p, _ in parts]) for layer in layers},
                    "final": np.concatenate([p["final"] for p, _ in parts]),
                    "logits": np.concatenate([lg for _, lg in parts])}
        finally:
            for h in handles:
                h.remove()
        return arch, results


def set_fp32_exact(torch):
    """No TF32 anywhere (cuBLAS matmuls, cuDNN's conv1d): float32 products on the GPU. torch >= 2.9
    has fp32_precision and refuses a mix of it with the older allow_tf32 flags."""
    if hasattr(torch.backends, "fp32_precision"):
        for obj in (torch.backends, torch.backends.cuda.matmul, torch.backends.cudnn,
                    getattr(torch.backends.cudnn, "conv", None)):
            if obj is not None and hasattr(obj, "fp32_precision"):
                try:
                    obj.fp32_precision = "ieee"
                except Exception:
                    pass
        return
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False


# ------------------------------------------------------------------------------------------


def quantity_names(layers, layer_types):
    return {layer: f"layer{layer}{'F' if layer_types[layer] == 'full_attention' else 'D'}" for layer in layers}


def compare(cases, variant, names, got, ref_name, ref, figures):
    """One case per quantity: taps in the shard's order, then teacher_hidden and the logits."""
    fig = figures.setdefault(f"{variant} {ref_name}", {})
    pairs = [(names[layer], got["taps"][layer], ref["taps"][layer]) for layer in names]
    pairs += [("teacher_hidden", got["final"], ref["final"]), ("logits", got["logits"], ref["logits"])]
    for qname, g, r in pairs:
        v = rel(g, r) if g.shape == r.shape else float("nan")
        fig[qname] = float(f"{v:.4g}") if math.isfinite(v) else "nan"
        ok = v <= REL_TOL   # NaN fails too
        shape = "" if g.shape == r.shape else f" (shapes {list(g.shape)} against {list(r.shape)})"
        cases.report(f"{variant} {qname} vs {ref_name}", [] if ok else [f"max|d|/max|ref| = {v:.3e} > {REL_TOL:g}{shape}"],
                     f"max|d|/max|ref| = {v:.3e}" if ok else "")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ddtreed", help="path to the ddtreed binary")
    ap.add_argument("--model-dir", default=os.path.join(HERE, "..", "..", "..", "shared", "models", "qwen35-tiny"))
    ap.add_argument("--devices", default="cpu,cuda", help="transformers' devices (cuda only where torch sees a GPU)")
    ap.add_argument("--only-ddtree", action="store_true",
                    help="no transformers: ddtree against the float64 oracle only (the plumbing's self-test)")
    ap.add_argument("--workdir", help="keep the token files and shards here (default: a temporary dir)")
    args = ap.parse_args()

    def skip(why):
        print(f"skipped: {why}")
        fail_json("skipped", why)
        return SKIPPED

    if not args.ddtreed or not os.path.exists(args.ddtreed):
        return skip(f"ddtreed not built ({args.ddtreed})")
    if not os.path.isdir(args.model_dir):
        return skip(f"{args.model_dir} is absent (the qwen35-tiny checkpoint)")
    tf, devices = None, []
    have_oracle = importlib.util.find_spec("qwen35") is not None   # the float64 oracle (numpy only)
    if args.only_ddtree:
        if not have_oracle:
            return skip("--only-ddtree needs tests/oracle/qwen35.py beside this script or in tests/oracle")
    else:
        try:
            tf = Transformers()
        except Exception as exc:   # ImportError, or a transformers too old / broken to load
            return skip(f"transformers is not importable: {type(exc).__name__}: {exc}")
        torch = tf.torch
        set_fp32_exact(torch)
        for d in [d.strip() for d in args.devices.split(",") if d.strip()]:
            if d == "cuda" and not torch.cuda.is_available():
                print("note: torch sees no CUDA device: transformers runs on the CPU only")
                continue
            devices.append(d)
        print(f"transformers {tf.versions['transformers']}, torch {tf.versions['torch']}, devices {devices}, "
              f"fla {'installed' if tf.fast_libs['fla'] else 'absent'}, causal-conv1d "
              f"{'installed' if tf.fast_libs['causal_conv1d'] else 'absent'} (the torch path is forced either way)")

    workdir = args.workdir or tempfile.mkdtemp(prefix="qwen35_transformers_")
    os.makedirs(workdir, exist_ok=True)
    cases, figures, errors, archs = Cases(), {}, [], {}
    t0 = time.time()
    for vi, (variant, layers) in enumerate(VARIANTS):
        model_dir = os.path.join(args.model_dir, variant)
        try:
            with open(os.path.join(model_dir, "config.json")) as fh:
                cfg = json.load(fh)
            text_cfg = cfg.get("text_config", cfg)
            names = quantity_names(layers, text_cfg["layer_types"])
            rng = np.random.default_rng(100 + vi)
            seqs = [rng.integers(0, min(TOKEN_LIMIT, text_cfg["vocab_size"]), n).astype(np.int32) for n in LENGTHS]
            got = ddtree_features(os.path.abspath(args.ddtreed), model_dir, layers, seqs, workdir, FEATURES_TIMEOUT_S)
        except Exception as exc:
            cases.report(f"{variant} ddtreed features", [f"{type(exc).__name__}: {exc}"])
            errors.append(f"{variant}: {exc}")
            continue
        if tf is not None:
            try:
                archs[variant], refs = tf.run(model_dir, layers, seqs, devices)
                for device in devices:
                    compare(cases, variant, names, got, f"transformers-{device}", refs[device], figures)
            except Exception as exc:
                cases.report(f"{variant} transformers", [f"{type(exc).__name__}: {exc}"])
                errors.append(f"{variant} transformers: {exc}")
        if have_oracle:
            try:
                compare(cases, variant, names, got, "oracle-f64", oracle_reference(model_dir, layers, seqs), figures)
            except Exception as exc:
                cases.report(f"{variant} oracle-f64", [f"{type(exc).__name__}: {exc}"])
                errors.append(f"{variant} oracle: {exc}")
    if not args.workdir:
        for name in os.listdir(workdir):
            os.remove(os.path.join(workdir, name))
        os.rmdir(workdir)

    worst_what, worst = None, -1.0
    for key, fig in figures.items():
        variant, ref_name = key.split(" ", 1)
        for qname, v in fig.items():
            x = float("inf") if v == "nan" else v
            if x > worst:
                worst_what, worst = f"{variant} {qname} vs {ref_name}", x
    rc = cases.summary()
    if worst_what is not None:
        print(f"{'FAIL' if worst > REL_TOL else 'ok  '} worst: {worst_what}: max|d|/max|ref| = "
              f"{worst:.3e} ({'over' if worst > REL_TOL else 'within'} {REL_TOL:g})")
    line = {"impl": IMPL, "tol": REL_TOL, "mode": "only-ddtree" if args.only_ddtree else "transformers",
            "lengths": LENGTHS, "figures": figures, "cases_passed": cases.passed, "cases_failed": cases.failed,
            "seconds": round(time.time() - t0, 2)}
    if worst_what is not None:
        line["worst"] = {"what": worst_what, "figure": float(f"{worst:.4g}") if math.isfinite(worst) else "nan"}
    if tf is not None:
        line.update(tf.versions)
        line.update({"devices": devices, "classes": archs, "gated_delta_rule": "torch (forced)",
                     "fla_installed": tf.fast_libs["fla"], "causal_conv1d_installed": tf.fast_libs["causal_conv1d"]})
    if errors:
        line["errors"] = errors[:6]
    if cases.passed + cases.failed == 0:
        line["failed"] = "no comparison ran: " + ("; ".join(errors[:2]) or "?")
        rc = 1
    print(json.dumps(line))
    return rc


if __name__ == "__main__":
    sys.exit(main())
