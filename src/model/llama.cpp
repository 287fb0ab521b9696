// Llama (LlamaForCausalLM): the plain pre-norm decoder; RoPE default or llama3
// scaling; optional attention / MLP biases.
#include "io/json_config.h"
#include "model/decoder.h"
#include "model/registry.h"

namespace augur {

std::unique_ptr<Model> make_llama(const JsonConfig& cfg, WeightSource& weights, ModelInfo info) {
  DecoderConfig c = read_decoder_config(cfg);
  return make_decoder_model(c, weights, std::move(info));
}

}  // namespace augur
