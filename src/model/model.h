// A loaded model: a forward over a flattened batch of rows.
//
// Each row is (KV blocks of one sequence, first position, tokens) and may be a
// prefill chunk, one decode token or a verify window; positions are per row.
// The model returns logits only for the positions asked for.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backend/executor.h"
#include "backend/kv_cache.h"
#include "backend/ops.h"
#include "backend/placement.h"
#include "core/tensor.h"

namespace augur {

struct ModelInfo {
  std::string model_type;       // config.json model_type, e.g. "qwen3"
  std::string architecture;     // e.g. "Qwen3ForCausalLM"
  int64_t n_layer = 0;
  int64_t d_model = 0;
  int64_t n_vocab = 0;           // token ids [0, n_vocab)
  // The token ids of the LM head's rows where it covers only some (a draft
  // vocabulary: Model::with_head_rows); empty: every token, in order.
  std::vector<int32_t> head_rows;
  int64_t max_position = 0;     // max_position_embeddings
  int64_t n_params = 0;         // parameters held by the model
  int64_t weight_bytes = 0;     // bytes of those parameters as stored
  int64_t decode_weight_bytes = 0;  // weight bytes one decode step reads
  std::vector<int32_t> eos_ids; // config.json + generation_config.json
  int32_t bos_id = -1;
  Placement placement;          // where weights, activations and the cache live
  // Logits a token: n_vocab, or the draft vocabulary's size.
  int64_t n_logits() const { return head_rows.empty() ? n_vocab : int64_t(head_rows.size()); }
  KvSpec kv;
  RecurrentSpec recurrent;      // n_layer 0: no recurrent state
};

struct ForwardRow {
  std::span<const int32_t> tokens;
  int32_t pos0 = 0;                     // position of tokens[0]
  std::span<const int32_t> block_table; // blocks covering [0, pos0 + tokens.size())
  int32_t n_logits = 1;                 // logits for the last n_logits tokens
  // Recurrent-state slot of the row's sequence (models with recurrent layers;
  // others ignore it). The forward continues the state in it and leaves the
  // state after the row's last token; a row at pos0 0 starts from the empty
  // state whatever the slot held. Rows of one forward use distinct slots.
  int32_t state_slot = -1;
};

// Hidden states a forward reads beside its tokens or leaves beside its
// logits (draft heads and the drafters that feed them).
struct HiddenIo {
  // [n_tokens, d_model] f32 on the model's device: a draft head's second
  // input per token (an MTP head: its target's hidden state), or undefined.
  Tensor in;
  // [n_tokens, d_model] f32 on the model's device: filled with each token's
  // final hidden state (after the final norm, what the LM head reads), or
  // undefined.
  Tensor out;
};

// A row of Model::replay_recurrent: the recurrent state in `slot` is at
// position pos0 and goes on over the next n_tokens positions, whose inputs
// a verify window left in the slot's history.
struct ReplayRow {
  int32_t slot = -1;
  int32_t pos0 = 0;
  int32_t n_tokens = 0;
};

class Model {
 public:
  virtual ~Model() = default;
  const ModelInfo& info() const { return info_; }
  // One forward over a flattened batch, run by `executor` (made for the
  // model's placement). logits: [sum of rows' n_logits, info().n_logits()] f32, rows in order,
  // on the host or the executor's device. ids: the rows' token ids already on
  // the device ([n_tokens] i32: a previous step's samples), the rows' tokens
  // then only counting them; or undefined. taps: records intermediate
  // tensors by name and layer ("embed.0", "attn_out.i", "mlp_out.i", "hidden.i":
  // the residual stream after layer i), or null.
  void forward(Executor& executor, std::span<const ForwardRow> rows, KvCache& kv, const Tensor& logits,
               const Tensor& ids = Tensor(), Taps* taps = nullptr, const HiddenIo& hidden = {});

  // Rolls recurrent state forward over tokens fed before (a rollback's kept
  // drafts): each row's slot, put back to the state at pos0, leaves the
  // state after pos0 + n_tokens, bit for bit what the forward that fed them
  // left there, reading only the inputs that forward kept
  // (KvCache::kInputHistory positions a slot) and no weight matrix. Run by an
  // executor of its own (its recordings are of this work, not forwards).
  void replay_recurrent(Executor& executor, std::span<const ReplayRow> rows, KvCache& kv);

  // The checkpoint's multi-token-prediction head, null when it has none: a
  // model of its own (own KV cache, one decoder layer) over pairs (token
  // t + 1, this model's final hidden state at t) that predicts token t + 2,
  // sharing this model's embedding and LM head (HiddenIo::in carries the
  // hidden states). It lives as long as this model.
  Model* mtp() const { return mtp_.get(); }
  // Whether forward reads HiddenIo::in (a draft head).
  bool reads_hidden() const { return reads_hidden_; }
  // This model with its LM head cut to the rows of `ids` (a draft
  // vocabulary: token ids, most frequent first; logits then follow that
  // order, ModelInfo::head_rows), sharing every other weight with this one,
  // which must outlive it. Its MTP head, if any, is not carried over.
  virtual std::unique_ptr<Model> with_head_rows(std::span<const int32_t> ids) const = 0;

 protected:
  // Checks the rows against the cache and readies their state (host work
  // before the forward: a recurrent row at position 0 starts from the empty state).
  virtual void prepare(std::span<const ForwardRow> rows, KvCache& kv) = 0;
  // The forward's ops (an Executor::Body, with kv and taps).
  virtual void layers(const BatchPlan& plan, KvCache& kv, Scratch& scratch, const Tensor& logits, Taps* taps,
                      const HiddenIo& hidden) = 0;
  // replay_recurrent's ops over every recurrent layer (an Executor::Body
  // with kv): the plan's rows and positions are the tokens replayed.
  virtual void replay_layers(const BatchPlan& plan, KvCache& kv, Scratch& scratch) = 0;

  ModelInfo info_;
  std::unique_ptr<Model> mtp_;
  bool reads_hidden_ = false;
};

// Loads a Hugging Face checkpoint directory (config.json + safetensors), its
// weights kept as `placement` says (the host by default), showing progress on
// a terminal. Unknown model_type is an error
// listing the supported ones.
// Loads a checkpoint's MTP head too where it ships one (Model::mtp()).
std::unique_ptr<Model> load_model(const std::string& dir, const Placement& placement = Placement());

// A model of a known shape with random weights made in memory, for benchmarks
// (see synthetic_model_names()).
std::unique_ptr<Model> make_synthetic_model(const std::string& name, uint64_t seed = 0,
                                            const Placement& placement = Placement());
std::vector<std::string> synthetic_model_names();

}  // namespace augur
