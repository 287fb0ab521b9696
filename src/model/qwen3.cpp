// Qwen3 (Qwen3ForCausalLM): the Llama block plus an RMSNorm over each query
// and key head before RoPE (q_norm, k_norm); embeddings often tied.
#include "io/json_config.h"
#include "model/decoder.h"
#include "model/registry.h"

namespace augur {

std::unique_ptr<Model> make_qwen3(const JsonConfig& cfg, WeightSource& weights, ModelInfo info) {
  DecoderConfig c = read_decoder_config(cfg);
  c.qk_norm = true;
  // Qwen3 layers may use a sliding window only when use_sliding_window is set,
  // which no released checkpoint does; refuse it rather than ignore it.
  if (cfg.get_bool("use_sliding_window", false))
    cfg.error("use_sliding_window", "sliding-window Qwen3 is not supported yet");
  return make_decoder_model(c, weights, std::move(info));
}

}  // namespace augur
