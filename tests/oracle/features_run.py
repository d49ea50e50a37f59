"""features_run.py: `ddtreed features` on token sequences, read back (tests/oracle/st.py), for the
checks that compare ddtree's features with a reference: tests/oracle/qwen35_features_check.py (the
float64 oracle) and tests/gpu/qwen35_transformers.py (transformers' own model). One owner of
that round trip: the token file written, the shard checked against it, the taps split per layer.
"""
import math
import os
import subprocess

import numpy as np

import st


def rel(got, ref):
    """max |got - ref| / max |ref| in float64 (NaN when either holds a NaN or ref is 0)."""
    ref = np.asarray(ref, dtype=np.float64)
    scale = float(np.max(np.abs(ref)))
    d = float(np.max(np.abs(np.asarray(got, dtype=np.float64) - ref)))
    return d / scale if scale > 0 and math.isfinite(d) else float("nan")


def ddtree_features(tool, model_dir, layers, seqs, workdir, timeout_s, extra=()):
    """Runs `ddtreed features` (with the options extra) on seqs; returns {"taps": {layer: (Ttot, H)}, "final": (Ttot, H),
    "logits": (Ttot, V)} (float64; the logits from the shard's teacher_hidden and the
    checkpoint's lm_head), or raises RuntimeError saying what went wrong."""
    offsets = np.concatenate([[0], np.cumsum([len(s) for s in seqs])]).astype(np.int64)
    ids = np.concatenate(seqs).astype(np.int32)
    name = os.path.basename(os.path.normpath(model_dir))
    tokens, out = os.path.join(workdir, f"{name}.tokens"), os.path.join(workdir, f"{name}.features")
    st.write(tokens, {"input_ids": ids, "offsets": offsets})
    cmd = [tool, "features", "--model", model_dir, "--tokens", tokens,
           "--layers", ",".join(map(str, layers)), "--dtype", "f32", "--out", out, *extra]
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout_s)
    if p.returncode != 0:
        raise RuntimeError(f"ddtreed features exited {p.returncode}: {p.stdout.decode('utf-8', 'replace').strip()}")
    f = st.read(out)
    if not np.array_equal(f["input_ids"], ids) or not np.array_equal(f["offsets"], offsets):
        raise RuntimeError("the shard's input_ids / offsets differ from the token file's")
    H = f["teacher_hidden"].shape[1] if f["teacher_hidden"].ndim == 2 else -1
    if (f.dtypes["features"] != "F32" or f.dtypes["teacher_hidden"] != "F32"
            or f["features"].shape != (len(ids), len(layers) * H) or f["teacher_hidden"].shape[0] != len(ids)):
        raise RuntimeError(f"shard: features {f.dtypes['features']} {list(f['features'].shape)}, teacher_hidden "
                           f"{f.dtypes['teacher_hidden']} {list(f['teacher_hidden'].shape)}; expected F32 "
                           f"[{len(ids)}, {len(layers)} x H] and [{len(ids)}, H]")
    tensors, _ = st.read_model_dir(model_dir)
    final = f["teacher_hidden"].astype(np.float64)                                # (Ttot, H)
    taps = {layer: f["features"][:, li * H:(li + 1) * H].astype(np.float64)       # (Ttot, H)
            for li, layer in enumerate(layers)}
    return {"taps": taps, "final": final, "logits": final @ tensors["lm_head.weight"].astype(np.float64).T}
