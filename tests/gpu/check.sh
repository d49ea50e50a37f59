#!/usr/bin/env bash
# check.sh: the ONE script of a device run (tests/gpu/README.md). It runs from the bundle that
# tests/gpu/bundle.sh made here (`bash DIR/check.sh`): no compiler, no Debian package on the
# device machine. Run from the source tree (tests/gpu/check.sh) it first makes that bundle
# (build-bundle/bundle, which needs the build dependencies) and then runs it.
#
# In order of value, every step time-boxed with `timeout` inside one deadline (CHECK_BUDGET_S,
# default 470 s, so the whole run stays under 8 minutes; a step that no longer fits says
# "not run (out of time)"):
#   1. the machine: driver, GPU, python3 / torch / transformers, where libcudart, libcublas and
#      libnccl are (the CUDA prefix, ldconfig, or the nvidia wheels found through python3; a
#      plain libnccl.so link in a temporary folder when only libnccl.so.2 exists, for a build
#      from source), LD_LIBRARY_PATH made from them, and every bundled ELF's libraries resolved
#      (a library that does not resolve ends the check there: nothing else could run);
#   2. the GPU tests: cuda_device, backend_ops (every op, CUDA against CPU), step_cuda (whole
#      steps and trainer runs, GPU against CPU), target_cuda (the frozen targets in bf16 on the
#      GPU against the CPU's bf16 path, their weights' device bytes), comm (NCCL); a GPU test that says skipped on
#      the device machine is a failure; then qwen35_transformers.py: `ddtreed features` on
#      models/qwen35-tiny against transformers' Qwen3.5 in float32 on the CPU, and on the GPU
#      where torch sees one (it needs none, so it runs without one too; a disagreement fails the
#      check, no transformers is a skip);
#   3. ddtreed train examples/tiny.json on the GPU ("devices": "all"), 200 steps: the daemon's
#      own foreground run, with its records;
#   4. bench_loss_cuda at the seed's settings (24,576 x 5,120 x 248,320, chunk 1024, bf16
#      products) with its three matmul ceilings; bench_attention_cuda (the drafter's attention
#      at the seed's shape, forward + backward, SIMT and flash kernels side by side, and the
#      target's causal prefill, against the bf16 GEMM ceiling); bench_step_cuda at the Qwen3.6-27B drafter
#      shape (bf16 products); the seed's PyTorch loss and step beside them (bf16); the target's
#      prefill at the Qwen3.6-27B shape (bench_qwen35 --cuda, bf16 weights resident) beside
#      transformers' Qwen3_5TextModel (target_transformers_gpu.py), each with its product ceiling;
#   5. compute-sanitizer memcheck of test_backend_ops on the subset that fits
#      (DDTREE_BACKEND_OPS_SMALL=1: not the 8 GiB case);
#   6. while time remains: the fp32 rows (ddtree's loss and step, torch's loss), the small loss
#      cases.
# Room for the next checks: a step goes in its place in this order with `step` or `bench_step`.
#
# Files (at most 8 come back from the device tool), under ${OUT:-/tmp/ddtree-gpu}:
#   summary.md    the machine, every step's status, the loss, ceiling, workspace and step tables,
#                 the Qwen3.5 target against transformers
#   check.log     every step's output, with its command, exit status and time
#   sanitizer.log compute-sanitizer's output
#   results.jsonl one JSON line per benchmark step and the Qwen3.5 comparison, tagged, or
#                 {"tag":..,"missing":..}
#   train.log     the tiny training run's output
# Exit status: 0 when every GPU test, the Qwen3.5 comparison (or its skip) and the training run
# passed; 77 when no GPU was seen and nothing failed (the summary says so; this is how
# tests/gpu/bundle_check.sh runs the script on a machine without one); 1 otherwise. Benchmarks
# never fail it.
set -uo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
if [ ! -x "$HERE/bin/test_backend_ops" ]; then   # the source tree: bundle first, then run it
    ROOT=$(cd "$HERE/../.." && pwd)
    "$ROOT/tests/gpu/bundle.sh" "$ROOT/build-bundle/bundle" || exit 1
    exec bash "$ROOT/build-bundle/bundle/check.sh" "$@"
