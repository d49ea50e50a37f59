#!/usr/bin/env bash
# dflash2_cli_test.sh DDTREED: DFlash2 drafters (SPEC.md 2.1) through ddtreed's command-line
# readers, as a user runs them: a DFlash2 run trained by `ddtreed train` on a synthetic target,
# its checkpoint and export good for `ddtreed verify`, its export told from a run directory
# (record/dir_kind.c), `ddtreed export` of its checkpoint the trainer's export byte for byte;
# `ddtreed step` on that export, with the loss JSON's selector keys (the run config's
# train.selector_* names), writes a gradient for every tensor of the export in the tensor's own
# shape (the base kernels [2, taps, H]); a bad selector key refused naming the file and the key; a config.json saying DFlash2DraftModel over a DFlash drafter's tensors refused
# naming the first DFlash2 tensor it lacks, and one of an architecture ddtree does not implement
# naming the field. (`ddtreed speculate`'s reader: speculate_cli_test.sh.) The step's numbers are
# not checked here: tests/oracle/step_torch_check.py does. python3 with json and struct only.
# One line per case, a final "N passed, M failed".
set -uo pipefail
ddtreed=$1
[ -x "$ddtreed" ] || { echo "FAIL $ddtreed is not an executable"; exit 1; }
source "$(dirname "$0")/../cases.sh"
cases_begin ddtree_dflash2
py=$work/st.py
cat >"$py" <<'PY'
"""Fixtures of dflash2_cli_test.sh: safetensors written and read with struct and json."""
import json, random, struct, sys

def write_st(path, tensors):
    """tensors: [(name, dtype, shape, bytes)] in data order"""
    header, off = {}, 0
    for name, dtype, shape, data in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + len(data)]}
        off += len(data)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for t in tensors:
            f.write(t[3])

def header(path):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    h = json.loads(raw[8:8 + n])
    h.pop("__metadata__", None)
    return h

def inputs(out, V, H, taps, S, seed):
    """OUT/head.safetensors (embed_tokens, lm_head [V, H]) and OUT/batch.safetensors (one
    sequence of S tokens, every one trained, two anchors kept)"""
    rng = random.Random(seed)
    f32 = lambda n, std: struct.pack("<%df" % n, *[rng.gauss(0.0, std) for _ in range(n)])
    write_st(out + "/head.safetensors", [("embed_tokens.weight", "F32", [V, H], f32(V * H, 1.0)),
                                         ("lm_head.weight", "F32", [V, H], f32(V * H, H ** -0.5))])
    ids = [rng.randrange(V) for _ in range(S)]
    write_st(out + "/batch.safetensors", [
        ("input_ids", "I32", [1, S], struct.pack("<%di" % S, *ids)),
        ("loss_mask", "U8", [1, S], bytes([1] * S)),
        ("features", "F32", [1, S, taps * H], f32(S * taps * H, 1.0)),
        ("anchors", "I32", [1, 2], struct.pack("<2i", 2, 7)),
        ("keep", "U8", [1, 2], bytes([1, 1]))])

def grads(out, export):
    """every tensor of EXPORT/model.safetensors has grad.NAME in OUT, F32 of its shape; prints
    the base kernel's shape"""
    g, w = header(out), header(export + "/model.safetensors")
    for name, t in w.items():
        got = g.get("grad." + name)
        assert got and got["dtype"] == "F32" and got["shape"] == t["shape"], (name, t["shape"], got)
    scalars = {"loss", "ce", "kl", "cap", "weight_sum", "sel"}
    assert set(g) - {"grad." + n for n in w} == scalars, sorted(set(g) - {"grad." + n for n in w})
    print(g["grad.layers.0.attention_conv.base_kernel"]["shape"])

def config(path, *edits):
    """edits: KEY VALUE ... (VALUE JSON)"""
    c = json.load(open(path))
    for key, value in zip(edits[::2], edits[1::2]):
        c[key] = json.loads(value)
    json.dump(c, open(path, "w"), indent=1)

globals()[sys.argv[1]](*[int(a) if a.isdigit() else a for a in sys.argv[2:]])
PY

