#!/usr/bin/env bash
# train_cli_test.sh DDTREED EXAMPLES_DIR: ddtreed's run commands end to end, as a user runs
# them: every example passes `ddtreed plan`; a short run stopped with --stop-after, resumed
# with --resume to its end, exported again with `ddtreed export`, its SQLite records read
# back; a byte flipped in a checkpoint and in an export found by `ddtreed verify` and refused by
# `ddtreed export`, the resume falling back to the checkpoint before (its event, its log line);
# bad configs and bad command lines refused with the field named and the right exit status (1:
# refused, 2: usage). One line per case, a final "N passed, M failed".
set -uo pipefail
ddtreed=$1 examples=$2
source "$(dirname "$0")/../cases.sh"
cases_begin ddtree_cli
# plan_case NAME RC PATTERN... -- ARGS...: `ddtreed plan ARGS` from the source root exits RC and
# prints a line matching each PATTERN (grep's basic expressions)
plan_case() {
    local name=$1 want=$2 out rc p
    shift 2
    local patterns=()
    while [ "$1" != -- ]; do patterns+=("$1"); shift; done
    shift
    out=$(cd "$root" && "$ddtreed" plan "$@" 2>&1)
    rc=$?
    [ "$rc" -eq "$want" ] || { fail "$name" "exit $rc, want $want"$'\n'"$out"; return; }
    for p in "${patterns[@]}"; do
        grep -q -e "$p" <<<"$out" || { fail "$name" "no line matches: $p"$'\n'"$out"; return; }
    done
    ok "$name"
}

