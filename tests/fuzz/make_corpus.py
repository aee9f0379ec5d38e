#!/usr/bin/env python3
"""make_corpus.py - writes the seed corpus of the frame-parser fuzz target (tests/fuzz/corpus/).

Each seed is a byte stream as the server reads it after the handshake: well-formed requests of
every op, and the malformed shapes the parser must refuse. Layout (rendezvous/protocol.h):
u32 len | u8 code | u32 id | i64 num | u32 nkeys | u32 nvals | (u32 n, n bytes)*, big-endian.
"""
import os
import struct

OPS = dict(AUTH=1, SET=2, GET=3, ADD=4, CAS=5, CHECK=6, WAIT=7, DELETE=8, NUM_KEYS=9,
           APPEND=10, MULTI_GET=11, MULTI_SET=12, PING=13)


def frame(code, keys=(), vals=(), num=0, fid=1, nkeys=None, nvals=None):
    items = b"".join(struct.pack(">I", len(x)) + x for x in list(keys) + list(vals))
    body = struct.pack(">BIqII", code, fid, num,
                       len(keys) if nkeys is None else nkeys,
                       len(vals) if nvals is None else nvals) + items
    return struct.pack(">I", len(body)) + body


def trailing():
    """A PING whose len covers two bytes after its (zero) items."""
    f = frame(OPS["PING"])
    return struct.pack(">I", len(f) - 4 + 2) + f[4:] + b"xx"


seeds = {
    "set": frame(OPS["SET"], [b"key"], [b"value"]),
    "get_wait": frame(OPS["GET"], [b"key"], num=1000),
    "add_neg": frame(OPS["ADD"], [b"ctr"], num=-(1 << 63)),
    "cas": frame(OPS["CAS"], [b"k"], [b"", b"desired"]),
    "check": frame(OPS["CHECK"], [b"a", b"b", b"c"]),
    "wait_forever": frame(OPS["WAIT"], [b"a"], num=-1),
    "delete": frame(OPS["DELETE"], [b"k"]),
    "num_keys": frame(OPS["NUM_KEYS"]),
    "append": frame(OPS["APPEND"], [b"log"], [b"line\n"]),
    "multi_get": frame(OPS["MULTI_GET"], [b"k%d" % i for i in range(4)], num=5),
    "multi_set": frame(OPS["MULTI_SET"], [b"a", b"b"], [b"1", b"2"]),
    "ping": frame(OPS["PING"]),
    "auth": frame(OPS["AUTH"], vals=[b"s3cret"]),
    "pipeline": b"".join(frame(OPS[o], [b"k"] if o in ("GET", "DELETE") else [], fid=i)
                         for i, o in enumerate(["PING", "GET", "DELETE", "NUM_KEYS"])),
    "unknown_op": frame(99),
    "zero_op": frame(0),
    "wrong_counts": frame(OPS["SET"], [b"k"]),
    "key_too_long": frame(OPS["GET"], [b"k" * 65]),
    "value_too_long": frame(OPS["SET"], [b"k"], [b"v" * 1025]),
    "too_many_keys": frame(OPS["CHECK"], [b"k"] * 17),
    "nul_in_key": frame(OPS["GET"], [b"a\0b"]),
    "counts_overflow": frame(OPS["CHECK"], nkeys=0xFFFFFFFF, nvals=0xFFFFFFFF),
    "item_overrun": frame(OPS["GET"], [b"key"])[:-3] + struct.pack(">I", 1000)[1:],
    "trailing": trailing(),
    "huge_len": struct.pack(">I", 0x7FFFFFFF) + b"\x02" * 32,
    "short_len": struct.pack(">I", 3) + b"abc",
    "truncated": frame(OPS["SET"], [b"key"], [b"value"])[:17],
    "hello_then_frames": struct.pack(">IHH", 0x44545354, 1, 0) + frame(OPS["PING"]),
    "http": b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
    "empty_key_and_value": frame(OPS["SET"], [b""], [b""]),
}

here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")
os.makedirs(here, exist_ok=True)
for name, data in seeds.items():
    with open(os.path.join(here, name), "wb") as f:
        f.write(data)
print("wrote %d seeds to %s" % (len(seeds), here))
