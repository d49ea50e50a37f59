"""harness.py: what the oracle scripts of tests/ (*_torch_check.py) share, apart from the math.

    sys.path.insert(0, ".../tests/oracle")
    import harness
    harness.require_torch()                   # prints "skipped: ..." and exits 77 without torch
    cases = harness.Cases()
    cases.run(name, fn, *args)                # fn(*args) -> (errors, info): one line per case
    return cases.summary()                    # "N passed, M failed"; the exit status

The conventions: exit 77 (ctest's "skipped", never "passed") when torch or the tool under test
is missing, 1 on any failure, 0 otherwise; one line per case, `ok   NAME: INFO` or
`FAIL NAME: ERROR; ERROR [INFO]`, an exception in a case being that case's failure; the last
line `N passed, M failed`. For the ddtreed scripts: the --ddtreed/--workdir/--emulate options
(ddtreed_options, tool_of, case_workdir) and main() around the cases (ddtreed_main), one
ddtreed run with a timeout or its float32 emulation (run_ddtreed, require_tensors), and the
check of a run that must refuse a file lacking a tensor (refusal_errors). read_json and
write_json for config files; top2_gap() is the near-tie measure the fixtures redraw by.
Nothing here knows the C code or SPEC.md's formulas (those are in reference.py).
"""

import argparse
import contextlib
import importlib
import json
import os
import shutil
import subprocess
import sys
import tempfile

from cases import Cases  # noqa: E402,F401  (the scripts use harness.Cases)

try:
    importlib.import_module("numpy")   # the scripts import it after require_torch()
    import torch
except ImportError as exc:   # require_torch() reports it
    torch = None
    _IMPORT_ERROR = exc

SKIPPED = 77        # ctest's SKIP_RETURN_CODE
EMULATE = "emulate"  # tool_of()'s answer for --emulate


def require_torch():
    """Exits 77 (skipped) with a note when numpy or torch cannot be imported."""
    if torch is None:
        print(f"skipped: torch not available ({_IMPORT_ERROR})")
        sys.exit(SKIPPED)


def read_json(path):
    """The JSON value in the file at path."""
    with open(path) as fh:
        return json.load(fh)


def write_json(path, obj):
    """obj as JSON (indent 1) into the file at path."""
    with open(path, "w") as fh:
        json.dump(obj, fh, indent=1)


def top2_gap(z):
    """(rows,) difference between the two largest values of each row of z (rows, V); inf when
    V < 2 (no second value, no tie)."""
    if z.shape[1] < 2:
        return torch.full((z.shape[0],), float("inf"), dtype=z.dtype)
    t = torch.topk(z, 2, dim=1).values
    return t[:, 0] - t[:, 1]


# ------------------------------------------------------------------------------------------
# The ddtreed scripts


def ddtreed_options(doc):
    """An ArgumentParser (described by doc's first line) with --ddtreed, --workdir and
    --emulate; a script adds its own options before parse_args()."""
    ap = argparse.ArgumentParser(description=doc.split("\n")[0])
    ap.add_argument("--ddtreed", help="path to the ddtreed binary")
    ap.add_argument("--workdir", help="keep the case files here (default: a temporary dir)")
    ap.add_argument("--emulate", action="store_true",
                    help="check against a float32 torch emulation instead of ddtreed")
    return ap


def tool_of(args):
    """EMULATE, ddtreed's absolute path, or None (with the note `skipped: ddtreed not built`)
    when --ddtreed names no file: the caller then exits 77."""
    if args.emulate:
        return EMULATE
    if not args.ddtreed or not os.path.exists(args.ddtreed):
        print("skipped: ddtreed not built" + (f" ({args.ddtreed})" if args.ddtreed else ""))
        return None
    return os.path.abspath(args.ddtreed)


def ddtreed_main(args, prefix, run_all):
    """main() of a ddtreed script after parse_args(): 77 without ddtreed (tool_of); otherwise
    run_all(tool, workdir, cases) with torch on one thread, in case_workdir(args.workdir,
    prefix), then the last line. Returns the exit status."""
    tool = tool_of(args)
    if tool is None:
        return SKIPPED
    torch.set_num_threads(1)
    cases = Cases()
    with case_workdir(args.workdir, prefix) as workdir:
        run_all(tool, workdir, cases)
    return cases.summary()


@contextlib.contextmanager
def case_workdir(workdir, prefix):
    """The directory of the case files: --workdir (created, kept) or a temporary directory
    named after prefix, removed at the end."""
    if workdir:
        path = os.path.abspath(workdir)
        os.makedirs(path, exist_ok=True)
        yield path
        return
    path = tempfile.mkdtemp(prefix=prefix)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def run_ddtreed(tool, args, out, timeout_s, emulate):
    """(exit status, stdout + stderr) of `ddtreed ARGS` writing out (removed first); a run past
    timeout_s is status -1 and says so. When tool is EMULATE, emulate() does the command's work
    instead: a file it cannot read or that lacks a tensor (require_tensors) is status 1 and a
    message, as ddtreed refuses it."""
    if os.path.exists(out):
        os.remove(out)
    if tool == EMULATE:
        try:
            emulate()
        except (OSError, ValueError, KeyError) as exc:
            return 1, f"emulate: {exc}"
        return 0, ""
    cmd = [tool] + list(args)
    try:
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return -1, f"timed out after {timeout_s} s: {' '.join(cmd)}"
    return p.returncode, p.stdout.decode("utf-8", "replace")


def require_tensors(f, path, names):
    """Raises ValueError naming path and the tensor when the file f (st.read's) lacks one of
    names: an emulation's refusal."""
    for name in names:
        if name not in f:
            raise ValueError(f"{path}: missing tensor {name}")


def refusal_errors(rc, text, path, tensor, out, output_kind):
    """(errors, info) of a run that must refuse the file path for lacking tensor: a non-zero
    exit, a message naming the file and the tensor, no output (output_kind, e.g. "an output
    file") written to out."""
    errors = []
    if rc == 0:
        errors.append("exit status 0")
    if rc < 0 and "timed out" in text:
        errors.append(text)
    if path not in text and os.path.basename(path) not in text:
        errors.append(f"message does not name {path}: {text.strip()[-300:]!r}")
    if tensor not in text:
        errors.append(f"message does not name the tensor {tensor}: {text.strip()[-300:]!r}")
    if os.path.exists(out):
        errors.append(f"wrote {output_kind}")
    return errors, f"exit {rc}: {text.strip().splitlines()[-1] if text.strip() else ''}"
