// Where a family gets its weights: a checkpoint on disk, or random values of
// the right shapes made in memory (synthetic benchmarks). Families ask by
// canonical name and expected shape; a missing tensor or a shape that does not
// match is an error naming the tensor and where it was looked for.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "backend/placement.h"
#include "core/tensor.h"
#include "io/quantization.h"

namespace augur {

class Checkpoint;

// How one checkpoint generation stores what a family reads by canonical
// (transformers) name and value: other name prefixes, norm gains stored
// already shifted (1 + γ where the family reads γ), depthwise conv kernels
// stored [C, K, 1] where the family reads [C, 1, K]. A family detects the
// generation from the tensors themselves and sets the view before loading.
struct CheckpointView {
  std::string name = "transformers";  // for messages
  std::vector<std::pair<std::string, std::string>> renames;  // canonical prefix -> stored prefix, first match wins
  std::vector<std::string> shifted_gains;  // name suffixes: stored = canonical + 1
  std::vector<std::string> kernel_last;    // name suffixes: canonical [C, 1, K] stored as [C, K, 1]
};

class WeightSource {
 public:
  virtual ~WeightSource() = default;
  // Whether the tensor of that canonical name is present (through the view).
  bool has(std::string_view name) const { return has_stored(stored_name(name)); }
  // The stored shape of a stored name, empty when absent (detecting generations).
  virtual std::vector<int64_t> stored_shape(std::string_view stored) const = 0;
  virtual bool has_stored(std::string_view stored) const = 0;

  void set_view(CheckpointView view) { view_ = std::move(view); }
  const CheckpointView& view() const { return view_; }
  std::string stored_name(std::string_view canonical) const;

  // A weight used by matmul/embedding, as the placement keeps it.
  Tensor matrix(std::string_view name, std::initializer_list<int64_t> shape);
  // A 1-D gain or bias as an f32 copy, with `add` added to every element
  // (1 + γ norm conventions).
  Tensor vector_f32(std::string_view name, int64_t n, float add = 0.0f);
  // A small tensor of any rank (conv kernels) as an f32 copy of the stored shape.
  Tensor tensor_f32(std::string_view name, std::initializer_list<int64_t> shape);

  // A table the model computes (RoPE frequencies), placed as vectors are.
  Tensor constant_f32(std::span<const float> values) const;

  // Where and how matrix(), vector_f32(), tensor_f32() and constant_f32()
  // keep what they return (the host, as stored, by default).
  void set_placement(const Placement& p) { placement_ = p; }

  int64_t n_params() const { return n_params_; }
  int64_t bytes() const { return bytes_; }

 protected:
  // The stored tensor of that name, checked against `shape`.
  virtual Tensor fetch(std::string_view name, const std::vector<int64_t>& shape, bool is_vector) = 0;

 private:
  // fetch() through the view: renamed, reshaped, gains unshifted (f32 copy then).
  Tensor fetch_canonical(std::string_view name, const std::vector<int64_t>& shape, bool is_vector);
  CheckpointView view_;
  Placement placement_;
  int64_t n_params_ = 0;
  int64_t bytes_ = 0;
};

// Affine-quantized matrices (mlx-community checkpoints, `quant` from their
// config.json) are read as QAFFINE tensors (core/quant.h): the CPU keeps them
// packed, other devices dequantize them as they place them.
std::unique_ptr<WeightSource> checkpoint_weights(std::shared_ptr<const Checkpoint> ckpt,
                                                 const QuantConfig& quant = {});
// Matrices ~ U(-a, a) with a = sqrt(3 / fan_in) (std 1/sqrt(fan_in)), vectors
// near 1, as bf16; deterministic for a seed.
std::unique_ptr<WeightSource> synthetic_weights(uint64_t seed);

}  // namespace augur
