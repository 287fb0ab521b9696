#!/usr/bin/env python3
"""Sums one decode step's kernels from an ncu --csv log (scripts/cuda_profile.sh).

The last decode step is the run of kernels from the last occurrence of the
marker kernel (a step's first kernel, the embedding) to the end of the log
(the bench's final decode steps; a truncated log gives a partial step).
Prints per kernel name: count, total µs, DRAM GB read+written, GB/s.
  python3 tools/profile/kernel_profile.py ncu_qwen3-8b.log [--marker embedding]
"""
import argparse, csv, collections, re, sys


def short(name):
    name = re.sub(r"\(.*", "", name)          # drop the parameter list
    name = re.sub(r"^void ", "", name)
    name = name.replace("augur::<unnamed>::", "").replace("augur::cuda::<unnamed>::", "")
    return name


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("log")
    ap.add_argument("--marker", default="embedding")
    ap.add_argument("--steps", type=int, default=1, help="how many steps from the end to average")
    a = ap.parse_args()
    rows = collections.OrderedDict()
    with open(a.log) as f:
        lines = [l for l in f if l.startswith('"')]
    for r in csv.DictReader(lines):
        k = int(r["ID"])
        e = rows.setdefault(k, {"name": r["Kernel Name"], "grid": r["Grid Size"], "block": r["Block Size"]})
        e[r["Metric Name"]] = float(r["Metric Value"].replace(",", ""))
    ids = list(rows)
    starts = [i for i in ids if a.marker in rows[i]["name"]]
    if a.steps < 1 or len(starts) < a.steps:
        sys.exit(f"fewer than {a.steps} marker kernels '{a.marker}'")
    # The last `steps` steps: from the steps-th last marker to the end of the log.
    step_ids = [i for i in ids if i >= starts[-a.steps]]
    agg = collections.OrderedDict()
    tot_t = tot_b = 0.0
    for i in step_ids:
        e = rows[i]
        key = (short(e["name"]), e["grid"])
        g = agg.setdefault(key, [0, 0.0, 0.0])
        t = e.get("gpu__time_duration.sum", 0.0) / 1e3
        b = e.get("dram__bytes_read.sum", 0.0) + e.get("dram__bytes_write.sum", 0.0)
        g[0] += 1; g[1] += t; g[2] += b
        tot_t += t; tot_b += b
    n = a.steps
    print(f"{len(step_ids) // n} kernels per step, {tot_t / n:.1f} µs, {tot_b / n / 1e9:.3f} GB, {tot_b / tot_t / 1e3:.0f} GB/s")
    for (name, grid), (c, t, b) in sorted(agg.items(), key=lambda kv: -kv[1][1]):
        print(f"{c // n:5d} x {name[:60]:60s} grid {grid:14s} {t / n:9.1f} µs  {t / c:7.2f} µs each  "
              f"{b / n / 1e9:7.3f} GB  {b / t / 1e3 if t else 0:6.0f} GB/s")


if __name__ == "__main__":
    main()
