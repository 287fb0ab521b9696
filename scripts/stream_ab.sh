#!/usr/bin/env bash
# The stream kernel (gemv.cu, AUGUR_CUDA_STREAM) in one device call: tests,
# sanitizers, the per-matrix sweep and engine A/B runs of its variants, each
# measured twice, against rows_kernel.
#   here: bash scripts/build_cuda_bundle.sh
#   device: bash scripts/stream_ab.sh        carry: [".dev"]   (NCU=1 adds an ncu profile)
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/cuda_env.sh
timeout 120 "$BIN/test_cuda" --gtest_brief=1 2>&1 | grep -v '^\[cuda\|bit-equal' | tail -3
SAN=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer)
for tool in memcheck racecheck; do
  timeout 90 "$SAN" --tool $tool "$BIN/test_cuda" --gtest_brief=1 \
    --gtest_filter='CudaMatmul.StreamKernelShapes:CudaMatmul.Deterministic' > "$LOG/san_$tool.txt" 2>&1
  echo "$tool: $(tail -1 "$LOG/san_$tool.txt")"
done
timeout 150 "$BIN/cuda_bench" --skinny-sweep > "$LOG/sweep.txt" 2>&1
grep -E "x[0-9]|variant [034]|ceiling" "$LOG/sweep.txt" | sed 's/ S[2-8] [0-9.]* ([0-9]*)//g'
summ() { python3 -c "
import json,sys
d=json.load(open(sys.argv[1]))
print('%-16s'%sys.argv[2], 'copy %.0f'%(d['copy_bandwidth_bytes_per_s']/1e9),
      ' '.join('b%d/ctx%d %.3f ms %.1f%%'%(e['batch'],e['context'],e['forward_ms_per_step'],
               100*e.get('fraction_of_copy_bandwidth',0)) for e in d.get('decode',[])))
" "$1" "$2"; }
B="$BIN/augur bench --device cuda --synthetic qwen3-8b --prompt 2048 --gen 32 --batch 1 --context 128 --json"
run() {
  name=$1; shift
  env "$@" timeout 90 $B > "$LOG/$name.json" 2> "$LOG/$name.err" && summ "$LOG/$name.json" "$name" ||
    { echo "$name failed"; tail -3 "$LOG/$name.err"; }
}
for rep in 1 2; do
  run rows$rep AUGUR_CUDA_STREAM=0
  run interleave$rep AUGUR_CUDA_STREAM=1
  run slab$rep AUGUR_CUDA_STREAM=1 AUGUR_CUDA_STREAM_INTERLEAVE=0
done
run slab_warp AUGUR_CUDA_STREAM=1 AUGUR_CUDA_STREAM_INTERLEAVE=0 AUGUR_CUDA_STREAM_ARRIVE=0
run il_warp AUGUR_CUDA_STREAM=1 AUGUR_CUDA_STREAM_ARRIVE=0
run il_ring96 AUGUR_CUDA_STREAM=1 AUGUR_CUDA_STREAM_RING=96
run il_ring192 AUGUR_CUDA_STREAM=1 AUGUR_CUDA_STREAM_RING=192
# NCU=1: one stream launch of each 8B matrix under Nsight Compute (alone, so
# without its PDL overlap): DRAM throughput and the consumers' stall reasons.
if [[ "${NCU:-0}" != 0 ]]; then
  NCU_BIN=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -n 1)
  AUGUR_CUDA_STREAM=1 timeout 200 "$NCU_BIN" --kernel-name regex:stream_kernel --launch-skip 200 --launch-count 5 \
    --section SpeedOfLight --section WarpStateStats --section MemoryWorkloadAnalysis \
    "$BIN/augur" bench --device cuda --synthetic qwen3-8b --prompt 256 --gen 2 --batch 1 > "$LOG/ncu_stream.txt" 2>&1
  grep -E "stream_kernel|DRAM Throughput|Duration|Stall|Warp Cycles Per Issued" "$LOG/ncu_stream.txt" | head -60
fi
