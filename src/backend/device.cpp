#include "backend/device.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string_view>

#include "backend/cuda/kernels.h"
#include "backend/cuda/memory.h"
#include "core/dtype.h"
#include "core/error.h"

namespace augur {

Device parse_device(std::string_view name) {
  if (name == "cpu") return Device::CPU;
  if (name == "cuda") return Device::CUDA;
  fail("[device] unknown device '", name, "' (cpu, cuda)");
}

std::string_view device_name(Device d) { return d == Device::CUDA ? "cuda" : "cpu"; }

bool device_available(Device d) { return d == Device::CPU || cuda::available(); }

Device default_device() { return cuda::available() ? Device::CUDA : Device::CPU; }

Tensor empty_on(Device d, DType dtype, std::initializer_list<int64_t> shape) {
  return empty_on(d, dtype, shape.begin(), int(shape.size()));
}

Tensor empty_on(Device d, DType dtype, const int64_t* shape, int ndim) {
  if (d == Device::CPU) return Tensor::empty(dtype, shape, ndim);
  int64_t n = 1;
  for (int i = 0; i < ndim; ++i) n *= shape[i];
  return Tensor::view_of(cuda::allocate(size_t(n) * dtype_size(dtype)), 0, dtype, shape, ndim);
}

void copy_tensor(const Tensor& src, const Tensor& dst) {
  if (src.dtype() != dst.dtype() || src.numel() != dst.numel())
    fail("[copy] ", dtype_name(src.dtype()), src.shape_str(), " into ", dtype_name(dst.dtype()), dst.shape_str());
  if (!src.is_contiguous() || !dst.is_contiguous()) fail("[copy] tensors must be contiguous");
  const size_t n = src.nbytes();
  const bool from_gpu = src.device() == Device::CUDA, to_gpu = dst.device() == Device::CUDA;
  if (!from_gpu && !to_gpu)
    std::memcpy(dst.raw(), src.raw(), n);
  else if (!from_gpu)
    cuda::copy_to_device(dst.raw(), src.raw(), n);
  else if (!to_gpu)
    cuda::copy_to_host(dst.raw(), src.raw(), n);
  else
    cuda::copy_on_device(dst.raw(), src.raw(), n);
}

Tensor to_device(const Tensor& t, Device d) {
  if (t.device() == d && t.is_contiguous()) return t;
  Tensor out = empty_on(d, t.dtype(), t.shape().data(), t.ndim());
  copy_tensor(t, out);
  return out;
}

namespace {

void require_half(const char* op, const Tensor& t) {
  if (!t.defined() || (t.dtype() != DType::BF16 && t.dtype() != DType::F16) || !t.is_contiguous())
    fail("[", op, "] needs a contiguous BF16 or F16 tensor");
}
cuda::Half half_of(DType t) { return t == DType::F16 ? cuda::Half::F16 : cuda::Half::BF16; }
float half_to_f32(uint16_t h, DType t) { return t == DType::F16 ? f16_to_f32(h) : bf16_to_f32(h); }

}  // namespace

DType device_half(Device d) {
  if (d == Device::CPU) return DType::F32;
  static const DType half = [] {
    const char* env = std::getenv("AUGUR_CUDA_HALF");
    if (env == nullptr || std::string_view(env) == "f16") return DType::F16;
    if (std::string_view(env) == "bf16") return DType::BF16;
    fail("[device] AUGUR_CUDA_HALF='", env, "': expected f16 or bf16");
  }();
  return half;
}

Tensor convert_half(const Tensor& t, DType to) {
  require_half("convert_half", t);
  if (to != DType::BF16 && to != DType::F16) fail("[convert_half] target must be BF16 or F16");
  Tensor out = empty_on(t.device(), to, t.shape().data(), t.ndim());
  if (t.device() == Device::CUDA) {
    cuda::convert_half(static_cast<const uint16_t*>(t.raw()), half_of(t.dtype()), static_cast<uint16_t*>(out.raw()),
                       half_of(to), t.numel(), cuda::stream());
    return out;
  }
  const uint16_t* src = static_cast<const uint16_t*>(t.raw());
  uint16_t* dst = static_cast<uint16_t*>(out.raw());
  for (int64_t i = 0; i < t.numel(); ++i) {
    const float v = half_to_f32(src[i], t.dtype());
    dst[i] = to == DType::F16 ? f32_to_f16(std::fabs(v) > 65504.0f ? std::copysign(65504.0f, v) : v) : f32_to_bf16(v);
  }
  return out;
}

float max_abs(const Tensor& t) {
  require_half("max_abs", t);
  if (t.device() == Device::CUDA)
    return cuda::max_abs_half(static_cast<const uint16_t*>(t.raw()), half_of(t.dtype()), t.numel(), cuda::stream());
  float m = 0;
  const uint16_t* src = static_cast<const uint16_t*>(t.raw());
  for (int64_t i = 0; i < t.numel(); ++i) m = std::max(m, std::fabs(half_to_f32(src[i], t.dtype())));
  return m;
}

void synchronize(Device d) {
  if (d == Device::CUDA) cuda::synchronize();
}

namespace {

class CudaCapturedWork final : public CapturedWork {
 public:
  explicit CudaCapturedWork(cuda::GraphPtr g) : graph_(std::move(g)) {}
  void replay() override { cuda::launch(*graph_); }

 private:
  cuda::GraphPtr graph_;
};

}  // namespace

std::unique_ptr<CapturedWork> capture(Device d, const std::function<void()>& work) {
  if (d != Device::CUDA) fail("[device] capture is for accelerators, not ", device_name(d));
  cuda::begin_capture();
  try {
    work();
  } catch (...) {
    cuda::abort_capture();
    throw;
  }
  return std::make_unique<CudaCapturedWork>(cuda::end_capture());
}

}  // namespace augur
