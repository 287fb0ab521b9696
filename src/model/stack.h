// The decoder stack every family composes: embedding, pre-norm residual
// blocks, final norm and LM head,
//   x += mixer(rms_norm(x)); x += mlp(rms_norm(x))
// where a block's mixer is self-attention (plain or output-gated) or a Gated
// DeltaNet, and its MLP a SwiGLU or a sparse MoE. A family file reads its
// config and its checkpoint's names into StackWeights (norm conventions such
// as 1 + γ resolved at load) and calls make_stack_model.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "model/gated_deltanet.h"
#include "model/layers.h"
#include "model/model.h"
#include "model/moe.h"

namespace augur {

class WeightSource;

struct StackConfig : TransformerDims {
  std::vector<float> inv_freq;  // [rot_dim / 2] (RoPE, possibly partial)
  GatedDeltaNetShape gdn;       // linear-attention layers, where there are any
};

struct Block {
  bool linear = false;         // mixer: Gated DeltaNet (true) or self-attention
  Tensor attn_norm;            // [d_model] f32
  AttentionWeights attn;       // self-attention layers
  GatedDeltaNetWeights gdn;    // linear-attention layers
  Tensor mlp_norm;             // [d_model] f32
  bool moe = false;            // MLP: sparse MoE (true) or SwiGLU
  MlpWeights mlp;
  MoeWeights experts;
};

// A draft head's input (an MTP head's): in place of the embedding alone,
//   x = fc_embed · norm_embed(embed(token)) + fc_hidden · norm_hidden(hidden)
// where hidden is the target's final hidden state (HiddenIo::in); the
// checkpoint's fc over the concatenation [embedding | hidden] split in two.
// Qwen3.5 / Qwen3-Next name them pre_fc_norm_embedding, pre_fc_norm_hidden
// and fc; DeepSeek-V3 / GLM heads name the same parts enorm, hnorm and
// eh_proj, and their shared_head (norm, head) is this stack's final norm and
// head.
struct HeadInput {
  Tensor norm_embed, norm_hidden;  // [d_model] f32
  Tensor fc_embed, fc_hidden;      // [d_model, d_model]
  bool defined() const { return fc_embed.defined(); }
};

struct StackWeights {
  HeadInput input;             // draft heads only
  Tensor embed;                // [n_vocab, d_model]
  std::vector<Block> layers;
  Tensor final_norm;           // [d_model] f32
  Tensor head;                 // [n_vocab, d_model]
};

// `info` carries the family's identity; shapes and sizes are filled in here
// (`src` for the parameter counts and the RoPE table's placement).
// mtp: the checkpoint's MTP head (a stack model with weights.input), owned by
// the model made here, or null.
std::unique_ptr<Model> make_stack_model(const StackConfig& cfg, StackWeights weights, WeightSource& src,
                                        ModelInfo info, std::unique_ptr<Model> mtp = nullptr);

}  // namespace augur
