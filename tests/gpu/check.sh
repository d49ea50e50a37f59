#!/usr/bin/env bash
# check.sh: the ONE script of a device run (tests/gpu/README.md): build with CUDA for sm_90, the
# gpu-labelled tests (backend_ops, cuda_device, step_cuda), bench_loss_cuda at the seed's scale
# with bf16 products (the seed's precision) and its three matmul ceilings, bench_step_cuda (one
# training step of the Qwen3.6-27B drafter's shape), the seed's PyTorch approach on the same GPU
# beside them, then, while time remains, the fp32 runs, the small loss cases and
# compute-sanitizer's memcheck of test_backend_ops.
# Every step is time-boxed with `timeout` inside one deadline (CHECK_BUDGET_S, default 470 s),
# so the whole run stays under 8 minutes; a step that no longer fits is skipped and says so.
# Steps run in order of value: the late ones (fp32 figures, small cases, the sanitizer) are the
# ones that get cut.
#
# Files (at most 8, as the device tool brings back): under ${OUT:-/tmp/ddtree-gpu}:
#   check.log     every step's output, with its command, exit status and time
#   build.log     configure and build
#   sanitizer.log compute-sanitizer's output
#   results.jsonl one JSON line per benchmark step, tagged: bench_loss_cuda's, bench_step_cuda's
#                 and loss_torch_gpu.py's, or {"tag":..,"missing":..} when a step left none
#   summary.md    every step's status; the loss, ceiling, workspace and step tables
# Exit status: 0 when the build and ctest -L gpu passed, 1 otherwise (benchmarks never fail it).
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT" || exit 1
LOGS=${OUT:-/tmp/ddtree-gpu}
mkdir -p "$LOGS"
BUILD=${BUILD:-$ROOT/build-gpu}
LOG=$LOGS/check.log
RESULTS=$LOGS/results.jsonl
SUMMARY=$LOGS/summary.md
: >"$LOG"; : >"$RESULTS"
START=$(date +%s)
DEADLINE=$((START + ${CHECK_BUDGET_S:-470}))
export PATH="$PATH:/usr/local/cuda/bin"
STEPS=()   # "name|status|seconds" rows for the summary
FAILED=0

# step NAME BOX_S COMMAND...: runs COMMAND under timeout min(BOX_S, time left - 5 s), output to
# check.log (and the terminal); records its status: ok, skipped (77), timed out, failed (rc)
step() {
    local name=$1 box=$2; shift 2
    local left=$((DEADLINE - $(date +%s) - 5))
    [ "$box" -gt "$left" ] && box=$left
    if [ "$box" -lt 10 ]; then
        echo "== $name: not run (out of time)" | tee -a "$LOG"
        STEPS+=("$name|not run (out of time)|0")
        return 124
    fi
    echo "== $name (at most ${box}s): $*" | tee -a "$LOG"
    local t0 rc status
    t0=$(date +%s)
    timeout -k 10 "$box" "$@" 2>&1 | tee -a "$LOG"
    rc=${PIPESTATUS[0]}
    case $rc in
        0) status=ok ;;
        77) status="skipped (77)" ;;
        124|137) status="timed out after ${box}s" ;;
        *) status="failed (rc $rc)" ;;
    esac
    echo "== $name: $status in $(( $(date +%s) - t0 ))s" | tee -a "$LOG"
    STEPS+=("$name|$status|$(( $(date +%s) - t0 ))")
    return "$rc"
}

