#!/usr/bin/env bash
# augur serve's throughput on a GPU machine (docs/benchmarks.md): writes a
# random-weight Qwen3-8B beside the Qwen3 tokenizer, serves it on CUDA and
# drives it with scripts/serve_load.py: 64 and 256 concurrent streaming
# clients, 128 prompt tokens / 128 generated and 1000 / 1000.
# Binaries from scripts/build_cuda_bundle.sh (TARGETS=augur), carried in $BIN:
#   run: BIN=.dev/serve bash scripts/serve_bench.sh
#   carry: [".dev/serve", "tests/data/tokenizers/qwen3"]
# Env: CKPT (default /tmp/q8), TOKENIZER (a folder with Qwen3's tokenizer.json,
# default tests/data/tokenizers/qwen3), MAX_BATCH (256), STEP_TOKENS (2048),
# SERVE_ARGS, LEVELS.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/cuda_env.sh
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
CKPT=${CKPT:-/tmp/q8}
[[ -f $CKPT/config.json ]] || python3 scripts/write_checkpoint.py qwen3-8b "$CKPT" --tokenizer "${TOKENIZER:-tests/data/tokenizers/qwen3}"
port=8300
"$BIN/augur" serve "$CKPT" --device cuda --port $port --max-batch "${MAX_BATCH:-256}" \
  --step-tokens "${STEP_TOKENS:-2048}" ${SERVE_ARGS:-} 2>"$LOG/serve.log" &
pid=$!
SECONDS=0
for _ in $(seq 1200); do grep -q "listening on" "$LOG/serve.log" && break; kill -0 $pid 2>/dev/null || break; sleep 0.25; done
cat "$LOG/serve.log"
echo "serve: up after ${SECONDS} s"
status=0
while read -r clients requests prompt gen; do
  python3 scripts/serve_load.py --base http://127.0.0.1:$port --clients "$clients" --requests "$requests" \
    --prompt-tokens "$prompt" --max-tokens "$gen" --vocab 151936 --json | tee -a "$LOG/serve_load.jsonl" || status=1
done <<< "${LEVELS:-64 2 128 128
256 2 128 128
64 1 1000 1000
256 1 1000 1000}"
python3 -c "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:$port/metrics').read().decode())" |
  grep -E '^augur_(engine_steps|kv_cache|prefix|running|queue|generation)' || true
kill $pid
wait $pid 2>/dev/null
exit $status
