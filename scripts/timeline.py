#!/usr/bin/env python3
"""Reads an AUGUR_CUDA_TIMELINE file (every kernel's GPU start and end, written
by a profile build: -DAUGUR_CUDA_PROFILE=ON, `PROFILE=1
scripts/build_cuda_bundle.sh`) and prints where a decode step spends its time.

  timeline.py FILE [--steps N] [--with NAME] [--longest]

Steps start at each embedding_kernel; the last N steps with the most common
kernel count (the decode steps) are averaged position by position. --with
keeps only steps with a kernel whose name contains NAME (a speculative run's
verify steps: --with 'stream_kernel<5' for 1 + 4 tokens; its first, plain
run has more steps). The step's period (start to the next step's start)
is printed beside its span: the difference is host time between steps. For each
kernel: "adds", its end minus the previous kernel's end (the time the step's
critical path spends on it, as kernels finish in order), "gap", its start
minus the previous end (negative: it was resident early, through PDL), and
its duration. Then the totals of "adds" by kernel name and one middle layer
in full. --longest takes the single longest step instead (a prefill forward,
e.g. of `augur bench DIR --prompt 16384 --gen 1`).
"""
import argparse
import collections
import csv
import re


def short(name):
    name = re.sub(r"augur::cuda::(\(anonymous namespace\)::)?", "", name)
    name = name.replace("(detail::StreamEpi)", "epi").replace("detail::StreamEpi::", "")
    base = name.split("(")[0] if not name.startswith("void ") else name[5:].split("(")[0]
    return base.replace(" ", "")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("file")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--with", dest="with_name", default="")
    ap.add_argument("--longest", action="store_true", help="the longest step alone (a prefill)")
    args = ap.parse_args()
    with open(args.file) as f:
        ks = [(int(r["start_ns"]), int(r["end_ns"]), short(r["name"]), int(r["grid"])) for r in csv.DictReader(f)]
    ks.sort()
    steps, cur = [], None
    for k in ks:
        if k[2].startswith("embedding_kernel"):
            cur = []
            steps.append(cur)
        if cur is not None:
            cur.append(k)
    if not steps:
        print("no steps (no embedding_kernel in the timeline)")
        return
    starts = {id(s): i for i, s in enumerate(steps)}
    pool = [s for s in steps if not args.with_name or any(args.with_name in k[2] for k in s)]
    if not pool:
        print(f"no steps with a kernel named like {args.with_name!r}")
        return
    if args.longest:
        chosen = [max(pool, key=lambda s: s[-1][1] - s[0][0])]
        mode = len(chosen[0])
    else:
        mode = collections.Counter(len(s) for s in pool).most_common(1)[0][0]
        chosen = [s for s in pool if len(s) == mode][-args.steps:]
    n = len(chosen)
    names = [k[2] for k in chosen[0]]
    adds, gaps, durs = [0.0] * mode, [0.0] * mode, [0.0] * mode
    total = 0.0
    for s in chosen:
        total += (s[-1][1] - s[0][0]) / 1e3 / n
        for i, k in enumerate(s):
            prev_end = s[i - 1][1] if i > 0 else k[0]
            adds[i] += (k[1] - prev_end) / 1e3 / n
            gaps[i] += (k[0] - prev_end) / 1e3 / n
            durs[i] += (k[1] - k[0]) / 1e3 / n
    nexts = [steps[starts[id(s)] + 1][0][0] - s[0][0] for s in chosen if starts[id(s)] + 1 < len(steps)]
    period = f", {sum(nexts) / len(nexts) / 1e3:.1f} us start to start" if nexts else ""
    print(f"{n} steps of {mode} kernels, {total:.1f} us a step (first start to last end){period}")
    by = collections.defaultdict(lambda: [0.0, 0])
    for i, nm in enumerate(names):
        by[nm][0] += adds[i]
        by[nm][1] += 1
    print("adds by kernel (us a step, count, mean):")
    for nm, (t, c) in sorted(by.items(), key=lambda e: -e[1][0]):
        print(f"  {t:8.1f} {c:4d} {t / c:7.2f}  {nm}")
    # The layer period: the smallest p that repeats the middle of the step.
    mid = mode // 2
    period = next((p for p in range(2, mode // 4) if names[mid:mid + 3 * p] == names[mid + p:mid + 4 * p]), 0)
    if period:
        print(f"one layer (positions {mid}-{mid + period - 1}): adds, gap, duration (us), grid, name")
        for i in range(mid, mid + period):
            print(f"  {adds[i]:7.2f} {gaps[i]:7.2f} {durs[i]:7.2f} {chosen[-1][i][3]:5d}  {names[i]}")
    print("first and last kernels:")
    for i in list(range(0, 4)) + list(range(mode - 4, mode)):
        print(f"  {adds[i]:7.2f} {gaps[i]:7.2f} {durs[i]:7.2f} {chosen[-1][i][3]:5d}  {names[i]}")


if __name__ == "__main__":
    main()
