"""st.py: a minimal safetensors reader/writer in numpy, for the oracle tests (SPEC.md section 4).

    import st
    f = st.read("x.safetensors")          # f.tensors {name: ndarray}, f.dtypes, f.metadata
    st.write("y.safetensors", {"a": arr}, dtypes={"a": "BF16"}, metadata={"format": "pt"})
    tensors, dtypes = st.read_model_dir("hf_dir")   # model.safetensors or the index + shards

The format, as SPEC.md section 4 states it: an 8-byte little-endian header length N, a JSON
header (per tensor `dtype`, `shape`, `data_offsets` [begin, end) relative to the data start,
plus an optional `__metadata__` of string values), the header padded with spaces to a multiple
of 8, tensors tiling the data with no gap, file size exactly 8 + N + last end. read() enforces
every one of these rules and raises StError naming the file and the rule.

Dtypes: F64, F32, F16, BF16, I64, I32, U8 (and I8, I16, BOOL on reading). BF16 has no numpy
type: it is decoded to float32 exactly (bits << 16) and encoded from float32 with round to
nearest even (NaN kept a NaN); bf16_round() gives the float32 values a BF16 store keeps.

Deliberately not here: memory mapping, big-endian hosts, the safetensors package (not
installed; this file is the independent reader the oracle tests use). Exercised by
`python3 tests/oracle/st.py` (a round-trip self-test) and by the *_torch_check.py scripts.
No torch needed.
"""

import json
import os
import struct
import sys

import numpy as np

# name -> (numpy storage dtype, little-endian; bytes per element)
_STORAGE = {
    "F64": np.dtype("<f8"), "F32": np.dtype("<f4"), "F16": np.dtype("<f2"),
    "BF16": np.dtype("<u2"), "I64": np.dtype("<i8"), "I32": np.dtype("<i4"),
    "I16": np.dtype("<i2"), "I8": np.dtype("i1"), "U8": np.dtype("u1"), "BOOL": np.dtype("u1"),
}
_WRITABLE = ("F64", "F32", "F16", "BF16", "I64", "I32", "U8")
_DEFAULT_NAME = {np.dtype(np.float64): "F64", np.dtype(np.float32): "F32",
                 np.dtype(np.float16): "F16", np.dtype(np.int64): "I64",
                 np.dtype(np.int32): "I32", np.dtype(np.uint8): "U8"}


class StError(ValueError):
    """A file that breaks a rule of the format: the message is 'PATH: the rule'."""


# ------------------------------------------------------------------------------------------
# BF16 <-> float32 by bit manipulation


