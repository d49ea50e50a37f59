#!/usr/bin/python3
"""export_loaders_check.py: the serving export (SPEC.md section 5) read back the way the loaders
that serve or train DFlash drafters read it, on exports `ddtreed train` writes.

    /usr/bin/python3 tests/daemon/export_loaders_check.py --ddtreed build/bin/ddtreed [--model-dir DIR]

It trains four tiny runs (a DFlash2 drafter among them) for two steps each and reads every export
as these loaders do (python3 and its standard library only: none of the loaders is installed here,
so each one's reading is restated from its source, cited per check; the facts, not their code):
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
A DFlash export must hold none of DFlash2's keys (SGLang builds the convolutions of a
DFlashDraftModel whose dflash_config has conv_kernel_size). A DFlash2 export (SPEC.md 2.1) is read
by each loader's DFlash2 rules besides, each function's docstring naming the file and the commit
or version the rule was read at: vllm_dflash2, sglang_dflash2, specforge_dflash2, zlab_dflash2,
speculators_dflash2, and weight_mapping's DFlash2 parameters.
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

Exit status: 0 all passed, 1 a failure, 77 (ctest's "skipped") when ddtreed is not built.
Last line: `N passed, M failed`.
"""

import argparse
import array
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

DEFAULT_MAX_POSITIONS = 32768   # model_config.h DDT_MAX_POSITIONS_DEFAULT: Qwen3Config's default
MANIFEST = "ddtree-manifest.json"   # export.h DDT_EXPORT_MANIFEST
WEIGHT_GLOBS = ("*.safetensors", "*.bin", "*.pt")   # vLLM's allow_patterns, "*.pt" its fallback

DRAFTER = {"num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8, "intermediate_size": 48,
           "block_size": 4}
DFLASH2 = {"architecture": "dflash2", "conv_kernel_size": 2, "conv_group_size": 8, "selector_rank": 8,
           "selector_top_k": 4}   # G = 32 / 8 = 4
TRAIN = {"steps": 2, "sequences_per_step": 2, "seq_len": 24, "max_anchors": 3, "heldout": 2}
SYNTHETIC = {"kind": "synthetic", "hidden_size": 32, "num_hidden_layers": 6, "num_attention_heads": 4,
             "num_key_value_heads": 2, "head_dim": 8, "intermediate_size": 48, "vocab_size": 64}


def runs(model_dir):
    """(name, run config, expected max_position_embeddings) of the runs to export"""
    mixed = dict(DRAFTER, num_hidden_layers=3, sliding_window=6, target_layer_ids="auto",
                 layer_types=["sliding_attention", "sliding_attention", "full_attention"])
    full = dict(DRAFTER, num_hidden_layers=2, target_layer_ids=[0, 3])
    dflash2 = dict(mixed, target_layer_ids=[0, 3], **DFLASH2)   # a sliding layer: is_causal false matters
    out = [("synthetic_mixed", {"target": SYNTHETIC, "drafter": mixed}, DEFAULT_MAX_POSITIONS),
           ("synthetic_full", {"target": SYNTHETIC, "drafter": full}, DEFAULT_MAX_POSITIONS),
           ("synthetic_dflash2", {"target": SYNTHETIC, "drafter": dflash2}, DEFAULT_MAX_POSITIONS)]
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


def bf16_finite(data, t):
    """whether a BF16 tensor holds no NaN or Inf (exponent bits all ones)"""
    a, b = t["data_offsets"]
    bits = array.array("H", data[a:b])
    if sys.byteorder == "big":
        bits.byteswap()
    return all(v & 0x7F80 != 0x7F80 for v in bits)


def is_dflash2(c):
    return c.get("architectures") == ["DFlash2DraftModel"]


