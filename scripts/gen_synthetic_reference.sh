#!/usr/bin/env bash
# Regenerates tests/data/tokenizer/synthetic_reference.json: small synthetic
# tokenizers covering components the real four do not use, with the ids and
# texts Hugging Face tokenizers (npm `tokenizers`, pinned) gives for them.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
python3 "$root/scripts/gen_synthetic_tokenizers.py" "$tmp/tokenizers"
(cd "$tmp" && npm init -y >/dev/null && npm install --silent tokenizers@0.23.2 >/dev/null)
NODE_PATH="$tmp/node_modules" node "$root/scripts/gen_synthetic_reference.js" \
  "$tmp/tokenizers" "$root/tests/data/tokenizer/synthetic_reference.json"
echo "wrote tests/data/tokenizer/synthetic_reference.json"
