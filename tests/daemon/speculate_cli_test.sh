#!/usr/bin/env bash
# speculate_cli_test.sh DDTREED [MODELS_DIR]: `ddtreed speculate` end to end, as a user runs it
# (SPEC.md section 7): a tiny llama target directory written here (random weights, F32), a
# drafter trained on it for a few steps with `ddtreed train` and exported, then speculated with
# --tree 4,16 on prompts of a token file written here; the result checked (greedy-equal, 1 <=
# tau_spec <= B, tau_spec_tree(K) >= tau_spec for K >= B-1, calls > 0, one entry per prompt); the
# same on stories260K when MODELS_DIR/stories260k is there ("skipped" otherwise); and the bad
# inputs, each refused with a non-zero status and a message naming the file and the field: an
# export with a byte flipped in model.safetensors or config.json (against its manifest), an
# export missing a tensor, a config.json saying DFlash2DraftModel over a DFlash drafter's tensors
# or naming an architecture ddtree does not implement, a config.json with a wrong hidden_size, vocab_size, num_target_layers
# or tap id, a prompt longer than the target's context, a tree budget above the cap, bad command
# lines (status 2). python3 with its json and struct modules only.
# One line per case, a final "N passed, M failed".
set -uo pipefail
ddtreed=$1 models=${2:-}
[ -x "$ddtreed" ] || { echo "FAIL $ddtreed is not an executable"; exit 1; }
source "$(dirname "$0")/../cases.sh"
cases_begin ddtree_spec
py=$work/st.py
cat >"$py" <<'PY'
"""Fixtures of speculate_cli_test.sh: safetensors written and rewritten with struct and json."""
import json, random, struct, sys

def write_st(path, tensors, meta=None):
    """tensors: [(name, dtype, shape, bytes)] in data order"""
    header, off = {}, 0
    for name, dtype, shape, data in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + len(data)]}
        off += len(data)
    if meta is not None:
        header["__metadata__"] = meta
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for t in tensors:
            f.write(t[3])

def read_st(path):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    meta = header.pop("__metadata__", None)
    items = sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0])
    base = 8 + n
    return [(k, v["dtype"], v["shape"], raw[base + v["data_offsets"][0]:base + v["data_offsets"][1]])
            for k, v in items], meta

def f32(values):
    return struct.pack("<%df" % len(values), *values)

def target(out, H, L, nh, nkv, d, I, V, ctx, seed):
    """a llama directory: embeddings N(0, 1), matrices N(0, 1/fan_in), lm_head N(0, 16/H)
    (peaked next-token distributions, as ddt_target_synthetic's), norms 1"""
    rng = random.Random(seed)
    def mat(rows, cols, std):
        return f32([rng.gauss(0.0, std) for _ in range(rows * cols)])
    ones = lambda n: f32([1.0] * n)
    t = [("model.embed_tokens.weight", "F32", [V, H], mat(V, H, 1.0))]
    for i in range(L):
        p = "model.layers.%d." % i
        t += [(p + "input_layernorm.weight", "F32", [H], ones(H)),
              (p + "self_attn.q_proj.weight", "F32", [nh * d, H], mat(nh * d, H, H ** -0.5)),
              (p + "self_attn.k_proj.weight", "F32", [nkv * d, H], mat(nkv * d, H, H ** -0.5)),
              (p + "self_attn.v_proj.weight", "F32", [nkv * d, H], mat(nkv * d, H, H ** -0.5)),
              (p + "self_attn.o_proj.weight", "F32", [H, nh * d], mat(H, nh * d, (nh * d) ** -0.5)),
              (p + "post_attention_layernorm.weight", "F32", [H], ones(H)),
              (p + "mlp.gate_proj.weight", "F32", [I, H], mat(I, H, H ** -0.5)),
              (p + "mlp.up_proj.weight", "F32", [I, H], mat(I, H, H ** -0.5)),
              (p + "mlp.down_proj.weight", "F32", [H, I], mat(H, I, I ** -0.5))]
    t += [("model.norm.weight", "F32", [H], ones(H)), ("lm_head.weight", "F32", [V, H], mat(V, H, 4.0 * H ** -0.5))]
    write_st(out + "/model.safetensors", t, {"format": "pt"})
    json.dump({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": H,
               "intermediate_size": I, "num_hidden_layers": L, "num_attention_heads": nh,
               "num_key_value_heads": nkv, "head_dim": d, "vocab_size": V, "max_position_embeddings": ctx,
               "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "hidden_act": "silu",
               "tie_word_embeddings": False, "torch_dtype": "float32"}, open(out + "/config.json", "w"), indent=1)

