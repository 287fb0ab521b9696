#include "model/decoder.h"

#include <cmath>

#include "core/error.h"
#include "core/progress.h"
#include "io/json_config.h"
#include "model/layers.h"
#include "model/rope.h"
#include "model/weights.h"

namespace augur {

DecoderConfig read_decoder_config(const JsonConfig& cfg) {
  DecoderConfig c;
  static_cast<TransformerDims&>(c) = read_transformer_dims(cfg);
  c.d_ff = cfg.get_int("intermediate_size");
  if (c.d_ff <= 0) cfg.error("intermediate_size", "must be positive");
  c.mlp_bias = cfg.get_bool("mlp_bias", false);
  c.inv_freq = rope_inv_freq(cfg, c.head_dim);
  return c;
}

std::unique_ptr<Model> make_decoder_model(const DecoderConfig& cfg, WeightSource& w, ModelInfo info) {
  const int64_t d = cfg.d_model, q_dim = cfg.n_head * cfg.head_dim, kv_dim = cfg.n_head_kv * cfg.head_dim;
  StackWeights sw;
  Progress progress("loading weights", cfg.n_layer + 1);
  sw.embed = w.matrix("model.embed_tokens.weight", {cfg.n_vocab, d});  // [n_vocab, d_model]
  for (int64_t i = 0; i < cfg.n_layer; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    Block l;
    l.attn_norm = w.vector_f32(p + "input_layernorm.weight", d);
    const Tensor qkv[] = {w.matrix(p + "self_attn.q_proj.weight", {q_dim, d}),
                          w.matrix(p + "self_attn.k_proj.weight", {kv_dim, d}),
                          w.matrix(p + "self_attn.v_proj.weight", {kv_dim, d})};
    l.attn.wqkv = stack_rows(qkv);
    l.attn.wo = w.matrix(p + "self_attn.o_proj.weight", {d, q_dim});
    if (cfg.attention_bias) {
      l.attn.bqkv = stack_vectors({w.vector_f32(p + "self_attn.q_proj.bias", q_dim),
                                   w.vector_f32(p + "self_attn.k_proj.bias", kv_dim),
                                   w.vector_f32(p + "self_attn.v_proj.bias", kv_dim)});
      l.attn.bo = w.vector_f32(p + "self_attn.o_proj.bias", d);
    }
    if (cfg.qk_norm) {
      l.attn.q_norm = w.vector_f32(p + "self_attn.q_norm.weight", cfg.head_dim);
      l.attn.k_norm = w.vector_f32(p + "self_attn.k_norm.weight", cfg.head_dim);
    }
    l.mlp_norm = w.vector_f32(p + "post_attention_layernorm.weight", d);
    l.mlp = load_swiglu(w, p + "mlp.", d, cfg.d_ff, cfg.mlp_bias);
    sw.layers.push_back(std::move(l));
    progress.update(i + 1);
  }
  sw.final_norm = w.vector_f32("model.norm.weight", d);
  sw.head = cfg.tie_embeddings ? sw.embed : w.matrix("lm_head.weight", {cfg.n_vocab, d});
  progress.update(cfg.n_layer + 1);
  return make_stack_model(cfg, std::move(sw), w, std::move(info));
}

}  // namespace augur
