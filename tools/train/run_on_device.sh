#!/usr/bin/env bash
# Trains augur-tiny on the device machine and sends the checkpoint back in
# parts small enough for the device tool (15 MiB each).
#   device run, carrying build/corpus:  bash tools/train/run_on_device.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/augur-train-out}
WORK=/tmp/augur-tiny-train
mkdir -p "$OUT" "$WORK"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true
python3 -c "import torch, transformers, tokenizers, safetensors; print('tokenizers', tokenizers.__version__)"
# The whole pipeline on a sliver first, so a late mistake costs seconds.
python3 tools/train/train_tiny.py --corpus build/corpus --out /tmp/augur-tiny-smoke --smoke 2>&1 | tail -25 | tee "$OUT/smoke.log"
python3 tools/train/train_tiny.py --corpus build/corpus --out "$WORK" "$@" 2>&1 | tee "$OUT/train.log"
cp "$WORK/train_log.json" "$OUT/"
tar -C "$WORK" -czf - augur-tiny reference.safetensors heldout.txt | split -b 15M - "$OUT/tiny.tgz.part-"
ls -l "$OUT"
