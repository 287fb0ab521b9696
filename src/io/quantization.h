// mlx-lm's affine quantization, as mlx-community checkpoints store it.
//
// A matrix w [.., out, in] of module P is stored as three tensors:
//   P.weight  U32 [.., out, in * bits / 32]: each row a little-endian bit
//             stream, value j at bits [j * bits, (j + 1) * bits) (3, 5 and 6
//             bits cross word boundaries);
//   P.scales  [.., out, in / group_size] and
//   P.biases  [.., out, in / group_size], in the checkpoint's float type;
// and w[.., o, j] = scales[.., o, g] * q[.., o, j] + biases[.., o, g] with
// g = j / group_size. config.json says so under "quantization":
//   {"group_size": 64, "bits": 4, "mode": "affine",
//    "model.layers.0.mlp.gate": {"group_size": 64, "bits": 8}, ...}
// with per-module entries overriding the default (false: left in floats).
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>

#include "core/tensor.h"

namespace augur {

class JsonConfig;

struct AffineQuant {
  int bits = 4;
  int group_size = 64;
};

// Throws naming `what` unless bits is 2, 3, 4, 5, 6 or 8 and group_size 32,
// 64 or 128 (mlx's choices).
void check_affine(const AffineQuant& q, std::string_view what);

class QuantConfig {
 public:
  // config.json's "quantization" (or none). A transformers quantizer
  // ("quantization_config" with a "quant_method": GPTQ, AWQ, FP8, ...) or an
  // mlx mode other than affine (mxfp4, nvfp4, ...) is an error naming it.
  static QuantConfig from(const JsonConfig& cfg);
  bool any() const { return present_; }
  // The spec of module `module` ("model.layers.0.mlp.gate"); none where the
  // config leaves that module in floats.
  std::optional<AffineQuant> for_module(std::string_view module) const;

 private:
  bool present_ = false;
  AffineQuant default_;
  std::map<std::string, std::optional<AffineQuant>, std::less<>> modules_;
};

// The float matrix [.., out, in] of a stored triple, in the scales' dtype (as
// mlx's dequantize gives it). `name` labels errors (shapes that do not agree
// with q and in).
Tensor dequantize_affine(const Tensor& packed, const Tensor& scales, const Tensor& biases, const AffineQuant& q,
                         int64_t in, std::string_view name);

// Quantizes a float matrix [.., out, in] (in % group_size == 0; `name`
// labels errors): each group's bias is its minimum rounded down to bf16 and
// its scale the step to its maximum rounded up, so every weight lies in the
// group's range and dequantize_affine gives it back to within half a step
// (and the result's own bf16 rounding). Non-finite weights are an error.
struct AffineTriple {
  Tensor weight, scales, biases;  // U32, BF16, BF16
};
AffineTriple quantize_affine(const Tensor& w, const AffineQuant& q, std::string_view name = "matrix");

}  // namespace augur

namespace augur {

// `augur quantize`: writes to `out` (created; it must be empty or new, and
// not inside `dir`) the checkpoint of `dir` with its matrices affine-quantized as
// mlx-lm writes them, and config.json's "quantization" saying so; every
// other file (tokenizer, chat template, generation config) copied as it is.
// Quantized: float tensors named *.weight of two or more dimensions whose
// rows split into groups (embeddings, projections, experts, MTP heads); the
// MoE routers (*.mlp.gate, *.shared_expert_gate) at 8 bits, as mlx-lm
// quantizes them; norms, conv kernels and biases stay as they are.
struct QuantizeReport {
  int64_t quantized = 0, kept = 0;  // tensors
  size_t bytes_in = 0, bytes_out = 0;
  int shards = 0;
};
QuantizeReport quantize_checkpoint(const std::string& dir, const std::string& out, const AffineQuant& q,
                                   const std::function<void(int64_t done, int64_t total)>& progress = {});

}  // namespace augur
