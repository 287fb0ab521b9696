#!/usr/bin/env bash
# Two engines A/B in one device call: augur from two trees (say main and a
# change), each built here with
#   TARGETS=augur DEST=.dev/a scripts/build_cuda_bundle.sh   (and .dev/b)
# then on the device: bash scripts/ab_engines.sh ["ENV=V ..." ...]  carry [".dev"]
# Runs the Qwen3-8B batch-1 bench (contexts 2048 after the prompt, and 128)
# for a then b, REPS times (default 3), under each setting ("" the default),
# alternating so that drift of the machine falls on both.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/cuda_env.sh
engines=()
for d in a b; do
  [[ -f .dev/$d/bundle.tar.xz || -x .dev/$d/augur ]] || continue  # one engine: settings only
  [[ -x .dev/$d/augur ]] || tar -C .dev/$d -xJf .dev/$d/bundle.tar.xz
  engines+=("$d")
done
[[ $# -eq 0 ]] && set -- ""
for rep in $(seq "${REPS:-3}"); do
  for setting in "$@"; do
    for d in "${engines[@]}"; do
      name="$d ${setting:-default}"
      tag=$(echo "${d}_${setting:-default}_$rep" | tr -c 'A-Za-z0-9=\n' '_')
      env $setting timeout 120 .dev/$d/augur bench --device cuda --synthetic "${MODEL:-qwen3-8b}" --prompt 2048 \
        --gen "${GEN:-64}" --batch 1 --context 128 --json > "$LOG/$tag.json" 2> "$LOG/$tag.err" &&
        python3 scripts/bench_summary.py "$LOG/$tag.json" "$name" || { echo "$name failed"; tail -3 "$LOG/$tag.err"; }
    done
  done
done
