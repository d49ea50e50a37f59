#!/usr/bin/env bash
# train_qwen35_test.sh DDTREED MODEL_DIR PYTHON: a short online run on a tiny Qwen3.5 target
# (target.kind hf, no token file: the target generates its sequences through its decoding
# cache, target_qwen35.c, then gives their features), as a user runs it. The target is the
# shared qwen35-tiny text-only checkpoint made learnable by tests/daemon/qwen35_structured.py (the
# same architecture and layout; next token mostly a bigram chain of the current one): the
# random checkpoint itself predicts a hash-like function of the whole context, which a
# one-layer drafter does not learn in a test's budget (tau_chain 1.000 -> 1.016 over 150 steps).
# Asserts the run completes, its loss falls and its tau_chain rises from 1.000 at step 0 to at
# least 1.5 (this run: 11.66 -> 3.24, tau_chain 1.000 -> 2.031; acc_1 0.52).
# Exit 77 (skipped) without MODEL_DIR.
set -uo pipefail
ddtreed=$1 model=$2 python=$3
if [ ! -f "$model/config.json" ]; then
    echo "skipped: $model is not there (the shared qwen35-tiny model)"
    exit 77
fi
work=$(mktemp -d /tmp/ddtree_q35train.XXXXXX)
trap 'rm -rf "$work"' EXIT
if ! "$python" "$(dirname "$0")/qwen35_structured.py" "$model" "$work/target"; then
    echo "FAIL could not write the structured checkpoint"
    exit 1
fi
cat >"$work/run.json" <<JSON
{"name": "qwen35-tiny", "target": {"kind": "hf", "path": "$work/target", "temperature": 0.3, "top_p": 0.95},
 "drafter": {"num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2,
             "head_dim": 16, "intermediate_size": 128, "block_size": 4, "target_layer_ids": "auto"},
 "train": {"steps": 300, "sequences_per_step": 4, "seq_len": 64, "max_anchors": 16, "heldout": 8,
           "lr": 1e-2, "seed": 0},
 "checkpoint": {"every_steps": 1000, "keep": 1}, "eval": {"every_steps": 300, "sequences": 8}}
JSON
out=$(OPENBLAS_NUM_THREADS=2 "$ddtreed" train "$work/run.json" --state-dir "$work/state" 2>&1)
rc=$?
sed -n '/loss  \|acceptance/p' <<<"$out"
if [ $rc -ne 0 ] || ! grep -q "completed at step 300 of 300" <<<"$out"; then
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
read -r tau tau0 < <(sed -n 's/^  acceptance *tau_chain \([0-9.]*\) (from \([0-9.]*\) at step 0).*/\1 \2/p' <<<"$out")
if awk -v a="${tau0:-}" -v b="${tau:-}" 'BEGIN { exit !(a != "" && b != "" && a + 0 <= 1.0 && b >= 1.5) }'; then
    echo "ok   tau_chain rises: $tau0 -> $tau"
else
    echo "FAIL tau_chain does not rise to 1.5: '${tau0:-}' -> '${tau:-}'"
    exit 1
fi