fi
B=$HERE                      # the bundle: bin/ lib/ py/ examples/ models/ MANIFEST
bash "$B/unpack.sh" || { echo "check.sh: the bundle's libraries could not be unpacked (unpack.sh)" >&2; exit 1; }
LOGS=${OUT:-/tmp/ddtree-gpu}
mkdir -p "$LOGS"
LOG=$LOGS/check.log
RESULTS=$LOGS/results.jsonl
SUMMARY=$LOGS/summary.md
: >"$LOG"; : >"$RESULTS"
START=$(date +%s)
DEADLINE=$((START + ${CHECK_BUDGET_S:-470}))
STEPS=()     # "name|status|seconds" rows for the summary
MACHINE=()   # "what|found" rows for the summary
FAILED=0
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

say() { echo "$*" | tee -a "$LOG"; }
found() { MACHINE+=("$1|$2"); say "  $1: $2"; }

# step NAME BOX_S COMMAND...: runs COMMAND under timeout min(BOX_S, time left - 5 s), output to
# check.log (and the terminal); records its status: ok, skipped (77), timed out, failed (rc)
step() {
    local name=$1 box=$2; shift 2
    local left=$((DEADLINE - $(date +%s) - 5))
    [ "$box" -gt "$left" ] && box=$left
    if [ "$box" -lt 10 ]; then
        say "== $name: not run (out of time)"
        STEPS+=("$name|not run (out of time)|0")
        return 124
    fi
    say "== $name (at most ${box}s): $*"
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
    say "== $name: $status in $(( $(date +%s) - t0 ))s"
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

# a GPU test: its skip (77) is a failure where nvidia-smi saw a GPU, expected where it saw none
gpu_test() {
    local name=$1; shift
    step "$@"
    case $? in
        0) ;;
        77) [ "$HAVE_GPU" = 1 ] && { FAILED=1; STEPS+=("$name: skipped with a GPU present|failed|0"); } ;;
        *) FAILED=1 ;;
    esac
}

# --- 1. the machine ------------------------------------------------------------------------
say "ddtree GPU check: $(date -u +%FT%TZ), bundle $B, logs in $LOGS"
head -n 2 "$B/MANIFEST" | tee -a "$LOG"
GPU=$(nvidia-smi --query-gpu=name,memory.total,driver_version,compute_cap --format=csv,noheader 2>/dev/null)
found "GPUs (nvidia-smi)" "${GPU:-none (no nvidia-smi, or it saw no GPU)}"
found "CPU" "$(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo)"
found "glibc" "$(getconf GNU_LIBC_VERSION 2>/dev/null || echo unknown) (the bundle: $(grep -o 'GLIBC_2\.[0-9]*' "$B/MANIFEST" | head -n 1) or newer)"
PY=   # the first python3 that has torch, else the first there is
for p in $(command -v -a python3 2>/dev/null) /usr/bin/python3 /usr/local/bin/python3 /opt/conda/bin/python3; do
    [ -x "$p" ] || continue
    [ -z "$PY" ] && PY=$p
    "$p" -c 'import torch' 2>/dev/null && { PY=$p; break; }
done
if [ -n "$PY" ]; then
    found "python3" "$PY: $("$PY" - <<'EOF' 2>&1 | tr '\n' ' '
import importlib
parts = []
for name in ("torch", "transformers", "safetensors", "numpy"):
    try:
        m = importlib.import_module(name)
        extra = ""
        if name == "torch":
            extra = f" (CUDA {m.version.cuda}, {m.cuda.device_count() if m.cuda.is_available() else 0} GPUs)"
        parts.append(f"{name} {m.__version__}{extra}")
    except Exception as exc:
        parts.append(f"{name} absent ({type(exc).__name__})")
