#include "backend/device.h"

#include <cstring>

#include "backend/cuda/kernels.h"
#include "backend/cuda/memory.h"
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
