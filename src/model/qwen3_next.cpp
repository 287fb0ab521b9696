// Qwen3-Next (Qwen3NextForCausalLM): the Qwen3.5 hybrid blocks with fused
// DeltaNet projections and sparse MoE MLPs.
//   in_proj_qkvz [n_head_k * (2 dk + 2 r dv), d_model] holds, per key head g,
//   q_g, k_g, then the r = n_head / n_head_k value heads of v and of z that g
//   serves; in_proj_ba [n_head_k * 2r, d_model] holds, per key head, r rows of
//   b then r of a (fix_query_key_value_ordering). Load regroups their rows into
//   the canonical q | k | v, z, b, a matrices (a copy), so the forward is the
//   shared one.
//   MoE on layer i unless i is in mlp_only_layers or (i + 1) is not a multiple
//   of decoder_sparse_step (then a dense SwiGLU of intermediate_size);
//   norm_topk_prob as configured. mtp.* becomes the model's MTP head (hybrid.h).
#include <algorithm>
#include <string>
#include <vector>

#include "core/progress.h"
#include "io/json_config.h"
#include "model/hybrid.h"
#include "model/registry.h"
#include "model/weights.h"

namespace augur {

namespace {

// Row indices regrouping in_proj_qkvz into [q | k | v] and [z].
void qkvz_rows(const GatedDeltaNetShape& s, std::vector<int64_t>& qkv, std::vector<int64_t>& z) {
  const int64_t r = s.n_head / s.n_head_k, dk = s.head_dim_k, vz = r * s.head_dim_v;
  const int64_t group = 2 * dk + 2 * vz;
  for (int64_t part : {0, 1})  // q, then k
    for (int64_t g = 0; g < s.n_head_k; ++g)
      for (int64_t i = 0; i < dk; ++i) qkv.push_back(g * group + part * dk + i);
  for (int64_t g = 0; g < s.n_head_k; ++g)
    for (int64_t i = 0; i < vz; ++i) {
      qkv.push_back(g * group + 2 * dk + i);
      z.push_back(g * group + 2 * dk + vz + i);
    }
}

// Row indices regrouping in_proj_ba into [b] and [a].
void ba_rows(const GatedDeltaNetShape& s, std::vector<int64_t>& b, std::vector<int64_t>& a) {
  const int64_t r = s.n_head / s.n_head_k;
  for (int64_t g = 0; g < s.n_head_k; ++g)
    for (int64_t i = 0; i < r; ++i) {
      b.push_back(g * 2 * r + i);
      a.push_back(g * 2 * r + r + i);
    }
}

}  // namespace

std::unique_ptr<Model> make_qwen3_next(const JsonConfig& cfg, WeightSource& w, ModelInfo info) {
  HybridConfig c = read_hybrid_config(cfg);
  const int64_t d = c.d_model;
  const GatedDeltaNetShape& s = c.gdn;
  const int64_t n_expert = cfg.get_int("num_experts", 0);
  MoeConfig m;
  if (n_expert > 0) {
    m = read_moe_config(cfg);
    m.norm_topk = cfg.get_bool("norm_topk_prob", true);
  }
  const int64_t sparse_step = cfg.get_int("decoder_sparse_step", 1);
  if (sparse_step <= 0) cfg.error("decoder_sparse_step", "must be positive");
  std::vector<int64_t> mlp_only;
  if (cfg.has("mlp_only_layers") && !cfg.is_null("mlp_only_layers")) mlp_only = cfg.get_int_list("mlp_only_layers");
  auto is_moe = [&](int64_t i) {
    return n_expert > 0 && (i + 1) % sparse_step == 0 &&
           std::find(mlp_only.begin(), mlp_only.end(), i) == mlp_only.end();
  };
  int64_t d_ff = 0;
  for (int64_t i = 0; i < c.n_layer; ++i)
    if (!is_moe(i)) {
      d_ff = cfg.get_int("intermediate_size");
      if (d_ff <= 0) cfg.error("intermediate_size", "must be positive");
      break;
    }

  std::vector<int64_t> qkv_rows, z_rows, b_rows, a_rows;
  qkvz_rows(s, qkv_rows, z_rows);
  ba_rows(s, b_rows, a_rows);

  StackWeights hw;
  Progress progress("loading weights", c.n_layer + 1);
  hw.embed = w.matrix("model.embed_tokens.weight", {c.n_vocab, d});
  for (int64_t i = 0; i < c.n_layer; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    Block l;
    l.linear = c.linear[size_t(i)];
    l.attn_norm = load_centred_norm(w, p + "input_layernorm.weight", d);
    if (l.linear) {
      const std::string q = p + "linear_attn.";
      const Tensor qkvz = w.matrix(q + "in_proj_qkvz.weight", {s.conv_dim() + s.value_dim(), d});
      const Tensor ba = w.matrix(q + "in_proj_ba.weight", {2 * s.n_head, d});
      // Regrouped into the canonical [q | k | v], z, b, a, stacked.
      const Tensor in[] = {select_rows(qkvz, qkv_rows), select_rows(qkvz, z_rows), select_rows(ba, b_rows),
                           select_rows(ba, a_rows)};
      l.gdn.in_all = stack_rows(in);
      load_deltanet_common(w, p, c, l.gdn);
    } else {
      l.attn = load_gated_attention(w, p, c);
    }
    l.mlp_norm = load_centred_norm(w, p + "post_attention_layernorm.weight", d);
    l.moe = is_moe(i);
    if (l.moe)
      l.experts = load_moe(w, p, d, m);
    else
      l.mlp = load_swiglu(w, p + "mlp.", d, d_ff);
    hw.layers.push_back(std::move(l));
    progress.update(i + 1);
  }
  hw.final_norm = load_centred_norm(w, "model.norm.weight", d);
  hw.head = c.tie_embeddings ? hw.embed : w.matrix("lm_head.weight", {c.n_vocab, d});
  // The MTP layer's MLP: sparse MoE where the model has experts.
  std::unique_ptr<Model> mtp = load_mtp_head(cfg, w, c, hw, info, [&](const std::string& p, Block& l) {
    l.moe = n_expert > 0;
    if (l.moe)
      l.experts = load_moe(w, p, d, m);
    else
      l.mlp = load_swiglu(w, p + "mlp.", d, cfg.get_int("intermediate_size"));
  });
  progress.update(c.n_layer + 1);
  return make_stack_model(c, std::move(hw), w, std::move(info), std::move(mtp));
}

}  // namespace augur
