#!/usr/bin/python3
"""export_loaders_check.py: the serving export (SPEC.md section 5) read back the way the loaders
that serve or train DFlash drafters read it, on exports `ddtreed train` writes.

    /usr/bin/python3 tests/daemon/export_loaders_check.py --ddtreed build/bin/ddtreed [--model-dir DIR]

It trains three tiny runs for two steps each and reads every export as these loaders do (python3,
json and numpy only: none of them is installed here, so each one's reading is restated from its
source, cited per check; the facts, not their code):
- Hugging Face's Qwen3Config (transformers src/transformers/models/qwen3/configuration_qwen3.py):
  the typed fields it takes from config.json, and `sliding_window = sliding_window if
  use_sliding_window else None`; layer_types given, so max_window_layers plays no part;
- SpecForge (specforge/modeling/draft/dflash.py): resolve_dflash_attention_layout (layer_types of
  num_hidden_layers entries, a sliding_attention layer needs a positive sliding_window after
  Qwen3Config), dflash_config's target_layer_ids and mask_token_id, block_size, and the module
  names of DFlashDraftModel (fc, hidden_norm, layers.i..., norm; no embed_tokens, no lm_head);
- vLLM (vllm/model_executor/models/qwen3_dflash.py): _resolve_layer_attention (a sliding layer's
  window is dflash_config.swa_window_size or the top-level sliding_window, else ValueError; mixed
  sliding/full layers need the V2 model runner), max_position from max_position_embeddings, and
  the weight mapping q/k/v_proj -> qkv_proj, gate/up_proj -> gate_up_proj;
- SGLang (python/sglang/srt/models/dflash.py, python/sglang/srt/speculative/dflash_utils.py):
  get_dflash_attention_sliding_window_size (config.sliding_window for a sliding layer, else
  ValueError), hidden_act "silu" only, max_position_embeddings (32768 when missing), load_weights
  (the stacked mapping, names with or without "model.", fc.weight's shape checked);
- z-lab's MLX loader (dflash/model_mlx.py load_draft): the keys it indexes without a default,
  max_position_embeddings among them.
Besides: torch_dtype and dtype are "bfloat16" and every tensor is BF16 (finite), __metadata__ is
{"format": "pt"}, the file obeys SPEC.md section 4's safetensors rules, the directory holds
config.json, model.safetensors and ddtree-manifest.json alone, the manifest leaving the loaders
as they are (vLLM's DefaultModelLoader._prepare_weights, vllm/model_executor/model_loader/
default_loader.py, globs "*.safetensors", "*.bin", then "*.pt" and reads model.safetensors.index.json
when there is one: model.safetensors alone matches; Hugging Face's from_pretrained opens
config.json and model.safetensors by name) and listing those two files with their sizes, max_position_embeddings is
the target's (32768 for a synthetic target, the documented default; stories260K's 512 from its
config.json when --model-dir is at hand), and `ddtreed export` of the run's checkpoint writes the
same files.

Exit status: 0 all passed, 1 a failure, 77 (ctest's "skipped") when numpy or ddtreed is missing.
Last line: `N passed, M failed`.
"""

import argparse
import fnmatch
import glob
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "oracle"))
from cases import Cases   # noqa: E402

SKIPPED = 77
try:
    import numpy as np
except ImportError:
    print("skipped: numpy is not installed")
    sys.exit(SKIPPED)

DEFAULT_MAX_POSITIONS = 32768   # model_config.h DDT_MAX_POSITIONS_DEFAULT: Qwen3Config's default
MANIFEST = "ddtree-manifest.json"   # export.h DDT_EXPORT_MANIFEST
WEIGHT_GLOBS = ("*.safetensors", "*.bin", "*.pt")   # vLLM's allow_patterns, "*.pt" its fallback

DRAFTER = {"num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8, "intermediate_size": 48,
           "block_size": 4}
TRAIN = {"steps": 2, "sequences_per_step": 2, "seq_len": 24, "max_anchors": 3, "heldout": 2}
SYNTHETIC = {"kind": "synthetic", "hidden_size": 32, "num_hidden_layers": 6, "num_attention_heads": 4,
             "num_key_value_heads": 2, "head_dim": 8, "intermediate_size": 48, "vocab_size": 64}