# from the repository root (a config's relative paths lead from its own folder, wherever it runs)
root=$(cd "$examples/.." && pwd)
# an example changed into $work: its relative target.path made absolute (it would lead from $work)
derive() { sed -e "s#\"path\": \"qwen3.6-27b\"#\"path\": \"$root/examples/qwen3.6-27b\"#" "$@"; }
for f in "$examples"/*.json; do
    if out=$(cd "$root" && "$ddtreed" plan "$f" 2>&1) && grep -q "predicted peak" <<<"$out"; then
        ok "plan $(basename "$f")"
    else
        fail "plan $(basename "$f")" "$out"
    fi
done

# the seed's online plans (examples/qwen3.6-27b: the config.json alone)
plan_case "plan seed-ddtree.json: Qwen3.6-27B co-located, fits 149 GB" 0 \
    "target (co-located) *53.797 GB" "budget 149.000 GB: fits" -- examples/seed-ddtree.json
plan_case "plan seed-ddtree-96gb.json: the rtx-pro-6000 named, a split of 3 target GPUs, fits 95 GB" 0 \
    "each of 3 target GPU(s):" "budget 95.000 GB of the rtx-pro-6000's [0-9.]* GB: fits" \
    "^  card rtx-pro-6000 (.*): memory [0-9.]* GB, shared memory [0-9.]* KiB per block (.*), [0-9]* threads per SM$" \
    -- examples/seed-ddtree-96gb.json
# without memory.budget_bytes the card's memory is the budget (libddk's figure, read back from --json)
derive -e 's/"budget_bytes": 95000000000, //' "$root/examples/seed-ddtree-96gb.json" >"$work/card96.json"
out=$(cd "$root" && "$ddtreed" plan "$work/card96.json" 2>&1)
json=$(cd "$root" && "$ddtreed" plan "$work/card96.json" --json 2>/dev/null)
if [ $? -eq 0 ] && grep -q "budget [0-9.]* GB, the rtx-pro-6000's memory: fits" <<<"$out" &&
   /usr/bin/python3 -c 'import json, sys; p = json.loads(sys.argv[1]); k = p["card"]
assert p["budget_from"] == "card" and p["budget_bytes"] == k["memory_bytes"] > 0 and k["applies"], p
assert k["name"] == "rtx-pro-6000" and k["shared_memory_per_block_bytes"] > 0 and k["threads_per_sm"] > 0, k' "$json"; then
    ok "plan: the card's memory is the budget when none is given"
else
    fail "plan: the card's memory is the budget when none is given" "$out"$'\n'"$json"
fi
out=$(cd "$root" && "$ddtreed" plan examples/seed-ddtree.json --json 2>/dev/null)
if /usr/bin/python3 -c 'import json, sys; p = json.loads(sys.argv[1])
assert "card" not in p and p["budget_from"] == "given", p' "$out" &&
   ! (cd "$root" && "$ddtreed" plan examples/seed-ddtree.json 2>&1 | grep -q "card"); then
    ok "plan: a config without a card names none"
else
    fail "plan: a config without a card names none" "$out"
fi
# the card named on the command line: seed-ddtree.json's 149 GB budget on an h200, then beyond a 96 GB card
plan_case "plan --card h200" 0 "^  card h200 " "budget 149.000 GB of the h200's [0-9.]* GB: fits" \
    -- examples/seed-ddtree.json --card h200
plan_case "plan --card: the config's budget beyond the card refused" 1 \
    "memory.budget_bytes: 149000000000 bytes (149.0 GB) is beyond the rtx-pro-6000's memory, [0-9]* bytes" \
    -- examples/seed-ddtree.json --card rtx-pro-6000
plan_case "plan --budget beyond the card refused" 1 \
    "--budget: 200000000000 bytes (200.0 GB) is beyond the rtx-pro-6000's memory" \
    -- examples/seed-ddtree-96gb.json --budget 200000000000
plan_case "plan --card: an unknown card refused, the known ones named" 2 \
    '--card: "rtx6000" is not a card ddtree knows: name one of .*rtx-pro-6000' "h100" \
    -- examples/seed-ddtree-96gb.json --card rtx6000
derive -e 's/"card": "rtx-pro-6000"/"card": "rtx6000"/' "$root/examples/seed-ddtree-96gb.json" >"$work/badcard.json"
plan_case "memory.card: an unknown card refused, the known ones named" 1 \
    'memory.card: "rtx6000" is not a card ddtree knows: name one of .*h100.*rtx-pro-6000' -- "$work/badcard.json"
derive -e 's/"budget_bytes": 95000000000/"budget_bytes": 200000000000/' "$root/examples/seed-ddtree-96gb.json" >"$work/overcard.json"
plan_case "memory.budget_bytes beyond the card refused" 1 \
    "memory.budget_bytes: 200000000000 bytes (200.0 GB) is beyond the rtx-pro-6000's memory" -- "$work/overcard.json"
# "same" planned away from the node: its 5 GPUs, 2 proposed for the target, so 3 drafter ranks of 2 of the 5 sequences each
derive -e 's/"devices": \["cuda:5", "cuda:6", "cuda:7"\]/"devices": "same"/' "$root/examples/seed-ddtree-96gb.json" >"$work/same96.json"
plan_case "plan: co-location on 95 GB does not fit, a split is proposed, its drafter ranks planned" 1 \
    "proposed: co-location does not fit" \
    "does NOT fit as configured: co-located, the target and the drafter need" \
    "as the split proposed (co-located does not fit): per drafter GPU of 3, beside 2 target GPU(s); the config names 5" \
    "^  49152 positions at a time (2 sequence(s) x 1024 anchors x block 24; a rank takes 2 of the step's 5 sequences)" \
    'fits as a split (the figures above): 3 drafter GPU(s), 2 target GPU(s)' \
    '^    {"devices": \["cuda:0", "cuda:1", "cuda:2"\], "target": {"devices": \["cuda:3", "cuda:4"\]}}$' \
    -- "$work/same96.json"
sed 's/"budget_bytes": 95000000000, //' "$work/same96.json" >"$work/same96card.json"
plan_case "plan: co-location on the rtx-pro-6000's whole memory does not fit either, a split is proposed" 1 \
    "proposed: co-location does not fit" \
    "the rtx-pro-6000's memory: does NOT fit as configured: co-located, the target and the drafter need [0-9.]* GB per GPU against a budget of" \
    "fits as a split" -- "$work/same96card.json"
# a target not at hand is planned from its declared shape, every field of it: Qwen3-8B's
# 8.19 B parameters are 32.763 GB in fp32 (the MLP and attention too, not only the embeddings)
plan_case "plan: Qwen3-8B from its declared shape: 32.763 GB of fp32 weights" 0 \
    "intermediate_size 12288, vocab_size 151936, a dense target" "^  target weights  *32.763 GB" -- examples/qwen3-8b.json
# issue 27: the seed (8 GPUs) under 95 GB does not fit as configured (exit 1, "fits" false) but as
# the split printed, which, written into the config, plans as it said and exits 0
plan_case "plan: the seed under 95 GB: not as configured, the split to write printed" 1 \
    "budget 95.000 GB: does NOT fit as configured" "fits as a split (the figures above): 5 drafter GPU(s), 3 target GPU(s)" \
    '^    {"devices": \["cuda:0", "cuda:1", "cuda:2", "cuda:3", "cuda:4"\], "target": {"devices": \["cuda:5", "cuda:6", "cuda:7"\]}}$' \
    "^  predicted peak  *93.637 GB" -- examples/seed-ddtree.json --budget 95000000000
json=$(cd "$root" && "$ddtreed" plan examples/seed-ddtree.json --budget 95e9 --json 2>/dev/null)
/usr/bin/python3 - "$json" "$root/examples/seed-ddtree.json" "$work/seed-split.json" <<'PY' &&
import json, sys
p = json.loads(sys.argv[1])
assert p["fits"] is False and p["target"]["proposed"] and p["proposal"]["fits"] is True, p
assert sum(p["peak_parts"].values()) == p["predicted_peak_bytes"], p["peak_parts"]
import os
c = json.load(open(sys.argv[2]))
# its relative target.path is the example's folder's: absolute in the copy
c["target"]["path"] = os.path.join(os.path.dirname(sys.argv[2]), c["target"]["path"])
c["devices"] = p["proposal"]["config"]["devices"]
c["target"].update(p["proposal"]["config"]["target"])
json.dump(c, open(sys.argv[3], "w"))
PY
    plan_case "plan: the split proposed, written into the config, fits" 0 "budget 95.000 GB: fits" \
        "^  predicted peak  *93.637 GB" -- "$work/seed-split.json" --budget 95GB ||
    fail "plan --json: the seed under 95 GB: fits false, the proposal fits, peak_parts sum to the peak" "$json"
for b in 96000000000 96e9 96GB 96G 96gb 96GiB; do
    want=96000000000; [ "$b" = 96GiB ] && want=103079215104
    out=$(cd "$root" && "$ddtreed" plan examples/seed-ddtree.json --budget "$b" --json 2>/dev/null)
    if /usr/bin/python3 -c 'import json, sys; assert json.loads(sys.argv[1])["budget_bytes"] == int(sys.argv[2])' "$out" "$want"; then
        ok "plan --budget $b is $want bytes"
    else
        fail "plan --budget $b is $want bytes" "$out"
    fi
done
plan_case "plan --budget 96x: not understood, the forms named" 2 "--budget 96x: not understood (--budget wants bytes: .*96GiB" \
    -- examples/seed-ddtree.json --budget 96x
printf '{"name": ' >"$work/badjson.json"
plan_case "plan: a file that is not JSON is named" 1 "^ddtreed plan: $work/badjson.json: .*not valid JSON" \
    -- "$work/badjson.json"
for cmd in plan export; do
    out=$("$ddtreed" $cmd --help 2>&1)
    if [ $? -eq 0 ] && grep -q "^usage: ddtreed $cmd" <<<"$out"; then ok "$cmd --help"; else fail "$cmd --help" "$out"; fi
done
for bad in 'overlap|"devices": ["cuda:0", "cuda:1"], "target": {"kind": "synthetic", "devices": ["cuda:1"]}|cuda:1, a drafter GPU too' \
           'cpu ranks|"devices": "cpu", "target": {"kind": "synthetic", "devices": ["cuda:0"]}|the drafter trains on CPU ranks' \
           'shards|"target": {"kind": "shards", "path": "/x", "shards": ["/x/a"], "devices": ["cuda:0"]}|no target at train time' \
           'not a list|"target": {"kind": "synthetic", "devices": 0}|a list of GPUs ["cuda:N", ...] apart from devices'"'"' or a number of target ranks'; do
    IFS='|' read -r what body want <<<"$bad"
    printf '{"name": "bad", %s, "train": {"sequences_per_step": 2}}\n' "$body" >"$work/bad.json"
    out=$("$ddtreed" plan "$work/bad.json" 2>&1)
    if [ $? -eq 1 ] && grep -q "target.devices" <<<"$out" && grep -qF "$want" <<<"$out"; then
        ok "target.devices refused: $what"
    else
        fail "target.devices refused: $what" "$out"
    fi
done

cat >"$work/run.json" <<'JSON'
{"name": "cli", "target": {"kind": "synthetic", "hidden_size": 32, "num_hidden_layers": 3,
 "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8, "intermediate_size": 48,
 "vocab_size": 64},
 "drafter": {"num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2,
             "head_dim": 8, "intermediate_size": 48, "block_size": 4},
 "train": {"steps": 6, "sequences_per_step": 2, "seq_len": 24, "max_anchors": 3, "heldout": 2},
 "checkpoint": {"every_steps": 2, "keep": 2}, "eval": {"every_steps": 3, "sequences": 2}}
JSON
state="$work/state"
out=$("$ddtreed" train "$work/run.json" --state-dir "$state" --stop-after 3 2>&1)
if [ $? -eq 0 ] && grep -q "paused at step 3 of 6" <<<"$out"; then ok "train --stop-after 3 pauses"; else fail "train --stop-after 3 pauses" "$out"; fi
run=$(ls "$state/runs" | head -n 1)
out=$("$ddtreed" train --resume "$state" 2>&1)
if [ $? -eq 0 ] && grep -q "completed at step 6 of 6" <<<"$out" && [ -f "$state/runs/$run/export/model.safetensors" ]; then
    ok "train --resume completes and exports"
else
    fail "train --resume completes and exports" "$out"
fi
# export given a state directory, a checkpoint, or a step not kept: what to give instead
for bad in "$state||is a state directory: give one of its runs, $state/runs/<id> (its runs: $run)" \
           "$state/runs/$run/checkpoints/step-00000004||is a checkpoint: give its run directory" \
           "$state/runs/$run|--step 3|no complete checkpoint of step 3; the kept steps: 4"; do
    IFS='|' read -r dir args want <<<"$bad"
    out=$("$ddtreed" export "$dir" --out "$work/x" $args 2>&1)
    if [ $? -eq 1 ] && grep -qF -- "$want" <<<"$out"; then ok "export refuses: $want"; else fail "export refuses: $want" "$out"; fi
done
out=$("$ddtreed" export "$state/runs/$run" --out "$work/export" --step 4 2>&1)
if [ $? -eq 0 ] && [ -f "$work/export/config.json" ] && grep -q DFlashDraftModel "$work/export/config.json"; then
    ok "export --step 4"
else
    fail "export --step 4" "$out"
fi
out=$(/usr/bin/python3 - "$state/ddtree.db" "$run" <<'PY' 2>&1
import sqlite3, sys
db = sqlite3.connect(sys.argv[1])
steps = db.execute("select count(*), max(step) from steps where run_id = ?", (sys.argv[2],)).fetchone()
state = db.execute("select state, step from runs where id = ?", (sys.argv[2],)).fetchone()
evals = db.execute("select count(*) from evals where run_id = ?", (sys.argv[2],)).fetchone()[0]
ckpts = db.execute("select count(*) from checkpoints where run_id = ?", (sys.argv[2],)).fetchone()[0]
kinds = {k for (k,) in db.execute("select kind from events where run_id = ?", (sys.argv[2],))}
assert steps == (6, 6), steps
assert state == ("completed", 6), state
assert evals >= 2 and ckpts >= 3, (evals, ckpts)
assert {"state", "checkpoint"} <= kinds, kinds
print("ok")
PY
)
if [ "$out" = ok ]; then ok "records in ddtree.db"; else fail "records in ddtree.db" "$out"; fi

# checksums: a byte flipped in the newest checkpoint's state.safetensors is found by `ddtreed
# verify` (exit 1) and refused by `ddtreed export`; --resume falls back to the checkpoint before
# it, with a checkpoint_corrupt event and a log line; a flipped byte in the export, a checkpoint
# written before checksums, and verify's command line
flip() {   # flip FILE: the lowest bit of its middle byte
    python3 -c 'import sys; p = sys.argv[1]; b = bytearray(open(p, "rb").read()); b[len(b) // 2] ^= 1
open(p, "wb").write(b)' "$1"
}
# verify_case NAME RC DIR PATTERN...: `ddtreed verify DIR` exits RC, prints as many lines as
# patterns, each matching one (grep -E)
verify_case() {
    local name=$1 want=$2 dir=$3 out rc p
    shift 3
    out=$("$ddtreed" verify "$dir" 2>&1)
    rc=$?
    [ "$rc" -eq "$want" ] || { fail "$name" "exit $rc, want $want"$'\n'"$out"; return; }
    [ "$(wc -l <<<"$out")" -eq $# ] || { fail "$name" "$(wc -l <<<"$out") lines, want $#"$'\n'"$out"; return; }
    for p in "$@"; do
        grep -qE -e "$p" <<<"$out" || { fail "$name" "no line matches: $p"$'\n'"$out"; return; }
    done
    ok "$name"
}
cs="$work/checksums"
"$ddtreed" train "$work/run.json" --state-dir "$cs" --stop-after 5 >/dev/null 2>&1
csrun=$(ls "$cs/runs" | head -n 1)
ck="$cs/runs/$csrun/checkpoints"
hex='[0-9a-f]{16}'
verify_case "verify: a state directory's checkpoints, good" 0 "$cs" "^$ck/step-00000004: good$" "^$ck/step-00000005: good$"
flip "$ck/step-00000005/state.safetensors"
verify_case "verify: a flipped byte in the newest checkpoint" 1 "$cs" "^$ck/step-00000004: good$" \
    "^$ck/step-00000005: corrupt: state.safetensors \(expected xxh64 $hex, got $hex\)$"
verify_case "verify: the run directory" 1 "$cs/runs/$csrun/" "^$ck/step-00000004: good$" "^$ck/step-00000005: corrupt: "
verify_case "verify: the good checkpoint alone" 0 "$ck/step-00000004" "^$ck/step-00000004: good$"
out=$("$ddtreed" export "$cs/runs/$csrun" --out "$work/cs_export" 2>&1)
if [ $? -eq 1 ] && grep -qE "$ck/step-00000005/state.safetensors is corrupt \(expected xxh64 $hex, got $hex\): " <<<"$out" &&
   grep -qF -- "--step N" <<<"$out" && [ ! -e "$work/cs_export" ]; then
    ok "export of a corrupt checkpoint refused, the file and what to do named"
else
    fail "export of a corrupt checkpoint refused, the file and what to do named" "$out"
fi
out=$("$ddtreed" train --resume "$cs" 2>&1)
if [ $? -eq 0 ] && grep -q "completed at step 6 of 6" <<<"$out" &&
   grep -qF "checkpoint passed over at resume path=\"$ck/step-00000005\"" <<<"$out" &&
   grep -qF "resumed_from=4" <<<"$out"; then
    ok "train --resume: a corrupt newest checkpoint passed over, resumed from the one before"
else
    fail "train --resume: a corrupt newest checkpoint passed over, resumed from the one before" "$out"
fi
out=$(/usr/bin/python3 - "$cs/ddtree.db" "$csrun" "$ck" <<'PY' 2>&1
import json, sqlite3, sys
db = sqlite3.connect(sys.argv[1])
rows = [json.loads(d) for (d,) in db.execute(
    "select detail_json from events where run_id = ? and kind = 'checkpoint_corrupt'", (sys.argv[2],))]
assert len(rows) == 1, rows
e = rows[0]
assert e["checkpoint"] == sys.argv[3] + "/step-00000005" and e["step"] == 5 and e["resumed_from"] == 4, e
assert e["moved_to"] == sys.argv[3] + "/corrupt-step-00000005", e
assert e["file"] == "state.safetensors" and e["verdict"] == "corrupt", e
assert e["message"].startswith("corrupt: state.safetensors (expected xxh64 "), e
state = db.execute("select state, step from runs where id = ?", (sys.argv[2],)).fetchone()
assert state == ("completed", 6), state
print("ok")
PY
)
if [ "$out" = ok ]; then ok "the checkpoint_corrupt event in ddtree.db"; else fail "the checkpoint_corrupt event in ddtree.db" "$out"; fi
# the corrupt checkpoint moved aside (kept for the operator, no longer one of the `keep` newest:
# the good step 4 stays); the new one and the export good
if [ -f "$ck/corrupt-step-00000005/state.safetensors" ]; then
    ok "the corrupt checkpoint moved aside to corrupt-step-00000005"
else
    fail "the corrupt checkpoint moved aside to corrupt-step-00000005" "$(ls "$ck")"
fi
verify_case "verify after the resume: the good one before, the new one and the export good" 0 "$cs" \
    "^$ck/step-00000004: good$" "^$ck/step-00000006: good$" "^$cs/runs/$csrun/export: good$"
flip "$cs/runs/$csrun/export/model.safetensors"
verify_case "verify: a flipped byte in the export" 1 "$cs/runs/$csrun/export" \
    "^$cs/runs/$csrun/export: corrupt: model.safetensors \(expected xxh64 $hex, got $hex\)$"
cp -r "$ck/step-00000006" "$work/before_checksums"
/usr/bin/python3 - "$work/before_checksums/state.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
del s["files"], s["seal"]
s["version"] = 3
json.dump(s, open(sys.argv[1], "w"))
PY
verify_case "verify: a checkpoint written before checksums" 0 "$work/before_checksums" \
    "^$work/before_checksums: unverified \(written before checksums\)$"
mkdir -p "$work/old_run/checkpoints" && cp -r "$work/before_checksums" "$work/old_run/checkpoints/step-00000006"
out=$("$ddtreed" export "$work/old_run" --out "$work/old_export" 2>&1)
if [ $? -eq 0 ] && grep -qF "<4>checkpoint: read unverified path=\"$work/old_run/checkpoints/step-00000006\"" <<<"$out" &&
   [ -f "$work/old_export/ddtree-manifest.json" ]; then
    ok "export of a checkpoint written before checksums: read with a warning, the export with its manifest"
else
    fail "export of a checkpoint written before checksums: read with a warning, the export with its manifest" "$out"
fi
rm "$work/before_checksums/state.safetensors"
verify_case "verify: a checkpoint without its tensors" 1 "$work/before_checksums" \
    "^$work/before_checksums: incomplete: state.safetensors missing$"
mkdir -p "$work/empty"
for bad in "|DIR is required" "$work/nowhere|no such directory" "$work/run.json|not a directory" \
           "$work/empty|directories: name a state directory (with runs/)" "--fast|DIR is not an option"; do
    IFS='|' read -r arg want <<<"$bad"
    out=$("$ddtreed" verify ${arg:+"$arg"} 2>&1)
    if [ $? -eq 2 ] && grep -qF -- "$want" <<<"$out"; then ok "verify refuses: $want"; else fail "verify refuses: $want" "$out"; fi
done
out=$("$ddtreed" verify "$cs" "$cs" 2>&1)
if [ $? -eq 2 ] && grep -q "one DIR only" <<<"$out"; then ok "verify refuses: two directories"; else fail "verify refuses: two directories" "$out"; fi

# a split on CPU ranks (2 drafter ranks, 1 target rank one step ahead), paused and resumed: the
# losses of the same run with the host's target, step for step
for place in host split; do
    devices='"host"'
    [ $place = split ] && devices=1
    sed -e 's/"kind": "synthetic",/"kind": "synthetic", "devices": '"$devices"',/' \
        -e 's/"checkpoint": {/"devices": 2, "checkpoint": {/' "$work/run.json" >"$work/$place.json"
    "$ddtreed" train "$work/$place.json" --state-dir "$work/$place" --stop-after 3 >/dev/null 2>&1 &&
        "$ddtreed" train --resume "$work/$place" >"$work/$place.out" 2>&1 || cat "$work/$place.out"
done
out=$(/usr/bin/python3 - "$work/host/ddtree.db" "$work/split/ddtree.db" <<'PY' 2>&1
import sqlite3, sys
host, split = ([row for row in sqlite3.connect(db).execute("select step, loss from steps order by step")]
               for db in sys.argv[1:])
assert len(host) == 6 and host == split, (host, split)
print("ok")
PY
)
if [ "$out" = ok ]; then ok "a split run, paused and resumed: the host run's losses"; else fail "a split run, paused and resumed: the host run's losses" "$out"; fi

echo '{"train": {"lr": "fast"}}' >"$work/bad.json"
out=$("$ddtreed" train "$work/bad.json" --state-dir "$work/s2" 2>&1)
if [ $? -eq 1 ] && grep -q "train.lr" <<<"$out"; then ok "a bad config names the field"; else fail "a bad config names the field" "$out"; fi
out=$("$ddtreed" plan "$work/bad.json" 2>&1)
if [ $? -eq 1 ] && grep -q "train.lr" <<<"$out"; then ok "plan refuses it too"; else fail "plan refuses it too" "$out"; fi
"$ddtreed" train --stop-after 0 >/dev/null 2>&1
if [ $? -eq 2 ]; then ok "usage errors exit 2"; else fail "usage errors exit 2"; fi
out=$("$ddtreed" train --resume "$work/nowhere" 2>&1)
if [ $? -eq 1 ] && grep -q "no run to resume" <<<"$out"; then ok "resume of nothing"; else fail "resume of nothing" "$out"; fi

# Runs that could not start are refused before they start (issue 27), naming the field and what
# to do, by `ddtreed train` and `ddtreed plan` alike: a misspelled JSONL path, a missing token
# file, chat data without tokenizer.json, a tokenizer whose ids pass the target's vocabulary.
# The target: a config.json of 100 ids and a weights file (stat only: nothing is loaded).
mkdir -p "$work/files/model" "$work/files/conf"
/usr/bin/python3 - "$work/files/model" <<'PY'
import json, os, sys
d = sys.argv[1]
json.dump({"model_type": "qwen3", "hidden_size": 16, "num_hidden_layers": 12, "num_attention_heads": 2,
           "num_key_value_heads": 1, "head_dim": 8, "intermediate_size": 32, "vocab_size": 100,
           "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "tie_word_embeddings": False,
           "max_position_embeddings": 4096}, open(os.path.join(d, "config.json"), "w"))
open(os.path.join(d, "model.safetensors"), "wb").close()
bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))   # GPT-2's byte alphabet
cs, n = bs[:], 0
for b in range(256):
    if b not in bs:
        bs.append(b); cs.append(256 + n); n += 1
vocab = {chr(c): i for i, c in enumerate(sorted(cs, key=lambda c: bs[cs.index(c)]))}
byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}
json.dump({"version": "1.0", "truncation": None, "padding": None, "added_tokens": [], "normalizer": None,
           "pre_tokenizer": byte_level, "post_processor": byte_level, "decoder": byte_level,
           "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                     "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                     "vocab": vocab, "merges": []}}, open(os.path.join(d, "big_tokenizer.json"), "w"))
PY
echo '{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}' >"$work/files/chat.jsonl"
files_case() {   # files_case NAME PATTERN BODY: train and plan refuse CONFIG (in conf/) naming PATTERN
    printf '{"name": "files", "target": {"kind": "hf", %s}, "train": {"steps": 2, "seq_len": 16}}\n' "$3" \
        >"$work/files/conf/run.json"
    local t p
    t=$("$ddtreed" train "$work/files/conf/run.json" --state-dir "$work/files/s" 2>&1)
    local trc=$?
    p=$("$ddtreed" plan "$work/files/conf/run.json" 2>&1)
    local prc=$?
    if [ $trc -eq 1 ] && [ $prc -eq 1 ] && grep -q -e "$2" <<<"$t" && grep -q -e "$2" <<<"$p"; then
        ok "train and plan refuse: $1"
    else
        fail "train and plan refuse: $1" "train: $t"$'\n'"plan: $p"
    fi
}
# relative paths lead from the config's folder (conf/), not from here
files_case "a misspelled JSONL path" 'target.data.files\[1\]: ".*/files/conf/../chta.jsonl": no such file or directory: give the path of a JSON Lines file' \
    '"path": "../model", "data": {"files": ["../chat.jsonl", "../chta.jsonl"]}'