# bench_step TAG NAME BOX_S COMMAND...: a benchmark step whose last output line starting with
# '{' goes to results.jsonl, tagged; without one (not run, timed out, crashed) a
# {"tag":TAG,"missing":STATUS} line stands in its place, so the summary names every benchmark
bench_step() {
    local tag=$1; shift
    local before; before=$(wc -l <"$LOG")
    step "$@"
    local rc=$?
    local line
    line=$(tail -n +"$((before + 1))" "$LOG" | grep '^{' | tail -n 1)
    if [ -n "$line" ]; then
        printf '%s\n' "$line" | sed "s/^{/{\"tag\":\"$tag\",/" >>"$RESULTS"
    else
        local last=${STEPS[${#STEPS[@]}-1]}
        last=${last#*|}; last=${last%|*}
        printf '{"tag":"%s","missing":"no JSON line (%s)"}\n' "$tag" "${last//\"/}" >>"$RESULTS"
    fi
    return "$rc"
}

echo "ddtree GPU check: $(date -u +%FT%TZ), logs in $LOGS" | tee -a "$LOG"
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 || echo "no nvidia-smi"
  nvcc --version 2>&1 | tail -n 1 || echo "no nvcc"; } | tee -a "$LOG"

# 1. what the build needs: cmake and pkg-config as commands, the -dev packages through dpkg;
#    apt-get only as root and only for what is missing (the device machine may have no network)
need=()
command -v cmake >/dev/null || need+=(cmake)
command -v pkg-config >/dev/null || need+=(pkg-config)
for p in libopenblas-dev libcjson-dev libsqlite3-dev libmicrohttpd-dev libuv1-dev libcurl4-openssl-dev; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || need+=("$p")
done
if [ ${#need[@]} -gt 0 ]; then
    if [ "$(id -u)" = 0 ]; then
        step "install ${need[*]}" 150 bash -c 'source scripts/lib/common.sh && ddtree_install "$@"' _ "${need[@]}"
    else
        echo "missing ${need[*]} and not root: the build may fail" | tee -a "$LOG"
        STEPS+=("install ${need[*]}|not root: not installed|0")
    fi
fi

# 2. configure and build (sm_90 only: the H200); the gpu tests and the two benchmarks are what we need
# shellcheck disable=SC2016  # expanded by the inner bash
BUILD_CMD='cmake -S "$1" -B "$2" -DDDTREE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_BUILD_TYPE=Release &&
    cmake --build "$2" -j "$(nproc)" --target test_backend_ops test_cuda_device test_step_cuda \
        test_comm bench_loss_cuda bench_step_cuda'
if step "configure + build" 240 bash -c "$BUILD_CMD" _ "$ROOT" "$BUILD" >"$LOGS/build.log" 2>&1; then
    built=1
else
    built=0; FAILED=1
fi
tail -n 5 "$LOGS/build.log" | tee -a "$LOG"
grep -i -E "warning" "$LOGS/build.log" | head -n 20 | tee -a "$LOG"

if [ "$built" = 1 ]; then
    # 3. the gpu-labelled tests (backend_ops: every op CUDA vs CPU; cuda_device; step_cuda: a
    #    whole training step and trainer runs, GPU vs CPU)
    before=$(wc -l <"$LOG")
    step "ctest -L gpu" 150 ctest --test-dir "$BUILD" -L gpu --output-on-failure || FAILED=1
    # ctest reports a 77 as skipped and still exits 0: a skipped GPU test on a GPU is a failure
    if tail -n +"$((before + 1))" "$LOG" | grep -q "Not Run\|Skipped"; then
        echo "ctest -L gpu: a test was skipped on the device machine" | tee -a "$LOG"; FAILED=1
        STEPS+=("ctest -L gpu: a GPU test skipped (no GPU seen)|failed|0")
    fi
    # 4. the loss at the seed's scale with bf16 products (the default; and the three ceilings)
    bench_step cuda-seed-bf16 "bench_loss_cuda seed scale, bf16 products" 90 "$BUILD/bin/bench_loss_cuda" --reps 2
    # 5. one training step of the Qwen3.6-27B drafter's shape, bf16 products (the default)
    bench_step step-bf16 "bench_step_cuda, bf16 products" 150 "$BUILD/bin/bench_step_cuda" --reps 2
fi

# 6. the seed's PyTorch approach on the same GPU, same shapes, in the seed's precision
#    (exits 77 without torch or CUDA)
PY=/usr/bin/python3
"$PY" -c 'import torch' 2>/dev/null || PY=$(command -v python3 || echo /usr/bin/python3)
export PYTHONUNBUFFERED=1
bench_step torch-bf16-seed "torch bf16 seed scale (the seed's precision)" 90 "$PY" tests/gpu/loss_torch_gpu.py \
    --dtype bf16 --reps 2

# 7. while time remains: the fp32 figures, the small loss cases, the torch fp32 rows
if [ "$built" = 1 ]; then
    bench_step cuda-seed-fp32 "bench_loss_cuda seed scale, fp32" 90 "$BUILD/bin/bench_loss_cuda" --bf16 0 --reps 2
    bench_step step-fp32 "bench_step_cuda, fp32" 90 "$BUILD/bin/bench_step_cuda" --bf16 0 --reps 1
    for b in 1 0; do
        bench_step "cuda-small-$([ $b = 1 ] && echo bf16 || echo fp32)" "bench_loss_cuda small, --bf16 $b" 40 \
            "$BUILD/bin/bench_loss_cuda" --bf16 "$b" --n 4096 --hidden 1024 --vocab 32000 --chunk 1024 \
            --tile 4096 --reps 5
    done
fi
bench_step torch-fp32-seed "torch fp32 seed scale" 120 "$PY" tests/gpu/loss_torch_gpu.py --dtype fp32 --reps 2
bench_step torch-fp32-small "torch fp32 small" 45 "$PY" tests/gpu/loss_torch_gpu.py --dtype fp32 \
    --n 4096 --hidden 1024 --vocab 32000 --lm-chunk 1024 --kl-chunk 512 --reps 5

# 8. compute-sanitizer memcheck of test_backend_ops (last: the slowest and the first to be cut)
if [ "$built" = 1 ] && command -v compute-sanitizer >/dev/null; then
    step "compute-sanitizer memcheck test_backend_ops" 150 compute-sanitizer --tool memcheck \
        --error-exitcode 3 "$BUILD/bin/test_backend_ops" >"$LOGS/sanitizer.log" 2>&1
    tail -n 8 "$LOGS/sanitizer.log" | tee -a "$LOG"
elif [ "$built" = 1 ]; then
    STEPS+=("compute-sanitizer|not on this machine|0")
fi

# 9. summary.md: every step and every figure (the Python below reads results.jsonl line by line
#    and renders what each line has: skipped, missing or partial lines become rows that say so)
{
    echo "# ddtree GPU check, $(date -u +%FT%TZ)"
    echo
    echo "$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null || echo 'no nvidia-smi'); total $(( $(date +%s) - START )) s; logs in $LOGS"
    echo
    echo "| step | status | s |"
    echo "| --- | --- | --- |"
    for s in "${STEPS[@]}"; do echo "| ${s//|/ | } |"; done
    echo
    "$PY" - "$RESULTS" <<'EOF' 2>&1 || { echo '```'; cat "$RESULTS"; echo '```'; }
import json, sys

rows = []
for n, line in enumerate(open(sys.argv[1]), 1):
    if not line.strip():
        continue
    try:
        r = json.loads(line)
        rows.append(r if isinstance(r, dict) else {"tag": f"line {n}", "missing": "not a JSON object"})
    except ValueError as exc:
        rows.append({"tag": f"line {n}", "missing": f"unreadable JSON ({exc})"})

def num(x, fmt, scale=1.0):
    return format(x / scale, fmt) if isinstance(x, (int, float)) and not isinstance(x, bool) else "-"

def pct(a, b):
    ok = all(isinstance(x, (int, float)) for x in (a, b)) and b > 0
    return f"{100.0 * a / b:.0f}%" if ok else "-"

def absent(r):   # a line that stands for no figures: skipped, missing
    return "skipped" in r or "missing" in r

def why(r):
    return f"skipped: {r['skipped']}" if "skipped" in r else str(r.get("missing", "no figures"))

loss_rows = [r for r in rows if r.get("impl") in ("ddtree-cuda", "torch-gpu")
             or (absent(r) and not str(r.get("tag", "")).startswith("step-"))]
step_rows = [r for r in rows if r.get("impl") == "ddtree-cuda-step" or str(r.get("tag", "")).startswith("step-")]
cuda = [r for r in rows if r.get("impl") == "ddtree-cuda" and not absent(r)]
natives = [r.get("ceiling_bf16_native_tflops") for r in cuda if r.get("ceiling_bf16_native_status") == "ok"]
native_any = max((x for x in natives if isinstance(x, (int, float))), default=None)

# --- the loss -------------------------------------------------------------------------------
print("## Loss figures")
print()
print("TFLOP/s count 2 n V H per logit-sized product: 3 materialised, 5 tiled; softmax statistics not counted. "
      "\"of ceiling\": against the native bf16 GEMM ceiling for bf16-products rows, the fp32 Sgemm ceiling for fp32 "
      "rows (torch rows: the same, from the ddtree runs).")
print()
print("| run | precision | shape n x H x V | chunk | mode | median s | TFLOP/s | of ceiling | workspace GB | loss |")
print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
fp32_any = max((r.get("ceiling_fp32_tflops") or 0 for r in cuda), default=0) or None
for r in loss_rows:
    tag = r.get("tag", "?")
    try:
        if absent(r):
            print(f"| {tag} | - | - | - | {why(r)} | - | - | - | - | - |")
            continue
        shape = f"{r.get('n', '?')} x {r.get('hidden', '?')} x {r.get('vocab', '?')}"
        if r.get("impl") == "ddtree-cuda":
            for m in ("full", "tiled"):
                f = r.get(m) or {}
                ofc = f.get("of_ceiling")
                print(f"| {tag} | {r.get('dtype', '?')} | {shape} | {r.get('chunk', '?')} "
                      f"| ddtree vocab_tile {f.get('vocab_tile', '?')} ({num(f.get('products'), '.0f')} products) "
                      f"| {num(f.get('seconds_median'), '.3f')} | {num(f.get('tflops'), '.1f')} "
                      f"| {num(ofc, '.0%') if ofc is not None else '-'} ({r.get('ceiling_reference', '-')}) "
                      f"| {num(f.get('workspace_bytes'), '.3f', 1e9)} | {num(f.get('loss'), '.6f')} |")
        else:
            ref = native_any if r.get("dtype") == "bf16" else fp32_any
            print(f"| {tag} | torch {r.get('dtype', '?')} | {shape} | {r.get('lm_chunk', '?')}/{r.get('kl_chunk', '?')} "
                  f"| torch chunked (3 products) | {num(r.get('seconds_median'), '.3f')} | {num(r.get('tflops'), '.1f')} "
                  f"| {pct(r.get('tflops'), ref)} | {num(r.get('workspace_bytes'), '.3f', 1e9)} | {num(r.get('loss'), '.6f')} |")
    except Exception as exc:   # one odd line must not hide the others
        print(f"| {tag} | unreadable line: {exc!r} | - | - | - | - | - | - | - | - |")
print()
print("- ddtree's inputs are uniform with the same std as torch's normal ones: the losses are comparable in size, not equal.")
print("- torch bf16 is the seed's precision (bf16 storage and products); ddtree bf16-products keeps fp32 storage and "
      "statistics and rounds the products' operands to bf16 on the tensor cores.")
print()

# --- the ceilings ---------------------------------------------------------------------------
print("## Matmul ceilings (best of the loss's product shapes at its chunk and 8192^3, median of 5)")
print()
if not cuda:
    print("- no bench_loss_cuda figures: no ceilings measured")
for r in cuda:
    print(f"- {r.get('tag', '?')} (chunk {r.get('chunk', '?')}):")
    for key, what in (("fp32", "fp32 Sgemm (backend matmul, no TF32)"),
                      ("bf16_products", "bf16 products (backend matmul_bf16, fp32 in memory)"),
                      ("bf16_native", "bf16 native (cublasGemmEx bf16 x bf16 -> fp32)")):
        st = r.get(f"ceiling_{key}_status", "absent")
        if st != "ok":
            print(f"  - {what}: {st}")
            continue
        cases = ", ".join(f"{c.get('m')}x{c.get('n')}x{c.get('k')} {num(c.get('tflops'), '.1f')}"
                          for c in r.get(f"ceiling_{key}_cases", []) if isinstance(c, dict))
        print(f"  - {what}: **{num(r.get(f'ceiling_{key}_tflops'), '.1f')} TFLOP/s** ({cases})")
print()
bf = [r for r in cuda if r.get("bf16_products") == 1 and r.get("vocab") == 248320]
for r in bf:
    nat = r.get("ceiling_bf16_native_tflops") if r.get("ceiling_bf16_native_status") == "ok" else native_any
    for m in ("full", "tiled"):
        f = r.get(m) or {}
        t = f.get("tflops")
        ok = isinstance(t, (int, float)) and isinstance(nat, (int, float)) and nat > 0
        verdict = ("met" if t >= 0.6 * nat else "not met") if ok else "cannot be judged (no native ceiling)"
        print(f"- goal, loss >= 60% of the measured bf16 ceiling: {r.get('tag')} vocab_tile {f.get('vocab_tile', '?')}: "
              f"{num(t, '.1f')} of {num(nat, '.1f')} TFLOP/s = {pct(t, nat)}: {verdict}")
if not bf:
    print("- goal, loss >= 60% of the measured bf16 ceiling: no seed-scale bf16-products figures")
print()

# --- the workspace against the seed's per-chunk peak ----------------------------------------
# The seed documents (../shared/seeds/, docs/memory.md), in bf16 (2 B): the lm_head chunked at
# 4,096 positions, "Peak per chunk: 4096 x 248K x 2 = 2 GB" (one chunk's logits); the KL at
# 2,048 positions with 3 intermediates, "3 x 2,048 x 248,320 x 2 = ~3 GB".
print("## Loss workspace against the seed's per-chunk peak (goal: <= 1/4)")
print()
seed_rows = [r for r in rows if r.get("impl") in ("ddtree-cuda", "torch-gpu") and not absent(r)
             and isinstance(r.get("vocab"), int) and r.get("vocab") >= 100000]
if seed_rows:
    V = seed_rows[0]["vocab"]
    lm, kl = 4096 * V * 2, 3 * 2048 * V * 2
    print(f"The seed, V {V}, bf16: lm_head chunk 4096 x V x 2 B = {lm/1e9:.2f} GB (its stated peak per chunk); "
          f"KL chunk 2048 with 3 intermediates, 3 x 2048 x V x 2 B = {kl/1e9:.2f} GB. "
          f"Goal: workspace <= 1/4 of {lm/1e9:.2f} GB = {lm/4e9:.3f} GB (and of {kl/1e9:.2f} GB = {kl/4e9:.3f} GB).")
    print()
    print("| run | mode | workspace GB | of lm_head chunk | of KL chunk | <= 1/4 of the per-chunk peak |")
    print("| --- | --- | --- | --- | --- | --- |")
    for r in seed_rows:
        lm, kl = 4096 * r["vocab"] * 2, 3 * 2048 * r["vocab"] * 2
        modes = [(f"ddtree {r.get('dtype')} vocab_tile {(r.get(m) or {}).get('vocab_tile', '?')}",
                  (r.get(m) or {}).get("workspace_bytes")) for m in ("full", "tiled")] \
            if r.get("impl") == "ddtree-cuda" else [(f"torch {r.get('dtype')} (allocated peak)", r.get("workspace_bytes"))]
        for name, w in modes:
            ok = isinstance(w, (int, float))
            verdict = ("yes" if w <= lm / 4 else ("only vs the KL chunk" if w <= kl / 4 else "no")) if ok else "-"
            print(f"| {r.get('tag')} | {name} | {num(w, '.3f', 1e9)} | {pct(w, lm)} | {pct(w, kl)} | {verdict} |")
else:
    print("- no seed-scale loss figures")
print()

# --- the training step ----------------------------------------------------------------------
print("## Training step (Qwen3.6-27B drafter shape; goals: >= 25,000 positions/s, peak <= 80 GB)")
print()
print("| run | products | shape | chunk / tile | step s | positions/s | vs 25,000 | peak GB | <= 80 GB | TFLOP/s | AdamW share | loss |")
print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
for r in step_rows:
    tag = r.get("tag", "?")
    try:
        if absent(r):
            print(f"| {tag} | {why(r)} | - | - | - | - | - | - | - | - | - | - |")
            continue
        pos, peak, st, ad = r.get("positions_per_s"), r.get("peak_bytes"), r.get("step_s"), r.get("adamw_s")
        goal = ("met" if pos >= 25000 else "not met") if isinstance(pos, (int, float)) else "-"
        fits = ("yes" if peak <= 80e9 else "no") if isinstance(peak, (int, float)) else "-"
        shape = (f"H {r.get('hidden', '?')}, {r.get('layers', '?')} layers, {r.get('anchors', '?')} x "
                 f"{r.get('block', '?')}, S {r.get('seq', '?')}, V {r.get('vocab', '?')}")
        print(f"| {tag} | {'bf16' if r.get('bf16') == 1 else 'fp32'} | {shape} | {r.get('chunk', '?')} / "
              f"{r.get('vocab_tile', '?')} | {num(st, '.3f')} | {num(pos, ',.0f')} | {pct(pos, 25000)} {goal} "
              f"| {num(peak, '.2f', 1e9)} | {fits} | {num(r.get('tflops'), '.1f')} | {pct(ad, st)} "
              f"| {num(r.get('loss'), '.6f')} |")
    except Exception as exc:
        print(f"| {tag} | unreadable line: {exc!r} | - | - | - | - | - | - | - | - | - | - |")
if not step_rows:
    print("| - | no bench_step_cuda line | - | - | - | - | - | - | - | - | - | - |")
EOF
} >"$SUMMARY"
cat "$SUMMARY"
echo "logs: $LOGS (check.log, build.log, sanitizer.log, results.jsonl, summary.md)"
exit "$FAILED"