def tokens(out, V, seed, *lens):
    rng = random.Random(seed)
    ids, offsets = [], [0]
    for n in lens:
        ids += [rng.randrange(V) for _ in range(n)]
        offsets.append(len(ids))
    write_st(out, [("input_ids", "I32", [len(ids)], struct.pack("<%di" % len(ids), *ids)),
                   ("offsets", "I64", [len(offsets)], struct.pack("<%dq" % len(offsets), *offsets))])

def drop(src, dst, name):
    t, meta = read_st(src)
    assert any(k == name for k, *_ in t), name
    write_st(dst, [x for x in t if x[0] != name], meta)

def config(path, *edits):
    """edits: KEY VALUE ... (VALUE JSON, or "-" to remove KEY); dflash_config.KEY inside it"""
    c = json.load(open(path))
    for key, value in zip(edits[::2], edits[1::2]):
        obj = c
        if key.startswith("dflash_config."):
            obj, key = c["dflash_config"], key.split(".", 1)[1]
        if value == "-":
            del obj[key]
        else:
            obj[key] = json.loads(str(value))
    json.dump(c, open(path, "w"), indent=1)

def check(path, summary, prompts, budgets, learnt="-"):
    """the result of SPEC.md section 7's contract; learnt "K:TAU": a drafter that learnt something
    (tau_spec above 1, tau_spec_tree(K) above TAU), which a drafter the decoding ignored or
    read wrong would not reach"""
    r = json.load(open(path))
    s = json.loads(open(summary).read().strip().splitlines()[-1])
    B, tau = r["block_size"], r["tau_spec"]
    assert r["greedy_equal"] is True, r["greedy_equal"]
    assert r["draft"] == "argmax", r["draft"]   # DFlash exports (a DFlash2 one: "selector")
    assert 1 <= tau <= B, (tau, B)
    assert sorted(r["tau_spec_tree"], key=int) == sorted(budgets.split(","), key=int), r["tau_spec_tree"]
    for k, t in r["tau_spec_tree"].items():
        assert 1 <= t <= B, (k, t)
        if int(k) >= B - 1:
            assert t >= tau - 1e-12, ("tau_spec_tree below the chain", k, t, tau)
        assert r["calls"]["tree"][k] > 0, r["calls"]
    assert r["calls"]["chain"] > 0, r["calls"]
    assert len(r["prompts"]) == int(prompts), len(r["prompts"])
    for p in r["prompts"]:
        assert p["equal"] is True and 1 <= len(p["generated"]) <= r["gen_len"], p
        assert all(isinstance(t, int) for t in p["generated"]), p
    for k in ("greedy", "chain"):
        assert r["tokens_per_s"][k] > 0, r["tokens_per_s"]
    assert set(r["tokens_per_s"]["tree"]) == set(r["tau_spec_tree"]), r["tokens_per_s"]
    assert "prompts" not in s and s["tau_spec"] == tau and s["greedy_equal"] is True, s
    if learnt != "-":
        k, floor = learnt.split(":")
        assert tau > 1 and r["tau_spec_tree"][k] > float(floor), ("the trained drafter accepts nothing", r)
    print("ok tau_spec %.3f tree %s B %d" % (tau, r["tau_spec_tree"], B))

globals()[sys.argv[1]](*[int(a) if a.lstrip("-").isdigit() else a for a in sys.argv[2:]])
PY

# refused CMD... : exit status $1, stderr holding every one of the fixed strings after --
refused() {
    local what=$1 want_rc=$2
    shift 2
    local args=() wants=()
    while [ "$1" != -- ]; do args+=("$1"); shift; done
    shift
    wants=("$@")
    out=$("$ddtreed" speculate "${args[@]}" 2>&1)
    local rc=$?
    local missing=""
    for w in "${wants[@]}"; do grep -qF -- "$w" <<<"$out" || missing="$missing [$w]"; done
    if [ "$rc" -eq "$want_rc" ] && [ -z "$missing" ]; then
        ok "$what"
    else
        fail "$what" "exit $rc (want $want_rc), missing:$missing
$out"
    fi
}

