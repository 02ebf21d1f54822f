#!/usr/bin/env python3
"""Compares the tensors of two safetensors files (standard library only; tests/runtime/test_dist.sh).

    st_compare.py A B            every tensor bit for bit
    st_compare.py --tol T A B    every F32 tensor within T: |a - b| <= T * max(1, max |a|) elementwise
    --skip S (before A B)        leaves out the tensors whose names contain S (running_: batch-norm statistics)

Metadata (__metadata__) is not compared. Prints one line saying what differs, or the largest
difference found; exits 0 when the files agree, 1 when not, 2 when a file cannot be read."""
import json
import struct
import sys


def load(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    header.pop("__metadata__", None)
    base = 8 + n
    out = {}
    for name, t in header.items():
        a, b = t["data_offsets"]
        out[name] = (t["dtype"], t["shape"], data[base + a:base + b])
    return out


def main():
    args = sys.argv[1:]
    tol = None
    skip = None
    while args[:1] in (["--tol"], ["--skip"]):
        if args[0] == "--tol":
            tol = float(args[1])
        else:
            skip = args[1]
        args = args[2:]
    if len(args) != 2:
        print("usage: st_compare.py [--tol T] [--skip S] A B")
        return 2
    try:
        a, b = load(args[0]), load(args[1])
        if skip:
            a = {k: v for k, v in a.items() if skip not in k}
            b = {k: v for k, v in b.items() if skip not in k}
    except (OSError, ValueError, KeyError, struct.error) as e:
        print("cannot read: %s" % e)
        return 2
    if sorted(a) != sorted(b):
        print("tensor names differ: %s" % sorted(set(a) ^ set(b)))
        return 1
    worst, where = 0.0, None
    for name in sorted(a):
        (da, sa, ba), (db, sb, bb) = a[name], b[name]
        if da != db or sa != sb:
            print("%s: %s%s against %s%s" % (name, da, sa, db, sb))
            return 1
        if ba == bb:
            continue
        if tol is None or da != "F32":
            print("%s: differs (bit for bit wanted)" % name)
            return 1
        xa = struct.unpack("<%df" % (len(ba) // 4), ba)
        xb = struct.unpack("<%df" % (len(bb) // 4), bb)
        scale = max(1.0, max(abs(v) for v in xa))
        d = max(abs(p - q) for p, q in zip(xa, xb)) / scale
        if not d <= tol:  # NaN fails too
            print("%s: differs by %.3g (relative), over %g" % (name, d, tol))
            return 1
        if d > worst:
            worst, where = d, name
    print("agree%s" % ((" within %g: largest difference %.3g in %s" % (tol, worst, where)) if where else " bit for bit"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