files_case "a token file that is not there" 'target.tokens: ".*/files/conf/../chat.tokens": no such file or directory: give the token file `ddtreed tokenize` wrote' \
    '"path": "../model", "tokens": "../chat.tokens"'
printf '{"target": {"kind": "hf", "path": "../mdoel"}}\n' >"$work/files/conf/run.json"
out=$("$ddtreed" train "$work/files/conf/run.json" --state-dir "$work/files/s" 2>&1)
if [ $? -eq 1 ] && grep -q 'target.path: .*/files/conf/../mdoel/config.json: cannot open' <<<"$out"; then
    ok "train refuses a misspelled target.path, naming the field"
else
    fail "train refuses a misspelled target.path, naming the field" "$out"
fi
files_case "chat data without tokenizer.json" 'target.path: .*/model/tokenizer.json: no such file: chat data is tokenized with the model.s own Hugging Face tokenizer.json' \
    '"path": "../model", "data": {"files": ["../chat.jsonl"]}'
out=$("$ddtreed" tokenize --model "$work/files/model" --chat "$work/files/chat.jsonl" --template qwen3 \
      --out "$work/files/t.safetensors" 2>&1)
if [ $? -eq 1 ] && grep -q "model/tokenizer.json: no such file: chat data is tokenized with the model's own Hugging Face tokenizer.json: put the one that came with the model" <<<"$out"; then
    ok "tokenize without tokenizer.json says what chat data needs"