def f32_to_bf16_bits(x):
    """uint16 array: x (any float array) as float32, rounded to bf16 to nearest even."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = (u + 0x7FFF + ((u >> 16) & 1)) >> 16                 # round half to even
    nan = np.isnan(np.asarray(x, dtype=np.float32))
    bits = np.where(nan, (u >> 16) | 0x40, rounded)                # quiet NaN stays a NaN
    return bits.astype(np.uint16)


def bf16_bits_to_f32(bits):
    """float32 array: the exact values of bf16 bit patterns (uint16)."""
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def bf16_round(x):
    """float32 array: x rounded to the nearest bf16 value (what a BF16 store keeps)."""
    return bf16_bits_to_f32(f32_to_bf16_bits(x)).reshape(np.shape(x))


# ------------------------------------------------------------------------------------------
# Reading


class StFile:
    """tensors: {name: ndarray} (BF16 decoded to float32 unless raw); dtypes: {name: "F32"...};
    metadata: {key: str} or None; order: names in the order of their data offsets."""

    def __init__(self, path, tensors, dtypes, metadata, order):
        self.path, self.tensors, self.dtypes, self.metadata, self.order = \
            path, tensors, dtypes, metadata, order

    def __getitem__(self, name):
        return self.tensors[name]

    def __contains__(self, name):
        return name in self.tensors


def read(path, raw=False):
    """Reads and validates one safetensors file; raises StError('PATH: rule') on any breach."""
    def bad(rule):
        raise StError(f"{path}: {rule}")

    with open(path, "rb") as fh:
        blob = fh.read()
    if len(blob) < 8:
        bad("shorter than the 8-byte header length")
    (n,) = struct.unpack("<Q", blob[:8])
    if 8 + n > len(blob):
        bad(f"header length {n} runs past the end of the file ({len(blob)} bytes)")
    if n % 8 != 0:
        bad(f"header length {n} is not a multiple of 8")
    try:
        header = json.loads(blob[8:8 + n].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        bad(f"header is not valid UTF-8 JSON ({exc})")
    if not isinstance(header, dict):
        bad("header is not a JSON object")
    metadata = header.pop("__metadata__", None)
    if metadata is not None:
        if not isinstance(metadata, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
            bad("__metadata__ is not an object of string values")
    entries = []
    for name, e in header.items():
        if not isinstance(e, dict) or set(e) != {"dtype", "shape", "data_offsets"}:
            bad(f"tensor {name!r}: entry must have exactly dtype, shape, data_offsets")
        dt, shape, offs = e["dtype"], e["shape"], e["data_offsets"]
        if dt not in _STORAGE:
            bad(f"tensor {name!r}: unknown dtype {dt!r}")
        if not isinstance(shape, list) or not all(
                isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in shape):
            bad(f"tensor {name!r}: shape must be a list of non-negative integers")
        if not (isinstance(offs, list) and len(offs) == 2 and all(
                isinstance(o, int) and not isinstance(o, bool) for o in offs)
                and 0 <= offs[0] <= offs[1]):
            bad(f"tensor {name!r}: data_offsets must be [begin, end] with 0 <= begin <= end")
        numel = int(np.prod(shape, dtype=np.int64)) if shape else 1
        if offs[1] - offs[0] != numel * _STORAGE[dt].itemsize:
            bad(f"tensor {name!r}: data_offsets span {offs[1] - offs[0]} bytes, "
                f"shape {shape} of {dt} needs {numel * _STORAGE[dt].itemsize}")
        entries.append((offs[0], offs[1], name, dt, shape))
    entries.sort(key=lambda t: (t[0], t[1]))
    pos = 0
    for begin, end, name, _, _ in entries:
        if begin != pos:
            bad(f"tensor {name!r}: data does not tile the buffer (gap or overlap at {begin}, "
                f"expected {pos})")
        pos = end
    if 8 + n + pos != len(blob):
        bad(f"file size {len(blob)} is not 8 + header {n} + data {pos}")
    data = memoryview(blob)[8 + n:]
    tensors, dtypes, order = {}, {}, []
    for begin, end, name, dt, shape in entries:
        arr = np.frombuffer(data[begin:end], dtype=_STORAGE[dt]).reshape(shape).copy()
        if dt == "BF16" and not raw:
            arr = bf16_bits_to_f32(arr).reshape(shape)
        elif dt == "BOOL" and not raw:
            arr = arr.astype(bool)
        tensors[name], dtypes[name] = arr, dt
        order.append(name)
    return StFile(path, tensors, dtypes, metadata, order)


def read_model_dir(directory):
    """A Hugging Face directory: ({name: ndarray}, {name: dtype}) from model.safetensors, or
    from model.safetensors.index.json and the shards its weight_map names (each name must be
    found in the shard the index says)."""
    index = os.path.join(directory, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as fh:
            weight_map = json.load(fh)["weight_map"]
        tensors, dtypes, files = {}, {}, {}
        for name, shard in weight_map.items():
            if shard not in files:
                files[shard] = read(os.path.join(directory, shard))
            f = files[shard]
            if name not in f:
                raise StError(f"{f.path}: the index names {name!r} here but it is absent")
            tensors[name], dtypes[name] = f.tensors[name], f.dtypes[name]
        return tensors, dtypes
    f = read(os.path.join(directory, "model.safetensors"))
    return dict(f.tensors), dict(f.dtypes)


# ------------------------------------------------------------------------------------------
# Writing


def encode(arr, dtype=None):
    """(dtype name, little-endian bytes) of arr stored as dtype (default: from arr's dtype)."""
    arr = np.asarray(arr)
    if dtype is None:
        if arr.dtype == np.bool_:
            dtype = "U8"
        else:
            dtype = _DEFAULT_NAME.get(arr.dtype)
        if dtype is None:
            raise ValueError(f"no safetensors dtype for numpy {arr.dtype}; pass dtypes=")
    if dtype not in _WRITABLE:
        raise ValueError(f"cannot write dtype {dtype!r}")
    if dtype == "BF16":
        data = f32_to_bf16_bits(arr.astype(np.float32))
    else:
        data = arr.astype(_STORAGE[dtype])
    return dtype, np.ascontiguousarray(data).tobytes()


def dumps(tensors, dtypes=None, metadata=None):
    """The bytes of a safetensors file holding tensors ({name: array}) in insertion order."""
    dtypes = dtypes or {}
    header, chunks, pos = {}, [], 0
    if metadata is not None:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    for name, arr in tensors.items():
        dt, raw = encode(arr, dtypes.get(name))
        header[name] = {"dtype": dt, "shape": [int(s) for s in np.shape(arr)],
                        "data_offsets": [pos, pos + len(raw)]}
        chunks.append(raw)
        pos += len(raw)
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + b"".join(chunks)


def write(path, tensors, dtypes=None, metadata=None):
    """Writes tensors ({name: array}) to path; dtypes {name: "BF16"|...} overrides the dtype
    taken from each array; metadata {key: value} becomes __metadata__ (values as strings)."""
    blob = dumps(tensors, dtypes, metadata)
    tmp = path + ".tmp"
    with open(tmp, "wb") as fh:
        fh.write(blob)
    os.replace(tmp, path)


def write_model_dir(directory, tensors, dtypes=None, shards=1, metadata=None):
    """A Hugging Face weight set: model.safetensors (shards == 1), or `shards` files
    model-0000i-of-0000n.safetensors and model.safetensors.index.json naming them."""
    os.makedirs(directory, exist_ok=True)
    metadata = {"format": "pt"} if metadata is None else metadata
    dtypes = dtypes or {}
    if shards == 1:
        write(os.path.join(directory, "model.safetensors"), tensors, dtypes, metadata)
        return
    names = list(tensors)
    weight_map, total = {}, 0
    for s in range(shards):
        part = names[s::shards]
        fname = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        write(os.path.join(directory, fname), {k: tensors[k] for k in part},
              {k: dtypes[k] for k in part if k in dtypes}, metadata)
        for k in part:
            weight_map[k] = fname
            total += len(encode(tensors[k], dtypes.get(k))[1])
    with open(os.path.join(directory, "model.safetensors.index.json"), "w") as fh:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, fh, indent=1)


