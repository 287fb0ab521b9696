#!/usr/bin/env python3
"""Speculative decoding on held-out text: acceptance and speed by draft source
and k, against plain greedy decoding, through `augur run` (a fresh process a
run, as a user runs it).

  python3 scripts/speculative_table.py [--augur build/release/bin/augur]
      [--model models/augur-tiny] [--device cpu|cuda] [--prompts 8] [-n 128]
      [--sources ngram,mtp] [--k 1,2,3,4] [--draft-vocab FILE]

Prompts are consecutive 64-token slices of augur-tiny's held-out window
(tests/data/augur_tiny/reference.safetensors, window_ids); each run generates
-n tokens greedily (EOS ignored). Every speculative run's ids must equal the
plain run's (the script stops otherwise). Printed: a Markdown table with the
drafts' acceptance rate, tokens a verify round (accepted + 1), decode tok/s
over the prompts, that of plain runs made beside them (one before each), and
the speedup over those.
"""
import argparse
import json
import struct
import subprocess
import sys


def window_ids(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        info = header["window_ids"]
        begin, end = info["data_offsets"]
        f.seek(8 + n + begin)
        raw = f.read(end - begin)
    return list(struct.unpack("<%di" % (len(raw) // 4), raw))


def run(augur, model, device, prompt, n, draft=None, k=None, vocab=None):
    cmd = [augur, "run", model, "--device", device, "--prompt-ids", ",".join(map(str, prompt)), "-n", str(n),
           "--temperature", "0", "--ignore-eos", "--json"]
    if draft:
        cmd += ["--draft", draft, "--draft-tokens", str(k)]
        if vocab:
            cmd += ["--draft-vocab", vocab]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--augur", default="build/release/bin/augur")
    ap.add_argument("--model", default="models/augur-tiny")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--window", default="tests/data/augur_tiny/reference.safetensors")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("--sources", default="ngram,mtp")
    ap.add_argument("--k", default="1,2,3,4")
    ap.add_argument("--draft-vocab")
    a = ap.parse_args()

    ids = window_ids(a.window)
    prompts = [ids[i * 64:(i + 1) * 64] for i in range(a.prompts)]
    plain, plain_s = [], 0.0
    for p in prompts:
        r = run(a.augur, a.model, a.device, p, a.n)
        plain.append(r["ids"])
        plain_s += r["timings"]["decode_s"]
    tokens = sum(len(x) - 1 for x in plain)
    print(f"plain greedy: {tokens / plain_s:.1f} tok/s decode ({len(prompts)} prompts x {a.n} tokens, {a.device})")
    print()
    print("| draft | k | acceptance | tokens a round | decode tok/s | plain tok/s beside it | speedup |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for source in a.sources.split(","):
        for k in map(int, a.k.split(",")):
            drafted = accepted = rounds = 0
            seconds = base = 0.0
            for p, want in zip(prompts, plain):
                # A plain run beside each speculative one: the speedup compares
                # runs made at the same moment (a shared machine drifts).
                base += run(a.augur, a.model, a.device, p, a.n)["timings"]["decode_s"]
                r = run(a.augur, a.model, a.device, p, a.n, source, k, a.draft_vocab)
                if r["ids"] != want:
                    sys.exit(f"{source} k={k}: output differs from plain greedy")
                s = r["speculation"]
                drafted += s["drafted"]
                accepted += s["accepted"]
                rounds += s["rounds"]
                seconds += r["timings"]["decode_s"]
            rate = accepted / drafted if drafted else 0.0
            per_round = (accepted + rounds) / rounds if rounds else 1.0
            tps = tokens / seconds
            print(f"| {source} | {k} | {100 * rate:.1f}% | {per_round:.2f} | {tps:.1f} | {tokens / base:.1f} | "
                  f"{base / seconds:.2f}x |")
            sys.stdout.flush()


if __name__ == "__main__":
    main()
