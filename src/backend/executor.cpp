#include "backend/executor.h"

#include <algorithm>

#include "core/error.h"

namespace augur {

Tensor Scratch::get(const std::string& slot, std::initializer_list<int64_t> shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  Tensor& buf = buffers_[slot];
  if (!buf.defined() || buf.numel() < n) {
    if (buf.defined()) n = std::max(n, int64_t(double(buf.numel()) * growth_));
    buf = scratch_on(device_, DType::F32, {std::max<int64_t>(n, 1)});
    ++generation_;
  }
  return Tensor::view_of(buf.buffer(), 0, DType::F32, shape.begin(), int(shape.size()));
}

size_t Scratch::bytes() const {
  size_t n = 0;
  for (const auto& [slot, buf] : buffers_) n += buf.nbytes();
  return n;
}

void Taps::record(const std::string& name, int64_t layer, const Tensor& t) {
  Tensor copy = Tensor::empty(t.dtype(), t.shape().data(), t.ndim());
  copy_tensor(t, copy);
  tensors_[name + "." + std::to_string(layer)] = std::move(copy);
}

Tensor Taps::get(const std::string& key) const {
  auto it = tensors_.find(key);
  return it == tensors_.end() ? Tensor() : it->second;
}

namespace {

// Attention grids are sized by a bound on the context: the next power of two
// above the longest row (at least 256), capped by the cache. Decode graphs are
// keyed by it, so a growing context re-records only at powers of two.
int64_t context_bucket(const BatchPlan& plan, const KvCache& kv) {
  int64_t need = 1;
  for (int32_t p : plan.positions) need = std::max<int64_t>(need, int64_t(p) + 1);
  int64_t bucket = 256;
  while (bucket < need) bucket *= 2;
  return std::min(bucket, kv.n_blocks() * kv.block_size());
}

// The tokens a row of a recordable step: a decode step (one token a row), a
// uniform verify (1 + k tokens every row, every token's logits), a uniform
// catch-up (1 + k tokens every row, the last one's logits: a draft head's
// first step of a round) or uniform rows with no logits (a rollback's
// replay), which launch the same work whatever the rows' positions; 0 for
// other steps.
int64_t recorded_tokens(const BatchPlan& plan) {
  if (plan.rows.empty()) return 0;
  const int64_t m = plan.rows[0].n_tokens, n_rows = int64_t(plan.rows.size());
  if (m < 1 || m > kMaxRecordedTokens) return 0;
  for (const auto& r : plan.rows)
    if (r.n_tokens != m) return 0;
  const int64_t n_out = int64_t(plan.logit_tokens.size());
  if (n_out == 0 || n_out == m * n_rows) return m;
  if (n_out != n_rows) return 0;
  for (int64_t i = 0; i < n_rows; ++i)
    if (plan.logit_tokens[size_t(i)] != plan.rows[size_t(i)].token_begin + m - 1) return 0;
  return m;
}

// ids on the host replace the plan's tokens (checked against the vocabulary);
// on an accelerator the uploaded layout reads them.
void take_ids(BatchPlan& plan, const Tensor& ids, Device device, int64_t n_vocab) {
  if (!ids.defined()) return;
  if (ids.dtype() != DType::I32 || !ids.is_contiguous() || ids.numel() != plan.n_tokens() || ids.device() != device)
    fail("[forward] token ids ", ids.shape_str(), " should be ", plan.n_tokens(), " contiguous I32 on ",
         device_name(device));
  if (device != Device::CPU) return;
  const int32_t* p = ids.data<int32_t>();
  for (int64_t t = 0; t < plan.n_tokens(); ++t) {
    if (p[t] < 0 || p[t] >= n_vocab) fail("[forward] token id ", p[t], " outside the vocabulary [0, ", n_vocab, ")");
    plan.tokens[size_t(t)] = p[t];
  }
}

void upload(BatchPlan& plan, Device device, const KvCache& kv, int64_t ctx, const Tensor& ids) {
  if (device == Device::CPU) return;
  plan.device = ops::upload_batch(device, plan.tokens, plan.rows, kv.block_size(), ctx);
  plan.device.fed_tokens = ids;
}

}  // namespace

Executor::Executor(Device device, int64_t max_steps)
    : device_(device),
      graphs_(device == Device::CUDA && cuda_settings().graphs),
      max_steps_(std::max<int64_t>(max_steps, 1)),
      scratch_(device),
      // Every growth makes each step recorded before it record again: a
      // server's batch grows a row at a time.
      recorded_scratch_(device, 1.5) {}

void Executor::evict_beyond(int64_t keep) {
  while (int64_t(steps_.size()) > keep) {
    auto lru = steps_.begin();
    for (auto it = steps_.begin(); it != steps_.end(); ++it)
      if (it->second->last_used < lru->second->last_used) lru = it;
    steps_.erase(lru);  // a replay still queued keeps its graph until it ends
  }
}

void Executor::run(BatchPlan& plan, const KvCache& kv, const Tensor& logits, const Tensor& ids, const Body& body,
                   std::vector<const void*> bound, bool eager) {
  const int64_t n_out = int64_t(plan.logit_tokens.size());
  if (!logits.defined() || logits.ndim() != 2 || logits.dim(0) != n_out ||
      (logits.device() != Device::CPU && logits.device() != device_))
    fail("[forward] logits ", logits.defined() ? logits.shape_str() : std::string("undefined"), " should be [", n_out,
         ", n_vocab] on the host or ", device_name(device_));
  const int64_t n_vocab = logits.dim(1);
  take_ids(plan, ids, device_, n_vocab);
  const int64_t ctx = context_bucket(plan, kv);
  // Logits asked for on the device are written in place.
  const bool direct = logits.device() == device_ && logits.is_contiguous();
  const int64_t m = recorded_tokens(plan);
  if (!graphs_ || eager || m == 0) {
    upload(plan, device_, kv, ctx, ids);
    Tensor out = direct ? logits : scratch_.get("logits", {n_out, n_vocab});
    body(plan, scratch_, out);
    if (!direct) copy_tensor(out, logits);
    return;
  }
  const StepKey key = std::make_tuple(kv.id(), int64_t(plan.rows.size()), m, n_out, ctx);
  auto found = steps_.find(key);
  if (found == steps_.end()) {
    evict_beyond(max_steps_ - 1);
    found = steps_.emplace(key, std::make_unique<Step>()).first;
  }
  Step& step = *found->second;
  step.last_used = ++use_clock_;
  const void* logits_at = direct ? logits.raw() : nullptr;
  const void* ids_at = ids.defined() ? ids.raw() : nullptr;
  if (!step.work || step.logits_at != logits_at || step.ids_at != ids_at || step.bound != bound ||
      step.scratch_generation != scratch_generation(device_) ||
      step.own_generation != recorded_scratch_.generation()) {
    // First step of this shape (or of new addresses: its own, the shared
    // scratch's, or the recorded steps' scratch's): run it eagerly (its
    // allocations happen now, outside the recording), then record the same
    // step for later replays. A step whose run or recording failed is
    // forgotten, never replayed half-made.
    try {
      step.plan = plan;
      step.work.reset();
      step.logits_at = logits_at;
      step.ids_at = ids_at;
      step.bound = std::move(bound);
      upload(step.plan, device_, kv, ctx, ids);
      Tensor out = direct ? logits : recorded_scratch_.get("logits", {n_out, n_vocab});
      body(step.plan, recorded_scratch_, out);
      if (!direct) copy_tensor(out, logits);
      step.scratch_generation = scratch_generation(device_);
      step.own_generation = recorded_scratch_.generation();
      step.work = capture(device_, [&] { body(step.plan, recorded_scratch_, out); });
      ++recordings_;
    } catch (...) {
      steps_.erase(key);
      throw;
    }
    return;
  }
  ops::reupload_batch(step.plan.device, plan.tokens, plan.rows, kv.block_size());
  step.work->replay();
  if (!direct) copy_tensor(recorded_scratch_.get("logits", {n_out, n_vocab}), logits);
}

}  // namespace augur
