#!/usr/bin/env bash
# Installs what augur needs on Debian 12 (apt packages; from npm the test
# tokenizers and the server tests' OpenAI client) and builds the Release tree in build/release.
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(g++ cmake ninja-build pkg-config nlohmann-json3-dev libcli11-dev libpcre2-dev
          libutf8proc-dev libgtest-dev libgmock-dev libbenchmark-dev libevent-dev)
command -v npm >/dev/null 2>&1 || packages+=(npm)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  sudo_cmd=()
  [[ $(id -u) -eq 0 ]] || sudo_cmd=(sudo)
  "${sudo_cmd[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq "${missing[@]}"
fi

# The server's end-to-end tests drive it with OpenAI's npm client.
if [[ ! -d tests/server/node_modules/openai ]]; then
  (cd tests/server && npm ci --no-audit --no-fund --silent)
fi

if [[ -x scripts/fetch_tokenizers.sh ]]; then
  scripts/fetch_tokenizers.sh
fi

cmake --preset release >/dev/null
cmake --build --preset release -j "$(nproc)"
