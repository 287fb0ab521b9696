#include "backend/placement.h"

#include "core/dtype.h"
#include "core/error.h"
#include "core/quant.h"

namespace augur {

void Placement::require_available() const {
  if (!device_available(device_))
    fail("[model] device ", device_name(device_), " is not available (no GPU, or a build without CUDA)");
}

Tensor Placement::matrix(const Tensor& stored) const {
  if (stored.is_quantized() && device_ != Device::CPU) return matrix(dequantize(stored));
  if (device_ == Device::CPU) {
    if (stored.dtype() != DType::F16) return stored;
    Tensor out = Tensor::empty(DType::F32, stored.shape().data(), stored.ndim());
    for (int64_t i = 0; i < stored.numel(); ++i) out.data<float>()[i] = stored.float_at(i);
    return out;
  }
  if (stored.dtype() == DType::F16 && device_half(device_) == DType::F16) return to_device(stored, device_);
  Tensor t = stored;
  if (t.dtype() != DType::BF16) {
    Tensor b = Tensor::empty(DType::BF16, t.shape().data(), t.ndim());
    for (int64_t i = 0; i < t.numel(); ++i) b.data<uint16_t>()[i] = f32_to_bf16(t.float_at(i));
    t = b;
  }
  t = to_device(t, device_);
  const bool f16 = device_half(device_) == DType::F16 && max_abs(t) <= 65504.0f;
  return f16 ? convert_half(t, DType::F16) : t;
}

Tensor Placement::vector(const Tensor& f32) const {
  return device_ == Device::CPU ? f32 : to_device(f32, device_);
}

}  // namespace augur
