#include "core/cpu_features.h"

#include <cstdlib>
#include <cstring>

namespace augur {

namespace {

CpuFeatures detect() {
  CpuFeatures f;
  __builtin_cpu_init();
  f.avx2 = __builtin_cpu_supports("avx2");
  f.fma = __builtin_cpu_supports("fma");
  f.f16c = __builtin_cpu_supports("f16c");
  f.avx512f = __builtin_cpu_supports("avx512f");
  f.avx512bw = __builtin_cpu_supports("avx512bw");
  f.avx512bf16 = __builtin_cpu_supports("avx512bf16");
  // AUGUR_CPU=avx2 or =scalar caps the kernels, to test every path on one machine.
  if (const char* cap = std::getenv("AUGUR_CPU")) {
    if (std::strcmp(cap, "avx2") == 0 || std::strcmp(cap, "scalar") == 0)
      f.avx512f = f.avx512bw = f.avx512bf16 = false;
    if (std::strcmp(cap, "scalar") == 0) f.avx2 = f.fma = f.f16c = false;
  }
  return f;
}

}  // namespace

const CpuFeatures& cpu_features() {
  static const CpuFeatures features = detect();
  return features;
}

}  // namespace augur