def runs(model_dir):
    """(name, run config, expected max_position_embeddings) of the runs to export"""
    mixed = dict(DRAFTER, num_hidden_layers=3, sliding_window=6, target_layer_ids="auto",
                 layer_types=["sliding_attention", "sliding_attention", "full_attention"])
    full = dict(DRAFTER, num_hidden_layers=2, target_layer_ids=[0, 3])
    out = [("synthetic_mixed", {"target": SYNTHETIC, "drafter": mixed}, DEFAULT_MAX_POSITIONS),
           ("synthetic_full", {"target": SYNTHETIC, "drafter": full}, DEFAULT_MAX_POSITIONS)]
    if model_dir and os.path.exists(os.path.join(model_dir, "config.json")):
        with open(os.path.join(model_dir, "config.json")) as f:
            want = json.load(f)["max_position_embeddings"]
        stories = dict(DRAFTER, num_hidden_layers=1, layer_types=["sliding_attention"], sliding_window=4)
        out.append(("stories260k", {"target": {"kind": "hf", "path": model_dir, "temperature": 0.6},
                                    "drafter": stories}, want))
    for name, cfg, _ in out:
        cfg.update(name=name, train=TRAIN, devices="cpu", checkpoint={"every_steps": 2, "keep": 1},
                   eval={"every_steps": 100, "sequences": 2})
    return out


# ------------------------------------------------------------------------------------------
# The export's files

def read_safetensors(path):
    """(header without __metadata__, __metadata__, data bytes) after SPEC.md s.4's rules"""
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    text = blob[8:8 + n].decode("utf-8")
    if n % 8 or len(text.rstrip(" ")) != len(text.rstrip()):
        raise ValueError(f"{path}: the header is not padded with spaces to a multiple of 8")
    header = json.loads(text)
    meta = header.pop("__metadata__", None)
    data = blob[8 + n:]
    spans = sorted(tuple(t["data_offsets"]) for t in header.values())
    end = 0
    for a, b in spans:
        if a != end:
            raise ValueError(f"{path}: tensors do not tile the data (a gap or overlap at {end})")
        end = b
    if end != len(data):
        raise ValueError(f"{path}: file size is not 8 + N + last end")
    return header, meta, data


def bf16_values(data, t):
    """a BF16 tensor's values as float32"""
    a, b = t["data_offsets"]
    bits = np.frombuffer(data[a:b], dtype="<u2").astype(np.uint32) << 16
    return bits.view(np.float32).reshape(t["shape"])


def expected_tensors(c):
    """SPEC.md s.2's names and shapes (what SpecForge's DFlashDraftModel's state_dict holds)"""
    H, I, d = c["hidden_size"], c["intermediate_size"], c["head_dim"]
    nh, nkv, taps = c["num_attention_heads"], c["num_key_value_heads"], len(c["dflash_config"]["target_layer_ids"])
    names = {"fc.weight": [H, taps * H], "hidden_norm.weight": [H], "norm.weight": [H]}
    for i in range(c["num_hidden_layers"]):
        p = f"layers.{i}."
        names.update({p + "input_layernorm.weight": [H], p + "post_attention_layernorm.weight": [H],
                      p + "self_attn.q_proj.weight": [nh * d, H], p + "self_attn.k_proj.weight": [nkv * d, H],
                      p + "self_attn.v_proj.weight": [nkv * d, H], p + "self_attn.o_proj.weight": [H, nh * d],
                      p + "self_attn.q_norm.weight": [d], p + "self_attn.k_norm.weight": [d],
                      p + "mlp.gate_proj.weight": [I, H], p + "mlp.up_proj.weight": [I, H],
                      p + "mlp.down_proj.weight": [H, I]})
    return names


# ------------------------------------------------------------------------------------------
# The loaders' readings

def is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


