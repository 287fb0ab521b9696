#!/usr/bin/env bash
# The one command for the GPU machine: CUDA op tests (test_cuda, and
# test_backend's cross-backend op tests, which run their CUDA cases when a
# GPU is present), compute-sanitizer on a reduced subset (where it works: not
# under gVisor), then the kernel and engine benchmarks.
# Binaries come from scripts/build_cuda_bundle.sh, carried in .dev/ (bundle.tar.xz):
#   run: bash scripts/cuda_device_test.sh        carry: [".dev"]
# Env: BENCH_ARGS (e.g. --quick), SANITIZE=0 to skip the sanitizer (SAN_TOOLS picks its tools), GTEST_FILTER,
# KERNEL_BENCH=0 / ENGINE_BENCH=0 / HYBRID_BENCH=0 to skip a benchmark; PROMPT GEN BATCHES CONTEXTS for augur bench.
# Logs go to $OUT (the device tool's return folder) when set.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/cuda_env.sh
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv,noheader
ldd "$BIN/test_cuda" | grep 'not found'
echo "libcublasLt (opened at the first CUDA use): LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"

status=0
echo "== test_cuda =="
timeout 150 "$BIN/test_cuda" --gtest_brief=1 ${GTEST_FILTER:+--gtest_filter="$GTEST_FILTER"} 2>&1 | tee "$LOG/test_cuda.log"
[[ ${PIPESTATUS[0]} -eq 0 ]] || status=1
if [[ -x "$BIN/test_backend" ]]; then
  echo "== test_backend =="
  timeout 300 "$BIN/test_backend" --gtest_brief=1 ${GTEST_FILTER:+--gtest_filter="$GTEST_FILTER"} 2>&1 |
    tee "$LOG/test_backend.log"
  [[ ${PIPESTATUS[0]} -eq 0 ]] || status=1
else
  echo "== test_backend: not in the bundle =="; status=1
fi

SMALL='CudaF16.BlockTailEqualsUnfusedOps:CudaMatmul.SkinnySmall:CudaMatmul.SkinnySplitK:CudaMatmul.PreconvertedInput:CudaOps.*:CudaAttention.DecodeSmall:CudaAttention.PrefillSmall:CudaFused.*:CudaF16.ConvertMaxAbsEmbeddingStore:CudaF16.QkvRopeStoreWritesF16:CudaSampling.GreedyIsArgmax:CudaSampling.TopKTiesGoToLowerIds:CudaSampling.PenaltiesMatchCpu:CudaHybridOps.*:Shapes/CudaDeltaRule.*/0'
SAN=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null || true)
if [[ "${SANITIZE:-1}" != 0 && -n "$SAN" ]]; then
  for tool in ${SAN_TOOLS:-memcheck racecheck synccheck}; do
    echo "== compute-sanitizer --tool $tool =="
    filter=$SMALL
    [[ $tool == memcheck ]] || filter='CudaAttention.DecodeSmall:CudaAttention.PrefillSmall:CudaOps.Argmax:CudaOps.RmsNorm:CudaFused.QkvRopeStore:CudaSampling.TopKTiesGoToLowerIds:CudaSampling.DrawsFollowSoftmax:CudaHybridOps.MoeRouteMatchesCpu:CudaHybridOps.MoeExpertsMatchCpu:Shapes/CudaDeltaRule.*/0'
    timeout 90 "$SAN" --tool "$tool" --error-exitcode 3 "$BIN/test_cuda" --gtest_brief=1 --gtest_filter="$filter" \
      >"$LOG/sanitizer_$tool.log" 2>&1
    rc=$?
    tail -n 4 "$LOG/sanitizer_$tool.log"
    if [[ $rc -eq 3 ]]; then status=1; echo "$tool: errors found"; elif [[ $rc -ne 0 ]]; then echo "$tool: exit $rc (tool unusable here?)"; fi
  done
else
  echo "== compute-sanitizer: skipped (${SAN:-not found}) =="
fi

if [[ "${KERNEL_BENCH:-1}" != 0 ]]; then
  echo "== cuda_bench =="
  timeout 180 "$BIN/cuda_bench" ${BENCH_ARGS:-} 2>&1 | tee "$LOG/cuda_bench.log"
  [[ ${PIPESTATUS[0]} -eq 0 ]] || status=1
fi

# The engine end to end: augur bench on the Qwen3-8B shape (issue 4's figures).
if [[ "${ENGINE_BENCH:-1}" != 0 && -x "$BIN/augur" ]]; then
  echo "== augur bench --device cuda --synthetic qwen3-8b =="
  timeout 300 "$BIN/augur" bench --device cuda --synthetic qwen3-8b --prompt "${PROMPT:-2048}" --gen "${GEN:-64}" \
    --batch "${BATCHES:-1,8,32,128}" --context "${CONTEXTS:-128,8192}" --json 2>"$LOG/augur_bench.err" | tee "$LOG/augur_bench.json"
  [[ ${PIPESTATUS[0]} -eq 0 ]] || { status=1; tail -n 5 "$LOG/augur_bench.err"; }
fi
# The hybrid family (issue 5): the Qwen3.5-27B shape, prefill 2048 and 16384.
if [[ "${HYBRID_BENCH:-1}" != 0 && -x "$BIN/augur" ]]; then
  echo "== augur bench --device cuda --synthetic qwen3.5-27b =="
  timeout 300 "$BIN/augur" bench --device cuda --synthetic qwen3.5-27b --prompt "${HYBRID_PROMPTS:-2048,16384}" \
    --gen "${GEN:-32}" --batch "${HYBRID_BATCHES:-1}" --json 2>"$LOG/hybrid_bench.err" | tee "$LOG/hybrid_bench.json"
  [[ ${PIPESTATUS[0]} -eq 0 ]] || { status=1; tail -n 5 "$LOG/hybrid_bench.err"; }
fi
exit $status
