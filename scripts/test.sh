#!/usr/bin/env bash
# Sets up, then runs the whole test suite: the Release build, then the same
# suite built with AddressSanitizer + UndefinedBehaviorSanitizer.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh

echo "== tests (Release)"
ctest --preset release -j "$(nproc)"

echo "== tests (ASan + UBSan)"
cmake --preset asan >/dev/null
cmake --build --preset asan -j "$(nproc)"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest --preset asan -j "$(nproc)"