QWEN3_FIELDS = {   # Qwen3Config's typed fields that the export sets (configuration_qwen3.py)
    "vocab_size": is_int, "hidden_size": is_int, "intermediate_size": is_int, "num_hidden_layers": is_int,
    "num_attention_heads": is_int, "num_key_value_heads": is_int, "head_dim": is_int,
    "hidden_act": lambda v: isinstance(v, str), "max_position_embeddings": is_int,
    "rms_norm_eps": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "tie_word_embeddings": lambda v: isinstance(v, bool), "attention_bias": lambda v: isinstance(v, bool),
    "use_sliding_window": lambda v: isinstance(v, bool), "sliding_window": lambda v: v is None or is_int(v),
    "layer_types": lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v),
}


def qwen3_config(c, errors):
    """the attributes Qwen3Config leaves: sliding_window None unless use_sliding_window"""
    for key, ok in QWEN3_FIELDS.items():
        if key not in c:
            errors.append(f"Qwen3Config: {key} missing (its default would be used)")
        elif not ok(c[key]):
            errors.append(f"Qwen3Config: {key} = {c[key]!r} has the wrong type")
    q = dict(c)
    q["sliding_window"] = c.get("sliding_window") if c.get("use_sliding_window") else None
    if c.get("rope_scaling") is not None:
        errors.append("rope_scaling is not null")
    return q


def specforge(q, errors):
    """resolve_dflash_attention_layout and DFlashDraftModel.__init__'s reads"""
    types = q["layer_types"]
    if len(types) != q["num_hidden_layers"]:
        errors.append("SpecForge: layer_types must hold num_hidden_layers entries")
    if set(types) - {"full_attention", "sliding_attention"}:
        errors.append(f"SpecForge: layer types {sorted(set(types))}")
    if "sliding_attention" in types and (q["sliding_window"] is None or q["sliding_window"] <= 0):
        errors.append("SpecForge: sliding_attention layers require use_sliding_window=true and a positive "
                      "sliding_window")
    dflash = q.get("dflash_config") or {}
    for key in ("target_layer_ids", "mask_token_id"):
        if key not in dflash:
            errors.append(f"SpecForge: dflash_config.{key} missing")
    if not is_int(q.get("block_size")) or not is_int(q.get("num_target_layers")):
        errors.append("SpecForge: block_size / num_target_layers not integers")


def vllm(q, errors, notes):
    """_resolve_layer_attention for every layer, and the max_position of its RoPE"""
    types = q["layer_types"]
    sliding = sum(t == "sliding_attention" for t in types)
    if 0 < sliding < len(types):
        notes.append("vLLM: mixed sliding/full layers: VLLM_USE_V2_MODEL_RUNNER=1")
    use_swa = (q.get("dflash_config") or {}).get("use_swa", False)
    for t in types:
        if t == "sliding_attention" or use_swa:
            window = (q.get("dflash_config") or {}).get("swa_window_size", q["sliding_window"])
            if window is None:
                errors.append("vLLM: DFlash sliding attention requires a window size")
    if not is_int(q.get("max_position_embeddings")):
        errors.append("vLLM: max_position_embeddings (the RoPE's max_position) missing")


def sglang(q, errors):
    """get_dflash_attention_sliding_window_size, the MLP's activation, the RoPE's max_position"""
    if "sliding_attention" in q["layer_types"] and q["sliding_window"] is None:
        errors.append("SGLang: DFLASH sliding_attention layers require config.sliding_window")
    if q.get("hidden_act", "silu") != "silu":
        errors.append("SGLang: only silu is supported")
    if "max_position_embeddings" not in q:
        errors.append("SGLang: max_position_embeddings missing (32768 would be assumed)")


def zlab_mlx(c, errors):
    """load_draft's cfg[...] reads (no default)"""
    for key in ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
                "intermediate_size", "vocab_size", "rms_norm_eps", "rope_theta", "max_position_embeddings",
                "block_size", "num_target_layers"):
        if key not in c:
            errors.append(f"z-lab MLX: cfg[{key!r}] missing")
    for key in ("target_layer_ids", "mask_token_id"):
        if key not in (c.get("dflash_config") or {}):
            errors.append(f"z-lab MLX: cfg['dflash_config'][{key!r}] missing")