# train NAME ARCHITECTURE_KEYS: a 2-step run of that drafter on the synthetic target into
# $work/NAME (its run directory in $run)
train() {
    cat >"$work/$1.json" <<JSON
{"name": "$1", "target": {"kind": "synthetic", "hidden_size": 32, "num_hidden_layers": 4,
  "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8, "intermediate_size": 48, "vocab_size": 64},
 "drafter": {"num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
             "intermediate_size": 48, "block_size": 4, "layer_types": ["sliding_attention", "full_attention"],
             "sliding_window": 6, "target_layer_ids": [1, 2] $2},
 "train": {"steps": 2, "sequences_per_step": 2, "seq_len": 24, "max_anchors": 3, "heldout": 2},
 "devices": "cpu", "checkpoint": {"every_steps": 2, "keep": 1}, "eval": {"every_steps": 100, "sequences": 2}}
JSON
    "$ddtreed" train "$work/$1.json" --state-dir "$work/$1" >"$work/$1.log" 2>&1 || return 1
    run="$work/$1/runs/$(ls "$work/$1/runs" | head -n 1)"
}

# refused NAME WANT... -- ARGS...: `ddtreed ARGS` exits 1 with stderr holding every WANT
refused() {
    local name=$1 wants=() out missing=""
    shift
    while [ "$1" != -- ]; do wants+=("$1"); shift; done
    shift
    out=$("$ddtreed" "$@" 2>&1)
    local rc=$?
    for w in "${wants[@]}"; do grep -qF -- "$w" <<<"$out" || missing="$missing [$w]"; done
    if [ $rc -eq 1 ] && [ -z "$missing" ]; then
        ok "$name"
    else
        fail "$name" "exit $rc, missing:$missing"$'\n'"$out"
    fi
}

# ------------------------------------------------------------------------------------------
# a DFlash2 run: trained, verified, exported again
if train dflash2 ', "architecture": "dflash2", "conv_group_size": 8, "selector_rank": 8, "selector_top_k": 4' &&
   grep -q '"DFlash2DraftModel"' "$run/export/config.json"; then
    ok "train a DFlash2 drafter: its export says DFlash2DraftModel"
else
    fail "train a DFlash2 drafter: its export says DFlash2DraftModel" "$(cat "$work/dflash2.log")"
fi
dflash2_run=$run
out=$("$ddtreed" verify "$work/dflash2" 2>&1)
if [ $? -eq 0 ] && grep -q "step-00000002: good$" <<<"$out" && grep -q "/export: good$" <<<"$out"; then
    ok "verify: the DFlash2 checkpoint (its state.json's drafter read) and export good"
else
    fail "verify: the DFlash2 checkpoint (its state.json's drafter read) and export good" "$out"
fi
refused "export: a DFlash2 export is told from a run directory" "$dflash2_run/export is an export already" -- \
    export "$dflash2_run/export" --out "$work/x"
out=$("$ddtreed" export "$dflash2_run" --out "$work/again" 2>&1)
if [ $? -eq 0 ] && cmp -s "$work/again/config.json" "$dflash2_run/export/config.json" &&
   cmp -s "$work/again/model.safetensors" "$dflash2_run/export/model.safetensors"; then
    ok "ddtreed export of the DFlash2 checkpoint: the trainer's export byte for byte"
else
    fail "ddtreed export of the DFlash2 checkpoint: the trainer's export byte for byte" "$out"
fi

# ------------------------------------------------------------------------------------------
# ddtreed step on it: the selector keys of the loss JSON, every gradient in its own shape
python3 "$py" inputs "$work" 64 32 2 16 3
printf '{"gamma": 4, "ce_target": "data", "selector_weight": 0.5, "selector_candidates": "inject",
 "selector_stop_gradient": true}\n' >"$work/loss.json"
step=(step --head "$work/head.safetensors" --batch "$work/batch.safetensors" --out "$work/grads.safetensors")
out=$("$ddtreed" "${step[@]}" --drafter "$dflash2_run/export" --loss "$work/loss.json" 2>&1) &&
    shape=$(python3 "$py" grads "$work/grads.safetensors" "$dflash2_run/export" 2>&1)
if [ $? -eq 0 ] && [ "$shape" = "[2, 2, 32]" ]; then
    ok "step: a gradient per tensor in its own shape, the base kernel's [2, 2, 32]"
else
    fail "step: a gradient per tensor in its own shape, the base kernel's [2, 2, 32]" "$out ${shape:-}"
fi
for bad in 'selector_candidates|"loose"|selector_candidates must be "strict" or "inject"' \
           'selector_stop_gradient|1|selector_stop_gradient must be true or false' \
           'selector_weight|-1|selector_weight' \
           'selector_temperature|2|selector_temperature'; do
    IFS='|' read -r key value want <<<"$bad"
    printf '{"gamma": 4, "ce_target": "data", "%s": %s}\n' "$key" "$value" >"$work/bad_loss.json"
    refused "step --loss: a bad $key" "$work/bad_loss.json: $want" -- \
        "${step[@]}" --drafter "$dflash2_run/export" --loss "$work/bad_loss.json"
done

# ------------------------------------------------------------------------------------------
# what the readers refuse: DFlash2's config.json over DFlash's tensors, an unknown architecture
# (copies without the manifest, as another trainer's exports: the edit is read, not found corrupt)
train dflash '' || fail "train a DFlash drafter" "$(cat "$work/dflash.log")"
for name in relabelled unknown; do
    rm -rf "${work:?}/$name" && cp -r "$run/export" "$work/$name" && rm "$work/$name/ddtree-manifest.json"
done
cp "$dflash2_run/export/config.json" "$work/relabelled/config.json"
refused "step: a DFlash2 config.json over a DFlash drafter's tensors" \
    "$work/relabelled/model.safetensors: tensor 'layers.0.attention_conv.base_kernel' is missing" -- \
    "${step[@]}" --drafter "$work/relabelled" --loss "$work/loss.json"
python3 "$py" config "$work/unknown/config.json" architectures '["Qwen3ForCausalLM"]'
refused "step: an architecture ddtree does not implement" \
    "$work/unknown/config.json: architectures is [\"Qwen3ForCausalLM\"]" "[\"DFlash2DraftModel\"] (section 2.1)" -- \
    "${step[@]}" --drafter "$work/unknown" --loss "$work/loss.json"
cases_end
