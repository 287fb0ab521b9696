// Shared by the CUDA op tests: device arrays owned by the test, the fixtures
// that skip without a GPU, random inputs and error statistics.
//   cuda_ops_test.cpp, cuda_attention_test.cpp: Dev, CudaTest, randn,
//     rand_bf16, ErrStats / compare;
//   cuda_fused_sampling_test.cpp, cuda_f16_test.cpp: Buf, CudaFused,
//     uniform_floats.
//
// All in an anonymous namespace, as when they lived in the test files: each
// test file gets its own copy (a fixture is a distinct type in each file, so
// every test suite stays within one file). The functions are inline so that a
// file which uses only some of them gets no unused-function warning.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <random>
#include <stdexcept>
#include <vector>

#include "backend/cuda/kernels.h"
#include "core/dtype.h"

namespace augur::cuda {
namespace {

// ---- cuda_ops_test.cpp, cuda_attention_test.cpp ---------------------------------------

// A device array owned by the test (tests allocate directly; the engine uses its allocator).
template <typename T>
class Dev {
 public:
  explicit Dev(size_t n) : n_(n) {
    if (n_ > 0 && cudaMalloc(&p_, n_ * sizeof(T)) != cudaSuccess) throw std::runtime_error("cudaMalloc failed");
  }
  explicit Dev(const std::vector<T>& h) : Dev(h.size()) { upload(h); }
  ~Dev() {
    if (p_ != nullptr) cudaFree(p_);
  }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  T* get() const { return p_; }
  size_t size() const { return n_; }
  // On the ops' stream: it is non-blocking, so legacy-stream copies and
  // memsets would not be ordered with the kernels.
  void upload(const std::vector<T>& h) {
    if (h.size() != n_) throw std::runtime_error("upload size mismatch");
    if (n_ > 0 && cudaMemcpyAsync(p_, h.data(), n_ * sizeof(T), cudaMemcpyHostToDevice, stream()) != cudaSuccess)
      throw std::runtime_error("cudaMemcpyAsync H2D failed");
    synchronize();
  }
  std::vector<T> download() const {
    std::vector<T> h(n_);
    if (n_ > 0 && cudaMemcpyAsync(h.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost, stream()) != cudaSuccess)
      throw std::runtime_error("cudaMemcpyAsync D2H failed");
    synchronize();
    return h;
  }
  void poison() {
    if (n_ > 0 && cudaMemsetAsync(p_, 0xff, n_ * sizeof(T), stream()) != cudaSuccess)
      throw std::runtime_error("cudaMemsetAsync failed");
  }

 private:
  T* p_ = nullptr;
  size_t n_;
};

class CudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!available()) GTEST_SKIP() << "no CUDA device";
    context();
  }
};

inline std::vector<float> randn(size_t n, std::mt19937& rng, float lo = -1.f, float hi = 1.f) {
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = u(rng);
  return v;
}

inline std::vector<uint16_t> rand_bf16(size_t n, std::mt19937& rng, float lo = -1.f, float hi = 1.f) {
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<uint16_t> v(n);
  for (auto& x : v) x = f32_to_bf16(u(rng));
  return v;
}

struct ErrStats {
  double max_abs = 0, rel_l2 = 0;
  bool all_finite = true;
};

inline ErrStats compare(const std::vector<float>& got, const std::vector<float>& ref) {
  ErrStats s;
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (!std::isfinite(got[i])) s.all_finite = false;
    const double d = double(got[i]) - ref[i];
    s.max_abs = std::max(s.max_abs, std::fabs(d));
    num += d * d;
    den += double(ref[i]) * ref[i];
  }
  s.rel_l2 = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
  return s;
}

// ---- cuda_fused_sampling_test.cpp, cuda_f16_test.cpp --------------------------------

template <typename T>
class Buf {
 public:
  explicit Buf(size_t n) : n_(n) {
    if (n_ > 0 && cudaMalloc(&p_, n_ * sizeof(T)) != cudaSuccess) throw std::runtime_error("cudaMalloc failed");
  }
  explicit Buf(const std::vector<T>& h) : Buf(h.size()) { upload(h); }
  ~Buf() {
    if (p_ != nullptr) cudaFree(p_);
  }
  Buf(const Buf&) = delete;
  Buf& operator=(const Buf&) = delete;
  T* get() const { return p_; }
  void upload(const std::vector<T>& h) {
    if (n_ > 0 && cudaMemcpyAsync(p_, h.data(), n_ * sizeof(T), cudaMemcpyHostToDevice, stream()) != cudaSuccess)
      throw std::runtime_error("H2D failed");
    synchronize();
  }
  std::vector<T> download() const {
    std::vector<T> h(n_);
    if (n_ > 0 && cudaMemcpyAsync(h.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost, stream()) != cudaSuccess)
      throw std::runtime_error("D2H failed");
    synchronize();
    return h;
  }
  void poison() {
    if (n_ > 0 && cudaMemsetAsync(p_, 0xff, n_ * sizeof(T), stream()) != cudaSuccess)
      throw std::runtime_error("memset failed");
  }

 private:
  T* p_ = nullptr;
  size_t n_;
};

class CudaFused : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!available()) GTEST_SKIP() << "no CUDA device";
  }
};

inline std::vector<float> uniform_floats(size_t n, std::mt19937& rng, float lo, float hi) {
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = u(rng);
  return v;
}

}  // namespace
}  // namespace augur::cuda