STACKED = ((".q_proj.", ".qkv_proj.", "q"), (".k_proj.", ".qkv_proj.", "k"), (".v_proj.", ".qkv_proj.", "v"),
           (".gate_proj.", ".gate_up_proj.", 0), (".up_proj.", ".gate_up_proj.", 1))


def weight_mapping(c, header, errors):
    """vLLM's and SGLang's load_weights: every tensor lands in a module parameter, every
    parameter is filled (each shard of qkv_proj and gate_up_proj once), fc.weight's shape"""
    H, d = c["hidden_size"], c["head_dim"]
    nh, nkv = c["num_attention_heads"], c["num_key_value_heads"]
    params = {}
    for i in range(c["num_hidden_layers"]):
        p = f"layers.{i}."
        params.update({p + "self_attn.qkv_proj.weight": {"q", "k", "v"}, p + "mlp.gate_up_proj.weight": {0, 1},
                       p + "self_attn.o_proj.weight": {None}, p + "mlp.down_proj.weight": {None},
                       p + "self_attn.q_norm.weight": {None}, p + "self_attn.k_norm.weight": {None},
                       p + "input_layernorm.weight": {None}, p + "post_attention_layernorm.weight": {None}})
    params.update({"fc.weight": {None}, "hidden_norm.weight": {None}, "norm.weight": {None}})
    filled = {k: set() for k in params}
    for name, t in header.items():
        target, shard = name, None
        for old, new, sid in STACKED:
            if old in name:
                target, shard = name.replace(old, new), sid
                break
        if target not in params:
            errors.append(f"weights: {name} maps to no parameter ({target})")
            continue
        filled[target].add(shard)
        want = {"q": nh * d, "k": nkv * d, "v": nkv * d}.get(shard)
        if want is not None and t["shape"][0] != want:
            errors.append(f"weights: {name} has {t['shape'][0]} rows, the qkv_proj shard {shard} {want}")
    for k, shards in params.items():
        if filled[k] != shards:
            errors.append(f"weights: {k} filled with shards {sorted(map(str, filled[k]))}, expected "
                          f"{sorted(map(str, shards))}")
    taps = len(c["dflash_config"]["target_layer_ids"])
    if header.get("fc.weight", {}).get("shape") != [H, taps * H]:
        errors.append("SGLang: DFLASH fc.weight shape mismatch")


def check_files(out, errors):
    """the export's files: the two a loader reads, and the manifest of both, which no loader's
    patterns take for weights or an index"""
    files = sorted(os.listdir(out))
    if files != ["config.json", MANIFEST, "model.safetensors"]:
        errors.append(f"the export holds {files}")
    weights = sorted({f for f in files for p in WEIGHT_GLOBS if fnmatch.fnmatch(f, p)})
    if weights != ["model.safetensors"] or any(f.endswith(".index.json") for f in files):
        errors.append(f"the loaders' weight patterns match {weights}")
    with open(os.path.join(out, MANIFEST)) as f:
        m = json.load(f)
    listed = m.get("files", {})
    if m.get("format") != "ddtree-manifest" or m.get("version") != 1 or sorted(listed) != ["config.json",
                                                                                           "model.safetensors"]:
        errors.append(f"manifest {m}")
        return
    for name, entry in listed.items():
        size = os.path.getsize(os.path.join(out, name))
        hex_ok = isinstance(entry.get("xxh64"), str) and len(entry["xxh64"]) == 16 and \
            all(c in "0123456789abcdef" for c in entry["xxh64"])
        if entry.get("size") != size or not hex_ok or sorted(entry) != ["size", "xxh64"]:
            errors.append(f"manifest entry of {name}: {entry}, the file has {size} bytes")


