#!/usr/bin/python3
"""loss_torch_check.py: an independent PyTorch oracle for ddk_loss_cpu() (SPEC.md section 1).

    /usr/bin/python3 tests/oracle/loss_torch_check.py --lib build/lib/libddk.so

It loads libddk with ctypes and, for a table of seeded random cases (odd sizes, chunk not
dividing n, vocab_tile 0 and > 0 not dividing V, labels given with -1 or NULL, weights given
with zeros/negatives or NULL, alpha 0 / 0.15 / 1, T 1 and 2, CAP on and off, a p_y -> 1 case),
recomputes the loss in float64 with torch AUTOGRAD written straight from SPEC.md, not from the
C code (loss_section1 of tests/oracle/reference.py, which the drafter oracle uses too), and
compares loss / ce / kl / cap / weight_sum / counted / correct, the per-position
l_i and d loss / d hs. It also checks that bad parameters return -EINVAL and write nothing, and
that no output is written past its end (guard values after each buffer).

What it deliberately does not do: test speed (tests/bench/ does), test the CUDA backend, or
test bf16 inputs. The float64 C reference of tests/kernels/test_loss.c is the other, torch-free oracle.

Run by ctest as `loss_torch` (label `oracle`). Exits 77 (ctest's "skipped") when torch cannot
be imported, 1 on any failure, 0 otherwise. Last line: `N passed, M failed`.
Dimension legend: n positions, H hidden size, V vocabulary.
"""

import argparse
import ctypes
import errno
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness          # noqa: E402

harness.require_torch()   # ctest reports exit 77 as skipped, never as passed
import numpy as np      # noqa: E402
import torch            # noqa: E402

import reference as R   # noqa: E402

# ------------------------------------------------------------------------------------------
# Tolerances (each with the reason it is what it is)

# Gradient: max |C - ref| <= GRAD_REL * max |ref| + GRAD_ABS over the whole (n, H) matrix.
# GRAD_REL: the C path is float32 (logits from an fp32 GEMM, softmax in fp32, g W summed over V
# in fp32), so each element carries ~sqrt(V) * 6e-8 of the magnitude of its terms, ~1e-6 for
# V ~ 2000; 1e-4 leaves two orders of headroom yet catches any wrong term (alpha, T, 1/Tc,
# 1/sum w), each of which is a relative error >= 1e-2.
GRAD_REL = 1e-4
# GRAD_ABS: a floor for matrices that are all zero (every position ignored); it is far below
# the gradient of the p_y -> 1 case (max ~3e-4), so that case is not hidden by it.
GRAD_ABS = 1e-7
# Scalars (loss, ce, kl, cap, weight_sum): |C - ref| <= SCALAR_REL * |ref| + SCALAR_ABS.
# SCALAR_REL: logsumexp of fp32 logits of magnitude ~10 is good to a few ulps of 10, i.e. ~1e-6
# relative to CE ~ log V; 1e-5 is that with headroom (a wrong term is >= 1e-2 off).
SCALAR_REL = 1e-5
# SCALAR_ABS: quantities near 0 (a small KL, CE when p_y -> 1) are differences of fp32 numbers
# of magnitude ~10, exact only to ~1e-6 absolute per position; the weighted means average that.
SCALAR_ABS = 1e-6
# Per-position l_i: |C - ref| <= SCALAR_REL * |ref| + PER_POSITION_ABS. One l_i is not averaged:
# it is a difference of fp32 log-sum-exps of magnitude up to ~20 (max logit + log V), each good
# to ~1 ulp (2e-6), and the KL part is multiplied by T^2 (4 here): ~1e-5 at worst. A plain fp32
# emulation of SPEC.md already shows 1.4e-6 on the alpha = 1, T = 2 case.
PER_POSITION_ABS = 2e-5
# Fixtures: a row whose two largest float64 logits are closer than this is redrawn, because
# fp32 logits (error ~1e-6 here) could then pick another argmax than the float64 oracle and
# legitimately flip the label (labels = NULL) or c_i of CAP. 1e-3 is far above that error.
ARGMAX_GAP = 1e-3
# The p_y -> 1 fixture: 1 - p_y of every position (~, fp32 rounding of hs moves it), and the
# scale of W that keeps its gradient ~1e-4, three orders above GRAD_ABS.
DOMINANT_ONE_MINUS_PY = 1e-6
DOMINANT_W_SCALE = 200.0
# Guard values written after every output buffer; any change is an out-of-bounds write.
GUARD = 4
GUARD_VALUE = np.float32(-12345.0)

