#!/usr/bin/env python3
"""What a decode step does outside its graph, from an AUGUR_CUDA_TIMELINE file
(kernels and copies): steps start at each embedding_kernel; for the last N
steps of each kind (with or without a sampling kernel after them), the
period from one step's start to the next, the graph's span, and each
operation outside the graph with its start and length relative to the
graph's end.

  step_gaps.py FILE [--steps N]
"""
import argparse
import collections
import csv
import re


def short(name):
    name = re.sub(r"augur::cuda::(\(anonymous namespace\)::)?", "", name)
    return (name[5:] if name.startswith("void ") else name).split("(")[0].split("<")[0]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("file")
    ap.add_argument("--steps", type=int, default=8)
    a = ap.parse_args()
    ops = sorted(((int(r["start_ns"]), int(r["end_ns"]), int(r["graph"]), short(r["name"]))
                  for r in csv.DictReader(open(a.file))), key=lambda o: o[0])
    starts = [i for i, o in enumerate(ops) if o[3] == "embedding_kernel"]
    steps = collections.defaultdict(list)
    for s, e in zip(starts, starts[1:]):
        # the operations before this step's embedding that follow the last step's graph
        body = ops[s:e]
        graph = [o for o in body if o[2] != 0]
        if not graph:
            continue
        g_end = max(o[1] for o in graph)
        # ops of the step that are not graph nodes: after its graph (logits
        # copy, sampling) and the next step's uploads before its embedding
        outside = [o for o in body if o[2] == 0]
        kind = "sampled" if any("argmax" in o[3] or "sample" in o[3] for o in outside) else "forward"
        steps[kind].append((ops[e][0] - ops[s][0], g_end - ops[s][0], g_end, outside, ops[e][0]))
    for kind, rows in steps.items():
        rows = rows[-a.steps - 1:-1]  # the last step of a kind is followed by something else
        print("%s: %d steps; period %.1f us, graph span %.1f us (mean of the last %d)" %
              (kind, len(steps[kind]), sum(r[0] for r in rows) / len(rows) / 1e3,
               sum(r[1] for r in rows) / len(rows) / 1e3, len(rows)))
        period, span, g_end, outside, nxt = rows[-1]
        for o in outside:
            print("   %-28s start %+8.1f us  len %6.1f us" % (o[3], (o[0] - g_end) / 1e3, (o[1] - o[0]) / 1e3))
        print("   %-28s start %+8.1f us" % ("next embedding", (nxt - g_end) / 1e3))


if __name__ == "__main__":
    main()
