// Models of known shapes with random weights, made in memory: benchmarks need
// the real shapes, not the real values.
#include <string>
#include <utility>

#include "core/error.h"
#include "io/json_config.h"
#include "model/registry.h"
#include "model/weights.h"

namespace augur {

namespace {

// config.json of each shape, as the published checkpoints have it.
const std::pair<const char*, const char*> kSynthetic[] = {
    {"qwen3-0.6b", R"({"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"],
      "hidden_size": 1024, "num_hidden_layers": 28, "num_attention_heads": 16,
      "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 3072,
      "vocab_size": 151936, "max_position_embeddings": 40960, "rms_norm_eps": 1e-6,
      "rope_theta": 1000000, "tie_word_embeddings": true, "eos_token_id": 151645})"},
    {"qwen3-1.7b", R"({"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"],
      "hidden_size": 2048, "num_hidden_layers": 28, "num_attention_heads": 16,
      "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 6144,
      "vocab_size": 151936, "max_position_embeddings": 40960, "rms_norm_eps": 1e-6,
      "rope_theta": 1000000, "tie_word_embeddings": true, "eos_token_id": 151645})"},
    {"qwen3-4b", R"({"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"],
      "hidden_size": 2560, "num_hidden_layers": 36, "num_attention_heads": 32,
      "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 9728,
      "vocab_size": 151936, "max_position_embeddings": 40960, "rms_norm_eps": 1e-6,
      "rope_theta": 1000000, "tie_word_embeddings": true, "eos_token_id": 151645})"},
    {"qwen3-8b", R"({"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"],
      "hidden_size": 4096, "num_hidden_layers": 36, "num_attention_heads": 32,
      "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 12288,
      "vocab_size": 151936, "max_position_embeddings": 40960, "rms_norm_eps": 1e-6,
      "rope_theta": 1000000, "tie_word_embeddings": false, "eos_token_id": 151645})"},
    {"llama3.2-1b", R"({"model_type": "llama", "architectures": ["LlamaForCausalLM"],
      "hidden_size": 2048, "num_hidden_layers": 16, "num_attention_heads": 32,
      "num_key_value_heads": 8, "head_dim": 64, "intermediate_size": 8192,
      "vocab_size": 128256, "max_position_embeddings": 131072, "rms_norm_eps": 1e-5,
      "rope_theta": 500000, "rope_scaling": {"rope_type": "llama3", "factor": 32.0,
      "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
      "tie_word_embeddings": true, "eos_token_id": [128001, 128008, 128009]})"},
    {"llama3.1-8b", R"({"model_type": "llama", "architectures": ["LlamaForCausalLM"],
      "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
      "num_key_value_heads": 8, "intermediate_size": 14336,
      "vocab_size": 128256, "max_position_embeddings": 131072, "rms_norm_eps": 1e-5,
      "rope_theta": 500000, "rope_scaling": {"rope_type": "llama3", "factor": 8.0,
      "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
      "tie_word_embeddings": false, "eos_token_id": [128001, 128008, 128009]})"},
    // Qwen3.5-27B's text_config (the published config.json nests it under a
    // multimodal "qwen3_5" config): 48 Gated DeltaNet + 16 gated attention
    // layers, and the MTP head the checkpoint ships (`--draft mtp`).
    {"qwen3.5-27b", R"({"model_type": "qwen3_5_text", "architectures": ["Qwen3_5ForCausalLM"],
      "hidden_size": 5120, "num_hidden_layers": 64, "num_attention_heads": 24,
      "num_key_value_heads": 4, "head_dim": 256, "intermediate_size": 17408,
      "vocab_size": 248320, "max_position_embeddings": 262144, "rms_norm_eps": 1e-6,
      "full_attention_interval": 4, "linear_conv_kernel_dim": 4,
      "linear_num_key_heads": 16, "linear_num_value_heads": 48,
      "linear_key_head_dim": 128, "linear_value_head_dim": 128, "attn_output_gate": true,
      "rope_parameters": {"rope_type": "default", "rope_theta": 10000000,
      "partial_rotary_factor": 0.25, "mrope_interleaved": true, "mrope_section": [11, 11, 10]},
      "mtp_num_hidden_layers": 1, "tie_word_embeddings": false, "eos_token_id": 248044})"},
};

}  // namespace

std::vector<std::string> synthetic_model_names() {
  std::vector<std::string> names;
  for (const auto& [name, cfg] : kSynthetic) names.emplace_back(name);
  return names;
}

std::unique_ptr<Model> make_synthetic_model(const std::string& name, uint64_t seed, const Placement& placement) {
  for (const auto& [n, text] : kSynthetic) {
    if (name != n) continue;
    const JsonConfig cfg = JsonConfig::parse(text, "synthetic:" + name);
    ModelInfo info;
    info.model_type = cfg.get_string("model_type");
    info.architecture = cfg.get_string_list("architectures")[0];
    for (int64_t id : cfg.get_int_list("eos_token_id")) info.eos_ids.push_back(int32_t(id));
    auto weights = synthetic_weights(seed);
    return build_model(cfg, *weights, std::move(info), placement);
  }
  std::string known;
  for (const auto& n : synthetic_model_names()) known += (known.empty() ? "" : ", ") + n;
  fail("[synthetic] unknown model '", name, "'; known: ", known);
}

}  // namespace augur
