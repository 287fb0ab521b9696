#include "model/stack.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "backend/device.h"
#include "core/error.h"
#include "model/weights.h"

namespace augur {

namespace {

class DecoderStack final : public Model {
 public:
  DecoderStack(const StackConfig& cfg, StackWeights weights, WeightSource& src, ModelInfo info,
               std::unique_ptr<Model> mtp)
      : cfg_(cfg), w_(std::move(weights)) {
    info_ = std::move(info);
    mtp_ = std::move(mtp);
    reads_hidden_ = w_.input.defined();
    AUGUR_ASSERT(int64_t(w_.layers.size()) == cfg.n_layer, "one Block per layer");
    inv_freq_ = src.constant_f32(cfg.inv_freq);
    shape_.n_head = cfg.n_head;
    shape_.n_head_kv = cfg.n_head_kv;
    shape_.head_dim = cfg.head_dim;
    shape_.scale = 1.0f / std::sqrt(float(cfg.head_dim));
    shape_.norm_eps = cfg.rms_eps;

    // Each layer's index into the KV cache (self-attention) or the recurrent
    // state (linear attention).
    int64_t n_full = 0, n_linear = 0;
    for (const auto& l : w_.layers) cache_index_.push_back(l.linear ? n_linear++ : n_full++);

    info_.n_layer = cfg.n_layer;
    info_.d_model = cfg.d_model;
    info_.n_vocab = cfg.n_vocab;
    info_.max_position = cfg.max_position;
    info_.n_params = src.n_params();
    info_.weight_bytes = src.bytes();
    info_.kv = {n_full, cfg.n_head_kv, cfg.head_dim};
    if (n_linear > 0) {
      const GatedDeltaNetShape& g = cfg.gdn;
      info_.recurrent = {n_linear, g.conv_dim(), g.conv_kernel - 1, g.n_head, g.head_dim_k, g.head_dim_v};
    }

    // A decode step reads every dense matrix once, the routed experts' share
    // of the expert matrices, and one row of the embedding.
    double read = double(w_.head.nbytes()) + double(w_.embed.nbytes()) / double(cfg.n_vocab);
    auto add = [&](const Tensor& t, double share = 1.0) {
      if (t.defined()) read += double(t.nbytes()) * share;
    };
    for (const auto& l : w_.layers) {
      for (const Tensor* t : {&l.gdn.in_all, &l.gdn.out, &l.attn.wqkv, &l.attn.wo, &l.mlp.gate_up, &l.mlp.down})
        add(*t);
      if (l.moe) {
        const double share = double(l.experts.n_expert_used) / double(l.experts.router.dim(0));
        add(l.experts.router);
        add(l.experts.gate_up, share);
        add(l.experts.down, share);
        add(l.experts.shared.gate_up);
        add(l.experts.shared.down);
        add(l.experts.shared_gate);
      }
    }
    info_.decode_weight_bytes = int64_t(read);
  }

  std::unique_ptr<Model> with_head_rows(std::span<const int32_t> ids) const override {
    if (ids.empty()) fail("[draft vocabulary] no token ids");
    if (!info_.head_rows.empty()) fail("[draft vocabulary] the model's head is already cut");
    std::vector<int64_t> rows;
    std::vector<bool> seen(size_t(info_.n_vocab), false);
    for (int32_t id : ids) {
      if (id < 0 || id >= info_.n_vocab)
        fail("[draft vocabulary] token id ", id, " is outside the vocabulary [0, ", info_.n_vocab, ")");
      if (seen[size_t(id)]) fail("[draft vocabulary] token id ", id, " is listed twice");
      seen[size_t(id)] = true;
      rows.push_back(id);
    }
    return std::unique_ptr<Model>(new DecoderStack(*this, select_rows(w_.head, rows), ids));
  }

 protected:
  void prepare(std::span<const ForwardRow> rows, KvCache& kv) override {
    if (info_.recurrent.n_layer == 0) return;
    const RecurrentSpec& want = info_.recurrent;
    const RecurrentSpec& have = kv.recurrent_spec();
    if (have.n_layer != want.n_layer || have.conv_dim != want.conv_dim || have.conv_tail != want.conv_tail ||
        have.n_head != want.n_head || have.head_dim_k != want.head_dim_k || have.head_dim_v != want.head_dim_v ||
        kv.n_slots() <= 0)
      fail("[forward] ", info_.model_type,
           " keeps recurrent state: the cache needs state slots made for this model's RecurrentSpec");
    std::vector<bool> used(size_t(kv.n_slots()), false);
    for (size_t r = 0; r < rows.size(); ++r) {
      const int32_t slot = rows[r].state_slot;
      if (slot < 0 || slot >= kv.n_slots())
        fail("[forward] row ", r, " has state slot ", slot, "; ", info_.model_type,
             " keeps recurrent state and needs a slot in [0, ", kv.n_slots(), ")");
      if (used[size_t(slot)]) fail("[forward] rows of one forward share state slot ", slot);
      used[size_t(slot)] = true;
    }
    for (const ForwardRow& row : rows)
      if (row.pos0 == 0) kv.zero_slot(row.state_slot);
  }

