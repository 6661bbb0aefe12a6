#!/usr/bin/env python3
"""Summarises a step timeline (a build with -DEMBER_CUDA_TRACE=ON, EMBER_CUDA_TRACE_OUT=FILE).

Each line of FILE is "t_ns grid block smem": one kernel's PdlWait return (pdl.cuh, TraceStamp).
A kernel's share of the critical path is the gap to the next stamp. Steps begin at a kernel with
the signature --start (default: the embedding of a one-row step, grid 1 x 256 threads). Prints,
for the last --steps steps of the most common length, each position's signature and mean gap in
microseconds.
Usage: trace-summary.py FILE [--steps N] [--start GRID,BLOCK]
"""
import argparse
import collections

ap = argparse.ArgumentParser()
ap.add_argument("file")
ap.add_argument("--steps", type=int, default=32)
ap.add_argument("--start", default="1,256")
args = ap.parse_args()
start_grid, start_block = (int(v) for v in args.start.split(","))

recs = []
with open(args.file) as f:
    for line in f:
        t, g, b, s = (int(v) for v in line.split())
        recs.append((t, g, b, s))
steps, cur = [], []
for i, r in enumerate(recs):
    if r[1] == start_grid and r[2] == start_block and cur:
        steps.append(cur)
        cur = []
    cur.append(i)
lengths = collections.Counter(len(s) for s in steps[1:])
if not lengths:
    raise SystemExit("no complete step in the trace")
n = lengths.most_common(1)[0][0]
chosen = [s for s in steps[1:] if len(s) == n][-args.steps:]
print(f"{len(steps)} steps, {len(chosen)} of {n} kernels summarised (lengths {dict(lengths)})")
gaps = [[0.0] * n for _ in chosen]
for k, s in enumerate(chosen):
    for j, i in enumerate(s):
        if i + 1 < len(recs):
            gaps[k][j] = (recs[i + 1][0] - recs[i][0]) / 1000.0
mean = [sum(g[j] for g in gaps) / len(gaps) for j in range(n)]
by_sig = collections.defaultdict(lambda: [0, 0.0])
for j, i in enumerate(chosen[-1]):
    sig = recs[i][1:]
    print(f"{j:4d} grid {sig[0]:6d} block {sig[1]:4d} smem {sig[2]:7d}  {mean[j]:8.2f} us")
    by_sig[sig][0] += 1
    by_sig[sig][1] += mean[j]
print(f"step: {sum(mean):.1f} us")
for sig, (count, total) in sorted(by_sig.items(), key=lambda kv: -kv[1][1]):
    print(f"grid {sig[0]:6d} block {sig[1]:4d} smem {sig[2]:7d}: {count:3d} x, {total:8.1f} us")