EINVAL = errno.EINVAL

# ------------------------------------------------------------------------------------------
# The C API, mirrored from kernels/include/ddk.h


class LossParams(ctypes.Structure):
    _fields_ = [("n", ctypes.c_int64), ("hidden", ctypes.c_int64), ("vocab", ctypes.c_int64),
                ("chunk", ctypes.c_int64), ("vocab_tile", ctypes.c_int64),
                ("kl_weight", ctypes.c_float), ("kl_temperature", ctypes.c_float),
                ("cap_weight", ctypes.c_float), ("cap_temperature", ctypes.c_float),
                ("bf16_products", ctypes.c_int), ("head_bf16", ctypes.c_int),
                ("selector", ctypes.c_void_p)]   # NULL here: plain DFlash (test_loss_selector.c has the selector)


class LossResult(ctypes.Structure):
    _fields_ = [("loss", ctypes.c_double), ("ce", ctypes.c_double), ("kl", ctypes.c_double),
                ("cap", ctypes.c_double), ("weight_sum", ctypes.c_double),
                ("counted", ctypes.c_int64), ("correct", ctypes.c_int64),
                ("sel", ctypes.c_double), ("sel_covered", ctypes.c_int64),
                ("sel_correct", ctypes.c_int64)]


RESULT_FIELDS = ("loss", "ce", "kl", "cap", "weight_sum", "counted", "correct")


def load_library(path):
    lib = ctypes.CDLL(path)
    lib.ddk_loss_cpu.restype = ctypes.c_int
    lib.ddk_loss_cpu.argtypes = [ctypes.POINTER(LossParams)] + [ctypes.c_void_p] * 7 + [
        ctypes.POINTER(LossResult)]
    lib.ddk_loss_workspace_bytes.restype = ctypes.c_int64
    lib.ddk_loss_workspace_bytes.argtypes = [ctypes.POINTER(LossParams), ctypes.c_int]
    return lib


def ptr(a):
    """A C pointer to a C-contiguous numpy array, or NULL for None."""
    if a is None:
        return None
    assert a.flags["C_CONTIGUOUS"]
    return a.ctypes.data_as(ctypes.c_void_p)


def make_params(n, H, V, chunk, vocab_tile, alpha, T, lam, Tc):
    return LossParams(n, H, V, chunk, vocab_tile, alpha, T, lam, Tc)


def call_c(lib, p, hs, ht, W, labels, weights, want_grad=True, want_per_position=True):
    """Runs ddk_loss_cpu; returns (rc, result, grad (n, H), per_position (n), guards_ok)."""
    n, H = p.n, p.hidden
    grad_buf = np.full(n * H + GUARD, GUARD_VALUE, dtype=np.float32)       # (n*H + guard)
    per_buf = np.full(n + GUARD, GUARD_VALUE, dtype=np.float32)            # (n + guard)
    out = LossResult()
    rc = lib.ddk_loss_cpu(ctypes.byref(p), ptr(hs), ptr(ht), ptr(W), ptr(labels), ptr(weights),
                          ptr(grad_buf) if want_grad else None,
                          ptr(per_buf) if want_per_position else None, ctypes.byref(out))
    guards_ok = bool(np.all(grad_buf[n * H:] == GUARD_VALUE) and np.all(per_buf[n:] == GUARD_VALUE))
    return rc, out, grad_buf[:n * H].reshape(n, H), per_buf[:n], guards_ok


# ------------------------------------------------------------------------------------------
# The oracle: SPEC.md section 1 in float64 autograd (loss_section1 of tests/oracle/reference.py)