def check_export(out, max_positions, notes):
    """every reading of the export in out; a list of errors"""
    errors = []
    check_files(out, errors)
    with open(os.path.join(out, "config.json")) as f:
        c = json.load(f)
    if c.get("architectures") != ["DFlashDraftModel"] or c.get("model_type") != "qwen3":
        errors.append("architectures / model_type")
    q = qwen3_config(c, errors)
    if errors:
        return errors
    sliding = "sliding_attention" in c["layer_types"]
    if c["use_sliding_window"] != sliding:
        errors.append(f"use_sliding_window {c['use_sliding_window']} with sliding layers: {sliding}")
    if sliding and not (is_int(c["sliding_window"]) and c["sliding_window"] >= c["block_size"]):
        errors.append(f"sliding_window {c['sliding_window']} must be an integer >= block_size {c['block_size']}")
    if not sliding and c["sliding_window"] is not None:
        errors.append("sliding_window must be null without a sliding layer")
    if c["max_position_embeddings"] != max_positions:
        errors.append(f"max_position_embeddings {c['max_position_embeddings']}, the target's is {max_positions}")
    if c.get("torch_dtype") != "bfloat16" or c.get("dtype") != "bfloat16":
        errors.append(f"torch_dtype / dtype {c.get('torch_dtype')!r} / {c.get('dtype')!r}")
    ids = c["dflash_config"]["target_layer_ids"]
    if len(set(ids)) != len(ids) or not all(0 <= i < c["num_target_layers"] for i in ids):
        errors.append(f"target_layer_ids {ids}")
    specforge(q, errors)
    vllm(q, errors, notes)
    sglang(q, errors)
    zlab_mlx(c, errors)

    header, meta, data = read_safetensors(os.path.join(out, "model.safetensors"))
    if meta != {"format": "pt"}:
        errors.append(f"__metadata__ {meta}")
    want = expected_tensors(c)
    if set(header) != set(want):
        errors.append(f"tensor names: extra {sorted(set(header) - set(want))}, "
                      f"missing {sorted(set(want) - set(header))}")
    for name, t in header.items():
        if t["dtype"] != "BF16":
            errors.append(f"{name} is {t['dtype']}, not BF16")
        elif want.get(name) != t["shape"]:
            errors.append(f"{name} has shape {t['shape']}, expected {want.get(name)}")
        elif not np.isfinite(bf16_values(data, t)).all():
            errors.append(f"{name} holds NaN or Inf")
    weight_mapping(c, header, errors)
    return errors


# ------------------------------------------------------------------------------------------

def train_and_export(ddtreed, work, name, cfg):
    """the run's export directory (trained by ddtreed train) and `ddtreed export`'s"""
    path = os.path.join(work, name + ".json")
    with open(path, "w") as f:
        json.dump(cfg, f)
    state = os.path.join(work, name)
    subprocess.run([ddtreed, "train", path, "--state-dir", state], check=True, capture_output=True, timeout=300)
    (run,) = glob.glob(os.path.join(state, "runs", "*"))
    again = os.path.join(work, name + "-again")
    subprocess.run([ddtreed, "export", run, "--out", again], check=True, capture_output=True, timeout=120)
    return os.path.join(run, "export"), again


def case(ddtreed, work, name, cfg, max_positions):
    notes = []
    live, again = train_and_export(ddtreed, work, name, cfg)
    errors = check_export(live, max_positions, notes)
    for f in ("config.json", "model.safetensors", MANIFEST):
        with open(os.path.join(live, f), "rb") as a, open(os.path.join(again, f), "rb") as b:
            if a.read() != b.read():
                errors.append(f"ddtreed export's {f} differs from the trainer's")
    return errors, "; ".join(notes)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ddtreed", required=True)
    ap.add_argument("--model-dir", help="stories260K (its max_position_embeddings is carried)")
    ap.add_argument("--workdir", help="keep the runs and exports here")
    a = ap.parse_args()
    if not os.access(a.ddtreed, os.X_OK):
        print(f"skipped: {a.ddtreed} is not built")
        return SKIPPED
    work = a.workdir or tempfile.mkdtemp(prefix="ddtree_export_loaders.")
    os.makedirs(work, exist_ok=True)
    cases = Cases()
    try:
        for name, cfg, max_positions in runs(a.model_dir):
            cases.run(f"{name}: read as Qwen3Config, SpecForge, vLLM, SGLang and z-lab read it", case, a.ddtreed,
                      work, name, cfg, max_positions)
    finally:
        if not a.workdir:
            shutil.rmtree(work, ignore_errors=True)
    return cases.summary()


if __name__ == "__main__":
    sys.exit(main())
