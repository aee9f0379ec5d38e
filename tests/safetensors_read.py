#!/usr/bin/env python3
"""safetensors_read.py - read a .safetensors file with nothing but the Python standard library.

An independent reader of the format, used by tests/test_ckpt.c to check that what dtrain writes
is what any other reader sees: it prints one line per tensor,

    <stem>  NAME  DTYPE  [D0, D1, ...]

(<stem> is the file name without .safetensors, e.g. "model"), in the format `dtrain ckpt show`
uses, and with --sums also "sum NAME %.6e" for every F32 tensor (summed in order, in double).
It validates as the reference implementation does and exits 1 with "invalid: ..." otherwise.

usage: safetensors_read.py [--sums] FILE.safetensors
"""
import json
import os
import struct
import sys
from array import array

BITS = {"BOOL": 8, "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6, "U8": 8, "I8": 8, "F8_E5M2": 8,
        "F8_E4M3": 8, "F8_E8M0": 8, "I16": 16, "U16": 16, "F16": 16, "BF16": 16, "I32": 32,
        "U32": 32, "F32": 32, "F64": 64, "I64": 64, "U64": 64}
MAX_HEADER = 100_000_000


class Invalid(Exception):
    pass


def no_duplicates(pairs):
    out = {}
    for k, v in pairs:
        if k in out:
            raise Invalid(f"key {k!r} appears twice")
        out[k] = v
    return out


def is_uint(x):
    return type(x) is int and x >= 0


def read(path):
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise Invalid("shorter than the 8-byte header length")
        (n,) = struct.unpack("<Q", head)
        if n > MAX_HEADER:
            raise Invalid(f"header length {n} too large")
        if 8 + n > size:
            raise Invalid(f"header length {n} runs past the end of the file")
        raw = f.read(n)
        data = f.read()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise Invalid("header is not UTF-8")
    if not text.startswith("{"):
        raise Invalid("header does not start with '{'")
    try:
        header = json.loads(text, object_pairs_hook=no_duplicates)
    except json.JSONDecodeError as e:
        raise Invalid(f"header is not JSON: {e}")
    meta = header.pop("__metadata__", None)
    if meta is not None and (not isinstance(meta, dict) or
                             not all(isinstance(v, str) for v in meta.values())):
        raise Invalid("__metadata__ must map strings to strings")
    tensors = []
    for name, info in header.items():
        if not isinstance(info, dict) or set(info) != {"dtype", "shape", "data_offsets"}:
            raise Invalid(f"tensor {name}: needs exactly dtype, shape, data_offsets")
        dtype, shape, offs = info["dtype"], info["shape"], info["data_offsets"]
        if dtype not in BITS:
            raise Invalid(f"tensor {name}: unknown dtype {dtype}")
        if not isinstance(shape, list) or not all(is_uint(d) for d in shape):
            raise Invalid(f"tensor {name}: bad shape")
        if not isinstance(offs, list) or len(offs) != 2 or not all(is_uint(o) for o in offs):
            raise Invalid(f"tensor {name}: bad data_offsets")
        numel = 1
        for d in shape:
            numel *= d
        bits = numel * BITS[dtype]
        if bits % 8 or offs[1] < offs[0] or offs[1] - offs[0] != bits // 8:
            raise Invalid(f"tensor {name}: data_offsets {offs} do not hold {dtype} {shape}")
        tensors.append((offs[0], offs[1], name, dtype, shape))
    tensors.sort()
    pos = 0
    for begin, end, name, _, _ in tensors:
        if begin != pos:
            raise Invalid(f"tensor {name}: starts at {begin}, expected {pos} (hole or overlap)")
        pos = end
    if pos != len(data):
        raise Invalid(f"data section of {len(data)} bytes, tensors need {pos}")
    return meta, tensors, data


def main(argv):
    sums = "--sums" in argv
    args = [a for a in argv if a != "--sums"]
    if len(args) != 1:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    path = args[0]
    stem = os.path.basename(path)
    if stem.endswith(".safetensors"):
        stem = stem[: -len(".safetensors")]
    try:
        meta, tensors, data = read(path)
    except (Invalid, OSError) as e:
        print(f"{path}: invalid: {e}")
        return 1
    for _, _, name, dtype, shape in sorted(tensors, key=lambda t: t[2]):
        print(f"{stem}  {name}  {dtype}  [{', '.join(str(d) for d in shape)}]")
    if sums:
        for begin, end, name, dtype, _ in tensors:
            if dtype != "F32":
                continue
            values = array("f")
            values.frombytes(data[begin:end])
            if sys.byteorder != "little":
                values.byteswap()
            total = 0.0
            for v in values:
                total += v
            print(f"sum {name} {total:.6e}")
    if meta:
        for k in sorted(meta):
            print(f"meta {k} = {meta[k]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
