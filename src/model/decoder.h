// The Llama block structure shared by dense decoder families:
//   x += attn(rms_norm(x)); x += swiglu_mlp(rms_norm(x))
// with optional per-head q/k norms (Qwen3), biases and tied embeddings.
// Families parse their config into DecoderConfig and name their weights.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "model/stack.h"

namespace augur {

class JsonConfig;
class WeightSource;

struct DecoderConfig : StackConfig {
  int64_t d_ff = 0;
  bool mlp_bias = false;
  bool qk_norm = false;  // RMSNorm over each q/k head (Qwen3)
};

// The fields every Llama-like config.json has, validated (a missing or
// contradictory field is an error naming it).
DecoderConfig read_decoder_config(const JsonConfig& cfg);

// Builds the model (every block self-attention and a SwiGLU), reading weights
// by their transformers names
// (model.layers.N.self_attn.q_proj.weight, ...). `info` carries the family's
// identity; shapes and sizes are filled in here.
std::unique_ptr<Model> make_decoder_model(const DecoderConfig& cfg, WeightSource& weights, ModelInfo info);

}  // namespace augur
