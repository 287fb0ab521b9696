#!/usr/bin/env bash
# Per-kernel GPU times of augur bench's decode steps under Nsight Compute
# (ncu, hardware counters: Firecracker machines only). Each kernel is timed
# alone with caches flushed first, as a decode step's weights always are;
# tools/profile/kernel_profile.py sums one step's kernels by name.
#   run: SHAPES="qwen3-8b" bash scripts/cuda_profile.sh     carry: [".dev"]
# Env: SHAPES, PROMPT (context), GEN, BATCH, LAUNCHES (kernels profiled, default
# 8000: enough for Qwen3-8B; Qwen3.5-27B's last step needs ~12000); logs to $OUT.
# Qwen3-8B took ~70 s, Qwen3.5-27B ~200 s on the H200.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/cuda_env.sh
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -n 1)
status=0
for shape in ${SHAPES:-qwen3-8b}; do
  echo "== ncu: augur bench --synthetic $shape =="
  timeout 280 "$NCU" --clock-control none --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum \
    --launch-count "${LAUNCHES:-8000}" --csv --log-file "$LOG/ncu_$shape.log" \
    "$BIN/augur" bench --device cuda --synthetic "$shape" --prompt "${PROMPT:-2048}" --gen "${GEN:-2}" \
    --batch "${BATCH:-1}" > "$LOG/ncu_$shape.csv" 2> "$LOG/ncu_$shape.err"
  rc=$?
  echo "rc=$rc"; tail -n 3 "$LOG/ncu_$shape.err"; wc -l "$LOG/ncu_$shape.csv"
  [[ $rc -eq 0 ]] || status=1
done
exit $status
