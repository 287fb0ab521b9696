#include "core/quant.h"

#include <vector>

#include "core/error.h"
#include "core/thread_pool.h"

namespace augur {

namespace {

void round_f16_scalar(float* v, int n) {
  for (int i = 0; i < n; ++i) v[i] = f16_to_f32(f32_to_f16(v[i]));
}

}  // namespace

Tensor empty_quantized(const QuantLayout& q, const int64_t* shape, int ndim) {
  int64_t n = 1;
  for (int i = 0; i < ndim; ++i) n *= shape[i];
  auto buf = std::make_shared<HostBuffer>(size_t(n / q.group) * q.block_bytes(), Fill::None);
  return Tensor::quantized_view(std::move(buf), 0, q, shape, ndim);
}

Tensor pack_affine(const Tensor& codes, const Tensor& scales, const Tensor& biases, int bits, int group, int64_t in,
                   std::string_view name) {
  if ((bits < 2 || bits > 8 || bits == 7) || (group != 32 && group != 64 && group != 128))
    fail("[quantization] ", name, ": ", bits, " bits in groups of ", group,
         "; packed matrices take 2, 3, 4, 5, 6 or 8 bits in groups of 32, 64 or 128");
  if (codes.dtype() != DType::U32)
    fail("[quantization] ", name, ": packed weights are ", dtype_name(codes.dtype()), ", expected U32");
  if (scales.dtype() != DType::F32 && scales.dtype() != DType::BF16 && scales.dtype() != DType::F16)
    fail("[quantization] ", name, ": scales are ", dtype_name(scales.dtype()), ", expected a float type");
  const int nd = codes.ndim();
  const bool shapes_agree = [&] {
    if (nd < 2 || scales.ndim() != nd || biases.shape() != scales.shape() || biases.dtype() != scales.dtype())
      return false;
    for (int i = 0; i < nd - 1; ++i)
      if (scales.dim(i) != codes.dim(i)) return false;
    return in > 0 && in % group == 0 && in * bits % 32 == 0 && codes.dim(nd - 1) == in * bits / 32 &&
           scales.dim(nd - 1) == in / group;
  }();
  if (!shapes_agree)
    fail("[quantization] ", name, ": weight ", codes.shape_str(), ", scales ", scales.shape_str(), " and biases ",
         biases.shape_str(), " do not make rows of ", in, " values at ", bits, " bits in groups of ", group);
  if (!codes.is_contiguous() || !scales.is_contiguous() || !biases.is_contiguous())
    fail("[quantization] ", name, ": tensors not contiguous");
  const QuantLayout q{uint8_t(bits), uint16_t(group), scales.dtype()};
  std::vector<int64_t> shape(codes.shape().begin(), codes.shape().begin() + nd);
  shape.back() = in;
  const int64_t rows = codes.numel() / codes.dim(nd - 1), groups = in / group;
  const size_t bb = q.block_bytes(), sb = dtype_size(q.scale), code_bytes = size_t(group) * bits / 8;
  Tensor out = empty_quantized(q, shape.data(), nd);
  const auto* c = static_cast<const uint8_t*>(codes.raw());
  const auto* s = static_cast<const uint8_t*>(scales.raw());
  const auto* b = static_cast<const uint8_t*>(biases.raw());
  auto* d = static_cast<uint8_t*>(out.raw());
  ThreadPool::global().parallel_for(rows, 64, [&](int64_t rb, int64_t re) {
    for (int64_t i = rb * groups; i < re * groups; ++i) {
      uint8_t* block = d + size_t(i) * bb;
      std::memcpy(block, s + size_t(i) * sb, sb);
      std::memcpy(block + sb, b + size_t(i) * sb, sb);
      std::memcpy(block + 2 * sb, c + size_t(i) * code_bytes, code_bytes);
    }
  });
  return out;
}

void dequantize_rows(const QuantLayout& q, const void* src, int64_t rows, int64_t K, DType out, void* dst) {
  quant_detail::dequantize_rows_with(q, src, rows, K, out, dst, &round_f16_scalar);
}

Tensor dequantize(const Tensor& q) { return dequantize(q, q.is_quantized() ? q.quant().scale : DType::F32); }

Tensor dequantize(const Tensor& q, DType out_type) {
  if (!q.is_quantized() || !q.is_contiguous() || q.device() != Device::CPU)
    fail("[quantization] dequantize needs a contiguous host QAFFINE tensor, got ", dtype_name(q.dtype()), " ",
         q.shape_str());
  const int nd = q.ndim();
  const int64_t K = q.dim(nd - 1), rows = q.numel() / K;
  if (out_type != q.quant().scale && out_type != DType::F32)
    fail("[quantization] dequantize to ", dtype_name(out_type), ": the scales' type or F32 only");
  Tensor out = Tensor::uninitialized(out_type, q.shape().data(), nd);
  const size_t rb_bytes = q.row_bytes(), out_row = size_t(K) * dtype_size(out.dtype());
  ThreadPool::global().parallel_for(rows, 16, [&](int64_t rb, int64_t re) {
    dequantize_rows(q.quant(), static_cast<const uint8_t*>(q.raw()) + size_t(rb) * rb_bytes, re - rb, K,
                    out.dtype(), static_cast<uint8_t*>(out.raw()) + size_t(rb) * out_row);
  });
  return out;
}

}  // namespace augur
