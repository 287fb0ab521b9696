// Shared layers of decoder-only transformers. Family files compose these;
// each block names the transformers function it reproduces.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <tuple>
#include <span>
#include <string>
#include <vector>

#include "backend/device.h"
#include "backend/ops.h"
#include "core/tensor.h"
#include "model/model.h"

namespace augur {

class JsonConfig;

// The transformer dimensions every decoder config.json states, as all
// families read them (transformers' names), validated: a missing or
// contradictory field is an error naming it.
struct TransformerDims {
  int64_t d_model = 0, n_layer = 0, n_head = 0, n_head_kv = 0, head_dim = 0;
  int64_t n_vocab = 0, max_position = 0;
  float rms_eps = 1e-6f;
  bool tie_embeddings = false;
  bool attention_bias = false;  // q/k/v/o biases
};
// head_dim defaults to hidden_size / num_attention_heads when absent.
TransformerDims read_transformer_dims(const JsonConfig& cfg);

// The flattened batch: tokens of all rows back to back.
struct BatchPlan {
  std::vector<int32_t> tokens;        // [n_tokens]
  std::vector<int32_t> positions;     // [n_tokens]
  std::vector<ops::AttnRow> rows;     // one per ForwardRow
  std::vector<int32_t> logit_tokens;  // [n_out] batch indices whose logits are returned
  ops::DeviceBatch device;            // the layout on the model's accelerator, if any
  int64_t n_tokens() const { return int64_t(tokens.size()); }
  ops::BatchView view() const {
    return {rows, positions, device.tokens.defined() ? &device : nullptr};
  }
};

// Validates rows against the model (token ids < n_vocab, positions within
// max_position) and flattens them.
BatchPlan plan_batch(std::span<const ForwardRow> rows, int64_t n_vocab, int64_t max_position);

// Token ids of a forward that are still on the model's device (`ids`, [n_tokens]
// i32; undefined: none): on the host they replace the plan's tokens (checked
// against n_vocab); on an accelerator DeviceForward::run copies them into the
// uploaded layout.
void take_ids(BatchPlan& plan, const Tensor& ids, Device device, int64_t n_vocab);

// On an accelerator, uploads the plan's layout for a cache of `block_size`
// whose positions stay below `max_context`.
void upload_plan(BatchPlan& plan, Device device, int64_t block_size, int64_t max_context);

// Reusable activation buffers of one model on its device, keyed by a slot
// name; a buffer is reallocated only when a larger shape is asked for, so the
// addresses of a decode step repeat (as a captured CUDA graph needs).
class Scratch {
 public:
  explicit Scratch(Device device = Device::CPU) : device_(device) {}
  Tensor get(const std::string& slot, std::initializer_list<int64_t> shape);
  Device device() const { return device_; }

 private:
  Device device_;
  std::map<std::string, Tensor> buffers_;
};

// The forward of a model on an accelerator: uploads the plan's layout, runs
// `body` (which writes the logits of plan.logit_tokens into a device tensor)
// and copies the logits to `logits`, on the host or the device. Pure decode steps (every row
// one token, one logit) are recorded once per (cache, rows, context bucket)
// as a CUDA graph and replayed, with their own scratch buffers so their
// addresses never move; set AUGUR_CUDA_GRAPHS=0 to run them eagerly.
class DeviceForward {
 public:
  using Body = std::function<void(const BatchPlan& plan, Scratch& scratch, const Tensor& logits)>;
  // graphs false: every step runs eagerly (a body that uploads host data of
  // its own per step cannot be replayed).
  DeviceForward(Device device, int64_t n_vocab, bool graphs = true);
  // ids: the plan's token ids on the device (take_ids), or undefined.
  void run(BatchPlan& plan, const KvCache& kv, const Tensor& logits, const Body& body, const Tensor& ids = Tensor());

