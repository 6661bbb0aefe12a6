#!/usr/bin/env python3
"""Compares the tensors of two GGUF files: the same names, types, shapes and data bytes.

usage: gguf-compare.py A.gguf B.gguf [--keys general.file_type,...] [--quiet]

Prints one line per tensor (name, type in A, type in B, "same" or "DIFFERENT") and a summary
counting tensors per type; exits 1 on any difference (also for a listed metadata key whose value
differs). Pure Python (no numpy), for checking `ember quantize` against llama-quantize.
"""
import struct
import sys
from collections import Counter

TYPE_NAMES = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 6: "Q5_0", 7: "Q5_1", 8: "Q8_0",
              10: "Q2_K", 11: "Q3_K", 12: "Q4_K", 13: "Q5_K", 14: "Q6_K", 30: "BF16"}
# (elements per block, bytes per block)
BLOCKS = {0: (1, 4), 1: (1, 2), 30: (1, 2), 2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24),
          8: (32, 34), 10: (256, 84), 11: (256, 110), 12: (256, 144), 13: (256, 176),
          14: (256, 210)}
SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q",
           12: "d"}


class Reader:
    def __init__(self, path):
        with open(path, "rb") as f:
            self.b = f.read()
        self.o = 0

    def take(self, fmt):
        v = struct.unpack_from("<" + fmt, self.b, self.o)
        self.o += struct.calcsize("<" + fmt)
        return v[0]

    def string(self):
        n = self.take("Q")
        s = self.b[self.o:self.o + n].decode("utf-8", "replace")
        self.o += n
        return s

    def value(self, t):
        if t == 8:
            return self.string()
        if t == 9:
            et, n = self.take("I"), self.take("Q")
            return [self.value(et) for _ in range(n)]
        return self.take(SCALARS[t])


def read_gguf(path):
    r = Reader(path)
    if r.b[:4] != b"GGUF":
        sys.exit(f"{path}: not a GGUF file")
    r.o = 4
    r.take("I")  # version
    n_tensors, n_kv = r.take("Q"), r.take("Q")
    kv = {}
    for _ in range(n_kv):
        key = r.string()
        kv[key] = r.value(r.take("I"))
    tensors = []
    for _ in range(n_tensors):
        name = r.string()
        dims = [r.take("Q") for _ in range(r.take("I"))]
        ttype, offset = r.take("I"), r.take("Q")
        tensors.append((name, dims, ttype, offset))
    align = kv.get("general.alignment", 32)
    data = (r.o + align - 1) // align * align
    out = {}
    for name, dims, ttype, offset in tensors:
        n = 1
        for d in dims:
            n *= d
        per, size = BLOCKS[ttype]
        out[name] = (dims, ttype, r.b[data + offset:data + offset + n // per * size])
    return kv, out


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    keys = []
    for a in sys.argv[1:]:
        if a.startswith("--keys="):
            keys = a[len("--keys="):].split(",")
    quiet = "--quiet" in sys.argv
    if len(args) != 2:
        sys.exit(__doc__)
    (kv_a, a), (kv_b, b) = read_gguf(args[0]), read_gguf(args[1])
    bad = 0
    for key in keys:
        if kv_a.get(key) != kv_b.get(key):
            print(f"metadata {key}: {kv_a.get(key)} vs {kv_b.get(key)}")
            bad += 1
    if set(a) != set(b):
        print("tensor names differ:", sorted(set(a) ^ set(b)))
        bad += 1
    types = Counter()
    for name in sorted(set(a) & set(b)):
        (da, ta, ba), (db, tb, bb) = a[name], b[name]
        same = da == db and ta == tb and ba == bb
        types[TYPE_NAMES.get(ta, str(ta))] += 1
        bad += not same
        if not quiet or not same:
            print(f"{name:32} {TYPE_NAMES.get(ta, ta):5} {TYPE_NAMES.get(tb, tb):5} "
                  f"{'same' if same else 'DIFFERENT'}")
    summary = ", ".join(f"{n} {t}" for t, n in sorted(types.items()))
    print(f"{len(a)} tensors ({summary}): {'all byte-identical' if not bad else f'{bad} differences'}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