# train a drafter on target directory $1 for $4 steps on sequences the target generates and
# export it to $2 (block size $3; $5: more drafter keys)
train_export() {
    local target=$1 out=$2 B=$3 steps=$4 extra=${5:-}
    cat >"$work/run.json" <<JSON
{"name": "spec", "target": {"kind": "hf", "path": "$target"},
 "drafter": {"num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2,
             "head_dim": 8, "intermediate_size": 48, "block_size": $B $extra},
 "train": {"steps": $steps, "sequences_per_step": 4, "seq_len": 48, "max_anchors": 8, "heldout": 2,
           "lr": 3e-3},
 "checkpoint": {"every_steps": $steps, "keep": 1}, "eval": {"every_steps": $steps, "sequences": 2}}
JSON
    local state
    state=$(mktemp -d "$work/state.XXXX")
    if ! "$ddtreed" train "$work/run.json" --state-dir "$state" >"$state/train.log" 2>&1; then
        cat "$state/train.log"
        return 1
    fi
    "$ddtreed" export "$state/runs/$(ls "$state/runs" | head -n 1)" --out "$out" >>"$state/train.log" 2>&1 ||
        { cat "$state/train.log"; return 1; }
}

# ------------------------------------------------------------------------------------------
# a tiny llama target written here: H 32, 3 layers, V 64, context 96
tdir=$work/target
mkdir -p "$tdir"
python3 "$py" target "$tdir" 32 3 4 2 8 48 64 96 7
python3 "$py" tokens "$work/prompts.safetensors" 64 1 12 9 20 5
python3 "$py" tokens "$work/prompts_eval.safetensors" 64 5 8 8 8 8 8 8
export=$work/export
# 300 steps (2 s): tau_spec about 1.1, tau_spec_tree(16) about 1.7 on 2 cores
if out=$(train_export "$tdir" "$export" 4 300 2>&1) && grep -q DFlashDraftModel "$export/config.json"; then
    ok "train + export a drafter on the tiny target"
else
    fail "train + export a drafter on the tiny target" "$out"
fi

# --drafter given what is not an export: what it is and what to give instead
state_dir=$(ls -d "$work"/state.* | head -n 1)
run_dir="$state_dir/runs/$(ls "$state_dir/runs" | head -n 1)"
ckpt_dir="$run_dir/checkpoints/$(ls "$run_dir/checkpoints" | grep '^step-' | head -n 1)"
for bad in "$run_dir|is a run directory, not a drafter export: give its export, RUN_DIR/export" \
           "$ckpt_dir|is a checkpoint, not a drafter export: export it first: ddtreed export RUN_DIR --step N" \
           "$state_dir|is a state directory, not a drafter export: give a run's export: DIR/runs/<id>/export" \
           "$tdir|is a target model (its config.json has no dflash_config), not a drafter export: that is --target's"; do
    IFS='|' read -r dir want <<<"$bad"
    out=$("$ddtreed" speculate --target "$tdir" --drafter "$dir" --prompts "$work/prompts.safetensors" 2>&1)
    if [ $? -eq 1 ] && grep -qF -- "$want" <<<"$out"; then
        ok "speculate --drafter $(basename "$dir"): $want"
    else
        fail "speculate --drafter $(basename "$dir"): $want" "$out"
    fi
done

out=$("$ddtreed" speculate --target "$tdir" --drafter "$export" --prompts "$work/prompts.safetensors" \
      --gen-len 24 --prompt-len 10 --tree 4,16 --out "$work/result.json" 2>&1 >"$work/summary.json")
rc=$?
if [ $rc -eq 0 ] && check=$(python3 "$py" check "$work/result.json" "$work/summary.json" 4 4,16 2>&1); then
    ok "speculate --tree 4,16: greedy-equal, tau in [1, B], the trees not below the chain ($check)"
else
    fail "speculate --tree 4,16" "exit $rc; $out ${check:-} $(cat "$work/summary.json" 2>/dev/null)"
fi
out=$("$ddtreed" speculate --target "$tdir" --drafter "$export" --prompts "$work/prompts_eval.safetensors" \
      --gen-len 48 --tree 4,16 --out "$work/eval.json" 2>&1 >"$work/eval_summary.json")
rc=$?
if [ $rc -eq 0 ] && check=$(python3 "$py" check "$work/eval.json" "$work/eval_summary.json" 6 4,16 16:1.2 2>&1); then
    ok "the trained drafter's drafts are accepted: tau_spec > 1, tau_spec_tree(16) > 1.2 ($check)"
else
    fail "the trained drafter's drafts are accepted" "exit $rc; $out ${check:-}"
fi
out=$(python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); print([p["prompt_len"] for p in r["prompts"]])' \
      "$work/result.json" 2>&1)