 private:
  struct Step {
    Scratch scratch;
    BatchPlan plan;  // the captured layout; refilled before each replay
    std::unique_ptr<CapturedWork> work;
    // What the recording addresses besides its scratch: the logits it writes
    // (the caller's device tensor, or null: its scratch, copied out) and the
    // ids it embeds (null: the uploaded ones). Others record it again.
    const void* logits_at = nullptr;
    const void* ids_at = nullptr;
  };
  Device device_;
  int64_t n_vocab_;
  bool graphs_;
  Scratch scratch_;  // eager forwards
  std::map<std::tuple<uint64_t, int64_t, int64_t>, std::unique_ptr<Step>> steps_;
};

// A host vector as a tensor on `device` (small constants: RoPE frequencies).
Tensor constant_f32(std::span<const float> values, Device device);

// The rows of `parts` stacked into one new matrix on their device: projections
// that share an input fused at load time. parts: [N_i, K] of one dtype.
Tensor stack_rows(std::initializer_list<Tensor> parts);

struct AttentionWeights {
  Tensor wq, wk, wv, wo;  // [n_head*head_dim, d_model], [n_head_kv*head_dim, d_model] x2, [d_model, n_head*head_dim]
  // wq, wk, wv stacked, [(n_head + 2 n_head_kv) * head_dim, d_model] (with
  // an output gate, wq's [2 n_head * head_dim] rows first): when defined (on
  // accelerators, no biases) it replaces them, and one pass does q/k norm,
  // RoPE and the cache writes.
  Tensor wqkv;
  Tensor bq, bk, bv, bo;  // optional biases, f32
  Tensor q_norm, k_norm;  // optional per-head RMSNorm gains [head_dim], f32 (Qwen3)
  // Gated attention (Qwen3NextAttention): wq is [n_head*2*head_dim, d_model]
  // and yields, per head, the query then a gate; the attention output is
  // multiplied by sigmoid(gate) before wo.
  bool output_gate = false;
};

struct AttentionShape {
  int64_t n_head = 0;
  int64_t n_head_kv = 0;
  int64_t head_dim = 0;
  float scale = 0;       // usually 1/sqrt(head_dim)
  int32_t window = 0;    // sliding window, 0 = none
  float norm_eps = 0;    // for q_norm / k_norm
};

// Self-attention of one layer (LlamaAttention / Qwen3Attention /
// Qwen3NextAttention.forward): project, optional per-head q/k norm, RoPE,
// write K/V, attend, optional sigmoid output gate, project out.
// x: [n_tokens, d_model] (already normed); out: [n_tokens, d_model]
void attention_block(const Tensor& x, const AttentionWeights& w, const AttentionShape& shape,
                     const Tensor& inv_freq, const BatchPlan& plan,
                     const ops::KvLayer& kv, const Tensor& out, Scratch& scratch);
// The same up to the output projection: returns its input, the attention
// output (gated where the layer has an output gate), [n_tokens, n_head*head_dim]
// in scratch.
// `projected`: x · wqkvᵀ already computed (block_tail's next projection), or
// undefined.
Tensor attention_mix(const Tensor& x, const AttentionWeights& w, const AttentionShape& shape, const Tensor& inv_freq,
                     const BatchPlan& plan, const ops::KvLayer& kv, Scratch& scratch,
                     const Tensor& projected = Tensor());

struct MlpWeights {
  Tensor gate, up;  // [d_ff, d_model]
  Tensor gate_up;   // gate and up stacked [2 d_ff, d_model]: replaces them when defined
  Tensor down;      // [d_model, d_ff]
  Tensor b_gate, b_up, b_down;  // optional biases, f32
};

// LlamaMLP.forward: down(silu(gate(x)) * up(x)). x, out: [n_tokens, d_model]
void swiglu_mlp(const Tensor& x, const MlpWeights& w, const Tensor& out, Scratch& scratch);

// The rest of a pre-norm block after its mixer (attention or DeltaNet) up to
// the output projection: x += a · w_outᵀ (+ b_out); h = rms_norm(x) * norm;
// out = swiglu_mlp(h). At decode on CUDA one persistent kernel
// (ops::decode_tail; h is then not written). Given the next block's input
// projection next_w ([N, d_model]) and norm gain, that kernel also does
// x += out and returns (rms_norm(x) * next_norm) · next_wᵀ ([n_tokens, N],
// scratch); otherwise (undefined result) the caller adds out and norms.
// a: [n_tokens, K]; w_out: [d_model, K]; x, h, out: [n_tokens, d_model]
// y_next, where given, receives that projection instead of scratch (the
// logits, with next_w the LM head: see logits_of_every_token).
Tensor block_tail(const Tensor& a, const Tensor& w_out, const Tensor& b_out, const Tensor& x, const Tensor& norm,
                  float eps, const MlpWeights& mlp, const Tensor& h, const Tensor& out, Scratch& scratch,
                  const Tensor& next_w = Tensor(), const Tensor& next_norm = Tensor(),
                  const Tensor& y_next = Tensor());

// The first block's input: h = rms_norm(x) * norm and, where the block takes
// a projection made ahead (w defined), returns x's projection by w
// ([n_tokens, N], scratch); at decode on CUDA one GEMV with the norm in it,
// and h is then not written. x, h: [n_tokens, d_model]; w: [N, d_model]
Tensor first_block_input(const Tensor& x, const Tensor& norm, float eps, const Tensor& w, const Tensor& h,
                         Scratch& scratch);

// Whether the logits are every token's, in order, on x's device (decode):
// then the last block_tail can make them (next_w the head, next_norm the
// final norm, y_next the logits).
bool logits_of_every_token(const BatchPlan& plan, const Tensor& x, const Tensor& logits);

// Final norm and LM head on the tokens whose logits were asked for.
// x: [n_tokens, d_model]; head: [n_vocab, d_model]; logits: [n_out, n_vocab]
void output_logits(const Tensor& x, const Tensor& norm, float eps, const Tensor& head,
                   const BatchPlan& plan, const Tensor& logits, Scratch& scratch);

// y += bias per row, when the bias is defined (CPU only). y: [M, N]; bias: [N]
void add_bias(const Tensor& y, const Tensor& bias);

}  // namespace augur