def expected_tensors(c):
    """SPEC.md s.2's names and shapes (what SpecForge's DFlashDraftModel's state_dict holds), and
    s.2.1's for a DFlash2 drafter (what the DFlash2 models of vLLM, SGLang, SpecForge, z-lab and
    speculators hold: the base kernels [2, taps, H], the codebooks without ".weight")"""
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
    if is_dflash2(c):
        d2 = c["dflash_config"]
        taps, G, r = d2["conv_kernel_size"], H // d2["conv_group_size"], d2["selector_rank"]
        for i in range(c["num_hidden_layers"]):
            for conv in ("attention_conv", "mlp_conv"):
                p = f"layers.{i}.{conv}."
                names.update({p + "base_kernel": [2, taps, H], p + "kernel_projection.weight": [2 * taps * G, H]})
        V = c["vocab_size"]
        names.update({"candidate_selector.predecessor_codebook": [V, r],
                      "candidate_selector.successor_codebook": [V, r],
                      "candidate_selector.hidden_projection.weight": [r, H]})
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


# ------------------------------------------------------------------------------------------
# The loaders' DFlash2 readings (SPEC.md 2.1)

DFLASH2_SIZES = ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k")


def draft_int(value):
    return is_int(value) and value > 0


def vllm_dflash2(c, errors, notes):
    """vLLM, vllm/model_executor/models/qwen3_dflash2.py (vllm-project/vllm@1b1712a0, PR #52816):
    DFlash2Qwen3DecoderLayer reads int(dflash_config["conv_kernel_size"]) and
    ["conv_group_size"], DFlash2Qwen3Model ["selector_rank"] and ["selector_top_k"] (a KeyError
    without one), DFlashGroupedConv refuses a group size that does not divide hidden_size, and
    dflash_config's input_embedding_scale and output_multiplier (1.0) and final_logit_softcapping
    (off) change the drafter; the convolution's block is 1 + num_speculative_tokens. Dispatch:
    registry "DFlash2DraftModel" -> qwen3_dflash2, and v1/worker/gpu/spec_decode/__init__.py
    takes the DFlash2Speculator (the V2 model runner's) for method "dflash" with that
    architecture. Causality, qwen3_dflash.py _dflash_layer_causal (vllm-project/vllm@036a00d1):
    the top-level is_causal, else dflash_config.causal, else sliding_attention layers causal."""
    d2 = c.get("dflash_config") or {}
    if c.get("architectures") != ["DFlash2DraftModel"]:
        errors.append("vLLM: architectures must be [\"DFlash2DraftModel\"] (registry)")
    for key in DFLASH2_SIZES:
        if not draft_int(d2.get(key)):
            errors.append(f"vLLM: dflash_config[{key!r}] missing or not a positive integer")
    if draft_int(d2.get("conv_group_size")) and c["hidden_size"] % d2["conv_group_size"]:
        errors.append("vLLM: conv_group_size must divide hidden_size")
    for i, t in enumerate(c["layer_types"]):
        causal = c.get("is_causal")
        if causal is None:
            causal = d2.get("causal")
        if causal is None:
            causal = t == "sliding_attention"
        if causal:
            errors.append(f"vLLM: layer {i} would run causal; DFlash2's blocks are bidirectional (is_causal false)")
    for key, neutral in (("input_embedding_scale", 1.0), ("output_multiplier", 1.0)):
        if d2.get(key, neutral) != neutral:
            errors.append(f"vLLM: dflash_config.{key} {d2[key]} changes the drafter")
    if float(d2.get("final_logit_softcapping") or 0.0) > 0:
        errors.append("vLLM: dflash_config.final_logit_softcapping changes the drafter")
    notes.append(f"vLLM: method dflash, num_speculative_tokens {c['block_size'] - 1}, VLLM_USE_V2_MODEL_RUNNER=1")