# ------------------------------------------------------------------------------------------
# Self-test: python3 tests/oracle/st.py [FILE...]   (FILEs: real safetensors files to read)


def _self_test(paths):
    import tempfile
    failures = []

    def expect(ok, what):
        if not ok:
            failures.append(what)

    g = np.random.default_rng(0)
    # BF16 encoding: exact values survive, ties go to even, NaN/inf survive, decoding is exact
    exact = np.array([0.0, -0.0, 1.0, -2.5, 2.0 ** 127, 2.0 ** -130, np.inf, -np.inf],
                     dtype=np.float32)   # 2^-130: a subnormal bf16 holds exactly
    expect(np.array_equal(bf16_round(exact), exact, equal_nan=True), "bf16: exact values")
    # 1 + 2^-8 is halfway between 1 and 1 + 2^-7: to even (1); 1 + 3*2^-8: to 1 + 2^-6
    ties = np.array([1 + 2.0 ** -8, 1 + 3 * 2.0 ** -8, 1 + 2.0 ** -8 + 2.0 ** -20],
                    dtype=np.float32)
    expect(np.array_equal(bf16_round(ties), np.array([1.0, 1 + 2.0 ** -6, 1 + 2.0 ** -7],
                                                     dtype=np.float32)), "bf16: ties to even")
    expect(bool(np.isnan(bf16_round(np.array([np.nan], dtype=np.float32)))[0]), "bf16: NaN")
    x = g.standard_normal(10000).astype(np.float32)
    rel = np.max(np.abs(bf16_round(x) - x) / np.abs(x))
    expect(rel <= 2.0 ** -8, f"bf16: rounding error {rel} > 2^-8 (half an ulp of 8 bits)")
    # bf16 of x must be the nearer of the two bf16 neighbours (checked via truncation)
    lo = bf16_bits_to_f32(x.view(np.uint32) >> 16)
    hi = bf16_bits_to_f32((x.view(np.uint32) >> 16) + 1)
    r = bf16_round(x)
    expect(bool(np.all(np.abs(r - x) <= np.minimum(np.abs(lo - x), np.abs(hi - x)))),
           "bf16: not the nearest")

    tensors = {
        "f32": g.standard_normal((3, 5)).astype(np.float32),
        "f64": g.standard_normal((2, 2, 2)),
        "bf16": g.standard_normal((7,)).astype(np.float32),
        "f16": g.standard_normal((4, 3)).astype(np.float16),
        "i32": g.integers(-5, 5, size=(6,)).astype(np.int32),
        "i64": g.integers(-2 ** 40, 2 ** 40, size=(2, 3)).astype(np.int64),
        "u8": g.integers(0, 255, size=(5,)).astype(np.uint8),
        "scalar": np.array(3.25, dtype=np.float64),
        "empty": np.zeros((0, 4), dtype=np.float32),
    }
    with tempfile.TemporaryDirectory() as tmp:
        p = os.path.join(tmp, "rt.safetensors")
        write(p, tensors, dtypes={"bf16": "BF16"}, metadata={"format": "pt", "k": 7})
        f = read(p)
        expect(f.metadata == {"format": "pt", "k": "7"}, f"metadata {f.metadata}")
        for k, v in tensors.items():
            want = bf16_round(v) if k == "bf16" else v
            expect(f.tensors[k].shape == v.shape and np.array_equal(f.tensors[k], want),
                   f"round trip of {k}")
        expect(f.dtypes == {"f32": "F32", "f64": "F64", "bf16": "BF16", "f16": "F16",
                            "i32": "I32", "i64": "I64", "u8": "U8", "scalar": "F64",
                            "empty": "F32"}, f"dtypes {f.dtypes}")
        blob = open(p, "rb").read()
        expect(struct.unpack("<Q", blob[:8])[0] % 8 == 0, "header not padded to 8")
        # every broken rule is rejected, naming the file
        (n,) = struct.unpack("<Q", blob[:8])
        header = json.loads(blob[8:8 + n])

        def with_header(h, data=blob[8 + n:], pad=True):
            t = json.dumps(h).encode()
            if pad:
                t += b" " * (-len(t) % 8)
            return struct.pack("<Q", len(t)) + t + data

        gap = dict(header)
        gap["f32"] = dict(gap["f32"], data_offsets=[gap["f32"]["data_offsets"][0] + 4,
                                                   gap["f32"]["data_offsets"][1] + 4])
        bad_files = {
            "truncated": blob[:-1],
            "extra byte": blob + b"\0",
            "short": blob[:5],
            "unpadded": with_header(header, pad=False) if len(json.dumps(header)) % 8 else b"",
            "gap": with_header(gap),
            "bad dtype": with_header(dict(header, u8=dict(header["u8"], dtype="X9"))),
            "bad shape": with_header(dict(header, u8=dict(header["u8"], shape=[4]))),
            "bad json": struct.pack("<Q", 8) + b"{ nope  " + blob[8 + n:],
        }
        for what, content in bad_files.items():
            if not content:
                continue
            q = os.path.join(tmp, "bad.safetensors")
            with open(q, "wb") as fh:
                fh.write(content)
            try:
                read(q)
                failures.append(f"accepted a file with {what}")
            except StError as exc:
                expect(str(exc).startswith(q + ": "), f"error does not name the file: {exc}")
        # sharded model directories read back the same as one file
        d = os.path.join(tmp, "sharded")
        write_model_dir(d, tensors, {"bf16": "BF16"}, shards=3)
        t2, d2 = read_model_dir(d)
        expect(set(t2) == set(tensors) and all(np.array_equal(t2[k], f.tensors[k])
                                               for k in tensors), "sharded round trip")
    for path in paths:
        f = read(path)
        print(f"read {path}: {len(f.tensors)} tensors, metadata {f.metadata}")
    for what in failures:
        print("FAIL", what)
    print(f"st.py self-test: {'FAILED' if failures else 'ok'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(_self_test(sys.argv[1:]))
