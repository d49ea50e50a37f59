#!/usr/bin/python3
"""step_torch_peer.py: the PyTorch peer of bench_step: one drafter training step (forward +
loss + backward) of the same shapes, float32, autograd, on the CPU. Prints one JSON line.

    step_torch_peer.py [--hidden 256 --layers 2 --heads 8 --kv-heads 8 --head-dim 32
                        --intermediate 768 --block 16 --anchors 64 --seq 512 --vocab 8192
                        --nseq 1 --taps 2 --window 0 --threads 1 --reps 3]

The step is tests/oracle/reference.py's drafter_step run in float32: SPEC.md section 2 as a
PyTorch user writes it (dense visibility mask per layer, full-vocabulary logits for CE + KL,
autograd for every gradient). Same loss as bench_step: ce_target "teacher", kl_weight 0.15,
gamma 10, anchors spread evenly, all loss-mask ones. Exits 77 when torch is missing.
"""
import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "oracle"))
try:
    import numpy as np
    import torch
    import reference
except ImportError as exc:
    print(f"skipped: {exc}", file=sys.stderr)
    sys.exit(77)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name, default in (("hidden", 256), ("layers", 2), ("heads", 8), ("kv-heads", 8),
                          ("head-dim", 32), ("intermediate", 768), ("block", 16),
                          ("anchors", 64), ("seq", 512), ("vocab", 8192), ("nseq", 1),
                          ("taps", 2), ("window", 0), ("threads", 1), ("reps", 3)):
        ap.add_argument("--" + name, type=int, default=default)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    rng = np.random.default_rng(0)
    layer_types = ["sliding_attention" if a.window > 0 and l + 1 < a.layers else "full_attention"
                   for l in range(a.layers)]
    cfg = {"hidden_size": a.hidden, "num_hidden_layers": a.layers, "num_attention_heads": a.heads,
           "num_key_value_heads": a.kv_heads, "head_dim": a.head_dim,
           "intermediate_size": a.intermediate, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
           "layer_types": layer_types, "sliding_window": a.window or None, "block_size": a.block,
           "vocab_size": a.vocab,
           "dflash_config": {"mask_token_id": a.vocab - 1, "target_layer_ids": list(range(a.taps))}}
    params = {name: (np.ones(shape) if len(shape) == 1 else 0.02 * rng.standard_normal(shape))
              .astype(np.float32) for name, shape in reference.drafter_param_shapes(cfg).items()}
    H, S, A = a.hidden, a.seq, a.anchors
    embed = rng.standard_normal((a.vocab, H)).astype(np.float32)
    head = (rng.standard_normal((a.vocab, H)) / np.sqrt(H)).astype(np.float32)
    batch = {"input_ids": rng.integers(0, a.vocab, (a.nseq, S)).astype(np.int32),
             "loss_mask": np.ones((a.nseq, S), np.uint8),
             "features": rng.standard_normal((a.nseq, S, a.taps * H)).astype(np.float32),
             "teacher_hidden": rng.standard_normal((a.nseq, S, H)).astype(np.float32),
             "anchors": np.tile((np.arange(A) * (S - 1) // A).astype(np.int32), (a.nseq, 1)),
             "keep": np.ones((a.nseq, A), np.uint8)}
    loss_cfg = {"gamma": 10.0, "kl_weight": 0.15, "kl_temperature": 1.0, "cap_weight": 0.0,
                "cap_temperature": 1.0, "ce_target": "teacher"}
    seconds, loss = [], None
    for rep in range(a.reps + 1):   # the first is a warm-up
        t0 = time.perf_counter()
        out = reference.drafter_step(cfg, params, embed, head, batch, loss_cfg, dtype=torch.float32)
        if rep:
            seconds.append(time.perf_counter() - t0)
        loss = float(out["loss"])
    med = statistics.median(seconds)
    positions = a.nseq * A * a.block
    print(json.dumps({"impl": "torch", "torch_version": torch.__version__, "seconds_median": med,
                      "positions": positions, "positions_per_s": positions / med, "loss": loss,
                      "threads": a.threads}))


if __name__ == "__main__":
    main()