def sglang_dflash2(c, errors):
    """SGLang, python/sglang/srt/speculative/dflash_utils.py parse_dflash_draft_config
    (sgl-project/sglang@00731f0b): conv_kernel_size and conv_group_size together (both or
    neither), selector_rank and selector_top_k together, integers >= 0, block_size
    dflash_config's else the top-level one (16 without either), output_multiplier > 0;
    python/sglang/srt/models/dflash.py (the DFlash2 model of sglang PR #35371, SGLang 0.5.23):
    DFlash2DraftModel in EntryClass requires selector_rank, DFlashGroupedConv a group size that
    divides hidden_size, and _get_dflash_attention_type makes every layer ENCODER_ONLY (a whole
    block) when is_causal is false, its sliding_attention layers DECODER (causal) without it."""
    d2 = c.get("dflash_config") or {}
    if bool(d2.get("conv_kernel_size", 0)) != bool(d2.get("conv_group_size", 0)):
        errors.append("SGLang: conv_kernel_size and conv_group_size must come together")
    if bool(d2.get("selector_rank", 0)) != bool(d2.get("selector_top_k", 0)):
        errors.append("SGLang: selector_rank and selector_top_k must come together")
    if not d2.get("selector_rank"):
        errors.append("SGLang: DFlash2DraftModel requires dflash_config.selector_rank")
    for key in DFLASH2_SIZES:
        if not draft_int(d2.get(key)):
            errors.append(f"SGLang: dflash_config.{key} not a positive integer")
    if d2.get("block_size", c.get("block_size", 16)) != c["block_size"]:
        errors.append("SGLang: the block it builds the convolutions for is not the export's block_size")
    if draft_int(d2.get("conv_group_size")) and c["hidden_size"] % d2["conv_group_size"]:
        errors.append("SGLang: DFLASH conv_group_size must divide hidden_size")
    if c.get("is_causal") is not False:
        errors.append("SGLang: without is_causal false its sliding_attention layers run causal")
    if float(d2.get("output_multiplier", 1.0)) <= 0:
        errors.append("SGLang: DFLASH output_multiplier must be positive")


def specforge_dflash2(c, errors):
    """SpecForge, specforge/modeling/draft/dflash2.py (sgl-project/SpecForge@0dcf8859):
    DFlash2DraftModel requires dflash_config's conv_kernel_size, conv_group_size, selector_rank and
    selector_top_k as int (not bool), DFlashGroupedConv 1 <= conv_kernel_size <= block_size and a
    group size that divides hidden_size, CandidateSelector selector_rank >= 1 and selector_top_k in
    [1, vocab_size]; its block_size is the top-level config.block_size (dflash.py
    DFlashDraftModel, sgl-project/SpecForge@0354ed80)."""
    d2 = c.get("dflash_config") or {}
    for key in DFLASH2_SIZES:
        if not is_int(d2.get(key)):
            errors.append(f"SpecForge: DFlash2DraftModel requires dflash_config.{key}")
    if not is_int(c.get("block_size")):
        errors.append("SpecForge: config.block_size (top-level) missing")
        return
    if not 1 <= d2.get("conv_kernel_size", 0) <= c["block_size"]:
        errors.append("SpecForge: conv_kernel_size must be in [1, block_size]")
    if not draft_int(d2.get("conv_group_size")) or c["hidden_size"] % d2["conv_group_size"]:
        errors.append("SpecForge: conv_group_size must divide hidden_size")
    if d2.get("selector_rank", 0) < 1 or not 1 <= d2.get("selector_top_k", 0) <= c["vocab_size"]:
        errors.append("SpecForge: selector_rank >= 1 and selector_top_k in [1, vocab_size]")