print("; ".join(parts))
EOF
)"
else
    found "python3" "absent: the PyTorch rows will say so"
    PY=python3
fi

# where a soname is: ldconfig's cache, the CUDA prefix, then the nvidia wheels' lib folders
WHEEL_LIBS=$("$PY" - <<'EOF' 2>/dev/null
import glob, os
try:
    import nvidia
    paths = list(nvidia.__path__)
except Exception:
    paths = []
seen = set()
for base in paths:
    for lib in glob.glob(os.path.join(base, "**", "lib*.so*"), recursive=True):
        d = os.path.dirname(lib)
        if d not in seen:
            seen.add(d)
            print(d)
EOF
)
locate_lib() {   # SONAME: the folder that holds it, or nothing
    local so=$1 d
    d=$(ldconfig -p 2>/dev/null | awk -v so="$so" '$1 == so {print $NF; exit}')
    [ -n "$d" ] && { dirname "$d"; return; }
    for d in /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda-*/lib64 /usr/local/cuda-*/targets/*/lib $WHEEL_LIBS; do
        [ -e "$d/$so" ] && { echo "$d"; return; }
    done
}
LIBPATH=$B/lib
for so in libcuda.so.1 libcudart.so.13 libcublas.so.13 libcublasLt.so.13 libnccl.so.2; do
    d=$(locate_lib "$so")
    found "$so" "${d:-not found}"
    [ -n "$d" ] && [[ ":$LIBPATH:" != *":$d:"* ]] && LIBPATH+=":$d"
done
NCCL_DIR=$(locate_lib libnccl.so.2)
if [ -n "$NCCL_DIR" ] && [ ! -e "$NCCL_DIR/libnccl.so" ]; then   # what a linker looks for
    mkdir -p "$TMP/nccl-link"
    ln -s "$NCCL_DIR/libnccl.so.2" "$TMP/nccl-link/libnccl.so"
    found "libnccl.so (for a build from source)" "$TMP/nccl-link/libnccl.so -> $NCCL_DIR/libnccl.so.2"
fi
export LD_LIBRARY_PATH="$LIBPATH${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
found "LD_LIBRARY_PATH" "$LD_LIBRARY_PATH"
SANITIZER=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer /usr/local/cuda/compute-sanitizer/compute-sanitizer 2>/dev/null | head -n 1)
found "compute-sanitizer" "${SANITIZER:-not found}"
found "models in the bundle" "$(ls "$B/models" 2>/dev/null | tr '\n' ' ')"
unresolved=$(for f in "$B"/bin/* "$B"/lib/*; do ldd "$f" 2>&1 | grep 'not found' | sed "s|^|$(basename "$f"): |"; done)
if [ -n "$unresolved" ]; then
    found "unresolved libraries" "$(echo "$unresolved" | tr '\n' ';')"
    STEPS+=("libraries of the bundle|failed: $(echo "$unresolved" | wc -l) unresolved|0")
    FAILED=1
fi
HAVE_GPU=0
[ -n "$GPU" ] && HAVE_GPU=1

if [ "$FAILED" = 0 ]; then
    # --- 2. the GPU tests (each exits 77 without a GPU: a failure here) -------------------------
    gpu_test cuda_device "test_cuda_device" 30 "$B/bin/test_cuda_device"
    # the card's limits and the kernel instances chosen for them (ddk_cuda_instances)
    found "limits and instances" "$(grep -h '^instances cuda:' "$LOG" | head -n 4 | tr '\n' ';')"
    gpu_test backend_ops "test_backend_ops" 150 "$B/bin/test_backend_ops"
    gpu_test step_cuda "test_step_cuda" 150 "$B/bin/test_step_cuda"
    gpu_test target_cuda "test_target_cuda" 60 "$B/bin/test_target_cuda" "$B/models/qwen35-tiny"
    gpu_test comm "test_comm" 60 "$B/bin/test_comm"
    # --- 2b. the Qwen3.5 target against transformers (needs no GPU; on it too where torch sees one) ---
    export PYTHONUNBUFFERED=1
    bench_step qwen35-transformers "qwen35_transformers.py (ddtreed features against transformers, fp32)" 90 \
        "$PY" "$B/py/qwen35_transformers.py" --ddtreed "$B/bin/ddtreed" --model-dir "$B/models/qwen35-tiny"
    case $? in 0|77|124|137) ;; *) FAILED=1 ;; esac   # 77: no transformers; a time-out says so, like a benchmark
    if [ "$HAVE_GPU" = 1 ]; then
        # --- 3. the daemon's own run on the GPU ------------------------------------------------
        step "ddtreed train tiny on the GPU, 200 steps" 90 "$B/bin/ddtreed" train "$B/examples/tiny.json" \
            --state-dir "$TMP/state" --stop-after 200 >"$LOGS/train.log" 2>&1 || FAILED=1
        tail -n 8 "$LOGS/train.log" | tee -a "$LOG"

        # --- 4. the seed's loss and step, ddtree beside PyTorch, bf16 -------------------------
        bench_step loss-seed-bf16 "bench_loss_cuda seed settings (chunk 1024, bf16 products)" 90 \
            "$B/bin/bench_loss_cuda" --chunk 1024 --bf16 1 --reps 2
        bench_step loss-seed-head16 "bench_loss_cuda seed settings, the target's bf16 head read in place (co-located)" 90 \
            "$B/bin/bench_loss_cuda" --chunk 1024 --bf16 2 --reps 2
        # the drafter's attention at the seed's shape, SIMT (before) and flash (after) kernels side
        # by side, against the bf16 GEMM ceiling (a bundle made before it existed lacks it)
        if [ -x "$B/bin/bench_attention_cuda" ]; then
            bench_step attention-seed "bench_attention_cuda seed shape, SIMT and flash kernels" 60 \
                "$B/bin/bench_attention_cuda" --reps 2
        else
            STEPS+=("bench_attention_cuda|not in the bundle (tests/gpu/bundle.sh BINARIES)|0")
        fi
        bench_step step-bf16 "bench_step_cuda Qwen3.6-27B drafter, bf16 products (weight copies, activations rounded once)" 150 \
            "$B/bin/bench_step_cuda" --bf16 1 --copies 1 --reps 2
        # DFlash2 (SPEC.md 2.1) of the published recipe's shape (block 8, 512 anchors), DFlash beside it
        bench_step step-dflash2 "bench_step_cuda DFlash2, the recipe's shape (block 8, 512 anchors), bf16 copies" 120 \
            "$B/bin/bench_step_cuda" --bf16 1 --copies 1 --reps 2 --block 8 --anchors 512 --window 2048 --dflash2
        bench_step step-dflash-b8 "bench_step_cuda DFlash, the same shape" 120 \
            "$B/bin/bench_step_cuda" --bf16 1 --copies 1 --reps 2 --block 8 --anchors 512 --window 2048
        bench_step loss-torch-bf16 "torch loss, seed scale, bf16 (the seed's precision)" 90 \
            "$PY" "$B/py/loss_torch_gpu.py" --dtype bf16 --reps 2
        bench_step step-torch-bf16 "torch step, Qwen3.6-27B drafter, bf16 (the seed's approach)" 120 \
            "$PY" "$B/py/step_torch_gpu.py" --dtype bf16 --reps 2
        bench_step step-bf16-fp32-operands "bench_step_cuda, bf16 products on fp32 operands (before the copies)" 150 \
            "$B/bin/bench_step_cuda" --bf16 1 --copies 0 --reps 1

        # --- 4b. the target's prefill at the Qwen3.6-27B shape, ddtree beside transformers ---
        # 4 layers (one 3:1 group; ddtree's random weights are drawn on the host, ~20 s), V 4096
        # on ddtree's side (the embedding is no product); both scale their time to 64 layers
        bench_step prefill-ddtree "bench_qwen35 --cuda, Qwen3.6-27B shape, 4 layers, 4096 tokens, bf16" 120 \
            "$B/bin/bench_qwen35" --cuda --hidden 5120 --layers 4 --heads 24 --kv-heads 4 --head-dim 256 \
            --key-heads 16 --value-heads 48 --key-dim 128 --value-dim 128 --intermediate 17408 --vocab 4096 \
            --tokens 4096 --reps 3 --decode-steps 8
        bench_step prefill-transformers "transformers Qwen3_5TextModel, the same shape, bf16" 150 \
            "$PY" "$B/py/target_transformers_gpu.py" --layers 4 --tokens 4096 --reps 3

        # --- 5. compute-sanitizer on the subset that fits ------------------------------------
        if [ -n "$SANITIZER" ]; then
            DDTREE_BACKEND_OPS_SMALL=1 step "compute-sanitizer memcheck test_backend_ops (small)" 150 \
                "$SANITIZER" --tool memcheck --error-exitcode 3 "$B/bin/test_backend_ops" \
                >"$LOGS/sanitizer.log" 2>&1 || FAILED=1
            tail -n 8 "$LOGS/sanitizer.log" | tee -a "$LOG"
        else
            STEPS+=("compute-sanitizer|not on this machine|0")
        fi

        # --- 6. while time remains ----------------------------------------------------------
        bench_step loss-seed-fp32 "bench_loss_cuda seed scale, fp32" 90 "$B/bin/bench_loss_cuda" \
            --chunk 1024 --bf16 0 --reps 2
        bench_step step-fp32 "bench_step_cuda, fp32" 90 "$B/bin/bench_step_cuda" --bf16 0 --reps 1
        for b in 1 0; do
            bench_step "loss-small-$([ $b = 1 ] && echo bf16 || echo fp32)" "bench_loss_cuda small, --bf16 $b" 40 \
                "$B/bin/bench_loss_cuda" --bf16 "$b" --n 4096 --hidden 1024 --vocab 32000 --chunk 1024 \
                --tile 4096 --reps 5
        done
        bench_step loss-torch-fp32 "torch loss, seed scale, fp32" 120 "$PY" "$B/py/loss_torch_gpu.py" \
            --dtype fp32 --reps 2
    else
        STEPS+=("training run, benchmarks, compute-sanitizer|not run: no GPU seen|0")
        printf '{"tag":"all benchmarks","skipped":"no GPU seen by nvidia-smi"}\n' >>"$RESULTS"
    fi
fi

# --- summary.md: the machine, every step, every figure --------------------------------------
{
    echo "# ddtree GPU check, $(date -u +%FT%TZ)"
    echo
    echo "$(head -n 2 "$B/MANIFEST" | tail -n 1); total $(( $(date +%s) - START )) s"
    echo
    echo "## Machine"
    echo
    echo "| what | found |"
    echo "| --- | --- |"
    for m in "${MACHINE[@]}"; do echo "| ${m%%|*} | ${m#*|} |"; done
    echo
    echo "## Steps"
    echo
    echo "| step | status | s |"
    echo "| --- | --- | --- |"
    for s in "${STEPS[@]}"; do echo "| ${s//|/ | } |"; done
    echo
    "$PY" "$B/py/summary.py" "$RESULTS" 2>&1 || { echo '```'; cat "$RESULTS"; echo '```'; }
} >"$SUMMARY"
cat "$SUMMARY"
echo "logs: $LOGS (summary.md, check.log, results.jsonl, train.log, sanitizer.log)"
[ "$HAVE_GPU" = 0 ] && [ "$FAILED" = 0 ] && exit 77   # everything ran that can without a GPU
exit "$FAILED"
