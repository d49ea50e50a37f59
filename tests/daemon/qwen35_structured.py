#!/usr/bin/env python3
"""qwen35_structured.py SRC DST: a Qwen3.5 text checkpoint with learnable text, for the
online-training test (tests/daemon/train_qwen35_test.sh) whose tau must rise.

The shared qwen35-tiny checkpoint (SRC: its text-only variant) has random weights: the token
it predicts is a hash-like function of the whole context, which a drafter of one layer does not
learn in a test's budget. DST is the same architecture and layout with two changes, so that the
next token is mostly a fixed function of the current one (a random bigram chain) while every
layer still contributes:
  - every matrix of the layers (attention, DeltaNet, MLP) scaled by LAYER_SCALE, so the
    residual stream stays near the current token's embedding;
  - lm_head row perm[a] = HEAD_SCALE * embed_tokens[a] / |embed_tokens[a]|, perm a seeded
    random permutation: the logit of perm[a] after token a is ~HEAD_SCALE sqrt(H) larger than
    the others, so sampling at a low temperature follows the chain a -> perm[a].
Written F32, one file, the same config.json. Numpy only; the safetensors format is read and
written here (8-byte little-endian header length, JSON header, raw little-endian data).
"""
import json
import os
import shutil
import struct
import sys

import numpy as np

LAYER_SCALE = 0.1
HEAD_SCALE = 1.5
SEED = 7


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if info["dtype"] != "F32":
            sys.exit("%s: %s is %s; this script reads the F32 text-only variant" % (path, name, info["dtype"]))
        a, b = info["data_offsets"]
        out[name] = np.frombuffer(data[a:b], dtype="<f4").reshape(info["shape"]).copy()
    return out


def write_safetensors(path, tensors):
    header, offset, blobs = {"__metadata__": {"format": "pt"}}, 0, []
    for name in sorted(tensors):
        blob = np.ascontiguousarray(tensors[name], dtype="<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(tensors[name].shape),
                        "data_offsets": [offset, offset + len(blob)]}
        offset += len(blob)
        blobs.append(blob)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for blob in blobs:
            f.write(blob)


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: qwen35_structured.py SRC_DIR DST_DIR")
    src, dst = sys.argv[1], sys.argv[2]
    tensors = read_safetensors(os.path.join(src, "model.safetensors"))
    for name, w in tensors.items():
        if ".layers." in name and w.ndim >= 2:
            tensors[name] = w * LAYER_SCALE
    embed = tensors["model.embed_tokens.weight"]             # (V, H)
    perm = np.random.default_rng(SEED).permutation(embed.shape[0])
    head = np.zeros_like(embed)
    head[perm] = HEAD_SCALE * embed / np.linalg.norm(embed, axis=1, keepdims=True)
    tensors["lm_head.weight"] = head
    os.makedirs(dst, exist_ok=True)
    shutil.copy(os.path.join(src, "config.json"), os.path.join(dst, "config.json"))
    write_safetensors(os.path.join(dst, "model.safetensors"), tensors)


if __name__ == "__main__":
    main()
