#!/usr/bin/env bash
# Timelines of the batch-1 decode step (AUGUR_CUDA_TIMELINE, CUPTI), one per
# setting, each read by scripts/timeline.py: where the step's time goes
# kernel by kernel. Also the step without the timeline, for CUPTI's cost.
#   here: TARGETS=augur CUPTI=1 bash scripts/build_cuda_bundle.sh
#   (the whole bundle with CUPTI no longer fits the carried tree's 64 MiB)
#   device: bash scripts/decode_timeline.sh ["ENV=V ENV2=V" ...]   carry: [".dev"]
# Each argument is one setting (environment assignments; "" the default).
# MODEL (default qwen3-8b) and CTX (default 128) choose the bench; PLAIN=0
# skips the run without the timeline.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/cuda_env.sh
MODEL=${MODEL:-qwen3-8b}
CTX=${CTX:-128}
[[ $# -eq 0 ]] && set -- ""
for setting in "$@"; do
  tag=$(echo "${setting:-default}" | tr -c 'A-Za-z0-9=\n' '_')
  echo "=== ${setting:-default}"
  for tl in 0 1; do
    [[ $tl == 0 && ${PLAIN:-1} == 0 ]] && continue
    extra=()
    [[ $tl == 1 ]] && extra=(AUGUR_CUDA_TIMELINE="$LOG/tl_$tag.csv")
    env $setting "${extra[@]}" timeout 150 "$BIN/augur" bench --device cuda --synthetic "$MODEL" --prompt 512 \
      --gen 32 --batch 1 --context "$CTX" --json > "$LOG/tl_$tag.$tl.json" 2> "$LOG/tl_$tag.$tl.err" ||
      { echo "bench failed"; tail -3 "$LOG/tl_$tag.$tl.err"; continue; }
    python3 -c "
import json,sys
d=json.load(open(sys.argv[1]))
print('timeline' if sys.argv[2]=='1' else 'plain   ', ' '.join('b%d/ctx%d %.3f ms'%(e['batch'],e['context'],e['forward_ms_per_step']) for e in d['decode']))
" "$LOG/tl_$tag.$tl.json" $tl
  done
  python3 scripts/timeline.py "$LOG/tl_$tag.csv" | tee "$LOG/tl_$tag.txt" | head -60
done