def reference(hs, ht, W, labels, weights, alpha, T, lam, Tc):
    """Returns a dict of the SPEC.md outputs, computed in float64 from the float32 inputs by
    reference.py's loss_section1, plus per_position (n,) and grad = d loss / d hs (n, H)."""
    hs64 = torch.from_numpy(hs).double().requires_grad_(True)                      # (n, H)
    ht64 = None if ht is None else torch.from_numpy(ht).double()                   # (n, H)
    W64 = torch.from_numpy(W).double()                                             # (V, H)
    y = None if labels is None else torch.from_numpy(labels).long()    # None: teacher argmax
    w = torch.ones(hs.shape[0], dtype=torch.float64) if weights is None else \
        torch.from_numpy(weights).double()
    out = R.loss_section1(hs64, ht64, W64, y, w, alpha, T, lam, Tc)
    out["loss_t"].backward()
    out["grad"] = hs64.grad.numpy()
    out["per_position"] = out["per_position"].numpy()
    return out


# ------------------------------------------------------------------------------------------
# Fixtures


def make_case(seed, n, H, V, teacher="indep", labels="none", weights="none", dominant=False):
    """Random float32 inputs whose logits have std ~2.

    teacher: None (no teacher), "indep" (independent of hs) or "near" (hs + noise, so the
    teacher's argmax often equals the student's and CAP's c_i is often 1).
    labels: "none" (NULL: teacher argmax), or "given" (half the student's argmax, the rest
    random, some -1).  weights: "none" (NULL) or "given" (random, some 0 and some negative).
    dominant: every position's label has 1 - p_y ~ 1e-6 (p_y -> 1), with a large W so that the
    gradient, ~(1 - p_y) |W|, stays far above GRAD_ABS. Forming softmax - onehot at the label as
    fp32 p_y - 1 loses up to 3e-8 of ~1e-6 there; an fp32 emulation doing that misses the
    gradient tolerance by 25x, one using -sum_{v != y} p_v passes it with 80x to spare.
    """
    g = np.random.default_rng(seed)
    W = (g.standard_normal((V, H)) * (2.0 / np.sqrt(H))).astype(np.float32)        # (V, H)
    hs = g.standard_normal((n, H)).astype(np.float32)                             # (n, H)
    ht = None
    y = None
    if dominant:
        W *= np.float32(DOMINANT_W_SCALE)
        hs *= np.float32(1.0 / DOMINANT_W_SCALE)
        y = g.integers(0, V, size=n).astype(np.int32)
        W64 = W.astype(np.float64)
        for i in range(n):   # move hs_i along W_y until 1 - p_y = DOMINANT_ONE_MINUS_PY
            wy = W64[y[i]]
            for _ in range(8):
                zs = W64 @ hs[i].astype(np.float64)
                others = np.delete(zs, y[i])
                lse_others = others.max() + np.log(np.exp(others - others.max()).sum())
                target = lse_others - np.log(DOMINANT_ONE_MINUS_PY)
                hs[i] = (hs[i] + (target - zs[y[i]]) / float(wy @ wy) * wy).astype(np.float32)
    else:
        if teacher is not None:
            ht = g.standard_normal((n, H)).astype(np.float32)
            if teacher == "near":
                ht = (hs + 0.3 * ht).astype(np.float32)
        # redraw rows whose float64 argmax is a near-tie (see ARGMAX_GAP)
        W64 = torch.from_numpy(W).double()
        for _ in range(100):
            bad = harness.top2_gap(torch.from_numpy(hs).double() @ W64.T) < ARGMAX_GAP
            if ht is not None:
                bad |= harness.top2_gap(torch.from_numpy(ht).double() @ W64.T) < ARGMAX_GAP
            bad = bad.numpy()
            if not bad.any():
                break
            k = int(bad.sum())
            hs[bad] = g.standard_normal((k, H)).astype(np.float32)
            if ht is not None:
                noise = g.standard_normal((k, H)).astype(np.float32)
                ht[bad] = (hs[bad] + 0.3 * noise) if teacher == "near" else noise
        else:
            raise RuntimeError("fixture: could not avoid argmax near-ties")
        if labels == "given":
            zs = hs.astype(np.float64) @ W.astype(np.float64).T
            y = np.where(g.random(n) < 0.5, np.argmax(zs, axis=1),
                         g.integers(0, V, size=n)).astype(np.int32)
            y[g.random(n) < 0.2] = -1
    w = None
    if weights == "given":
        w = g.uniform(0.1, 2.0, size=n).astype(np.float32)
        w[g.random(n) < 0.2] = 0.0
        w[g.random(n) < 0.1] = -0.5
    elif weights == "zero":
        w = np.zeros(n, dtype=np.float32)
    return hs, ht, W, y, w


