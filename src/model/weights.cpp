#include "model/weights.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>

#include "core/error.h"
#include "core/thread_pool.h"
#include "io/checkpoint.h"

namespace augur {

namespace {

std::string shape_str(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

float to_f32(const Tensor& t, int64_t i) {
  switch (t.dtype()) {
    case DType::F32: return t.data<float>()[i];
    case DType::BF16: return bf16_to_f32(t.data<uint16_t>()[i]);
    case DType::F16: return f16_to_f32(t.data<uint16_t>()[i]);
    default: AUGUR_ASSERT(false, "non-float weight");
  }
  return 0;
}

class CheckpointWeights final : public WeightSource {
 public:
  explicit CheckpointWeights(std::shared_ptr<const Checkpoint> ckpt) : ckpt_(std::move(ckpt)) {}
  bool has_stored(std::string_view name) const override { return ckpt_->has(name); }
  std::vector<int64_t> stored_shape(std::string_view name) const override {
    return ckpt_->has(name) ? ckpt_->info(name).shape : std::vector<int64_t>{};
  }

 protected:
  Tensor fetch(std::string_view name, const std::vector<int64_t>& shape, bool) override {
    if (!ckpt_->has(name)) fail("[weights] ", ckpt_->dir(), ": missing tensor '", name, "'");
    const TensorInfo& info = ckpt_->info(name);
    if (info.shape != shape)
      fail("[weights] ", info.file, ": tensor '", name, "' has shape ", shape_str(info.shape),
           ", expected ", shape_str(shape));
    if (info.dtype != DType::F32 && info.dtype != DType::BF16 && info.dtype != DType::F16)
      fail("[weights] ", info.file, ": tensor '", name, "' has dtype ", dtype_name(info.dtype),
           ", expected a float type");
    return ckpt_->get(name);
  }

 private:
  std::shared_ptr<const Checkpoint> ckpt_;
};

class SyntheticWeights final : public WeightSource {
 public:
  explicit SyntheticWeights(uint64_t seed) : seed_(seed) {}
  bool has_stored(std::string_view) const override { return true; }
  std::vector<int64_t> stored_shape(std::string_view) const override { return {}; }

 protected:
  Tensor fetch(std::string_view name, const std::vector<int64_t>& shape, bool is_vector) override {
    Tensor t = Tensor::empty(DType::BF16, shape.data(), int(shape.size()));
    uint16_t* dst = t.data<uint16_t>();
    const float amp = is_vector ? 0.1f : std::sqrt(3.0f / float(shape.back()));
    const float center = is_vector ? 1.0f : 0.0f;
    const uint64_t base = seed_ * 0x9E3779B97F4A7C15ull + std::hash<std::string_view>{}(name);
    // Chunks are seeded by index, so the values do not depend on the thread count.
    constexpr int64_t kChunk = 1 << 16;
    const int64_t n = t.numel(), n_chunks = (n + kChunk - 1) / kChunk;
    ThreadPool::global().parallel_for(n_chunks, 1, [&](int64_t cb, int64_t ce) {
      for (int64_t c = cb; c < ce; ++c) {
        uint64_t s = base ^ (uint64_t(c) * 0xD1B54A32D192ED03ull);
        for (int64_t i = c * kChunk; i < std::min(n, (c + 1) * kChunk); ++i) {
          s ^= s << 13; s ^= s >> 7; s ^= s << 17;  // xorshift64
          float u = float(s >> 40) * (1.0f / float(1 << 24)) * 2.0f - 1.0f;
          dst[i] = f32_to_bf16(center + amp * u);
        }
      }
    });
    return t;
  }

 private:
  uint64_t seed_;
};

}  // namespace

namespace {

bool ends_with_any(std::string_view name, const std::vector<std::string>& suffixes) {
  for (const auto& s : suffixes)
    if (name.size() >= s.size() && name.substr(name.size() - s.size()) == s) return true;
  return false;
}

}  // namespace

std::string WeightSource::stored_name(std::string_view canonical) const {
  for (const auto& [from, to] : view_.renames)
    if (canonical.substr(0, from.size()) == from) return to + std::string(canonical.substr(from.size()));
  return std::string(canonical);
}

Tensor WeightSource::fetch_canonical(std::string_view name, const std::vector<int64_t>& shape, bool is_vector) {
  const std::string stored = stored_name(name);
  if (shape.size() == 3 && shape[1] == 1 && ends_with_any(name, view_.kernel_last)) {
    // [C, K, 1] holds the same bytes as [C, 1, K]: a new view, no copy.
    Tensor t = fetch(stored, {shape[0], shape[2], 1}, is_vector);
    return Tensor::view_of(t.buffer(), size_t(static_cast<char*>(t.raw()) - static_cast<char*>(t.buffer()->data())),
                           t.dtype(), shape.data(), 3);
  }
  Tensor t = fetch(stored, shape, is_vector);
  if (!ends_with_any(name, view_.shifted_gains)) return t;
  Tensor out = Tensor::empty(DType::F32, t.shape().data(), t.ndim());
  for (int64_t i = 0; i < t.numel(); ++i) out.data<float>()[i] = to_f32(t, i) - 1.0f;  // exact near 1
  return out;
}

Tensor WeightSource::matrix(std::string_view name, std::initializer_list<int64_t> shape) {
  Tensor t = fetch_canonical(name, std::vector<int64_t>(shape), false);
  n_params_ += t.numel();
  bytes_ += int64_t(t.nbytes());
  return placement_.matrix(t);
}

Tensor WeightSource::vector_f32(std::string_view name, int64_t n, float add) {
  Tensor t = fetch_canonical(name, {n}, true);
  n_params_ += t.numel();
  bytes_ += int64_t(t.nbytes());
  Tensor out = Tensor::empty(DType::F32, {n});
  for (int64_t i = 0; i < n; ++i) out.data<float>()[i] = to_f32(t, i) + add;
  return placement_.vector(out);
}

Tensor WeightSource::constant_f32(std::span<const float> values) const {
  Tensor out = Tensor::empty(DType::F32, {int64_t(values.size())});
  std::copy(values.begin(), values.end(), out.data<float>());
  return placement_.vector(out);
}

Tensor WeightSource::tensor_f32(std::string_view name, std::initializer_list<int64_t> shape) {
  Tensor t = fetch_canonical(name, std::vector<int64_t>(shape), false);
  n_params_ += t.numel();
  bytes_ += int64_t(t.nbytes());
  Tensor out = Tensor::empty(DType::F32, t.shape().data(), t.ndim());
  for (int64_t i = 0; i < t.numel(); ++i) out.data<float>()[i] = to_f32(t, i);
  return placement_.vector(out);
}

std::unique_ptr<WeightSource> checkpoint_weights(std::shared_ptr<const Checkpoint> ckpt) {
  return std::make_unique<CheckpointWeights>(std::move(ckpt));
}

std::unique_ptr<WeightSource> synthetic_weights(uint64_t seed) {
  return std::make_unique<SyntheticWeights>(seed);
}

}  // namespace augur
