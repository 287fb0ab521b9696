#!/usr/bin/env python3
"""One line from an `augur bench --json` file: per decode entry the forward
time a step (and the step's with sampling), tokens/s and the fraction of copy bandwidth, and prefill.
Usage: bench_summary.py FILE NAME"""
import json
import sys

d = json.load(open(sys.argv[1]))
entries = ' '.join('b%d/ctx%d %.3f ms (step %.3f) %.1f tok/s %.1f%%' %
                   (e['batch'], e['context'], e['forward_ms_per_step'], e['ms_per_step'], e['tokens_per_s'],
                    100 * e.get('fraction_of_copy_bandwidth', 0)) for e in d.get('decode', []))
prefill = 'prefill %.0f tok/s' % d['prefill_tokens_per_s'] if d.get('prefill_tokens_per_s') else ''
print('%-16s' % sys.argv[2], 'copy %.0f' % (d['copy_bandwidth_bytes_per_s'] / 1e9), entries, prefill)