else
    fail "tokenize without tokenizer.json says what chat data needs" "$out"
fi
ln -s big_tokenizer.json "$work/files/model/tokenizer.json"
files_case "a tokenizer past the target's vocabulary" 'target.path: ".*/model/tokenizer.json": its ids run to 255, past the target.s vocab_size 100 (config.json): it is not this model.s tokenizer' \
    '"path": "../model", "data": {"files": ["../chat.jsonl"]}'
printf '{"train": {"learning_rate": 0.001, "step": 3}}\n' >"$work/files/typo.json"
out=$("$ddtreed" plan "$work/files/typo.json" 2>&1)
if grep -q "train.learning_rate: is not a known field: did you mean train.lr?" <<<"$out"; then
    ok "an unknown key: did you mean"; else fail "an unknown key: did you mean" "$out"; fi
for typo in 'learning_rate|learning_rate: is not a known field: did you mean train.lr?' \
            'train": {"step|train.step: is not a known field: did you mean train.steps?' \
            'target": {"pth|target.pth: is not a known field: did you mean target.path?'; do
    IFS='|' read -r key want <<<"$typo"
    closing=$(tr -cd '{' <<<"$key" | sed 's/{/}/g')
    printf '{"%s": 1%s}\n' "$key" "$closing" >"$work/files/typo.json"
    out=$("$ddtreed" plan "$work/files/typo.json" 2>&1)
    if grep -qF -- "$want" <<<"$out"; then ok "did you mean: $want"; else fail "did you mean: $want" "$out"; fi
done

docs=$(dirname "$0")/../../docs/run-config.md
if diff <("$ddtreed" train --help | sed -n '/^| field/,$p') <(sed -n '/^| field/,$p' "$docs") >/dev/null; then
    ok "docs/run-config.md is the config table"
else
    fail "docs/run-config.md is the config table" "regenerate its table from: ddtreed train --help"
fi

cases_end
