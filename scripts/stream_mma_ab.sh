#!/usr/bin/env bash
# The batched-decode tensor-core GEMM (stream_mma.cu) in one device call:
# whatever of test_cuda, cuda_bench and augur the bundle holds (all three
# outgrow the carried tree's limit, so two calls):
#   here:   TARGETS="test_cuda cuda_bench" scripts/build_cuda_bundle.sh
#   device: bash scripts/stream_mma_ab.sh        carry: [".dev"]
#   here:   TARGETS=augur scripts/build_cuda_bundle.sh
#   device: bash scripts/stream_mma_ab.sh "AUGUR_CUDA_MMA_LANES=16" ...
# test_cuda: the stream_mma test, then memcheck and racecheck on it;
# cuda_bench: the per-matrix sweep against cuBLASLt; augur: Qwen3-8B at batch
# 8 and 32 (context 2048) with cuBLASLt and with AUGUR_CUDA_STREAM_MMA=1 (plus
# each argument's settings), twice, alternating.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/cuda_env.sh
if [[ -x "$BIN/test_cuda" ]]; then
  timeout 120 "$BIN/test_cuda" --gtest_brief=1 --gtest_filter='CudaMatmul.*' > "$LOG/test_mma.txt" 2>&1
  grep -E '^\[  FAILED|^\[  PASSED|Failure|rel_l2|split [0-9]' "$LOG/test_mma.txt" | head -20
  SAN=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer)
  for tool in memcheck racecheck; do
    timeout 150 "$SAN" --tool $tool "$BIN/test_cuda" --gtest_brief=1 --gtest_filter=CudaMatmul.StreamMmaShapes \
      > "$LOG/san_mma_$tool.txt" 2>&1
    echo "$tool: $(tail -1 "$LOG/san_mma_$tool.txt")"
  done
fi
if [[ -x "$BIN/cuda_bench" ]]; then
  timeout 200 "$BIN/cuda_bench" --stream-mma 2>&1 | grep -A40 '== stream_mma'
fi
if [[ -x "$BIN/augur" ]]; then
  settings=("AUGUR_CUDA_STREAM_MMA=0" "AUGUR_CUDA_STREAM_MMA=1")
  for a in "$@"; do settings+=("AUGUR_CUDA_STREAM_MMA=1 $a"); done
  for rep in 1 2; do
    for setting in "${settings[@]}"; do
      tag=$(echo "mma_${setting}_$rep" | tr -c 'A-Za-z0-9=\n' '_')
      env $setting timeout 150 "$BIN/augur" bench --device cuda --synthetic "${MODEL:-qwen3-8b}" --prompt 2048 \
        --gen 32 --batch 8,32 --json > "$LOG/$tag.json" 2> "$LOG/$tag.err" &&
        python3 scripts/bench_summary.py "$LOG/$tag.json" "$setting" || { echo "$setting failed"; tail -3 "$LOG/$tag.err"; }
    done
  done
fi
