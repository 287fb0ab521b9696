#!/usr/bin/env bash
# Where a batch-1 decode step's time goes, context by context, in one device
# call: the stamps build's per-block timestamps (stamps.cuh: the stream GEMVs'
# and decode attention's newest launches, i.e. the last layers of the bench's
# last forward) and the CUPTI timeline of the step (scripts/decode_timeline.sh).
#   here: TARGETS=augur CUPTI=1 bash scripts/build_cuda_bundle.sh      (first: it empties .dev)
#         BUILD=build/cuda-stamps DEST=.dev/s TARGETS=augur CUDA_FLAGS=-DAUGUR_STAMPS \
#           bash scripts/build_cuda_bundle.sh
#   device: CTXS="1024 2048" TIMELINE=1 bash scripts/attn_probe.sh ["ENV=V ENV2=V"]   carry: [".dev"]
set -uo pipefail
cd "$(dirname "$0")/.."
setting=${1:-}
for ctx in ${CTXS:-1024 2048}; do
  echo "=== context $ctx ${setting:-(default)}: stamps"
  (
    BIN=.dev/s
    source scripts/cuda_env.sh
    env $setting timeout 100 "$BIN/augur" bench --device cuda --synthetic qwen3-8b --prompt 512 --gen 32 --batch 1 \
      --context "$ctx" --json > "$LOG/stamps_$ctx.json" 2> "$LOG/stamps_$ctx.err" || tail -3 "$LOG/stamps_$ctx.err"
    grep -E '^(stream|attention) |^  ' "$LOG/stamps_$ctx.err" | tail -80
  )
  if [[ ${TIMELINE:-1} != 0 ]]; then
    echo "=== context $ctx ${setting:-(default)}: timeline"
    CTX=$ctx PLAIN=0 bash scripts/decode_timeline.sh "$setting" | head -40
  fi
done
