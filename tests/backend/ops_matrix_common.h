// Shared by the op matrix tests (ops_matrix_test.cpp, ops_matrix_hybrid_test.cpp,
// ops_matrix_sampling_test.cpp): the sizes, inputs rounded to a dtype, host
// and device tensors, the (backend, dtype) fixtures and their INSTANTIATE
// macros, the skip for what a backend does not take, and batch layouts.
//
// All in an anonymous namespace, as when the matrix was one file: each test
// file gets its own copy (a fixture is a distinct type in each file, so every
// suite stays within one file and is instantiated there, once). The functions
// are inline so that a file which uses only some of them gets no
// unused-function warning.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <iomanip>
#include <limits>
#include <numeric>
#include <ostream>
#include <random>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "backend/device.h"
#include "backend/ops.h"
#include "core/dtype.h"

namespace augur {

// Parameters print by name in failure messages (found by ADL).
inline void PrintTo(Device d, std::ostream* os) { *os << device_name(d); }
inline void PrintTo(DType t, std::ostream* os) { *os << dtype_name(t); }

namespace {

constexpr int64_t kSizes[] = {1, 31, 33, 4097};

// ---- helpers ------------------------------------------------------------------

inline float round_to(float v, DType t) {
  switch (t) {
    case DType::BF16: return bf16_to_f32(f32_to_bf16(v));
    case DType::F16: return f16_to_f32(f32_to_f16(v));
    default: return v;
  }
}

// n values uniform in [lo, hi), rounded to `t`.
inline std::vector<float> uniform(int64_t n, std::mt19937& rng, float lo, float hi, DType t = DType::F32) {
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = round_to(u(rng), t);
  return v;
}

// A host tensor of dtype `t` (F32 | BF16 | F16) holding `v` (representable in `t`).
inline Tensor host_tensor(DType t, std::initializer_list<int64_t> shape, const std::vector<float>& v) {
  Tensor out = Tensor::empty(t, shape);
  EXPECT_EQ(out.numel(), int64_t(v.size()));
  for (int64_t i = 0; i < out.numel(); ++i) {
    const float x = v[size_t(i)];
    if (t == DType::F32)
      out.data<float>()[i] = x;
    else
      out.data<uint16_t>()[i] = t == DType::BF16 ? f32_to_bf16(x) : f32_to_f16(x);
  }
  return out;
}

inline Tensor host_i32(std::initializer_list<int64_t> shape, const std::vector<int32_t>& v) {
  Tensor out = Tensor::empty(DType::I32, shape);
  EXPECT_EQ(out.numel(), int64_t(v.size()));
  std::copy(v.begin(), v.end(), out.data<int32_t>());
  return out;
}

// A fresh copy of `t` on `d` (never `t` itself: some ops write in place).
inline Tensor on(Device d, const Tensor& t) {
  if (d != Device::CPU) return to_device(t, d);
  Tensor c = Tensor::empty(t.dtype(), t.shape().data(), t.ndim());
  std::memcpy(c.raw(), t.raw(), t.nbytes());
  return c;
}

// An f32 output on `d` filled with NaN.
inline Tensor poisoned(Device d, std::initializer_list<int64_t> shape) {
  Tensor h = Tensor::empty(DType::F32, shape);
  std::fill_n(h.data<float>(), h.numel(), std::numeric_limits<float>::quiet_NaN());
  return on(d, h);
}

template <typename T = float>
std::vector<T> values(const Tensor& t) {
  const Tensor h = to_device(t, Device::CPU);
  return std::vector<T>(h.data<T>(), h.data<T>() + h.numel());
}

// Reports a test's worst error, as a property in its XML/JSON output (how
// near its tolerance each backend runs).
inline void record_worst(const std::string& key, double worst) {
  std::ostringstream v;
  v << std::scientific << std::setprecision(2) << worst;
  ::testing::Test::RecordProperty(key, v.str());
}

// Why `d` cannot run `op` on dtype `t` (empty when it can): the dtypes each
// backend takes, as ops.cpp checks them.
inline std::string unsupported(const char* op, Device d, DType t, std::initializer_list<DType> cpu,
                               std::initializer_list<DType> cuda) {
  const std::initializer_list<DType>& ok = d == Device::CPU ? cpu : cuda;
  if (std::find(ok.begin(), ok.end(), t) != ok.end()) return "";
  std::string why(op);
  why.append(" on ").append(device_name(d)).append(" takes");
  for (DType o : ok) why.append(" ").append(dtype_name(o));
  return why.append(" only, not ").append(dtype_name(t));
}

#define SKIP_IF_UNSUPPORTED(...)                                          \
  if (const std::string why = unsupported(__VA_ARGS__); !why.empty()) \
  GTEST_SKIP() << why

class OnDevice : public ::testing::TestWithParam<Device> {
 protected:
  Device dev() const { return GetParam(); }
  void SetUp() override {
    if (!device_available(dev())) GTEST_SKIP() << "no " << device_name(dev()) << " device";
  }
};

class OnDeviceDtype : public ::testing::TestWithParam<std::tuple<Device, DType>> {
 protected:
  Device dev() const { return std::get<0>(GetParam()); }
  DType dtype() const { return std::get<1>(GetParam()); }
  void SetUp() override {
    if (!device_available(dev())) GTEST_SKIP() << "no " << device_name(dev()) << " device";
  }
};

inline std::string device_param_name(const ::testing::TestParamInfo<Device>& info) {
  return std::string(device_name(info.param));
}
inline std::string device_dtype_param_name(const ::testing::TestParamInfo<std::tuple<Device, DType>>& info) {
  return std::string(device_name(std::get<0>(info.param))) + "_" + std::string(dtype_name(std::get<1>(info.param)));
}

#define INSTANTIATE_ON_DEVICES(Suite) \
  INSTANTIATE_TEST_SUITE_P(Ops, Suite, ::testing::Values(Device::CPU, Device::CUDA), device_param_name)
#define INSTANTIATE_ON_DEVICES_AND_DTYPES(Suite)                                                       \
  INSTANTIATE_TEST_SUITE_P(Ops, Suite,                                                                 \
                           ::testing::Combine(::testing::Values(Device::CPU, Device::CUDA),            \
                                              ::testing::Values(DType::F32, DType::BF16, DType::F16)), \
                           device_dtype_param_name)

// A batch layout: host rows and positions, and the device copy on an
// accelerator (ops::upload_batch).
struct RowSpec {
  int32_t n_tokens;
  int32_t pos0;
  std::vector<int32_t> blocks;  // empty: blocks 0, 1, ... (layouts that address no cache)
  int32_t slot = -1;
};

struct Batch {
  std::vector<std::vector<int32_t>> tables;  // rows[i].block_table views tables[i]
  std::vector<ops::AttnRow> rows;
  std::vector<int32_t> tokens, positions;
  ops::DeviceBatch device;
  bool has_device = false;
  ops::BatchView view() const { return {rows, positions, has_device ? &device : nullptr}; }
  const ops::DeviceBatch* device_ptr() const { return has_device ? &device : nullptr; }
  std::vector<ops::RecurrentRow> recurrent() const {
    std::vector<ops::RecurrentRow> r;
    for (const auto& row : rows) r.push_back({row.token_begin, row.n_tokens, row.state_slot});
    return r;
  }
};

inline Batch make_batch(Device d, const std::vector<RowSpec>& specs, int64_t block_size,
                        std::vector<int32_t> tokens = {}) {
  Batch b;
  int64_t max_context = 1;
  for (const auto& s : specs) {
    const int64_t end = int64_t(s.pos0) + s.n_tokens;
    max_context = std::max(max_context, end);
    std::vector<int32_t> t = s.blocks;
    if (t.empty()) {
      t.resize(size_t((end + block_size - 1) / block_size));
      std::iota(t.begin(), t.end(), 0);
    }
    b.tables.push_back(std::move(t));
  }
  int32_t begin = 0;
  for (size_t i = 0; i < specs.size(); ++i) {
    b.rows.push_back({begin, specs[i].n_tokens, specs[i].pos0, b.tables[i], specs[i].slot});
    for (int32_t j = 0; j < specs[i].n_tokens; ++j) b.positions.push_back(specs[i].pos0 + j);
    begin += specs[i].n_tokens;
  }
  b.tokens = tokens.empty() ? std::vector<int32_t>(size_t(begin), 0) : std::move(tokens);
  EXPECT_EQ(int64_t(b.tokens.size()), int64_t(begin));
  if (d != Device::CPU) {
    b.device = ops::upload_batch(d, b.tokens, b.rows, block_size, max_context);
    b.has_device = true;
  }
  return b;
}

}  // namespace
}  // namespace augur
