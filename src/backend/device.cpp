#include "backend/device.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string_view>

#include <unistd.h>

#include "backend/cuda/kernels.h"
#include "backend/cuda/memory.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/quant.h"

namespace augur {

Device parse_device(std::string_view name) {
  if (name == "cpu") return Device::CPU;
  if (name == "cuda") return Device::CUDA;
  fail("[device] unknown device '", name, "' (cpu, cuda)");
}

std::string_view device_name(Device d) { return d == Device::CUDA ? "cuda" : "cpu"; }

bool device_available(Device d) { return d == Device::CPU || cuda::available(); }

Device default_device() { return cuda::available() ? Device::CUDA : Device::CPU; }

size_t free_memory(Device d) {
  if (d == Device::CUDA) return cuda::free_bytes();
  const long pages = sysconf(_SC_AVPHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? size_t(pages) * size_t(page) : 0;
}

Tensor empty_on(Device d, DType dtype, std::initializer_list<int64_t> shape) {
  return empty_on(d, dtype, shape.begin(), int(shape.size()));
}

Tensor empty_on(Device d, DType dtype, const int64_t* shape, int ndim) {
  if (d == Device::CPU) return Tensor::empty(dtype, shape, ndim);
  int64_t n = 1;
  for (int i = 0; i < ndim; ++i) n *= shape[i];
  return Tensor::view_of(cuda::allocate(size_t(n) * dtype_size(dtype)), 0, dtype, shape, ndim);
}

Tensor scratch_on(Device d, DType dtype, std::initializer_list<int64_t> shape) {
  if (d == Device::CPU) return Tensor::uninitialized(dtype, shape.begin(), int(shape.size()));
  return empty_on(d, dtype, shape);
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

// An unset variable keeps `fallback`; "0" and "1" are the only values.
bool env_flag(const char* var, bool fallback) {
  const char* env = std::getenv(var);
  if (env == nullptr) return fallback;
  const std::string_view v(env);
  if (v == "0") return false;
  if (v == "1") return true;
  fail("[device] ", var, "='", v, "': expected 0 or 1");
}

DType env_half(const char* var) {
  const char* env = std::getenv(var);
  if (env == nullptr || std::string_view(env) == "f16") return DType::F16;
  if (std::string_view(env) == "bf16") return DType::BF16;
  fail("[device] ", var, "='", env, "': expected f16 or bf16");
}

}  // namespace

namespace {

CudaSettings& settings_storage() {
  static CudaSettings settings = [] {
    CudaSettings s;
    s.graphs = env_flag("AUGUR_CUDA_GRAPHS", s.graphs);
    s.pdl = env_flag("AUGUR_CUDA_PDL", s.pdl);
    s.half = env_half("AUGUR_CUDA_HALF");
    return s;
  }();
  return settings;
}

}  // namespace

const CudaSettings& cuda_settings() { return settings_storage(); }

void set_cuda_settings(const CudaSettings& settings) { settings_storage() = settings; }

DType device_half(Device d) { return d == Device::CPU ? DType::F32 : cuda_settings().half; }

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

Tensor stack_rows(std::span<const Tensor> parts) {
  if (parts.empty()) fail("[stack_rows] nothing to stack");
  const Tensor& first = parts.front();
  bool quantized = false, all_quantized = true;
  for (const Tensor& p : parts) {
    quantized = quantized || p.is_quantized();
    all_quantized = all_quantized && p.is_quantized() && p.quant() == first.quant();
  }
  if (quantized && !all_quantized) {  // quantized alike or not at all: the rest as floats
    std::vector<Tensor> floats;
    for (const Tensor& p : parts)
      floats.push_back(p.is_quantized() ? dequantize(p, dequantized_cpu_type(p.quant())) : p);
    return stack_rows(floats);
  }
  if (quantized) {  // whole rows of blocks, on the host
    int64_t rows = 0;
    for (const Tensor& p : parts) {
      if (p.ndim() != 2 || p.dim(1) != first.dim(1) || !p.is_contiguous() || p.device() != Device::CPU)
        fail("[stack_rows] ", p.shape_str(), " does not stack onto ", first.shape_str());
      rows += p.dim(0);
    }
    const int64_t shape[] = {rows, first.dim(1)};
    Tensor out = empty_quantized(first.quant(), shape, 2);
    char* at = static_cast<char*>(out.raw());
    for (const Tensor& p : parts) {
      std::memcpy(at, p.raw(), p.nbytes());
      at += p.nbytes();
    }
    return out;
  }
  int64_t rows = 0;
  bool same = true, halves = true;
  for (const Tensor& p : parts) {
    if (p.ndim() != 2 || p.dim(1) != first.dim(1) || p.device() != first.device())
      fail("[stack_rows] ", p.shape_str(), " does not stack onto ", first.shape_str());
    rows += p.dim(0);
    same = same && p.dtype() == first.dtype();
    halves = halves && (p.dtype() == DType::BF16 || p.dtype() == DType::F16);
  }
  const DType dt = same ? first.dtype() : halves ? DType::BF16 : DType::F32;
  Tensor out = empty_on(first.device(), dt, {rows, first.dim(1)});
  int64_t at = 0;
  for (const Tensor& p : parts) {
    const Tensor dst = out.slice_rows(at, at + p.dim(0));
    at += p.dim(0);
    if (p.dtype() == dt) {
      copy_tensor(p, dst);
    } else if (dt == DType::BF16) {
      copy_tensor(convert_half(p, dt), dst);
    } else {  // widen a 16-bit part to f32
      if (p.device() != Device::CPU || !p.is_contiguous())
        fail("[stack_rows] f32 and 16-bit parts stack on the host only");
      const uint16_t* src = static_cast<const uint16_t*>(p.raw());
      float* d = dst.data<float>();
      for (int64_t i = 0; i < p.numel(); ++i) d[i] = half_to_f32(src[i], p.dtype());
    }
  }
  return out;
}

Tensor select_rows(const Tensor& w, std::span<const int64_t> rows) {
  if (w.ndim() != 2) fail("[select_rows] needs a matrix, got ", w.shape_str());
  if (w.device() != Device::CPU)  // regrouped on the host, then placed back
    return to_device(select_rows(to_device(w, Device::CPU), rows), w.device());
  const int64_t shape[] = {int64_t(rows.size()), w.dim(1)};
  Tensor out = w.is_quantized() ? empty_quantized(w.quant(), shape, 2) : Tensor::empty(w.dtype(), shape, 2);
  const size_t row_bytes = w.row_bytes();
  for (size_t i = 0; i < rows.size(); ++i) {
    if (rows[i] < 0 || rows[i] >= w.dim(0)) fail("[select_rows] row ", rows[i], " outside [0, ", w.dim(0), ")");
    std::memcpy(static_cast<char*>(out.raw()) + i * row_bytes, w.slice_rows(rows[i], rows[i] + 1).raw(), row_bytes);
  }
  return out;
}

Tensor select_cols(const Tensor& w, int64_t begin, int64_t end) {
  if (w.ndim() != 2) fail("[select_cols] needs a matrix, got ", w.shape_str());
  if (begin < 0 || end > w.dim(1) || begin >= end)
    fail("[select_cols] columns [", begin, ", ", end, ") of ", w.shape_str());
  if (w.device() != Device::CPU) return to_device(select_cols(to_device(w, Device::CPU), begin, end), w.device());
  if (!w.is_contiguous()) fail("[select_cols] needs a contiguous matrix");
  if (w.is_quantized() && (begin % w.quant().group != 0 || end % w.quant().group != 0))  // columns that split a block
    return select_cols(dequantize(w, dequantized_cpu_type(w.quant())), begin, end);
  const int64_t shape[] = {w.dim(0), end - begin};
  Tensor out = w.is_quantized() ? empty_quantized(w.quant(), shape, 2) : Tensor::empty(w.dtype(), shape, 2);
  const size_t n = out.row_bytes(), skip = w.slice_cols(0, begin).row_bytes();
  for (int64_t r = 0; r < w.dim(0); ++r)
    std::memcpy(static_cast<char*>(out.raw()) + size_t(r) * n,
                static_cast<const char*>(w.raw()) + size_t(r) * w.row_bytes() + skip, n);
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

uint64_t scratch_generation(Device d) { return d == Device::CUDA ? cuda::scratch_generation() : 0; }

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
