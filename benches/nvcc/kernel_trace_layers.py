#!/usr/bin/env python3
"""Per-layer critical path of a decode step from a kernel_trace.c CSV.

    python3 kernel_trace_layers.py TRACE.csv [--anchor attn_prep] [--before 3] [--period 8]

The trace holds one line per kernel (start and end in ns, graph id, graph node, grid, block,
registers, name). Decode steps are the runs of graph kernels between two kernels launched
outside a graph (the draw). Under programmatic dependent launch a kernel's start is when it
became resident, not when its inputs were ready, so its own duration says little; what the
step waits for is the chain of ends. For each kernel this prints dEnd, the time from the end of
the kernel before it to its own end, averaged over every layer of every full step (layers are
found by the anchor kernel's name; `--before` kernels before it and `--period` kernels in
all; a position whose kernel differs between layers lists each with its count), and the
layer's sum: the per-layer step time.
"""
import argparse
import collections


def load_steps(path):
    rows = []
    with open(path) as f:
        for line in f:
            p = line.rstrip("\n").split(",", 9)
            if len(p) < 10:
                continue
            start, end, graph = int(p[0]), int(p[1]), int(p[2])
            rows.append((start, end, graph, int(p[4]), p[9]))
    rows.sort()
    steps, cur = [], []
    for r in rows:
        cur.append(r)
        if r[2] == 0:  # launched outside a graph: the draw closes a step
            steps.append(cur)
            cur = []
    return [s for s in steps if len(s) > 100]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("--anchor", default="attn_prep")
    ap.add_argument("--before", type=int, default=3)
    ap.add_argument("--period", type=int, default=8)
    a = ap.parse_args()
    steps = load_steps(a.trace)
    if len(steps) < 3:
        raise SystemExit(f"{a.trace}: fewer than 3 full decode steps")
    dend = collections.defaultdict(list)
    names = collections.defaultdict(collections.Counter)
    totals = []
    for s in steps[1:-1]:  # the first and last may be cut by the trace's window
        totals.append((s[-1][1] - s[0][1]) / 1000)
        at = [i for i, r in enumerate(s) if a.anchor in r[4]]
        for li in at[1:-1]:
            for j in range(-a.before, a.period - a.before):
                r, prev = s[li + j], s[li + j - 1]
                names[j][f"{r[4].replace('_sm_90a', '')} (grid {r[3]})"] += 1
                dend[j].append((r[1] - prev[1]) / 1000)
    print(f"{a.trace}: {len(totals)} steps, {sum(totals) / len(totals):.1f} us a step")
    total = 0.0
    for j in sorted(dend):
        v = dend[j]
        m = sum(v) / len(v)
        total += m
        seen = " / ".join(f"{n} x{c}" if len(names[j]) > 1 else n for n, c in names[j].most_common())
        print(f"  {j:3d}  dEnd {m:6.2f} us  {seen}")
    print(f"  layer: {total:.2f} us")


if __name__ == "__main__":
    main()