def zlab_dflash2(c, errors):
    """z-lab, dflash/model.py (z-lab/dflash@07ebd93d, read in a verbatim copy: the z-lab/dflash
    snapshot here, 44947fb, predates DFlash2): _draft_value(config, name) is dflash_config's
    value, else the top-level one: int() of conv_kernel_size, conv_group_size, selector_rank and
    selector_top_k (None fails), block_size (16 without it); Qwen3DFlashAttention: is_causal
    None makes the sliding_attention layers causal; DFlash2DraftModel.from_pretrained maps
    candidate_selector.{predecessor,successor}_codebook (no ".weight") onto its nn.Embedding."""
    d2 = c.get("dflash_config") or {}

    def value(name, default=None):
        return d2.get(name, c.get(name, default))

    for key in DFLASH2_SIZES:
        if not draft_int(value(key)):
            errors.append(f"z-lab: {key} missing (int(None))")
    if value("block_size", 16) != c["block_size"]:
        errors.append("z-lab: its block_size is not the export's")
    if c.get("is_causal") is not False and "sliding_attention" in c["layer_types"]:
        errors.append("z-lab: without is_causal false its sliding_attention layers run causal")


def speculators_dflash2(c, errors, notes):
    """speculators, src/speculators/models/dflash2/model_definitions.py
    (vllm-project/speculators@1f7db3ac, adapted from z-lab/dflash@07ebd93d):
    GroupedDynamicCausalConv refuses kernel_size > block_size and a group size that does not
    divide hidden_size, CandidateSelector top_k > vocab_size; its config (config.py,
    @961aeaa0) says architectures ["DFlash2DraftModel"]. Its vLLM plugin
    (speculators.vllm.dflash2) requires the four sizes and refuses a served block
    (1 + num_speculative_tokens) other than dflash_config.block_size, the block trained."""
    d2 = c.get("dflash_config") or {}
    if d2.get("block_size") != c["block_size"]:
        errors.append("speculators: dflash_config.block_size (the block trained) missing or not block_size")
    if not d2.get("conv_kernel_size", 0) <= c["block_size"]:
        errors.append("speculators: kernel_size cannot exceed block_size")
    if d2.get("selector_top_k", 0) > c["vocab_size"]:
        errors.append("speculators: top_k cannot exceed vocab_size")
    notes.append(f"served block {c['block_size']} exactly")


def dflash_has_no_dflash2_keys(c, errors):
    """a DFlash export as before DFlash2: no is_causal (vLLM, SGLang and z-lab keep its sliding
    layers causal and its full layers not, SPEC.md s.2) and no DFlash2 size in dflash_config
    (SGLang's DFlashDraftModel builds the convolutions when conv_kernel_size is there)"""
    if "is_causal" in c:
        errors.append("a DFlash export says is_causal")
    extra = sorted(set(c.get("dflash_config") or {}) - {"mask_token_id", "target_layer_ids"})
    if extra:
        errors.append(f"a DFlash export's dflash_config has {extra}")


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
    if is_dflash2(c):   # vLLM's and SGLang's DFlashGroupedConv and CandidateSelector: one tensor each
        params.update({name: {None} for name in expected_tensors(c) if "_conv." in name or "candidate_" in name})
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
    if c.get("architectures") not in (["DFlashDraftModel"], ["DFlash2DraftModel"]) or c.get("model_type") != "qwen3":
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
    if is_dflash2(c):
        vllm_dflash2(c, errors, notes)
        sglang_dflash2(c, errors)
        specforge_dflash2(c, errors)
        zlab_dflash2(c, errors)
        speculators_dflash2(c, errors, notes)
    else:
        dflash_has_no_dflash2_keys(c, errors)
    if errors:   # the tensors follow from a config.json the loaders take
        return errors

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
        elif not bf16_finite(data, t):
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
            readers = "Qwen3Config, SpecForge, vLLM, SGLang, z-lab and speculators" if "dflash2" in name else \
                "Qwen3Config, SpecForge, vLLM, SGLang and z-lab"
            cases.run(f"{name}: read as {readers} read it", case, a.ddtreed, work, name, cfg, max_positions)
    finally:
        if not a.workdir:
            shutil.rmtree(work, ignore_errors=True)
    return cases.summary()


if __name__ == "__main__":
    sys.exit(main())
