// What the host CPU can run, read once at start-up (CPUID + OS support),
// so kernels are chosen at run time rather than at build time.
#pragma once

namespace augur {

struct CpuFeatures {
  bool avx2 = false;
  bool fma = false;
  bool f16c = false;
  bool avx512f = false;
  bool avx512bw = false;
  bool avx512bf16 = false;
};

const CpuFeatures& cpu_features();

}  // namespace augur
