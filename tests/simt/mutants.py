#!/usr/bin/env python3
"""mutants.py: each mutant of a CUDA kernel below must make the SIMT emulation's tests fail.

The source tree is copied to a temporary folder, configured once with the sanitizers
(AddressSanitizer and UndefinedBehaviorSanitizer, no CUDA), and for each mutant: one exact
replacement in one file of kernels/cuda/, test_simt_kernels and test_simt_self rebuilt and run,
the file restored. A mutant that both tests pass is "missed", and the script exits 1.

    tests/simt/mutants.py [--only SUBSTRING] [--keep]

ctest: simt_mutants (label long: minutes; scripts/test runs it with DDTREE_LONG=1).
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# (name, file under kernels/cuda, the exact text, its replacement)
MUTANTS = [
    ("a swapped fragment register (frag_a: a[1] and a[2])", "attention_flash.cu",
     "    a[1] = ld32(p + 8 * ld);\n    a[2] = ld32(p + 8);",
     "    a[1] = ld32(p + 8);\n    a[2] = ld32(p + 8 * ld);"),
    ("a swapped B fragment register (frag_b: b[0] and b[1])", "attention_flash.cu",
     "    b[0] = ld32(p);\n    b[1] = ld32(p + 8);",
     "    b[0] = ld32(p + 8);\n    b[1] = ld32(p);"),
    ("the C-as-A reuse with two registers swapped (mma_c_as_a: a1 and a2)", "attention_flash.cu",
     "        const uint32_t a1 = pack_bf16(s[2 * kk][2], s[2 * kk][3]);\n"
     "        const uint32_t a2 = pack_bf16(s[2 * kk + 1][0], s[2 * kk + 1][1]);",
     "        const uint32_t a2 = pack_bf16(s[2 * kk][2], s[2 * kk][3]);\n"
     "        const uint32_t a1 = pack_bf16(s[2 * kk + 1][0], s[2 * kk + 1][1]);"),
    ("a wrong xor in the flash row max (quad_max: 2 -> 4)", "attention_flash.cu",
     "    return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));",
     "    return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 4));"),
    ("a wrong xor in the flash row sum (quad_sum: 1 -> 8)", "attention_flash.cu",
     "    x += __shfl_xor_sync(0xffffffffu, x, 1);\n    return x + __shfl_xor_sync(0xffffffffu, x, 2);",
     "    x += __shfl_xor_sync(0xffffffffu, x, 8);\n    return x + __shfl_xor_sync(0xffffffffu, x, 2);"),
    ("a missing barrier before the flash forward's next K/V tile", "attention_flash.cu",
     "            __syncthreads();   /* the previous tile is used up (first time: sQ stored) */\n",
     ""),
    ("a missing barrier in block_sum (ops_cuda.cu)", "ops_cuda.cu",
     "    __syncthreads();   /* a previous call's readers are done with warp_sums */\n",
     ""),
    ("a missing barrier before the Gated DeltaNet's next chunk", "deltanet_cuda.cu",
     "        __syncthreads();   /* the previous chunk's step 4 (or the state's load) is done */\n",
     ""),
    ("the flash dq pass's shared memory one row short (its fp32 rows placed one sKt row later)",
     "attention_flash.cu",
     "    float *sL = reinterpret_cast<float *>(sKt + D * LDT), *sD = sL + R;",
     "    float *sL = reinterpret_cast<float *>(sKt + (D + 1) * LDT), *sD = sL + R;"),
    ("the key-major pass's keys one row short (sKeys over the last sdOt row)", "attention_flash.cu",
     "    int4 *sKeys = reinterpret_cast<int4 *>(sdOt + D * LDT);",
     "    int4 *sKeys = reinterpret_cast<int4 *>(sdOt + (D - 1) * LDT);"),
    ("the Gated DeltaNet chunk's shared memory one row short", "deltanet_cuda.cu",
     "                              + (size_t)2 * lmax * R_STRIDE      /* R / Un, O (lmax, 33) */",
     "                              + (size_t)2 * lmax * R_STRIDE - R_STRIDE"),
    ("a wrong xor in the row sums' warp reduction (ops_cuda.cu warp_sum: offset - 1)", "ops_cuda.cu",
     "        v += __shfl_xor_sync(0xffffffffu, v, offset);\n    return v;\n}\n\n/* the sum of v over the block",
     "        v += __shfl_xor_sync(0xffffffffu, v, offset - 1);\n    return v;\n}\n\n/* the sum of v over the block"),
    # (offset == 1 ? 3 : offset) would be an equivalent mutant: after the offset-2 step lanes
    # l ^ 1 and l ^ 3 hold the same pair
    ("the loss's student argmax taking another lane's index (loss_cuda.cu block_argmax2: at offset 16, lane ^ 8's)",
     "loss_cuda.cu",
     "        const int oi0 = __shfl_xor_sync(0xffffffffu, i0, offset);",
     "        const int oi0 = __shfl_xor_sync(0xffffffffu, i0, offset == 16 ? 8 : offset);"),
    ("block_conv's dx reading past its block (block_conv_dx_kernel: every tap, whatever the slot)",
     "block_conv_cuda.cu",
     "        const int64_t nt = min64(taps, B - s % B);   /* the block's rows that read row s */",
     "        const int64_t nt = taps;"),
    ("a missing barrier before block_conv's dbase lane sum", "block_conv_cuda.cu",
     "    lanes[threadIdx.y][threadIdx.x] = acc;\n    __syncthreads();",
     "    lanes[threadIdx.y][threadIdx.x] = acc;"),
    ("the flash row rules ignoring DFlash2's bidirectional blocks (attention_rows.h)", "attention_rows.h",
     "    r.own_hi = r.own_lo + (W > 0 && !bidir ? o + 1 : B);",
     "    r.own_hi = r.own_lo + (W > 0 ? o + 1 : B);"),
    ("a missing barrier between the top-K's merge rounds (vector_cuda.cu topk_kernel)", "vector_cuda.cu",
     "            __syncthreads();   /* the previous round's (and the running list's) readers are done */\n",
     ""),
    ("the selector's score dot product taking another lane's sum (selector_cuda.cu: at offset 16, lane ^ 8's)",
     "selector_cuda.cu",
     "                dot += __shfl_xor_sync(0xffffffffu, dot, offset);",
     "                dot += __shfl_xor_sync(0xffffffffu, dot, offset == 16 ? 8 : offset);"),
    ("dA's scatter reading the first group's rows for every group (selector_cuda.cu ddk_cuda_sel_scatter)",
     "selector_cuda.cu",
     "(const float *)c->b.q + first * r, r, dA);",
     "(const float *)c->b.q, r, dA);"),
    ("every block of a token adding its sums, not only the first entry's (selector_cuda.cu sel_scatter_kernel)",
     "selector_cuda.cu",
     "                if (list[0] < e) {   /* an earlier entry's block owns the token */",
     "                if (list[0] > e) {   /* an earlier entry's block owns the token */"),
    ("a missing barrier in logsumexp_rows' block max (vector_cuda.cu block_max)", "vector_cuda.cu",
     "    __syncthreads();   /* every warp's max written */\n",
     ""),
    ("logsumexp_rows' term of a +inf max as exp(inf - inf) (vector_cuda.cu lse_term)", "vector_cuda.cu",
     "    return x != x ? 0.0f : x == m ? 1.0f : expf(x - m);",
     "    return x != x ? 0.0f : expf(x - m);"),
]


def run(cmd, **kw):
    return subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default="")
    ap.add_argument("--keep", action="store_true", help="keep the temporary tree")
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="ddtree-mutants-")
    src = os.path.join(tmp, "src")
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns("build*", ".git", "node_modules"))
    build = os.path.join(tmp, "build")
    r = run(["cmake", "-S", src, "-B", build, "-DCMAKE_BUILD_TYPE=RelWithDebInfo", "-DDDTREE_SANITIZE=ON",
             "-DDDTREE_CUDA=OFF"])
    if r.returncode:
        print(r.stdout[-3000:])
        return 1
    env = dict(os.environ, ASAN_OPTIONS="detect_leaks=0", UBSAN_OPTIONS="print_stacktrace=1",
               DDTREE_SIMT_FAIL_FAST="1")
    missed = 0
    tried = 0
    for name, fname, old, new in MUTANTS:
        if args.only not in name:
            continue
        path = os.path.join(src, "kernels", "cuda", fname)
        text = open(path).read()
        if text.count(old) != 1:
            print("STALE %s: the text to mutate is in %s %d times" % (name, fname, text.count(old)))
            missed += 1
            continue
        open(path, "w").write(text.replace(old, new))
        tried += 1
        try:
            b = run(["cmake", "--build", build, "-j2", "--target", "test_simt_kernels", "test_simt_self"])
            if b.returncode:
                print("caught %s (does not build)" % name)
                continue
            why = []
            for t in ("test_simt_self", "test_simt_kernels"):
                res = run([os.path.join(build, "bin", t)], env=env, timeout=900)
                if res.returncode:
                    lines = [l for l in res.stdout.splitlines()
                             if l.startswith(("FAIL", "simt:")) or "ERROR: AddressSanitizer" in l
                             or "runtime error" in l]
                    why.append("%s: %s" % (t, (lines[0] if lines else "exit %d" % res.returncode)[:160]))
            if why:
                print("caught %s: %s" % (name, why[0]))
            else:
                print("MISSED %s" % name)
                missed += 1
        finally:
            open(path, "w").write(text)
    if not args.keep:
        shutil.rmtree(tmp, ignore_errors=True)
    print("%d passed, %d failed" % (tried - missed, missed))
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
