// What the hybrid linear-attention families (Qwen3.5 dense and MoE,
// Qwen3-Next) share: their config and the loaders of the tensors they name
// alike. Their blocks (stack.h) mix with a Gated DeltaNet or gated full
// attention as `layer_types` says, the MLP a dense SwiGLU or a sparse MoE, and
// every RMSNorm outside the DeltaNet is zero-centred (gain 1 + γ).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "model/stack.h"

namespace augur {

class JsonConfig;
class WeightSource;

struct HybridConfig : StackConfig {
  std::vector<bool> linear;  // per layer: Gated DeltaNet (true) or full attention
};

// The fields every hybrid text config has, validated; the layer pattern from
// `layer_types` or, without it, `full_attention_interval` (default 4: every
// fourth layer is full attention).
HybridConfig read_hybrid_config(const JsonConfig& cfg);

// Loaders for the tensors the hybrid families name alike; `p` is the layer's
// prefix ("model.layers.3.").
Tensor load_centred_norm(WeightSource& w, const std::string& name, int64_t n);  // 1 + γ
AttentionWeights load_gated_attention(WeightSource& w, const std::string& p, const HybridConfig& c);
// conv1d, A_log, dt_bias, norm and out_proj of a Gated DeltaNet (the input
// projections differ between families: they set out.in_all).
void load_deltanet_common(WeightSource& w, const std::string& p, const HybridConfig& c,
                          GatedDeltaNetWeights& out);

struct MoeConfig {
  int64_t n_expert = 0, n_expert_used = 0, d_ff_expert = 0, d_ff_shared = 0;
  bool norm_topk = true;
};
// Reads num_experts, num_experts_per_tok, moe_intermediate_size,
// shared_expert_intermediate_size.
MoeConfig read_moe_config(const JsonConfig& cfg);
// mlp.gate, mlp.experts.{e}.{gate,up,down}_proj (or the fused
// mlp.experts.gate_up_proj / down_proj), mlp.shared_expert.*, mlp.shared_expert_gate.
MoeWeights load_moe(WeightSource& w, const std::string& p, int64_t d_model, const MoeConfig& m);

// The checkpoint's MTP head (Model::mtp()), or null where config.json's
// mtp_num_hidden_layers is 0 or absent or the checkpoint ships no mtp.*
// tensors (transformers and mlx-lm layouts: mtp.* beside the text model).
//   mtp.pre_fc_norm_embedding, mtp.pre_fc_norm_hidden [d] (1 + γ),
//   mtp.fc [d, 2d] over [embedding | hidden], mtp.layers.i.* gated
//   full-attention decoder layers (the MLP as the family's: load_mlp fills
//   it from the layer's prefix), mtp.norm [d] (1 + γ); the trunk's embedding
//   and LM head.
std::unique_ptr<Model> load_mtp_head(const JsonConfig& cfg, WeightSource& w, const HybridConfig& c,
                                     const StackWeights& trunk, const ModelInfo& info,
                                     const std::function<void(const std::string& p, Block& l)>& load_mlp);

}  // namespace augur
