// The Llama block structure shared by dense decoder families:
//   x += attn(rms_norm(x)); x += swiglu_mlp(rms_norm(x))
// with optional per-head q/k norms (Qwen3), biases and tied embeddings.
// Families parse their config into DecoderConfig and name their weights.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "model/model.h"

namespace augur {

class JsonConfig;
class WeightSource;

struct DecoderConfig {
  int64_t d_model = 0, n_layer = 0, n_head = 0, n_head_kv = 0, head_dim = 0, d_ff = 0;
  int64_t n_vocab = 0, max_position = 0;
  float rms_eps = 1e-6f;
  bool tie_embeddings = false;
  bool attention_bias = false;  // q/k/v/o biases
  bool mlp_bias = false;
  bool qk_norm = false;         // RMSNorm over each q/k head (Qwen3)
  std::vector<float> inv_freq;  // [rot_dim / 2]
};

// The fields every Llama-like config.json has, validated (a missing or
// contradictory field is an error naming it).
DecoderConfig read_decoder_config(const JsonConfig& cfg);

// Builds the model, reading weights by their transformers names
// (model.layers.N.self_attn.q_proj.weight, ...). `info` carries the family's
// identity; shapes and sizes are filled in here.
std::unique_ptr<Model> make_decoder_model(const DecoderConfig& cfg, WeightSource& weights, ModelInfo info);

}  // namespace augur