# name, seed, n, H, V, chunk, vocab_tile, alpha, T, lambda, Tc, make_case keywords
CASES = [
    ("ce_only_labels_ignored", 1, 37, 16, 101, 8, 0, 0.0, 1.0, 0.0, 1.0,
     dict(teacher=None, labels="given")),
    ("teacher_labels_kl", 2, 50, 32, 257, 7, 0, 0.15, 1.0, 0.0, 1.0,
     dict(teacher="near")),
    ("tiled_weights_T2_cap", 3, 64, 24, 500, 64, 64, 0.15, 2.0, 0.1, 0.7,
     dict(teacher="near", labels="given", weights="given")),
    ("kl_only_alpha1_T2", 4, 33, 8, 1000, 5, 0, 1.0, 2.0, 0.0, 1.0,
     dict(teacher="near", weights="given")),
    ("tiled_cap_no_teacher", 5, 20, 40, 311, 3, 50, 0.0, 1.0, 0.5, 0.7,
     dict(teacher=None, labels="given")),
    ("one_position", 6, 1, 5, 3, 1, 0, 0.15, 1.0, 0.1, 0.7,
     dict(teacher="indep")),
    ("chunk_over_n_tile_V_minus_1", 7, 45, 17, 129, 100, 128, 0.15, 1.0, 0.2, 0.7,
     dict(teacher="near", weights="given")),
    ("all_weights_zero", 8, 10, 12, 64, 4, 0, 0.15, 1.0, 0.1, 0.7,
     dict(teacher="indep", weights="zero")),
    ("alpha0_with_teacher_T2_cap", 9, 41, 20, 203, 9, 33, 0.0, 2.0, 0.3, 0.7,
     dict(teacher="near", labels="given", weights="given")),
    ("p_y_to_1", 10, 4, 32, 300, 3, 0, 0.0, 1.0, 0.0, 1.0,
     dict(teacher=None, dominant=True)),
    ("p_y_to_1_tiled", 10, 4, 32, 300, 3, 37, 0.0, 1.0, 0.0, 1.0,
     dict(teacher=None, dominant=True)),
    ("seed_config", 12, 129, 64, 2003, 32, 256, 0.15, 1.0, 0.1, 0.7,
     dict(teacher="near")),
]


# ------------------------------------------------------------------------------------------
# Checks


def close(c, r):
    return abs(c - r) <= SCALAR_REL * abs(r) + SCALAR_ABS


def run_case(lib, case):
    name, seed, n, H, V, chunk, tile, alpha, T, lam, Tc, kw = case
    hs, ht, W, y, w = make_case(seed, n, H, V, **kw)
    p = make_params(n, H, V, chunk, tile, alpha, T, lam, Tc)
    ref = reference(hs, ht, W, y, w, alpha, T, lam, Tc)
    rc, out, grad, per, guards_ok = call_c(lib, p, hs, ht, W, y, w)
    errors = []
    if rc != 0:
        return [f"rc={rc}"], ""
    if not guards_ok:
        errors.append("wrote past the end of grad_student or per_position")
    for f in RESULT_FIELDS:
        cv, rv = getattr(out, f), ref[f]
        ok = (cv == rv) if f in ("counted", "correct") else close(cv, rv)
        if not ok:
            errors.append(f"{f}: C {cv!r} ref {rv!r}")
    per_err = np.abs(per.astype(np.float64) - ref["per_position"])
    per_tol = SCALAR_REL * np.abs(ref["per_position"]) + PER_POSITION_ABS
    if not np.all(per_err <= per_tol) or not np.all(np.isfinite(per)):
        i = int(np.argmax(per_err - per_tol))
        errors.append(f"per_position[{i}]: C {per[i]!r} ref {ref['per_position'][i]!r}")
    gmax = float(np.max(np.abs(ref["grad"])))
    gerr = float(np.max(np.abs(grad.astype(np.float64) - ref["grad"])))
    gtol = GRAD_REL * gmax + GRAD_ABS
    if not (gerr <= gtol) or not np.all(np.isfinite(grad)):
        errors.append(f"grad: max abs diff {gerr:.3e} > tol {gtol:.3e} (max|ref| {gmax:.3e})")
    # The same result without the optional outputs (grad and per_position NULL).
    rc2, out2, _, _, _ = call_c(lib, p, hs, ht, W, y, w, want_grad=False, want_per_position=False)
    if rc2 != 0 or not close(out2.loss, ref["loss"]):
        errors.append(f"without grad/per_position: rc={rc2} loss {out2.loss!r}")
    info = (f"loss={out.loss:.6g} ref={ref['loss']:.6g} counted={out.counted} "
            f"correct={out.correct} grad_err={gerr:.2e}/{gtol:.2e}")
    return errors, info


