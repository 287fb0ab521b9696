#include "model/hybrid.h"

#include <cmath>
#include <string>

#include "core/error.h"
#include "io/json_config.h"
#include "model/rope.h"
#include "backend/device.h"
#include "model/weights.h"

namespace augur {

HybridConfig read_hybrid_config(const JsonConfig& cfg) {
  HybridConfig c;
  for (const char* key : {"head_dim", "linear_key_head_dim", "linear_value_head_dim", "linear_num_key_heads",
                          "linear_num_value_heads"})
    if (cfg.get_int(key) <= 0) cfg.error(key, "must be positive");
  static_cast<TransformerDims&>(c) = read_transformer_dims(cfg);
  if (!cfg.get_bool("attn_output_gate", true))
    cfg.error("attn_output_gate", "false is not supported: the hybrid families gate their attention output");
  // Qwen3_5TextConfig / Qwen3NextConfig default partial_rotary_factor to 0.25.
  c.inv_freq = rope_inv_freq(cfg, c.head_dim, 0.25);

  c.gdn.n_head_k = cfg.get_int("linear_num_key_heads");
  c.gdn.n_head = cfg.get_int("linear_num_value_heads");
  c.gdn.head_dim_k = cfg.get_int("linear_key_head_dim");
  c.gdn.head_dim_v = cfg.get_int("linear_value_head_dim");
  c.gdn.conv_kernel = cfg.get_int("linear_conv_kernel_dim", 4);
  c.gdn.norm_eps = c.rms_eps;
  if (c.gdn.n_head % c.gdn.n_head_k != 0)
    cfg.error("linear_num_value_heads", "must be a multiple of linear_num_key_heads (" +
                                            std::to_string(c.gdn.n_head_k) + ")");
  if (c.gdn.conv_kernel < 1) cfg.error("linear_conv_kernel_dim", "must be positive");

  // Layer pattern: layer_types (legacy names remapped as transformers'
  // remap_legacy_layer_types does), else every full_attention_interval-th layer.
  if (cfg.has("layer_types") && !cfg.is_null("layer_types")) {
    const auto types = cfg.get_string_list("layer_types");
    if (int64_t(types.size()) != c.n_layer)
      cfg.error("layer_types", "has " + std::to_string(types.size()) + " entries for " +
                                   std::to_string(c.n_layer) + " layers");
    for (size_t i = 0; i < types.size(); ++i) {
      const std::string& t = types[i];
      if (t == "linear_attention" || t == "mamba")
        c.linear.push_back(true);
      else if (t == "full_attention" || t == "attention")
        c.linear.push_back(false);
      else
        cfg.error("layer_types", "entry " + std::to_string(i) + " '" + t +
                                     "' is not supported (linear_attention, full_attention)");
    }
  } else {
    const int64_t interval = cfg.get_int("full_attention_interval", 4);
    if (interval <= 0) cfg.error("full_attention_interval", "must be positive");
    for (int64_t i = 0; i < c.n_layer; ++i) c.linear.push_back((i + 1) % interval != 0);
  }
  return c;
}

MoeConfig read_moe_config(const JsonConfig& cfg) {
  MoeConfig m;
  for (const char* key : {"num_experts", "num_experts_per_tok", "moe_intermediate_size"})
    if (cfg.get_int(key) <= 0) cfg.error(key, "must be positive");
  m.n_expert = cfg.get_int("num_experts");
  m.n_expert_used = cfg.get_int("num_experts_per_tok");
  m.d_ff_expert = cfg.get_int("moe_intermediate_size");
  m.d_ff_shared = cfg.get_int("shared_expert_intermediate_size", 0);
  if (m.d_ff_shared < 0) cfg.error("shared_expert_intermediate_size", "must not be negative");
  if (m.n_expert_used > m.n_expert) cfg.error("num_experts_per_tok", "exceeds num_experts");
  return m;
}

Tensor load_centred_norm(WeightSource& w, const std::string& name, int64_t n) {
  return w.vector_f32(name, n, 1.0f);  // Qwen3NextRMSNorm: x_normed * (1 + weight)
}

AttentionWeights load_gated_attention(WeightSource& w, const std::string& p, const HybridConfig& c) {
  const int64_t d = c.d_model, q_dim = c.n_head * c.head_dim, kv_dim = c.n_head_kv * c.head_dim;
  AttentionWeights a;
  a.output_gate = true;
  const Tensor qkv[] = {w.matrix(p + "self_attn.q_proj.weight", {2 * q_dim, d}),  // per head: query, gate
                        w.matrix(p + "self_attn.k_proj.weight", {kv_dim, d}),
                        w.matrix(p + "self_attn.v_proj.weight", {kv_dim, d})};
  a.wqkv = stack_rows(qkv);
  a.wo = w.matrix(p + "self_attn.o_proj.weight", {d, q_dim});
  if (c.attention_bias) {
    a.bqkv = stack_vectors({w.vector_f32(p + "self_attn.q_proj.bias", 2 * q_dim),
                            w.vector_f32(p + "self_attn.k_proj.bias", kv_dim),
                            w.vector_f32(p + "self_attn.v_proj.bias", kv_dim)});
    a.bo = w.vector_f32(p + "self_attn.o_proj.bias", d);
  }
  a.q_norm = load_centred_norm(w, p + "self_attn.q_norm.weight", c.head_dim);
  a.k_norm = load_centred_norm(w, p + "self_attn.k_norm.weight", c.head_dim);
  return a;
}

void load_deltanet_common(WeightSource& w, const std::string& p, const HybridConfig& c,
                          GatedDeltaNetWeights& out) {
  const GatedDeltaNetShape& s = c.gdn;
  const std::string q = p + "linear_attn.";
  // nn.Conv1d(groups=C) weight [C, 1, K] -> [C, K]
  out.conv = w.tensor_f32(q + "conv1d.weight", {s.conv_dim(), 1, s.conv_kernel})
                 .reshape({s.conv_dim(), s.conv_kernel});
  out.a_log = w.vector_f32(q + "A_log", s.n_head);
  out.dt_bias = w.vector_f32(q + "dt_bias", s.n_head);
  out.norm = w.vector_f32(q + "norm.weight", s.head_dim_v);  // RMSNormGated: γ as stored
  out.out = w.matrix(q + "out_proj.weight", {c.d_model, s.value_dim()});
}

MoeWeights load_moe(WeightSource& w, const std::string& p, int64_t d_model, const MoeConfig& m) {
  MoeWeights e;
  e.n_expert_used = m.n_expert_used;
  e.norm_topk = m.norm_topk;
  e.router = w.matrix(p + "mlp.gate.weight", {m.n_expert, d_model});
  const int64_t E = m.n_expert, I = m.d_ff_expert;
  std::vector<Tensor> gate_up, down;  // per expert: gate then up; down
  if (w.has(p + "mlp.experts.gate_up_proj")) {
    // Fused experts (Qwen3NextExperts): gate_up [E, 2I, d] (gate rows first), down [E, d, I].
    const Tensor gu = w.matrix(p + "mlp.experts.gate_up_proj", {E, 2 * I, d_model});
    const Tensor dn = w.matrix(p + "mlp.experts.down_proj", {E, d_model, I});
    for (int64_t x = 0; x < E; ++x) {
      gate_up.push_back(gu.slice_rows(x, x + 1).reshape({2 * I, d_model}));
      down.push_back(dn.slice_rows(x, x + 1).reshape({d_model, I}));
    }
  } else if (w.has(p + "mlp.switch_mlp.gate_proj.weight")) {
    // mlx-lm's SwitchGLU: gate and up [E, I, d], down [E, d, I].
    const std::string q = p + "mlp.switch_mlp.";
    const Tensor g = w.matrix(q + "gate_proj.weight", {E, I, d_model});
    const Tensor u = w.matrix(q + "up_proj.weight", {E, I, d_model});
    const Tensor dn = w.matrix(q + "down_proj.weight", {E, d_model, I});
    for (int64_t x = 0; x < E; ++x) {
      gate_up.push_back(g.slice_rows(x, x + 1).reshape({I, d_model}));
      gate_up.push_back(u.slice_rows(x, x + 1).reshape({I, d_model}));
      down.push_back(dn.slice_rows(x, x + 1).reshape({d_model, I}));
    }
  } else {
    for (int64_t x = 0; x < E; ++x) {
      const std::string q = p + "mlp.experts." + std::to_string(x) + ".";
      gate_up.push_back(w.matrix(q + "gate_proj.weight", {I, d_model}));
      gate_up.push_back(w.matrix(q + "up_proj.weight", {I, d_model}));
      down.push_back(w.matrix(q + "down_proj.weight", {d_model, I}));
    }
  }
  e.gate_up = stack_experts(gate_up, E);
  e.down = stack_experts(down, E);
  if (m.d_ff_shared > 0) {
    e.shared = load_swiglu(w, p + "mlp.shared_expert.", d_model, m.d_ff_shared);
    e.shared_gate = w.matrix(p + "mlp.shared_expert_gate.weight", {1, d_model});
  }
  return e;
}

std::unique_ptr<Model> load_mtp_head(const JsonConfig& cfg, WeightSource& w, const HybridConfig& c,
                                     const StackWeights& trunk, const ModelInfo& info,
                                     const std::function<void(const std::string& p, Block& l)>& load_mlp) {
  const int64_t n_layer = cfg.get_int("mtp_num_hidden_layers", 0);
  if (n_layer < 0) cfg.error("mtp_num_hidden_layers", "must not be negative");
  if (n_layer == 0) return nullptr;
  std::string root;
  for (const char* p : {"mtp.", "model.mtp.", "language_model.mtp.", "model.language_model.mtp."})
    if (w.has(std::string(p) + "fc.weight")) {
      root = p;
      break;
    }
  if (root.empty()) return nullptr;  // stripped by a conversion: the model loads without its head
  const int64_t d = c.d_model;
  HybridConfig hc = c;
  hc.n_layer = n_layer;
  hc.linear.assign(size_t(n_layer), false);
  StackWeights hw;
  hw.input.norm_embed = load_centred_norm(w, root + "pre_fc_norm_embedding.weight", d);
  hw.input.norm_hidden = load_centred_norm(w, root + "pre_fc_norm_hidden.weight", d);
  const Tensor fc = w.matrix(root + "fc.weight", {d, 2 * d});
  hw.input.fc_embed = select_cols(fc, 0, d);
  hw.input.fc_hidden = select_cols(fc, d, 2 * d);
  hw.embed = trunk.embed;
  for (int64_t i = 0; i < n_layer; ++i) {
    const std::string p = root + "layers." + std::to_string(i) + ".";
    Block l;
    l.attn_norm = load_centred_norm(w, p + "input_layernorm.weight", d);
    l.attn = load_gated_attention(w, p, c);
    l.mlp_norm = load_centred_norm(w, p + "post_attention_layernorm.weight", d);
    load_mlp(p, l);
    hw.layers.push_back(std::move(l));
  }
  hw.final_norm = load_centred_norm(w, root + "norm.weight", d);
  hw.head = trunk.head;
  ModelInfo mi;
  mi.model_type = info.model_type + " mtp";
  mi.architecture = info.architecture + " MTP head";
  mi.eos_ids = info.eos_ids;
  mi.bos_id = info.bos_id;
  mi.placement = info.placement;
  return make_stack_model(hc, std::move(hw), w, std::move(mi));
}

}  // namespace augur
