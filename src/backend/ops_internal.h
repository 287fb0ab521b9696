// Shared by the ops' implementation files (ops_*.cpp), not public: argument
// checks (a failure names the op and the offending shapes: a bug in the
// calling model code) and the conversions from tensors to the CUDA kernels'
// raw arguments.
#pragma once

#include <cstddef>
#include <initializer_list>
#include <memory>
#include <utility>

#include "backend/cuda/kernels.h"
#include "backend/cuda/memory.h"
#include "backend/ops.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/tensor.h"

namespace augur::ops::detail {

template <typename... Parts>
void require(bool ok, const char* op, Parts&&... parts) {
  if (!ok) fail("[", op, "] ", std::forward<Parts>(parts)...);
}

inline int64_t rows_of(const Tensor& t) { return t.ndim() == 0 ? 1 : t.numel() / t.dim(-1); }
inline bool on_cuda(const Tensor& t) { return t.defined() && t.device() == Device::CUDA; }
inline bool is_half(DType t) { return t == DType::BF16 || t == DType::F16; }

// A contiguous f32 tensor on the CPU (ops with no accelerator implementation).
inline void require_cpu_f32(const char* op, const Tensor& t, const char* name) {
  require(t.defined(), op, name, " is undefined");
  require(t.device() == Device::CPU, op, name, ": no implementation for this device in this build");
  require(t.dtype() == DType::F32, op, name, " must be F32, got ", dtype_name(t.dtype()));
  require(t.is_contiguous(), op, name, " must be contiguous");
}

// A contiguous f32 activation on `dev`.
inline void require_f32(const char* op, const Tensor& t, const char* name, Device dev) {
  require(t.defined(), op, name, " is undefined");
  require(t.device() == dev, op, name, " is on another device");
  require(t.dtype() == DType::F32, op, name, " must be F32, got ", dtype_name(t.dtype()));
  require(t.is_contiguous(), op, name, " must be contiguous");
}

// An f32 activation on the op's device: the CPU, or CUDA in a CUDA build.
inline void require_on(const char* op, const Tensor& t, const char* name, Device dev) {
  if (dev == Device::CPU)
    require_cpu_f32(op, t, name);
  else
    require_f32(op, t, name, dev);
}

inline void require_all_on(const char* op, Device dev,
                           std::initializer_list<std::pair<const Tensor*, const char*>> ts) {
  for (const auto& [t, name] : ts) require_on(op, *t, name, dev);
}

inline const cuda::half_bits* half_ptr(const Tensor& t) { return static_cast<const cuda::half_bits*>(t.raw()); }
inline cuda::half_bits* half_ptr_mut(const Tensor& t) { return static_cast<cuda::half_bits*>(t.raw()); }
// The kernels' name for a 16-bit float dtype.
inline cuda::Half half_of(const Tensor& t) { return t.dtype() == DType::F16 ? cuda::Half::F16 : cuda::Half::BF16; }

// A device copy of a small host array (on the backend stream).
inline std::shared_ptr<Buffer> upload_bytes(const void* src, size_t bytes) {
  auto buf = cuda::allocate(bytes);
  cuda::copy_to_device(buf->data(), src, bytes);
  return buf;
}

}  // namespace augur::ops::detail