def run_invalid(lib):
    """Bad parameters: -EINVAL and nothing written (out, grad, per_position untouched)."""
    n, H, V = 6, 8, 20
    hs, ht, W, y, w = make_case(99, n, H, V, teacher="indep", labels="given", weights="given")
    good = dict(n=n, H=H, V=V, chunk=4, vocab_tile=0, alpha=0.15, T=1.0, lam=0.1, Tc=0.7)
    y_big = y.copy()
    y_big[2] = V
    bad = [   # name, parameter overrides, teacher, labels
        ("chunk 0", dict(chunk=0), ht, y),
        ("kl_weight 2", dict(alpha=2.0), ht, y),
        ("kl_weight -0.1", dict(alpha=-0.1), ht, y),
        ("kl_temperature 0", dict(T=0.0), ht, y),
        ("cap_weight -1", dict(lam=-1.0), ht, y),
        ("cap_temperature 0", dict(Tc=0.0), ht, y),
        ("vocab_tile -1", dict(vocab_tile=-1), ht, y),
        ("n -1", dict(n=-1), ht, y),
        ("label >= V", dict(), ht, y_big),
        ("no teacher and no labels", dict(alpha=0.0), None, None),
        ("no teacher and kl_weight > 0", dict(), None, y),
    ]
    results = []
    for name, over, t, lab in bad:
        q = dict(good, **over)
        p = make_params(q["n"], q["H"], q["V"], q["chunk"], q["vocab_tile"], q["alpha"],
                        q["T"], q["lam"], q["Tc"])
        grad_buf = np.full((n, H), GUARD_VALUE, dtype=np.float32)   # (n, H), pre-filled
        per_buf = np.full(n, GUARD_VALUE, dtype=np.float32)         # (n), pre-filled
        out = LossResult(*([-7.0] * 5 + [-7, -7]))
        rc = lib.ddk_loss_cpu(ctypes.byref(p), ptr(hs), ptr(t), ptr(W), ptr(lab), ptr(w),
                              ptr(grad_buf), ptr(per_buf), ctypes.byref(out))
        errors = []
        if rc != -EINVAL:
            errors.append(f"rc={rc}, expected {-EINVAL}")
        if not (np.all(grad_buf == GUARD_VALUE) and np.all(per_buf == GUARD_VALUE)):
            errors.append("wrote grad_student or per_position")
        if any(getattr(out, f) != -7 for f in RESULT_FIELDS):
            errors.append("wrote the result")
        # The workspace query must reject the same parameters when they are its business
        # (everything but the data-dependent label range and the pointer rules).
        if over and name not in ("no teacher and no labels", "no teacher and kl_weight > 0"):
            ws = lib.ddk_loss_workspace_bytes(ctypes.byref(p), 1)
            if ws != -EINVAL:
                errors.append(f"ddk_loss_workspace_bytes={ws}, expected {-EINVAL}")
        results.append((f"invalid: {name}", errors))
    return results


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lib", required=True, help="path to libddk.so")
    args = ap.parse_args()
    torch.set_num_threads(1)
    lib = load_library(args.lib)

    cases = harness.Cases()
    for case in CASES:
        cases.run(case[0], run_case, lib, case)
    for name, errors in run_invalid(lib):
        cases.report(name, errors)
    return cases.summary()


if __name__ == "__main__":
    sys.exit(main())
