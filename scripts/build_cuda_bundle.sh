#!/usr/bin/env bash
# Builds the CUDA binaries on this machine (nvcc needed, no GPU) and copies
# them into .dev/ (git-ignored), for scripts/cuda_device_test.sh on the GPU
# machine: run `bash scripts/cuda_device_test.sh` there with carry [".dev"].
# libstdc++/libgcc are linked statically; libcublasLt.so.13, opened when the
# first CUDA context starts, comes from the device's system or its pip package
# nvidia-cublas (scripts/cuda_env.sh).
#
#   scripts/build_cuda_bundle.sh            # BUILD=build/cuda-bundle JOBS=2 DEST=.dev
# PROFILE=1: the measurement build (-DAUGUR_CUDA_PROFILE=ON: AUGUR_CUDA_TIMELINE,
# AUGUR_CUDA_SKIP) with libcupti, in its own build folder:
#   PROFILE=1 TARGETS=augur scripts/build_cuda_bundle.sh
# then on the device AUGUR_CUDA_TIMELINE=$OUT/tl.csv "$BIN/augur" bench ...
# and python3 scripts/timeline.py tl.csv.
set -euo pipefail
cd "$(dirname "$0")/.."
PROFILE=${PROFILE:-0}
if [[ "$PROFILE" != 0 ]]; then BUILD=${BUILD:-build/cuda-profile}; else BUILD=${BUILD:-build/cuda-bundle}; fi
JOBS=${JOBS:-2}
DEST=${DEST:-.dev}

cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_FLAGS="${CUDA_FLAGS:-}" \
  -DAUGUR_CUDA_PROFILE="$([[ "$PROFILE" != 0 ]] && echo ON || echo OFF)" -DAUGUR_STATIC_DEPS=ON -DCMAKE_EXE_LINKER_FLAGS="-static-libstdc++ -static-libgcc" >/dev/null
# TARGETS="augur" (say) builds and carries only those (the carried tree is
# limited to 64 MiB).
read -r -a targets <<< "${TARGETS:-test_cuda test_backend cuda_bench augur}"
cmake --build "$BUILD" --target "${targets[@]}" -j"$JOBS"

# Stripped and xz-compressed: the carried tree must stay under 64 MiB next to
# the repository (models/augur-tiny alone is 41 MB). cuda_device_test.sh
# unpacks it.
rm -rf "$DEST" && mkdir -p "$DEST/bin"
for t in "${targets[@]}"; do
  if [[ -x "$BUILD/tests/$t" ]]; then cp "$BUILD/tests/$t" "$DEST/bin/"; else cp "$BUILD/bin/$t" "$DEST/bin/"; fi
done
strip "$DEST"/bin/*
# The profile build carries CUPTI too, for AUGUR_CUDA_TIMELINE (1 MB compressed).
if [[ "$PROFILE" != 0 ]]; then
  cupti=$(find "$(dirname "$(command -v nvcc)")/.." -name 'libcupti.so.13' 2>/dev/null | head -1)
  if [[ -n "$cupti" ]]; then cp -L "$cupti" "$DEST/bin/"; else echo "PROFILE=1: libcupti.so.13 not found"; fi
fi
# xz -9e: its 64 MB dictionary spans the binaries (17.7 MB at the default level, 10.2 here).
XZ_OPT=${XZ_OPT:--9e} tar -C "$DEST/bin" -cJf "$DEST/bundle.tar.xz" .
rm -rf "$DEST/bin"
ls -l "$DEST"