  // Reference: LlamaModel.forward, Qwen3Model.forward, Qwen3_5TextModel.forward,
  // Qwen3NextModel.forward (pre-norm residual blocks).
  void layers(const BatchPlan& plan, KvCache& kv, Scratch& scratch, const Tensor& logits, Taps* taps,
              const HiddenIo& hidden) override {
    const int64_t T = plan.n_tokens(), d = cfg_.d_model;
    const ops::BatchView batch = plan.view();
    std::vector<ops::RecurrentRow> rec;
    for (const auto& r : plan.rows) rec.push_back({r.token_begin, r.n_tokens, r.state_slot});
    Tensor x = scratch.get("x", {T, d});  // residual stream
    Tensor h = scratch.get("h", {T, d});  // normed input of a block
    Tensor o = scratch.get("o", {T, d});  // output of a block
    if (w_.input.defined()) {
      // x = fc_embed · norm(embed(token)) + fc_hidden · norm(hidden)
      const HeadInput& in = w_.input;
      ops::embedding(w_.embed, plan.tokens, o, batch.device);
      ops::rms_norm(o, in.norm_embed, cfg_.rms_eps, h);
      ops::linear(h, in.fc_embed, x);
      ops::rms_norm(hidden.in, in.norm_hidden, cfg_.rms_eps, h);
      ops::linear(h, in.fc_hidden, o);
      ops::add_inplace(x, o);
    } else {
      ops::embedding(w_.embed, plan.tokens, x, batch.device);
    }
    if (taps) taps->record("embed", 0, x);
    // A block's input projection is made by the previous block's tail (with
    // its norm and residual add) where it can be; taps need every block's
    // output, so they make each block on its own.
    const bool ahead = taps == nullptr;
    auto input_w = [&](const Block& l) { return !ahead ? Tensor() : l.linear ? l.gdn.in_all : l.attn.wqkv; };
    Tensor projected = first_block_input(x, w_.layers[0].attn_norm, cfg_.rms_eps, input_w(w_.layers[0]), h, scratch);
    const bool fuse_head = ahead && logits_of_every_token(plan) && !hidden.out.defined();
    for (int64_t i = 0; i < cfg_.n_layer; ++i) {
      const Block& l = w_.layers[size_t(i)];
      const Block* next = i + 1 < cfg_.n_layer ? &w_.layers[size_t(i + 1)] : nullptr;
      const int64_t c = cache_index_[size_t(i)];
      const Tensor a = l.linear ? gated_deltanet_mix(h, l.gdn, cfg_.gdn, rec, kv.recurrent_layer(c), scratch, batch,
                                                     projected)
                                : attention_mix(h, l.attn, shape_, inv_freq_, batch, kv.layer(c), scratch, projected);
      projected = Tensor();
      const Tensor& w_out = l.linear ? l.gdn.out : l.attn.wo;
      const Tensor& b_out = l.linear ? Tensor() : l.attn.bo;
      if (l.moe || !ahead) {
        ops::linear(a, w_out, o);
        ops::add_bias(o, b_out);
        if (taps) taps->record("attn_out", i, o);
        ops::add_rms_norm(x, o, l.mlp_norm, cfg_.rms_eps, h);  // x += o; h = norm(x)
        if (l.moe)
          sparse_moe_block(h, l.experts, o, scratch);
        else
          swiglu_mlp(h, l.mlp, o, scratch);
        if (taps) taps->record("mlp_out", i, o);
      } else {
        // o = mlp(norm(x += out(a))), then x += o and the next block's input
        // projection (after the last block, the logits)
        const bool head = next == nullptr && fuse_head;
        projected = block_tail(a, w_out, b_out, x, l.mlp_norm, cfg_.rms_eps, l.mlp, h, o, scratch,
                               next ? input_w(*next) : (head ? w_.head : Tensor()),
                               next ? next->attn_norm : (head ? w_.final_norm : Tensor()), head ? logits : Tensor());
        if (projected.defined() && head) return;  // x += o and the logits done there
        if (projected.defined()) continue;        // x += o done there
      }
      if (next)
        ops::add_rms_norm(x, o, next->attn_norm, cfg_.rms_eps, h);
      else
        ops::add_inplace(x, o);  // output_logits norms the rows it needs
      if (taps) taps->record("hidden", i, x);
    }
    if (hidden.out.defined()) ops::rms_norm(x, w_.final_norm, cfg_.rms_eps, hidden.out);
    output_logits(x, w_.final_norm, cfg_.rms_eps, w_.head, plan, logits, scratch);
  }

  void replay_layers(const BatchPlan& plan, KvCache& kv, Scratch& scratch) override {
    std::vector<ops::RecurrentRow> rec;
    for (const auto& r : plan.rows) rec.push_back({r.token_begin, r.n_tokens, r.state_slot});
    for (int64_t i = 0; i < cfg_.n_layer; ++i) {
      const Block& l = w_.layers[size_t(i)];
      if (l.linear)
        gated_deltanet_replay(l.gdn, cfg_.gdn, rec, kv.recurrent_layer(cache_index_[size_t(i)]), scratch, plan.view());
    }
  }

