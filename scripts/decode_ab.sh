#!/usr/bin/env bash
# The batch-1 decode step in one device call: the CUDA tests, sanitizers on
# the stream kernel's tests, the per-matrix sweep, then engine runs of the
# step with kernels swapped or left out (AUGUR_CUDA_SKIP), each against the
# default measured in the same call, and the full benchmarks.
#   here: bash scripts/build_cuda_bundle.sh
#   device: bash scripts/decode_ab.sh        carry: [".dev"]
# QUICK=1 skips the tests, SWEEP=1 adds the per-matrix sweep, EPI=1 the fused
# ends' sweep, EXTRA=1 rows_kernel and 128 / 144 KB rings, SKIP_SMALL=1 a run
# without the small kernels; FULL=0 skips the full benchmarks.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/cuda_env.sh
if [[ "${QUICK:-0}" == 0 ]]; then
  timeout 120 "$BIN/test_cuda" --gtest_brief=1 > "$LOG/test_cuda.txt" 2>&1
  grep -E '^\[  FAILED|^\[  PASSED|^\[=' "$LOG/test_cuda.txt" | sort -u | head -20
  SAN=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer)
  # racecheck on the decode_tail test's large shapes runs past any limit, and
  # on the stream tests past 120 s: it takes the attention tests alone.
  for tool in memcheck racecheck; do
    filter='CudaFused.DecodeAttentionRopeEqualsUnfused:CudaFused.DecodeAttentionEarlyEqualsDefault'
    [[ $tool == memcheck ]] && filter+=':CudaMatmul.StreamKernelShapes:CudaMatmul.StreamFusedEnds:CudaMatmul.Deterministic:CudaF16.DecodeTailEqualsUnfusedOps'
    timeout 120 "$SAN" --tool $tool "$BIN/test_cuda" --gtest_brief=1 --gtest_filter="$filter" > "$LOG/san_$tool.txt" 2>&1
    echo "$tool: $(tail -1 "$LOG/san_$tool.txt")"
  done
fi
if [[ "${EPI:-0}" != 0 ]]; then
  timeout 150 "$BIN/cuda_bench" --stream-epi 2>&1 | grep -A20 '== stream'
fi
if [[ "${SWEEP:-0}" != 0 ]]; then
  timeout 150 "$BIN/cuda_bench" --skinny-sweep > "$LOG/sweep.txt" 2>&1
  grep -E "x[0-9]|variant [03]|ceiling" "$LOG/sweep.txt" | sed 's/ S[2-8] [0-9.]* ([0-9]*)//g'
fi
summ() { python3 scripts/bench_summary.py "$1" "$2"; }
B8="$BIN/augur bench --device cuda --synthetic qwen3-8b --prompt 2048 --gen 32 --batch 1 --context 128 --json"
run() {
  name=$1; shift
  env "$@" timeout 120 $B8 > "$LOG/$name.json" 2> "$LOG/$name.err" && summ "$LOG/$name.json" "$name" ||
    { echo "$name failed"; tail -3 "$LOG/$name.err"; }
}
ATT=decode_tc_kernel,decode_tc_rope_kernel,decode_tc_early_kernel,decode_kernel
SMALL=qkv_rope_store_kernel,rope_kernel,store_kv_kernel,add_rms_norm_kernel,rms_norm_kernel,swiglu_kernel,swiglu_packed_kernel
# default against variants, twice each, alternating: arguments name:ENV=V,ENV2=V2
# (e.g. early0:AUGUR_CUDA_ATTN_EARLY=0 tail0:AUGUR_CUDA_DECODE_TAIL=0), or
# without arguments B and B2 (default AUGUR_CUDA_ATTN_EARLY=0 and =1, the
# decode attention without the early key copy, and with it but never the
# one-trip split merge; B2="" to skip).
variants=("$@")
if [[ ${#variants[@]} == 0 ]]; then
  B=${B-AUGUR_CUDA_ATTN_EARLY=0}
  B2=${B2-AUGUR_CUDA_ATTN_EARLY=1}
  variants=("B:${B// /,}")
  [[ -n "$B2" ]] && variants+=("B2:${B2// /,}")
fi
for rep in 1 2; do
  run default$rep
  for v in "${variants[@]}"; do
    IFS=, read -r -a envs <<< "${v#*:}"
    run "${v%%:*}_$rep" "${envs[@]}"
  done
done
if [[ "${EXTRA:-0}" != 0 ]]; then
  run rows AUGUR_CUDA_STREAM=0
  run ring128 AUGUR_CUDA_STREAM_RING=128
  # 144 KB leaves room beside a stream GEMV block for a decode attention
  # block (74 KB at head_dim 128); measured 25-30 us a step slower (tenth session).
  run ring144 AUGUR_CUDA_STREAM_RING=144
  run ring144_rope AUGUR_CUDA_STREAM_RING=144 AUGUR_CUDA_ATTN_ROPE=1
fi
run skip_att AUGUR_CUDA_SKIP=$ATT
if [[ "${SKIP_SMALL:-0}" != 0 ]]; then run skip_small AUGUR_CUDA_SKIP=$SMALL; fi
if [[ "${FULL:-1}" != 0 ]]; then
  "$BIN/augur" bench --device cuda --synthetic qwen3-8b --prompt 2048 --gen 64 --batch 1,8,32,128 --context 128,8192 \
    --json > "$LOG/full8b.json" 2> "$LOG/full8b.err" && summ "$LOG/full8b.json" full8b || tail -3 "$LOG/full8b.err"
  for tail in 2; do
    AUGUR_CUDA_DECODE_TAIL=$tail timeout 150 "$BIN/augur" bench --device cuda --synthetic qwen3.5-27b --prompt 2048 \
      --gen 32 --batch 1 --json > "$LOG/27b_$tail.json" 2> "$LOG/27b_$tail.err" &&
      summ "$LOG/27b_$tail.json" "27b tail=$tail" || tail -3 "$LOG/27b_$tail.err"
  done
fi
