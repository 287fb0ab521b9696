#include "core/tensor.h"

#include <cstdlib>
#include <cstring>
#include <new>
#include <sstream>

#include "core/error.h"

namespace augur {

HostBuffer::HostBuffer(size_t bytes, Fill fill) : size_(bytes) {
  const size_t rounded = bytes == 0 ? 64 : (bytes + 63) / 64 * 64;
  ptr_ = std::aligned_alloc(64, rounded);
  if (!ptr_) throw std::bad_alloc();
#ifdef NDEBUG
  if (fill == Fill::Zero) std::memset(ptr_, 0, rounded);
#else
  // Debug and sanitizer builds fill the unfilled with NaN (every bit set),
  // so that a read before the first write shows in tests.
  std::memset(ptr_, fill == Fill::Zero ? 0 : 0xff, rounded);
#endif
}

HostBuffer::~HostBuffer() { std::free(ptr_); }

Tensor Tensor::empty(DType dtype, std::initializer_list<int64_t> shape) {
  return empty(dtype, shape.begin(), int(shape.size()));
}

Tensor Tensor::empty(DType dtype, const int64_t* shape, int ndim) {
  int64_t n = 1;
  for (int i = 0; i < ndim; ++i) n *= shape[i];
  auto buf = std::make_shared<HostBuffer>(size_t(n) * dtype_size(dtype));
  return view_of(std::move(buf), 0, dtype, shape, ndim);
}

Tensor Tensor::uninitialized(DType dtype, const int64_t* shape, int ndim) {
  int64_t n = 1;
  for (int i = 0; i < ndim; ++i) n *= shape[i];
  auto buf = std::make_shared<HostBuffer>(size_t(n) * dtype_size(dtype), Fill::None);
  return view_of(std::move(buf), 0, dtype, shape, ndim);
}

Tensor Tensor::view_of(std::shared_ptr<Buffer> buf, size_t offset, DType dtype,
                       const int64_t* shape, int ndim) {
  AUGUR_ASSERT(dtype != DType::QAFFINE, "a quantized view needs its layout (quantized_view)");
  return make(std::move(buf), offset, dtype, QuantLayout{}, shape, ndim);
}

Tensor Tensor::quantized_view(std::shared_ptr<Buffer> buf, size_t offset, const QuantLayout& q,
                              const int64_t* shape, int ndim) {
  AUGUR_ASSERT(ndim >= 1 && q.group > 0 && shape[ndim - 1] % q.group == 0, "quantized rows split into blocks");
  return make(std::move(buf), offset, DType::QAFFINE, q, shape, ndim);
}

Tensor Tensor::make(std::shared_ptr<Buffer> buf, size_t offset, DType dtype, const QuantLayout& q,
                    const int64_t* shape, int ndim) {
  AUGUR_ASSERT(ndim >= 0 && ndim <= kMaxDims, "tensor rank out of range");
  Tensor t;
  t.buf_ = std::move(buf);
  t.offset_ = offset;
  t.dtype_ = dtype;
  t.quant_ = q;
  t.ndim_ = ndim;
  int64_t s = 1;
  for (int i = ndim - 1; i >= 0; --i) {
    t.shape_[i] = shape[i];
    t.stride_[i] = s;
    s *= shape[i];
  }
  AUGUR_ASSERT(offset + t.bytes_of(s) <= t.buf_->size(), "view exceeds buffer");
  return t;
}

int64_t Tensor::numel() const {
  int64_t n = 1;
  for (int i = 0; i < ndim_; ++i) n *= shape_[i];
  return n;
}

bool Tensor::is_contiguous() const {
  int64_t s = 1;
  for (int i = ndim_ - 1; i >= 0; --i) {
    if (shape_[i] != 1 && stride_[i] != s) return false;
    s *= shape_[i];
  }
  return true;
}

Tensor Tensor::reshape(std::initializer_list<int64_t> shape) const {
  AUGUR_ASSERT(is_contiguous(), "reshape of a non-contiguous view");
  AUGUR_ASSERT(!is_quantized() || (shape.size() > 0 && *(shape.end() - 1) == shape_[ndim_ - 1]),
               "a quantized reshape keeps its rows");
  Tensor t = make(buf_, offset_, dtype_, quant_, shape.begin(), int(shape.size()));
  AUGUR_ASSERT(t.numel() == numel(), "reshape changes the element count");
  return t;
}

Tensor Tensor::slice_rows(int64_t begin, int64_t end) const {
  AUGUR_ASSERT(ndim_ >= 1 && begin >= 0 && begin <= end && end <= shape_[0], "bad row slice");
  AUGUR_ASSERT(!is_quantized() || ndim_ >= 2, "a quantized row slice takes whole rows");
  Tensor t = *this;
  t.offset_ = offset_ + bytes_of(begin * stride_[0]);
  t.shape_[0] = end - begin;
  return t;
}

Tensor Tensor::slice_cols(int64_t begin, int64_t end) const {
  AUGUR_ASSERT(ndim_ == 2 && begin >= 0 && begin <= end && end <= shape_[1], "bad column slice");
  AUGUR_ASSERT(!is_quantized() || (begin % quant_.group == 0 && end % quant_.group == 0),
               "a quantized column slice takes whole blocks");
  Tensor t = *this;
  t.offset_ = offset_ + bytes_of(begin * stride_[1]);
  t.shape_[1] = end - begin;
  return t;
}

void Tensor::not_float() const { fail("[tensor] ", dtype_name(dtype_), " is not a float type"); }

std::string Tensor::shape_str() const {
  std::ostringstream os;
  os << '[';
  for (int i = 0; i < ndim_; ++i) os << (i ? ", " : "") << shape_[i];
  os << ']';
  return os.str();
}

}  // namespace augur