if [ "$out" = "[10, 9, 10, 5]" ]; then ok "--prompt-len 10 cuts the longer prompts"; else fail "--prompt-len 10 cuts the longer prompts" "$out"; fi
out=$("$ddtreed" speculate --target "$tdir" --drafter "$export" --prompts "$work/prompts.safetensors" \
      --gen-len 8 --prompts-max 2 --out "$work/chain.json" 2>&1) &&
    out=$(python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); assert len(r["prompts"]) == 2 and r["tau_spec_tree"] == {} and r["greedy_equal"], r; print("ok")' \
          "$work/chain.json" 2>&1)
if [ "$out" = ok ]; then ok "--prompts-max 2, the chain alone"; else fail "--prompts-max 2, the chain alone" "$out"; fi

# ------------------------------------------------------------------------------------------
# bad inputs: each names the file and the field
base=(--target "$tdir" --prompts "$work/prompts.safetensors" --gen-len 8)
# a copy of the export edited by hand: without its manifest (as another trainer's export, or one
# written before checksums) the edit is read, not refused as a corrupt file
edited_copy() {
    rm -rf "$2" && cp -r "$1" "$2" && rm "$2/ddtree-manifest.json"
}
# a byte flipped in a file of the export: refused before anything is decoded, the file named with
# both checksums and what to do
for f in model.safetensors config.json; do
    rm -rf "$work/flipped" && cp -r "$export" "$work/flipped"
    python3 -c 'import sys; p = sys.argv[1]; b = bytearray(open(p, "rb").read()); b[len(b) // 2] ^= 1
open(p, "wb").write(b)' "$work/flipped/$f"
    refused "an export with a byte flipped in $f" 1 "${base[@]}" --drafter "$work/flipped" -- \
        "$work/flipped/$f is corrupt (expected xxh64 " "ddtreed export RUN_DIR --out DIR"
done
# without the manifest it is read as before, a warning logged
edited_copy "$export" "$work/unsummed"
out=$("$ddtreed" speculate "${base[@]}" --drafter "$work/unsummed" --prompts-max 1 2>&1)
if [ $? -eq 0 ] && grep -qF "<4>export: read unverified path=\"$work/unsummed\"" <<<"$out"; then
    ok "an export without its manifest: read, unverified, with a warning"
else
    fail "an export without its manifest: read, unverified, with a warning" "$out"
fi
edited_copy "$export" "$work/no_tensor"
python3 "$py" drop "$export/model.safetensors" "$work/no_tensor/model.safetensors" layers.0.mlp.up_proj.weight
refused "an export without a tensor" 1 "${base[@]}" --drafter "$work/no_tensor" -- \
    "$work/no_tensor/model.safetensors" "tensor 'layers.0.mlp.up_proj.weight' is missing"
# a config.json saying DFlash2DraftModel (SPEC.md 2.1) over a DFlash drafter's tensors: never run
# as DFlash, refused naming the first DFlash2 tensor it lacks; an architecture ddtree does not
# implement, refused naming the field
edited_copy "$export" "$work/as_dflash2"
python3 "$py" config "$work/as_dflash2/config.json" architectures '["DFlash2DraftModel"]' is_causal false \
    dflash_config.block_size 4 dflash_config.conv_kernel_size 2 dflash_config.conv_group_size 8 \
    dflash_config.selector_rank 8 dflash_config.selector_top_k 4
refused "a DFlash2 config.json over a DFlash drafter's tensors" 1 "${base[@]}" --drafter "$work/as_dflash2" -- \
    "$work/as_dflash2/model.safetensors: tensor 'layers.0.attention_conv.base_kernel' is missing"
edited_copy "$export" "$work/unknown_arch"
python3 "$py" config "$work/unknown_arch/config.json" architectures '["EagleDraftModel"]'
refused "config.json: an architecture ddtree does not implement" 1 "${base[@]}" --drafter "$work/unknown_arch" -- \
    "$work/unknown_arch/config.json: architectures is [\"EagleDraftModel\"]"
# (the last: an export without num_target_layers, which the servers do not need, its tap ids
# then checked against the target alone)
for bad in 'hidden_size|64|hidden_size 64 does not match the target'"'"'s 32' \
           'vocab_size|128|vocab_size 128 does not match the target'"'"'s 64' \
           'num_target_layers|5|num_target_layers 5 does not match the target'"'"'s 3' \
           'dflash_config.target_layer_ids|[1, 3]|num_target_layers|-|dflash_config.target_layer_ids: 3 is not a layer of the target'; do
    IFS='|' read -r -a edit <<<"$bad"
    want=${edit[-1]}
    unset 'edit[-1]'
    edited_copy "$export" "$work/bad_config"
    python3 "$py" config "$work/bad_config/config.json" "${edit[@]}"
    refused "config.json: a wrong ${edit[0]}" 1 "${base[@]}" --drafter "$work/bad_config" -- \
        "$work/bad_config/config.json: " "$want" "$tdir/config.json"
