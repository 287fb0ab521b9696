# Sourced by the device-side scripts (cuda_device_test.sh) and by hand:
# unpacks the carried binaries (scripts/build_cuda_bundle.sh) into $BIN, points
# LD_LIBRARY_PATH at libcublasLt.so.13 (the system's, or the pip package
# nvidia-cublas'), and makes the log folder $LOG ($OUT, the device tool's
# return folder, when set).
BIN=${BIN:-.dev}
LOG=${OUT:-/tmp/augur-cuda-logs}
mkdir -p "$LOG"
if [[ -f "$BIN/bundle.tar.xz" && ! -x "$BIN/test_cuda" ]]; then tar -C "$BIN" -xJf "$BIN/bundle.tar.xz"; fi
if ! ldconfig -p 2>/dev/null | grep -q 'libcublasLt.so.13'; then
  d=$(python3 -c "import nvidia.cublas,os;print(os.path.dirname(nvidia.cublas.__file__))" 2>/dev/null || true)
  if [[ -n "$d" && -e "$d/lib/libcublasLt.so.13" ]]; then
    export LD_LIBRARY_PATH="$d/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  elif [[ -e /usr/local/cuda/lib64/libcublasLt.so.13 ]]; then
    export LD_LIBRARY_PATH="/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  else
    echo "warning: libcublasLt.so.13 not found (nvidia.cublas: '${d}')"
  fi
fi
# AUGUR_CUDA_TIMELINE's CUPTI (a PROFILE=1 bundle): the bundle's copy.
if [[ -e "$BIN/libcupti.so.13" ]]; then export AUGUR_CUDA_CUPTI=${AUGUR_CUDA_CUPTI:-$(cd "$BIN" && pwd)/libcupti.so.13}; fi
