#!/usr/bin/env bash
# Issue 30's augur figures on checkpoints of shapes no preset of augur's has,
# written by transformers (scripts/write_checkpoint.py: qwen3-dense-3b and
# qwen3.5-hybrid-6b) and loaded from disk, in one device call, per checkpoint:
#   - prefill of 2048 and LONG tokens (`augur bench`: warmed up, one forward);
#   - batch-1 decode at contexts 128, 512, 2048 and 8192, as fractions of copy;
#   - decode of 32 rows after 512-token prompts (llama.cpp's batched-bench
#     shape, 512 + 128);
#   - `augur run`'s prefill of the same 2048 tokens in a fresh process (what a
#     user waits for: no warm-up), beside bench's.
# Then scripts/shapes_table.py prints one Markdown table of it all.
# Binaries from scripts/build_cuda_bundle.sh (TARGETS=augur), carried in $BIN:
#   run: BIN=.dev bash scripts/shapes_bench.sh        carry: [".dev"]
# Env: SHAPES (write_checkpoint.py shapes), CKPTS (checkpoint folders to use
# instead, as "name=dir ..."), CKPT_ROOT (/tmp/ckpt), DEVICE (cuda), PREFILL
# (2048: the first prefill, run's prompt and the decode runs' context), LONG
# (16384), GEN (64), CONTEXTS (128,512,8192; 2048 is the first run's), BATCH
# (32). On a machine without a GPU, e.g.:
#   BIN=build/release/bin DEVICE=cpu CKPTS="tiny=models/augur-tiny" PREFILL=256 LONG=512 \
#     GEN=4 CONTEXTS=128 BATCH=4 bash scripts/shapes_bench.sh
set -euo pipefail
cd "$(dirname "$0")/.."
DEVICE=${DEVICE:-cuda}
if [[ $DEVICE == cuda ]]; then
  source scripts/cuda_env.sh
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
else
  BIN=${BIN:-build/release/bin}
  LOG=${OUT:-/tmp/augur-shapes}
  mkdir -p "$LOG"
fi
PREFILL=${PREFILL:-2048} LONG=${LONG:-16384} GEN=${GEN:-64} CONTEXTS=${CONTEXTS:-128,512,8192} BATCH=${BATCH:-32}

if [[ -z ${CKPTS:-} ]]; then
  CKPTS=""
  for shape in ${SHAPES:-qwen3-dense-3b qwen3.5-hybrid-6b}; do
    dir=${CKPT_ROOT:-/tmp/ckpt}/$shape
    [[ -f $dir/config.json ]] || python3 scripts/write_checkpoint.py "$shape" "$dir"
    CKPTS+=" $shape=$dir"
  done
fi

jsons=()
for entry in $CKPTS; do
  name=${entry%%=*} dir=${entry#*=}
  echo "== $name ($dir) =="
  # Prefill at both lengths, batch-1 decode after the 2048-token prompt and at
  # the other contexts.
  "$BIN/augur" bench "$dir" --device "$DEVICE" --prompt "$PREFILL,$LONG" --gen "$GEN" --batch 1 --context "$CONTEXTS" \
    --json >"$LOG/$name.bench.json"
  # Batched decode after 512-token prompts.
  "$BIN/augur" bench "$dir" --device "$DEVICE" --prompt 512 --gen 128 --batch "$BATCH" --json >"$LOG/$name.batch.json"
  # A user's first prompt: a fresh process, 2048 tokens, one forward (bench's
  # chunking), nothing warmed.
  ids=$(python3 -c "import json, random, sys
c = json.load(open(sys.argv[1] + '/config.json'))
v = c.get('vocab_size') or c['text_config']['vocab_size']
random.seed(5)
print(','.join(str(random.randrange(v)) for _ in range(int(sys.argv[2]))))" "$dir" "$PREFILL")
  "$BIN/augur" run "$dir" --device "$DEVICE" --prompt-ids "$ids" -n 1 --ignore-eos --prefill-chunk "$PREFILL" --json \
    >"$LOG/$name.run.json"
  jsons+=("$name=$LOG/$name")
done
python3 scripts/shapes_table.py "${jsons[@]}" | tee "$LOG/shapes_table.md"