done
edited_copy "$export" "$work/bad_config"
python3 "$py" config "$work/bad_config/config.json" block_size 300
refused "config.json: a block_size past the slots" 1 "${base[@]}" --drafter "$work/bad_config" -- \
    "$work/bad_config/config.json: block_size 300: speculation drafts at most 256 slots"
# a tap id past the export's own num_target_layers: its reader (model_config.c) refuses it
edited_copy "$export" "$work/bad_config"
python3 "$py" config "$work/bad_config/config.json" dflash_config.target_layer_ids '[1, 3]'
refused "config.json: a tap id past its num_target_layers" 1 "${base[@]}" --drafter "$work/bad_config" -- \
    "$work/bad_config/config.json: dflash_config.target_layer_ids" "is not a layer of the target"
python3 "$py" tokens "$work/long.safetensors" 64 2 10 120 4
refused "a prompt longer than the target's context" 1 --target "$tdir" --drafter "$export" \
    --prompts "$work/long.safetensors" --gen-len 8 -- \
    "$work/long.safetensors: prompt 1 has 120 tokens" "context of 96" "$tdir/config.json max_position_embeddings"
refused "a prompt and --gen-len past the target's context" 1 "${base[@]}" --drafter "$export" --gen-len 80 -- \
    "prompt 2's 20 tokens and --gen-len 80 pass the target's context of 96"
refused "a token outside the target's vocabulary" 1 --target "$tdir" --drafter "$export" \
    --prompts "$work/prompts.safetensors" --stop 64 -- "--stop 64 is outside the target's vocabulary of 64"
refused "a tree budget above the cap" 2 "${base[@]}" --drafter "$export" --tree 4,70000 -- \
    "--tree: 70000 is not a node budget in [1, 65536]"
refused "a tree budget of 0" 2 "${base[@]}" --drafter "$export" --tree 0 -- "--tree: 0 is not a node budget"
refused "no --target" 2 --drafter "$export" --prompts "$work/prompts.safetensors" -- \
    "--target, --drafter and one of --prompts and --chat are required" "usage: ddtreed speculate"
refused "an unknown option" 2 "${base[@]}" --drafter "$export" --fast 1 -- "--fast is not an option"
refused "--gen-len not a number" 2 "${base[@]}" --drafter "$export" --gen-len many -- \
    "--gen-len wants a positive integer, got 'many'"
refused "an option without its value" 2 "${base[@]}" --drafter -- "--drafter needs a value"
refused "a bad --device" 2 "${base[@]}" --drafter "$export" --device gpu0 -- "--device is cpu or cuda:N"
# no GPU 7 here (the CUDA build: not a GPU of this node; without CUDA: no CUDA): a sentence, no backend
refused "a GPU that is not here" 1 "${base[@]}" --drafter "$export" --device cuda:7 -- "--device cuda:7: cuda:7"
refused "a missing target directory" 1 --target "$work/nowhere" --drafter "$export" \
    --prompts "$work/prompts.safetensors" -- "$work/nowhere"
refused "a missing prompts file" 1 --target "$tdir" --drafter "$export" --prompts "$work/none.safetensors" -- \
    "$work/none.safetensors"
"$ddtreed" speculate --help | grep -q "usage: ddtreed speculate" && ok "--help" || fail "--help"

# ------------------------------------------------------------------------------------------
# stories260K: a real (tiny) target, its tied head read as stored
stories=${models:+$models/stories260k}
if [ -n "$stories" ] && [ -f "$stories/model.safetensors" ]; then
    python3 "$py" tokens "$work/stories_prompts.safetensors" 512 3 16 24 8
    if out=$(train_export "$stories" "$work/stories_export" 4 4 ', "target_layer_ids": [1, 3]' 2>&1) &&
       out=$("$ddtreed" speculate --target "$stories" --drafter "$work/stories_export" \
             --prompts "$work/stories_prompts.safetensors" --gen-len 32 --tree 4,16 --out "$work/stories.json" \
             2>&1 >"$work/stories_summary.json") &&
       check=$(python3 "$py" check "$work/stories.json" "$work/stories_summary.json" 3 4,16 2>&1); then
        ok "stories260K: speculate --tree 4,16 ($check)"
    else
        fail "stories260K: speculate --tree 4,16" "$out ${check:-}"
    fi
else
    echo "skipped stories260K: ${stories:-MODELS_DIR}/model.safetensors is absent"
fi

cases_end
