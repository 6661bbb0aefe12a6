#!/usr/bin/env python3
"""Summarises the ring GEMV's own timeline (a trace build with -DEMBER_TRACE_GEMV writes
EMBER_CUDA_TRACE_OUT.gemv; gemv.cu, DumpGemvDetail).

Each line: k total grid block stages num_stages ready, then entry x drained end and the first
stages' landing times, in ns from the block's PdlWait; after "|", per stage (of the first 8) the
cycles from stage 0's landing to its own, then to its dot products and to its release. Prints, per GEMV shape (k, rows) and
recorded block (0, grid / 2, grid - 1), the mean over its last --last records in microseconds.
Usage: gemv-detail-summary.py FILE [--last N]
"""
import argparse
import collections

ap = argparse.ArgumentParser()
ap.add_argument("file")
ap.add_argument("--last", type=int, default=1000)
args = ap.parse_args()

groups = collections.defaultdict(list)
clocks = collections.defaultdict(list)
with open(args.file) as f:
    for line in f:
        head, _, tail = line.partition("|")
        v = [int(x) for x in head.split()]
        c = [int(x) for x in tail.split()]
        k, total, grid, block, stages, num_stages, ready = v[:7]
        role = "0" if block == 0 else ("last" if block == grid - 1 else "mid")
        groups[(k, total, role)].append(v)
        clocks[(k, total, role)].append(c)

print("shape (k x rows) block: n ring/stages ready@wait | entry x drained end (us from PdlWait)"
      " | first stages landed")
for (k, total, role), recs in sorted(groups.items()):
    recs = recs[-args.last:]
    n = len(recs)
    mean = lambda i: sum(r[i] for r in recs) / n / 1000.0
    ready = sum(r[6] for r in recs) / n
    width = min(len(r) for r in recs)
    landed = " ".join(f"{mean(i):6.2f}" for i in range(11, min(width, 11 + 8)))
    print(f"{k:6d} x {total:6d} {role:>4}: {n:5d} {recs[-1][4]:2d}/{recs[-1][5]:2d} {ready:4.1f} |"
          f" {mean(7):7.2f} {mean(8):5.2f} {mean(9):6.2f} {mean(10):6.2f} | {landed}")
    cl = clocks[(k, total, role)][-args.last:]
    cw = min(len(c) for c in cl)
    if cw >= 3:
        cm = [sum(c[i] for c in cl) / len(cl) for i in range(cw)]
        stages = " ".join(f"{cm[i]:6.0f}:{cm[i + 1]:4.0f}/{cm[i + 2]:4.0f}"
                          for i in range(0, cw - 2, 3))
        print(f"{'':21}cycles (landed: dots/released) {stages}")
