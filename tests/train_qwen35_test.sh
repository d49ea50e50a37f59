#!/usr/bin/env bash
# train_qwen35_test.sh DDTREED MODEL_DIR: a short online run on the tiny Qwen3.5 target
# (target.kind hf, no token file: the target generates its sequences through its decoding
# cache, target_qwen35.c, then gives their features), as a user runs it. Asserts the run
# completes and its loss falls (the last step's below the first's). The tiny checkpoint has
# random weights (its next-token distributions are near uniform over 512 tokens), so within
# this budget the drafter does not learn to be accepted: tau_chain is printed, not asserted
# (this run: 1.000 -> 1.016, one block of 64 accepting a token; 300 steps: 1.000 -> 1.031,
# greedy 1.000 -> 1.000). Exit 77 (skipped) without MODEL_DIR.
set -uo pipefail
ddtreed=$1 model=$2
if [ ! -f "$model/config.json" ]; then
    echo "skipped: $model is not there (the shared qwen35-tiny model)"
    exit 77
fi
work=$(mktemp -d /tmp/ddtree_q35train.XXXXXX)
trap 'rm -rf "$work"' EXIT
cat >"$work/run.json" <<JSON
{"name": "qwen35-tiny", "target": {"kind": "hf", "path": "$model", "temperature": 0.3, "top_p": 0.95},
 "drafter": {"num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2,
             "head_dim": 16, "intermediate_size": 128, "block_size": 4, "target_layer_ids": "auto"},
 "train": {"steps": 150, "sequences_per_step": 4, "seq_len": 64, "max_anchors": 8, "heldout": 8,
           "lr": 3e-3, "seed": 0},
 "checkpoint": {"every_steps": 1000, "keep": 1}, "eval": {"every_steps": 150, "sequences": 8}}
JSON
out=$(OPENBLAS_NUM_THREADS=2 "$ddtreed" train "$work/run.json" --state-dir "$work/state" 2>&1)
rc=$?
sed -n '/loss  \|acceptance/p' <<<"$out"
if [ $rc -ne 0 ] || ! grep -q "completed at step 150 of 150" <<<"$out"; then
    echo "FAIL the run did not complete"
    sed 's/^/  # /' <<<"$out" | tail -20
    exit 1
fi
read -r first last < <(sed -n 's/^  loss *\([0-9.]*\) -> \([0-9.]*\) over.*/\1 \2/p' <<<"$out")
if awk -v a="$first" -v b="$last" 'BEGIN { exit !(a != "" && b < a) }'; then
    echo "ok   loss falls: $first -> $last"
else
    echo "FAIL loss does not fall: '$first' -> '$last'"
    exit 1
fi
