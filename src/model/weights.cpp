#include "model/weights.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <optional>

#include "core/error.h"
#include "core/thread_pool.h"
#include "io/checkpoint.h"
#include "core/quant.h"
#include "io/quantization.h"

namespace augur {

namespace {

std::string shape_str(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

class CheckpointWeights final : public WeightSource {
 public:
  CheckpointWeights(std::shared_ptr<const Checkpoint> ckpt, QuantConfig quant)
      : ckpt_(std::move(ckpt)), quant_(std::move(quant)) {}
  bool has_stored(std::string_view name) const override { return ckpt_->has(name); }
  // A quantized matrix reports the shape it dequantizes to.
  std::vector<int64_t> stored_shape(std::string_view name) const override {
    if (!ckpt_->has(name)) return {};
    if (auto q = quantized(name)) return q->shape;
    return ckpt_->info(name).shape;
  }

 protected:
  Tensor fetch(std::string_view name, const std::vector<int64_t>& shape, bool) override {
    if (!ckpt_->has(name)) fail("[weights] ", ckpt_->dir(), ": missing tensor '", name, "'");
    const TensorInfo& info = ckpt_->info(name);
    const auto q = quantized(name);
    const std::vector<int64_t>& stored = q ? q->shape : info.shape;
    if (stored != shape)
      fail("[weights] ", info.file, ": tensor '", name, "' has shape ", shape_str(stored), ", expected ",
           shape_str(shape));
    if (q) return pack_affine(ckpt_->get(name), ckpt_->get(q->module + ".scales"), ckpt_->get(q->module + ".biases"),
                              q->spec.bits, q->spec.group_size, shape.back(), name);
    if (info.dtype != DType::F32 && info.dtype != DType::BF16 && info.dtype != DType::F16)
      fail("[weights] ", info.file, ": tensor '", name, "' has dtype ", dtype_name(info.dtype),
           ", expected a float type");
    return ckpt_->get(name);
  }

 private:
  struct Quantized {
    std::string module;        // the name less ".weight"
    AffineQuant spec;          // from config.json
    std::vector<int64_t> shape;  // dequantized
  };
  // An affine triple (U32 weight beside scales and biases), checked against
  // config.json's quantization; none for a float tensor.
  std::optional<Quantized> quantized(std::string_view name) const {
    constexpr std::string_view kSuffix = ".weight";
    if (name.size() <= kSuffix.size() || name.substr(name.size() - kSuffix.size()) != kSuffix) return std::nullopt;
    const TensorInfo& info = ckpt_->info(name);
    if (info.dtype != DType::U32) return std::nullopt;
    Quantized q;
    q.module = std::string(name.substr(0, name.size() - kSuffix.size()));
    if (!ckpt_->has(q.module + ".scales") || !ckpt_->has(q.module + ".biases"))
      fail("[weights] ", info.file, ": tensor '", name, "' is U32 (packed) but '", q.module, ".scales' or '",
           q.module, ".biases' is missing");
    const auto spec = quant_.for_module(q.module);
    if (!spec)
      fail("[weights] ", info.file, ": tensor '", name, "' is quantized but config.json's \"quantization\" ",
           quant_.any() ? "leaves that module in floats" : "is absent");
    q.spec = *spec;
    const std::vector<int64_t>& scales = ckpt_->info(q.module + ".scales").shape;
    q.shape = info.shape;
    if (q.shape.empty() || scales.size() != q.shape.size())
      fail("[weights] ", info.file, ": tensor '", name, "' ", shape_str(info.shape), " and its scales ",
           shape_str(scales), " do not agree");
    q.shape.back() = scales.back() * spec->group_size;
    if (q.shape.back() * spec->bits != info.shape.back() * 32)
      fail("[weights] ", info.file, ": tensor '", name, "' ", shape_str(info.shape), " with scales ",
           shape_str(scales), " is not ", spec->bits, "-bit in groups of ", spec->group_size,
           " as config.json says");
    return q;
  }

  std::shared_ptr<const Checkpoint> ckpt_;
  QuantConfig quant_;
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
  for (int64_t i = 0; i < t.numel(); ++i) out.data<float>()[i] = t.float_at(i) - 1.0f;  // exact near 1
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
  for (int64_t i = 0; i < n; ++i) out.data<float>()[i] = t.float_at(i) + add;
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
  for (int64_t i = 0; i < t.numel(); ++i) out.data<float>()[i] = t.float_at(i);
  return placement_.vector(out);
}

std::unique_ptr<WeightSource> checkpoint_weights(std::shared_ptr<const Checkpoint> ckpt, const QuantConfig& quant) {
  return std::make_unique<CheckpointWeights>(std::move(ckpt), quant);
}

std::unique_ptr<WeightSource> synthetic_weights(uint64_t seed) {
  return std::make_unique<SyntheticWeights>(seed);
}

}  // namespace augur
