#!/usr/bin/env bash
# bundle.sh: everything the GPU check needs, built here, in one folder that runs on the device
# machine with no compiler and no Debian package (tests/gpu/README.md):
#
#   tests/gpu/bundle.sh DIR [BUILD]
#
# Builds with CUDA (sm_90, sm_100 and sm_120, -lineinfo, no -march=native: the device machine's CPU is
# not this one) in BUILD (default build-bundle, configured here when it has no CMakeCache.txt;
# an existing build folder is used as it is configured, which is how tests/gpu/bundle_check.sh
# reuses scripts/test's build), then fills DIR (emptied first):
#   check.sh      the check (tests/gpu/check.sh), run as `bash DIR/check.sh`
#   unpack.sh     lib/'s gzipped files back (tests/gpu/unpack.sh; check.sh runs it first)
#   bin/          the GPU tests and benchmarks, ddtreed
#   lib/          libddk and every shared library those ELFs load that the device machine lacks,
#                 found with ldd (no hand-kept list); never glibc, libgcc, libstdc++, nor the
#                 driver, CUDA runtime, cuBLAS or NCCL, which the machine has in its own versions;
#                 every file over 1 MiB gzipped (libopenblas: 36 MB, 11 MB gzipped)
#   py/           the PyTorch peers, qwen35_transformers.py with the oracle modules it imports
#                 (st.py, cases.py, qwen35.py), the summary's renderer
#   examples/     the run configs the check trains
#   models/       the tiny models of ../shared/models (when present)
#   MANIFEST      what was bundled from which commit, every file with its size
# Fails (exit 1) when the build fails, a dependency does not resolve here, or DIR passes 60 MiB
# (the device tool carries at most 64 MiB with the working tree).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
[ $# -ge 1 ] && [ $# -le 2 ] || { echo "usage: tests/gpu/bundle.sh DIR [BUILD]" >&2; exit 2; }
DIR=$1
BUILD=${2:-$ROOT/build-bundle}
LIMIT_BYTES=$((60 * 1024 * 1024))
BINARIES=(test_backend_ops test_cuda_device test_step_cuda test_target_cuda test_comm bench_loss_cuda bench_step_cuda
          bench_attention_cuda bench_qwen35 ddtreed)
# the PyTorch peers (the loss, the step, transformers' Qwen3.5 prefill), the Qwen3.5 comparison with transformers and what it imports (the oracle's
# safetensors reader, case counter and float64 Qwen3.5 forward), the summary's renderer
PYTHON=(tests/gpu/loss_torch_gpu.py tests/gpu/step_torch_gpu.py tests/gpu/target_transformers_gpu.py
        tests/gpu/qwen35_transformers.py
        tests/oracle/st.py tests/oracle/cases.py tests/oracle/qwen35.py tests/oracle/features_run.py
        tests/gpu/summary.py)
EXAMPLES=(examples/tiny.json)
MODELS=(qwen35-tiny stories260k)
# what the device machine brings itself (sonames; prefixes end in a dot or a dash)
PROVIDED='^(ld-linux[^ ]*|linux-vdso\.so\.1|libc\.so\.|libm\.so\.|libdl\.so\.|libpthread\.so\.|librt\.so\.|libgcc_s\.so\.|libstdc\+\+\.so\.|libcuda\.so\.|libcudart\.so\.|libcublas\.so\.|libcublasLt\.so\.|libnccl\.so\.)'

export PATH="$PATH:/usr/local/cuda/bin"
if [ ! -f "$BUILD/CMakeCache.txt" ]; then
    echo "bundle: configuring $BUILD (CUDA sm_90;100;120, portable CPU code)"
    cmake -S "$ROOT" -B "$BUILD" -DDDTREE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="90;100;120" \
          -DDDTREE_NATIVE=OFF -DCMAKE_BUILD_TYPE=Release >"$BUILD.log" 2>&1 ||
        { tail -n 30 "$BUILD.log" >&2; echo "bundle: configure failed (log: $BUILD.log)" >&2; exit 1; }
else   # configured again with its own cache (no option changed, nothing rebuilt): targets added since
    cmake "$BUILD" >"$BUILD.log" 2>&1 ||
        { tail -n 30 "$BUILD.log" >&2; echo "bundle: configure failed (log: $BUILD.log)" >&2; exit 1; }
fi
echo "bundle: building ${BINARIES[*]} in $BUILD"
cmake --build "$BUILD" -j "$(nproc)" --target "${BINARIES[@]}" >>"$BUILD.log" 2>&1 ||
    { tail -n 30 "$BUILD.log" >&2; echo "bundle: build failed (log: $BUILD.log)" >&2; exit 1; }
ldd "$BUILD/lib/libddk.so.0" | grep libcudart >/dev/null ||
    { echo "bundle: $BUILD is not a CUDA build (configure it with -DDDTREE_CUDA=ON)" >&2; exit 1; }

rm -rf "$DIR"
mkdir -p "$DIR/bin" "$DIR/lib" "$DIR/py" "$DIR/examples" "$DIR/models"
DIR=$(cd "$DIR" && pwd)
install -m 0755 "$ROOT/tests/gpu/check.sh" "$DIR/check.sh"
install -m 0755 "$ROOT/tests/gpu/unpack.sh" "$DIR/unpack.sh"
for b in "${BINARIES[@]}"; do
    install -m 0755 "$BUILD/bin/$b" "$DIR/bin/$b"
done
for p in "${PYTHON[@]}"; do install -m 0644 "$ROOT/$p" "$DIR/py/"; done
for e in "${EXAMPLES[@]}"; do install -m 0644 "$ROOT/$e" "$DIR/examples/"; done
for m in "${MODELS[@]}"; do
    [ -d "$ROOT/../shared/models/$m" ] && cp -rL "$ROOT/../shared/models/$m" "$DIR/models/$m"
done

# The libraries: every soname an ELF in bin/ or lib/ needs (ldd lists the whole closure), copied
# under that soname from where it resolves here, until nothing new appears.
copied=' '
while :; do
    new=0
    for elf in "$DIR"/bin/* "$DIR"/lib/*; do
        while read -r soname arrow path _; do
            [ "$arrow" = "=>" ] || continue
            [[ $soname =~ $PROVIDED ]] && continue
            [[ $copied == *" $soname "* ]] && continue
            if [ ! -f "$path" ]; then
                echo "bundle: $(basename "$elf") needs $soname, which does not resolve here ($path)" >&2
                exit 1
            fi
            install -m 0755 "$(readlink -f "$path")" "$DIR/lib/$soname"
            copied+="$soname "
            new=1
        done < <(LD_LIBRARY_PATH="$DIR/lib" ldd "$elf" 2>/dev/null)
    done
    [ "$new" = 1 ] || break
done
# host symbols are not needed to run (device line info is in the fatbinary, kept by strip)
strip --strip-unneeded "$DIR"/bin/* "$DIR"/lib/* 2>/dev/null || true
find "$DIR/lib" -type f -size +1M -exec gzip -9 -n {} +   # unpack.sh undoes it on the device

{
    echo "ddtree GPU bundle"
    echo "commit $(git -C "$ROOT" rev-parse HEAD 2>/dev/null || echo unknown)$(git -C "$ROOT" diff --quiet HEAD 2>/dev/null || echo ' (with uncommitted changes)')"
    echo "built $(date -u +%FT%TZ) on $(uname -m) from $BUILD"
    grep -E '^(CMAKE_CUDA_ARCHITECTURES|DDTREE_NATIVE|CMAKE_BUILD_TYPE|DDTREE_NCCL|DDTREE_NCCL_LIBRARY):' "$BUILD/CMakeCache.txt" | sed 's/:[A-Z]*=/ = /' || true
    glibc=$(for f in "$DIR"/bin/* "$DIR"/lib/*; do objdump -T "$f" 2>/dev/null; done |
            grep -o 'GLIBC_2\.[0-9]*' | sort -u -V | tail -n 1 || true)
    echo "needs ${glibc:-GLIBC_2.17} or newer, the NVIDIA driver (libcuda), the CUDA 13 runtime and cuBLAS, NCCL 2, python3 with torch"
    echo
    (cd "$DIR" && find . -type f ! -name MANIFEST -printf '%s %p\n' | sort -k2)
} >"$DIR/MANIFEST"
size=$(du -sb "$DIR" | cut -f1)
echo "bundle: $DIR, $((size / 1024 / 1024)) MiB ($size bytes; at most $LIMIT_BYTES), libraries:$copied"
if [ "$size" -gt "$LIMIT_BYTES" ]; then
    echo "bundle: $DIR is $size bytes, over the 60 MiB the device run can carry" >&2
    exit 1
fi
