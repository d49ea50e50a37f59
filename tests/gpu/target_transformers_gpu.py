#!/usr/bin/python3
"""target_transformers_gpu.py: the peer of ddtree's target prefill on the GPU (issue 13's measure):
transformers' own Qwen3.5 text model at the Qwen3.6-27B shape, random bf16 weights, one prefill.

    python3 tests/gpu/target_transformers_gpu.py [--layers 8] [--tokens 4096] [--reps 3]
        [--ceiling-only]

Shape: SPEC.md 3.1's Qwen3.6-27B (H 5120, I 17408, V 248320, nh/nkv/hd 24/4/256, nk/nv/dk/dv
16/48/128/128, K 4, partial rotary 0.25, theta 1e7) with --layers layers in the real 3:1 pattern
(layer i full attention iff (i + 1) % 4 == 0). Qwen3_5TextModel (the decoder without the
lm_head: features need none) built on the GPU in bf16 with the machine's default attention,
under torch.no_grad; transformers' torch Gated DeltaNet path unless flash-linear-attention is
installed (reported). Time: one warm-up, then --reps prefills of --tokens tokens between
torch.cuda.synchronize() calls; the median. FLOPs: 2 T per weight of the layers (no embedding,
no head) plus the full layers' causal attention 2 T^2 nh hd (target_footprint.c's count), per
layer scaled to 64. The ceiling: the median of torch.matmul of bf16 (T, H) x (H, I), the
largest product of a layer, in TFLOP/s.

Output: ONE JSON line on stdout. Exits 77 without torch, a CUDA GPU or transformers' Qwen3.5.
Not a test.
"""
import argparse
import json
import statistics
import sys
import time

SKIPPED = 77
H, I, V = 5120, 17408, 248320
NH, NKV, HD = 24, 4, 256
NK, NV, DK, DV, K = 16, 48, 128, 128, 4


def layer_types(n):
    return ["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(n)]


def layer_params(full):
    """weights of one layer (SPEC.md 3.1's tensors)"""
    mlp = 3 * H * I + 2 * H
    if full:
        return mlp + 2 * NH * HD * H + 2 * NKV * HD * H + NH * HD * H + 2 * HD
    ck, cv = NK * DK, NV * DV
    cc = 2 * ck + cv
    return mlp + cc * H + cv * H + 2 * NV * H + cc * K + 2 * NV + DV + H * cv


def prefill_flops(types, T):
    f = 0.0
    for t in types:
        full = t == "full_attention"
        f += 2.0 * T * layer_params(full) + (2.0 * T * T * NH * HD if full else 0.0)
    return f


def timed(fn, reps, torch):
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--ceiling-only", action="store_true")
    a = ap.parse_args()
    out = {"impl": "transformers-qwen3_5", "layers": a.layers, "tokens": a.tokens}
    try:
        import torch
    except ImportError as exc:
        print(json.dumps({**out, "skipped": f"no torch ({exc})"}))
        return SKIPPED
    if not torch.cuda.is_available():
        print(json.dumps({**out, "skipped": "torch sees no CUDA GPU"}))
        return SKIPPED
    torch.backends.cuda.matmul.allow_tf32 = False
    dev = torch.device("cuda")
    x = torch.randn(a.tokens, H, device=dev, dtype=torch.bfloat16)
    w = torch.randn(H, I, device=dev, dtype=torch.bfloat16)
    s = timed(lambda: torch.matmul(x, w), max(a.reps, 5), torch)
    out["ceiling_tflops"] = round(2.0 * a.tokens * H * I / s / 1e12, 2)
    del x, w
    if a.ceiling_only:
        print(json.dumps(out))
        return 0
    try:
        import transformers
        from transformers import Qwen3_5TextConfig, Qwen3_5TextModel
    except ImportError as exc:
        print(json.dumps({**out, "skipped": f"no transformers with Qwen3.5 ({exc})"}))
        return SKIPPED
    out["transformers"] = transformers.__version__
    try:
        import fla  # noqa: F401
        out["delta_rule"] = "flash-linear-attention"
    except ImportError:
        out["delta_rule"] = "torch (transformers' fallback)"
    types = layer_types(a.layers)
    cfg = Qwen3_5TextConfig(vocab_size=V, hidden_size=H, intermediate_size=I, num_hidden_layers=a.layers,
                            num_attention_heads=NH, num_key_value_heads=NKV, head_dim=HD,
                            linear_num_key_heads=NK, linear_num_value_heads=NV, linear_key_head_dim=DK,
                            linear_value_head_dim=DV, linear_conv_kernel_dim=K, layer_types=types,
                            rope_parameters={"rope_type": "default", "rope_theta": 1e7,
                                             "partial_rotary_factor": 0.25},
                            max_position_embeddings=max(a.tokens, 4096), use_cache=False)
    torch.manual_seed(0)
    try:
        torch.set_default_dtype(torch.bfloat16)
        with dev:
            model = Qwen3_5TextModel(cfg).eval()
        torch.set_default_dtype(torch.float32)
        out["attention"] = getattr(model.config, "_attn_implementation", "default")
        ids = torch.randint(0, V, (1, a.tokens), device=dev)
        torch.cuda.reset_peak_memory_stats()
        with torch.no_grad():
            sec = timed(lambda: model(input_ids=ids, use_cache=False), a.reps, torch)
    except torch.cuda.OutOfMemoryError as exc:
        print(json.dumps({**out, "failed": f"out of memory ({str(exc).splitlines()[0]})"}))
        return 0
    flops = prefill_flops(types, a.tokens)
    out.update({"prefill_s": round(sec, 6), "tokens_per_s": round(a.tokens / sec, 1),
                "tflops": round(flops / sec / 1e12, 2),
                "prefill_s_64_layers": round(sec * 64 / a.layers, 4),
                "peak_bytes": torch.cuda.max_memory_allocated()})
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
