// Tensor views over refcounted buffers.
//
// A Buffer owns (or pins) bytes on one device: an aligned host allocation, or
// a range of a memory-mapped checkpoint kept alive by the mapping. A Tensor is
// a view: dtype, shape, strides (in elements) and a byte offset into a buffer.
// Copying a Tensor copies the view, never the data.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>

#include "core/dtype.h"

namespace augur {

enum class Device : uint8_t { CPU, CUDA };

class Buffer {
 public:
  virtual ~Buffer() = default;
  virtual void* data() = 0;
  virtual size_t size() const = 0;
  virtual Device device() const { return Device::CPU; }
};

// Host memory aligned to 64 bytes (one cache line, one AVX-512 vector),
// zero-filled unless Fill::None. Fill::None is for buffers every user writes
// before reading (a forward's scratch), whose first touch is then the
// kernel's own write instead of a memset pass before it: augur-tiny's first
// 391-token prefill on CPU, in a fresh process, 1,543 -> 1,657 tok/s (median
// of 6).
enum class Fill : uint8_t { Zero, None };
class HostBuffer final : public Buffer {
 public:
  explicit HostBuffer(size_t bytes, Fill fill = Fill::Zero);
  ~HostBuffer() override;
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;
  void* data() override { return ptr_; }
  size_t size() const override { return size_; }

 private:
  void* ptr_ = nullptr;
  size_t size_ = 0;
};

// Bytes that live inside another object (a mapped file): `owner` keeps them alive.
class BorrowedBuffer final : public Buffer {
 public:
  BorrowedBuffer(std::shared_ptr<const void> owner, void* ptr, size_t size)
      : owner_(std::move(owner)), ptr_(ptr), size_(size) {}
  void* data() override { return ptr_; }
  size_t size() const override { return size_; }

 private:
  std::shared_ptr<const void> owner_;
  void* ptr_;
  size_t size_;
};

constexpr int kMaxDims = 4;

// How a QAFFINE tensor [.., N, K] stores each row: K / group blocks of
// {scale, bias, codes} (core/quant.h says what they mean).
struct QuantLayout {
  uint8_t bits = 0;           // 2, 3, 4, 5, 6 or 8
  uint16_t group = 0;         // values a block: 32, 64 or 128
  DType scale = DType::BF16;  // scale and bias: BF16, F16 or F32
  size_t block_bytes() const { return 2 * dtype_size(scale) + size_t(group) * bits / 8; }
  bool operator==(const QuantLayout&) const = default;
};

class Tensor {
 public:
  Tensor() = default;
  // A fresh zero-filled contiguous host tensor.
  static Tensor empty(DType dtype, std::initializer_list<int64_t> shape);
  static Tensor empty(DType dtype, const int64_t* shape, int ndim);
  // A fresh contiguous host tensor whose contents are undefined (Fill::None).
  static Tensor uninitialized(DType dtype, const int64_t* shape, int ndim);
  // A contiguous view over `buf` starting at `offset` bytes.
  static Tensor view_of(std::shared_ptr<Buffer> buf, size_t offset, DType dtype,
                        const int64_t* shape, int ndim);
  // A contiguous QAFFINE view: rows of the last dimension in `q`'s blocks
  // (that dimension a multiple of q.group).
  static Tensor quantized_view(std::shared_ptr<Buffer> buf, size_t offset, const QuantLayout& q,
                               const int64_t* shape, int ndim);

  bool defined() const { return buf_ != nullptr; }
  DType dtype() const { return dtype_; }
  int ndim() const { return ndim_; }
  int64_t dim(int i) const { return shape_[i < 0 ? i + ndim_ : i]; }
  int64_t stride(int i) const { return stride_[i < 0 ? i + ndim_ : i]; }
  const std::array<int64_t, kMaxDims>& shape() const { return shape_; }
  int64_t numel() const;
  size_t nbytes() const { return bytes_of(numel()); }
  // QAFFINE: its blocks' layout (bits 0 for other dtypes).
  const QuantLayout& quant() const { return quant_; }
  bool is_quantized() const { return dtype_ == DType::QAFFINE; }
  // Bytes of one row of the last dimension, as stored.
  size_t row_bytes() const { return bytes_of(ndim_ ? shape_[ndim_ - 1] : 1); }
  bool is_contiguous() const;
  Device device() const { return buf_ ? buf_->device() : Device::CPU; }
  const std::shared_ptr<Buffer>& buffer() const { return buf_; }

  void* raw() const { return static_cast<char*>(buf_->data()) + offset_; }
  template <typename T>
  T* data() const { return static_cast<T*>(raw()); }

  // Same bytes, new contiguous shape (numel must match; source contiguous).
  Tensor reshape(std::initializer_list<int64_t> shape) const;
  // Rows [begin, end) of the outermost dimension.
  Tensor slice_rows(int64_t begin, int64_t end) const;
  // Columns [begin, end) of a 2-D tensor: a view whose rows keep the parent's
  // stride (contiguous only when it keeps every column).
  Tensor slice_cols(int64_t begin, int64_t end) const;

  std::string shape_str() const;  // "[2, 64]"
  // Element i (in storage order) of a contiguous host f32, bf16 or f16
  // tensor, as f32; another dtype is an error naming it.
  float float_at(int64_t i) const {
    switch (dtype_) {
      case DType::F32: return data<float>()[i];
      case DType::BF16: return bf16_to_f32(data<uint16_t>()[i]);
      case DType::F16: return f16_to_f32(data<uint16_t>()[i]);
      default: not_float();
    }
  }

 private:
  [[noreturn]] void not_float() const;
  // Bytes of `elems` elements in storage order (QAFFINE: whole blocks).
  size_t bytes_of(int64_t elems) const {
    return is_quantized() ? size_t(elems / quant_.group) * quant_.block_bytes() : size_t(elems) * dtype_size(dtype_);
  }
  static Tensor make(std::shared_ptr<Buffer> buf, size_t offset, DType dtype, const QuantLayout& q,
                     const int64_t* shape, int ndim);
  std::shared_ptr<Buffer> buf_;
  size_t offset_ = 0;
  DType dtype_ = DType::F32;
  int ndim_ = 0;
  std::array<int64_t, kMaxDims> shape_{};
  std::array<int64_t, kMaxDims> stride_{};
  QuantLayout quant_;
};

}  // namespace augur
