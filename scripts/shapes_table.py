#!/usr/bin/env python3
"""The table of scripts/shapes_bench.sh: per checkpoint, prefill (tok/s and
the fraction of the matrix-product peak `augur bench` measured in the same
process), batch-1 decode at each context (fraction of copy), batched decode
(tok/s) and `augur run`'s cold prefill as a fraction of bench's warmed one.

  shapes_table.py NAME=PREFIX ...   (reads PREFIX.bench.json, .batch.json, .run.json)
"""
import json
import sys


def load(path):
    with open(path) as f:
        return json.load(f)


def main(entries):
    rows = []
    for entry in entries:
        name, prefix = entry.split("=", 1)
        bench, batch, run = (load(f"{prefix}.{kind}.json") for kind in ("bench", "batch", "run"))
        run = run["timings"]
        prefill = ", ".join(
            f"{p['tokens']}: {p['tokens_per_s']:,.0f} tok/s ({100 * p['fraction_of_gemm_peak']:.1f}%)"
            for p in bench["prefill"])
        decode = ", ".join(f"ctx {d['context']}: {d['tokens_per_s']:.1f} tok/s ({100 * d['fraction_of_copy_bandwidth']:.1f}%)"
                           for d in sorted(bench["decode"], key=lambda d: d["context"]))
        b = batch["decode"][0]
        batched = f"{b['batch']} rows: {b['tokens_per_s']:,.0f} tok/s ({100 * b['fraction_of_copy_bandwidth']:.1f}%)"
        warm = next(p for p in bench["prefill"] if p["tokens"] == run["prefill_tokens"])
        cold = (f"{run['prefill_tokens_per_s']:,.0f} tok/s = "
                f"{100 * run['prefill_tokens_per_s'] / warm['tokens_per_s']:.1f}% of bench's")
        rows.append((name, bench["n_params"] / 1e9, prefill, decode, batched, cold))
    print("| checkpoint | params | prefill (% of GEMM peak) | batch-1 decode (% of copy) | batched decode after 512 "
          "| `augur run` prefill, fresh process |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name, params, prefill, decode, batched, cold in rows:
        print(f"| {name} | {params:.2f} B | {prefill} | {decode} | {batched} | {cold} |")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1:])
