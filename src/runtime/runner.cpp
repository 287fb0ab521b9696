#include "runtime/runner.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

#include "backend/device.h"
#include "core/error.h"

namespace augur {

Runner::Runner(Model& model, const RunnerOptions& opts)
    : model_(&model),
      opts_(opts),
      executor_(model.info().placement.device(), opts.max_recorded_steps),
      replay_executor_(model.info().placement.device(), opts.max_recorded_steps),
      kv_(model.info().kv, (opts.max_cached_tokens + opts.block_size - 1) / opts.block_size, opts.block_size,
          model.info().recurrent, opts.max_sequences, model.info().placement.device()),
      pool_(kv_.n_blocks()),
      slots_(kv_.n_slots()) {
  if (opts.prefill_chunk <= 0) fail("[runner] prefill_chunk must be positive");
}

Tensor Runner::step(std::span<Sequence* const> seqs, std::span<const std::span<const int32_t>> tokens,
                    std::span<const int32_t> n_logits, LogitsOn on, const HiddenIo& hidden) {
  Tensor logits = run(seqs, tokens, n_logits, on, Tensor(), hidden);
  for (size_t i = 0; i < seqs.size(); ++i) seqs[i]->append(tokens[i]);
  return logits;
}

Tensor Runner::step_ahead(std::span<Sequence* const> seqs, const Tensor& ids, LogitsOn on) {
  if (!ids.defined() || ids.numel() != int64_t(seqs.size()))
    fail("[runner] step_ahead: ", seqs.size(), " rows need as many ids, got ",
         ids.defined() ? ids.shape_str() : std::string("none"));
  // (Ids sampled on the host, e.g. from prompt logits kept there, move over.)
  const Device device = model_->info().placement.device();
  const Tensor on_device = ids.device() == device ? ids : to_device(ids, device);
  const int32_t placeholder = 0;
  const std::vector<std::span<const int32_t>> tokens(seqs.size(), std::span<const int32_t>(&placeholder, 1));
  const std::vector<int32_t> wants(seqs.size(), 1);
  return run(seqs, tokens, wants, on, on_device);
}

Tensor Runner::run(std::span<Sequence* const> seqs, std::span<const std::span<const int32_t>> tokens,
                   std::span<const int32_t> n_logits, LogitsOn on, const Tensor& ids, const HiddenIo& hidden) {
  AUGUR_ASSERT(seqs.size() == tokens.size() && seqs.size() == n_logits.size(), "step arity");
  std::vector<ForwardRow> rows(seqs.size());
  int64_t n_out = 0;
  for (size_t i = 0; i < seqs.size(); ++i) {
    seqs[i]->reserve(int64_t(tokens[i].size()));
    rows[i].tokens = tokens[i];
    rows[i].pos0 = int32_t(seqs[i]->length());
    rows[i].block_table = seqs[i]->block_table();
    rows[i].n_logits = n_logits[i];
    rows[i].state_slot = seqs[i]->state_slot();
    n_out += n_logits[i];
  }
  const int64_t n_vocab = model_->info().n_logits();
  const Device device = model_->info().placement.device();
  Tensor logits;
  if (on == LogitsOn::Device && device != Device::CPU) {
    if (!device_logits_.defined() || device_logits_.numel() < std::max<int64_t>(n_out, 1) * n_vocab)
      device_logits_ = empty_on(device, DType::F32, {std::max<int64_t>(n_out, 1) * n_vocab});
    const int64_t shape[] = {n_out, n_vocab};
    logits = Tensor::view_of(device_logits_.buffer(), 0, DType::F32, shape, 2);
  } else {
    logits = Tensor::empty(DType::F32, {n_out, n_vocab});
  }
  if (device == Device::CPU || (!hidden.in.defined() && !hidden.out.defined())) {
    model_->forward(executor_, rows, kv_, logits, ids, nullptr, hidden);
    return logits;
  }
  // Hidden states pass through buffers of this runner's, whose addresses
  // repeat step after step, so that such steps are recorded like any other.
  const int64_t n_tokens = (hidden.in.defined() ? hidden.in : hidden.out).dim(0);
  const int64_t d = model_->info().d_model;
  auto stable = [&](Tensor& buf, const Tensor& like) {
    if (!like.defined()) return Tensor();
    if (!buf.defined() || buf.numel() < like.numel()) buf = empty_on(device, DType::F32, {like.numel()});
    const int64_t shape[] = {n_tokens, d};
    return Tensor::view_of(buf.buffer(), 0, DType::F32, shape, 2);
  };
  HiddenIo io{stable(hidden_in_, hidden.in), stable(hidden_out_, hidden.out)};
  if (io.in.defined()) copy_tensor(hidden.in, io.in);
  model_->forward(executor_, rows, kv_, logits, ids, nullptr, io);
  if (io.out.defined()) copy_tensor(io.out, hidden.out);
  return logits;
}

void Runner::rollback(std::span<Sequence* const> seqs, std::span<const int64_t> keep) {
  AUGUR_ASSERT(seqs.size() == keep.size(), "rollback arity");
  std::vector<ReplayRow> rewound;  // recurrence replayed from the kept inputs
  std::vector<Sequence*> replay;   // fed again (the history did not hold them)
  std::vector<std::vector<int32_t>> tokens;
  for (size_t i = 0; i < seqs.size(); ++i) {
    Sequence& s = *seqs[i];
    if (keep[i] < 0 || keep[i] > s.length())
      fail("[runner] rollback to ", keep[i], " tokens of a sequence of ", s.length());
    if (keep[i] == s.length()) continue;
    if (s.state_slot() < 0) {
      s.truncate(keep[i]);
      continue;
    }
    const int64_t mark = s.marked_length();
    if (mark < 0 || mark > keep[i])
      fail("[runner] rollback to ", keep[i], " tokens needs a capture at or below it (last: ", mark, ")");
    if (s.can_rewind(keep[i])) {
      rewound.push_back(s.rewind(keep[i]));
      continue;
    }
    tokens.emplace_back(s.tokens().begin() + mark, s.tokens().begin() + keep[i]);
    s.truncate(mark);
    if (!tokens.back().empty()) {
      replay.push_back(&s);
    } else {
      tokens.pop_back();
    }
  }
  if (!rewound.empty()) model_->replay_recurrent(replay_executor_, rewound, kv_);
  if (replay.empty()) return;
  for (const auto& t : tokens) refed_tokens_ += int64_t(t.size());
  std::vector<std::span<const int32_t>> spans(tokens.begin(), tokens.end());
  const std::vector<int32_t> none(replay.size(), 0);
  step(replay, spans, none);
}

ops::SampledIds Runner::sample(const Tensor& logits, std::span<const ops::SampleRow> rows) {
  if (!logits.defined() || logits.ndim() != 2 || logits.device() == Device::CPU)
    return ops::sample_async(logits, rows);
  const int64_t n = logits.dim(0);
  if (!device_ids_.defined() || device_ids_.numel() < n)
    device_ids_ = empty_on(logits.device(), DType::I32, {std::max<int64_t>(n, 1)});
  const int64_t shape[] = {n};
  return ops::sample_async(logits, rows, Tensor::view_of(device_ids_.buffer(), 0, DType::I32, shape, 1));
}

Tensor Runner::feed(Sequence& seq, std::span<const int32_t> tokens, bool all_logits, LogitsOn on) {
  if (tokens.empty()) fail("[runner] nothing to feed");
  const int64_t n = int64_t(tokens.size()), n_vocab = model_->info().n_logits();
  Sequence* seqs[] = {&seq};
  if (on == LogitsOn::Device && model_->info().placement.device() != Device::CPU) {
    // The last chunk's logits stay where step() leaves them; all_logits
    // gathers every chunk's into a tensor of its own on the device.
    Tensor out = all_logits ? empty_on(model_->info().placement.device(), DType::F32, {n, n_vocab}) : Tensor();
    Tensor last;
    for (int64_t begin = 0; begin < n; begin += opts_.prefill_chunk) {
      const int64_t end = std::min(n, begin + opts_.prefill_chunk);
      const int32_t want = all_logits ? int32_t(end - begin) : (end == n ? 1 : 0);
      const std::span<const int32_t> chunk[] = {tokens.subspan(size_t(begin), size_t(end - begin))};
      const int32_t wants[] = {want};
      last = step(seqs, chunk, wants, LogitsOn::Device);
      if (all_logits) copy_tensor(last, out.slice_rows(begin, end));
    }
    return all_logits ? out : last;
  }
  Tensor out = Tensor::empty(DType::F32, {all_logits ? n : 1, n_vocab});
  for (int64_t begin = 0; begin < n; begin += opts_.prefill_chunk) {
    const int64_t end = std::min(n, begin + opts_.prefill_chunk);
    const bool last = end == n;
    const int32_t want = all_logits ? int32_t(end - begin) : (last ? 1 : 0);
    const std::span<const int32_t> chunk[] = {tokens.subspan(size_t(begin), size_t(end - begin))};
    const int32_t wants[] = {want};
    Tensor logits = step(seqs, chunk, wants);
    if (want > 0) {
      float* dst = out.data<float>() + (all_logits ? begin : 0) * n_vocab;
      std::memcpy(dst, logits.data<float>(), logits.nbytes());
    }
  }
  return out;
}

// The longest warm-up forward. Its work is paid at load and grows with the
// length, while what it saves does not: on the H200 a 4B dense model
// prefills 2048 tokens in 31 ms and 16384 in 440 ms, so a forward past 4096
// tokens loses a few percent to loading its bucket's new cuBLASLt kernels
// (~5 ms each), and a 27B model's warm-up up to 4096 tokens costs over a
// second of compute already.
constexpr int64_t kWarmUpMaxTokens = 4096;

void Runner::warm_up(int64_t tokens, int64_t few) {
  // One sequence holds the longest forward and the windows after it.
  int64_t room = pool_.n_free() * opts_.block_size;
  if (model_->info().max_position > 0) room = std::min(room, model_->info().max_position);
  few = std::min(few, opts_.prefill_chunk);
  while (few > 0 && few * (few + 1) / 2 > room) --few;
  if (few <= 0) return;
  const int64_t most = std::min({tokens, opts_.prefill_chunk, kWarmUpMaxTokens, room - few * (few + 1) / 2});
  std::vector<int64_t> lengths;
  for (int64_t m = 16; m < most; m *= 2) lengths.push_back(m);
  if (most > 0) lengths.push_back(most);
  const std::vector<int32_t> zeros(size_t(std::max(most, few)), 0);
  // A draft head's forward reads a hidden state beside each token.
  const int64_t d = model_->info().d_model;
  auto hidden_for = [&](int64_t m) {
    HiddenIo io;
    if (model_->reads_hidden()) io.in = Tensor::empty(DType::F32, {m, d});  // zeros
    return io;
  };
  std::unique_ptr<Sequence> seq;
  for (int64_t m : lengths) {
    seq.reset();  // (its slot first: a pool may hold one)
    seq = new_sequence();
    Sequence* seqs[] = {seq.get()};
    const std::span<const int32_t> chunk[] = {std::span<const int32_t>(zeros).first(size_t(m))};
    const int32_t wants[] = {1};
    step(seqs, chunk, wants, LogitsOn::Device, hidden_for(m));
  }
  if (!seq) seq = new_sequence();
  // Then forwards of few, few - 1, ..., 1 tokens after it, each asking for
  // every token's logits: a verify window's shapes, and last a decode step's.
  Sequence* seqs[] = {seq.get()};
  for (int64_t m = few; m >= 1; --m) {
    const std::span<const int32_t> window[] = {std::span<const int32_t>(zeros).first(size_t(m))};
    const int32_t wants[] = {int32_t(m)};
    step(seqs, window, wants, m == 1 ? LogitsOn::Host : LogitsOn::Device, hidden_for(m));
  }
}

}  // namespace augur