 private:
  // `other` with its head replaced by `head`, whose rows are the tokens `ids`.
  DecoderStack(const DecoderStack& other, Tensor head, std::span<const int32_t> ids)
      : cfg_(other.cfg_), w_(other.w_), shape_(other.shape_), cache_index_(other.cache_index_),
        inv_freq_(other.inv_freq_) {
    info_ = other.info_;
    reads_hidden_ = other.reads_hidden_;
    info_.decode_weight_bytes += int64_t(head.nbytes()) - int64_t(w_.head.nbytes());
    w_.head = std::move(head);
    info_.head_rows.assign(ids.begin(), ids.end());
  }

  StackConfig cfg_;
  StackWeights w_;
  AttentionShape shape_;
  std::vector<int64_t> cache_index_;  // per layer: KV layer or recurrent layer index
  Tensor inv_freq_;                   // [rot_dim / 2] f32
};

}  // namespace

std::unique_ptr<Model> make_stack_model(const StackConfig& cfg, StackWeights weights, WeightSource& src,
                                        ModelInfo info, std::unique_ptr<Model> mtp) {
  return std::make_unique<DecoderStack>(cfg, std::move(weights), src, std::move(info), std::move(mtp));
}

void Model::replay_recurrent(Executor& executor, std::span<const ReplayRow> rows, KvCache& kv) {
  if (info_.recurrent.n_layer == 0 || !kv.has_recurrent())
    fail("[replay] ", info_.model_type, " keeps no recurrent state to replay");
  // The rows as a forward's (no tokens read, no logits, no K/V touched), so
  // that the executor uploads their layout and records uniform replays.
  const int32_t none[KvCache::kInputHistory] = {};
  std::vector<ForwardRow> fw;
  std::vector<bool> used(size_t(kv.n_slots()), false);
  for (const ReplayRow& r : rows) {
    if (r.slot < 0 || r.slot >= kv.n_slots() || used[size_t(r.slot)] || r.pos0 < 0 || r.n_tokens < 0 ||
        r.n_tokens > KvCache::kInputHistory)
      fail("[replay] row (slot ", r.slot, ", position ", r.pos0, ", ", r.n_tokens, " tokens) outside the ",
           kv.n_slots(), " slots' histories of ", KvCache::kInputHistory, " positions, or a slot twice");
    used[size_t(r.slot)] = true;
    if (r.n_tokens == 0) continue;
    ForwardRow f;
    f.tokens = std::span<const int32_t>(none, size_t(r.n_tokens));
    f.pos0 = r.pos0;
    f.n_logits = 0;
    f.state_slot = r.slot;
    fw.push_back(f);
  }
  if (fw.empty()) return;
  BatchPlan plan = plan_batch(fw, info_.n_vocab, 0);
  const Tensor no_logits = Tensor::empty(DType::F32, {0, info_.n_logits()});
  executor.run(plan, kv, no_logits, Tensor(),
               [&](const BatchPlan& p, Scratch& scratch, const Tensor&) { replay_layers(p, kv, scratch); });
}

void Model::forward(Executor& executor, std::span<const ForwardRow> rows, KvCache& kv, const Tensor& logits,
                    const Tensor& ids, Taps* taps, const HiddenIo& hidden) {
  BatchPlan plan = plan_batch(rows, info_.n_vocab, info_.max_position);
  if (!logits.defined() || logits.dim(-1) != info_.n_logits())
    fail("[forward] logits ", logits.defined() ? logits.shape_str() : std::string("undefined"), " should be [",
         plan.logit_tokens.size(), ", ", info_.n_logits(), "]");
  auto check = [&](const Tensor& t, const char* what) {
    if (t.defined() && (t.ndim() != 2 || t.dim(0) != plan.n_tokens() || t.dim(1) != info_.d_model ||
                        t.dtype() != DType::F32 || t.device() != executor.device()))
      fail("[forward] hidden ", what, " is ", t.shape_str(), "; it should be [", plan.n_tokens(), ", ",
           info_.d_model, "] f32 on the model's device");
  };
  if (reads_hidden_ && !hidden.in.defined())
    fail("[forward] ", info_.model_type, " reads a hidden state beside each token (HiddenIo::in)");
  check(hidden.in, "in");
  check(hidden.out, "out");
  prepare(rows, kv);
  // Hidden states live where the caller put them: a recording is bound to
  // their addresses (Runner keeps them in buffers of its own).
  std::vector<const void*> bound;
  for (const Tensor* t : {&hidden.in, &hidden.out}) bound.push_back(t->defined() ? t->raw() : nullptr);
  int64_t longest = 0;
  for (const ForwardRow& r : rows) longest = std::max<int64_t>(longest, int64_t(r.tokens.size()));
  const ops::ProductKernels kernels(executor.device(), longest, info_.d_model);
  executor.run(
      plan, kv, logits, ids,
      [&](const BatchPlan& p, Scratch& scratch, const Tensor& out) { layers(p, kv, scratch, out, taps, hidden); },
      std::move(bound), taps != nullptr);
}

}  // namespace augur
