// Qwen3.5 (Qwen3_5ForCausalLM, and the language model of
// Qwen3_5ForConditionalGeneration) and Qwen3.5-MoE, one file: the blocks are
// the same but for the MLP.
//   layers: Gated DeltaNet (separate in_proj_qkv / in_proj_z / in_proj_b /
//   in_proj_a) or gated full attention, by layer_types; MLP dense SwiGLU
//   (qwen3_5) or sparse MoE with a gated shared expert on every layer
//   (qwen3_5_moe, routing weights always renormalised: Qwen3_5MoeTopKRouter).
// model_type qwen3_5_text / qwen3_5_moe_text is a text checkpoint
// (model.layers.*); qwen3_5 / qwen3_5_moe nest the text config under
// text_config and keep the text model under model.language_model.* (the vision
// tower is not loaded; mtp.* becomes the model's MTP head, hybrid.h).
// Checkpoint generations: the transformers export above, and mlx-lm's
// converted layout (language_model.model.* / language_model.lm_head, conv1d
// kernels [C, K, 1], and the 1 + γ norm gains stored already shifted, except
// the gated norm inside the DeltaNet), told apart by the conv kernel's shape.
#include <string>

#include "core/progress.h"
#include "io/json_config.h"
#include "model/hybrid.h"
#include "model/registry.h"
#include "model/weights.h"

namespace augur {

namespace {

// Reference: mlx_lm.models.qwen3_5.TextModel.sanitize, which moves the conv
// kernel axis and shifts these gains when converting; a converted checkpoint
// is recognised by its conv kernel being already moved.
void set_view(WeightSource& w, const HybridConfig& c) {
  CheckpointView view;
  if (w.has_stored("language_model.model.embed_tokens.weight"))
    view.renames = {{"model.", "language_model.model."}, {"lm_head.", "language_model.lm_head."}};
  w.set_view(view);
  int64_t first_linear = -1;
  for (int64_t i = 0; i < c.n_layer && first_linear < 0; ++i)
    if (c.linear[size_t(i)]) first_linear = i;
  if (first_linear < 0) return;
  const std::string conv = "model.layers." + std::to_string(first_linear) + ".linear_attn.conv1d.weight";
  const std::vector<int64_t> shape = w.stored_shape(w.stored_name(conv));
  if (shape.size() == 3 && shape[2] == 1 && shape[1] == c.gdn.conv_kernel && c.gdn.conv_kernel > 1) {
    view.name = "mlx-lm";
    view.kernel_last = {"conv1d.weight"};
    view.shifted_gains = {".input_layernorm.weight", ".post_attention_layernorm.weight", "model.norm.weight",
                          ".q_norm.weight", ".k_norm.weight"};
    w.set_view(view);
  }
}

std::unique_ptr<Model> make(const JsonConfig& top, WeightSource& w, ModelInfo info, bool moe) {
  const bool nested = top.has("text_config") && !top.is_null("text_config");
  const JsonConfig cfg = nested ? top.sub("text_config") : top;
  HybridConfig c = read_hybrid_config(cfg);
  if (nested && !cfg.has("tie_word_embeddings")) c.tie_embeddings = top.get_bool("tie_word_embeddings", false);
  if (nested && info.eos_ids.empty() && cfg.has("eos_token_id") && !cfg.is_null("eos_token_id"))
    for (int64_t id : cfg.get_int_list("eos_token_id")) info.eos_ids.push_back(int32_t(id));
  int64_t d_ff = 0;
  if (!moe) {
    d_ff = cfg.get_int("intermediate_size");
    if (d_ff <= 0) cfg.error("intermediate_size", "must be positive");
  }
  MoeConfig m;
  if (moe) {
    m = read_moe_config(cfg);
    m.norm_topk = true;
  }

  set_view(w, c);
  const std::string root = w.has("model.language_model.embed_tokens.weight") ? "model.language_model." : "model.";
  const int64_t d = c.d_model;
  const GatedDeltaNetShape& s = c.gdn;
  StackWeights hw;
  Progress progress("loading weights", c.n_layer + 1);
  hw.embed = w.matrix(root + "embed_tokens.weight", {c.n_vocab, d});
  for (int64_t i = 0; i < c.n_layer; ++i) {
    const std::string p = root + "layers." + std::to_string(i) + ".";
    Block l;
    l.linear = c.linear[size_t(i)];
    l.attn_norm = load_centred_norm(w, p + "input_layernorm.weight", d);
    if (l.linear) {
      const std::string q = p + "linear_attn.";
      const Tensor in[] = {w.matrix(q + "in_proj_qkv.weight", {s.conv_dim(), d}),
                           w.matrix(q + "in_proj_z.weight", {s.value_dim(), d}),
                           w.matrix(q + "in_proj_b.weight", {s.n_head, d}),
                           w.matrix(q + "in_proj_a.weight", {s.n_head, d})};
      l.gdn.in_all = stack_rows(in);
      load_deltanet_common(w, p, c, l.gdn);
    } else {
      l.attn = load_gated_attention(w, p, c);
    }
    l.mlp_norm = load_centred_norm(w, p + "post_attention_layernorm.weight", d);
    l.moe = moe;
    if (moe)
      l.experts = load_moe(w, p, d, m);
    else
      l.mlp = load_swiglu(w, p + "mlp.", d, d_ff);
    hw.layers.push_back(std::move(l));
    progress.update(i + 1);
  }
  hw.final_norm = load_centred_norm(w, root + "norm.weight", d);
  hw.head = c.tie_embeddings ? hw.embed : w.matrix("lm_head.weight", {c.n_vocab, d});
  std::unique_ptr<Model> mtp = load_mtp_head(cfg, w, c, hw, info, [&](const std::string& p, Block& l) {
    l.moe = moe;
    if (moe)
      l.experts = load_moe(w, p, d, m);
    else
      l.mlp = load_swiglu(w, p + "mlp.", d, d_ff);
  });
  progress.update(c.n_layer + 1);
  return make_stack_model(c, std::move(hw), w, std::move(info), std::move(mtp));
}

}  // namespace

std::unique_ptr<Model> make_qwen3_5(const JsonConfig& cfg, WeightSource& weights, ModelInfo info) {
  return make(cfg, weights, std::move(info), false);
}

std::unique_ptr<Model> make_qwen3_5_moe(const JsonConfig& cfg, WeightSource& weights, ModelInfo info) {
  return make(cfg, weights, std::move(info), true);
}

}  // namespace augur
