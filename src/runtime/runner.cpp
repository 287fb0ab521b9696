#include "runtime/runner.h"

#include <chrono>
#include <cstring>

#include "core/error.h"

namespace augur {

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

Runner::Runner(Model& model, const RunnerOptions& opts)
    : model_(&model),
      opts_(opts),
      kv_(model.info().kv, (opts.max_cached_tokens + opts.block_size - 1) / opts.block_size, opts.block_size,
          model.info().recurrent, opts.max_sequences, model.info().device),
      pool_(kv_.n_blocks()),
      slots_(kv_.n_slots()) {
  if (opts.prefill_chunk <= 0) fail("[runner] prefill_chunk must be positive");
}

Tensor Runner::step(std::span<Sequence* const> seqs, std::span<const std::span<const int32_t>> tokens,
                    std::span<const int32_t> n_logits) {
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
  Tensor logits = Tensor::empty(DType::F32, {n_out, model_->info().n_vocab});
  model_->forward(rows, kv_, logits);
  for (size_t i = 0; i < seqs.size(); ++i) seqs[i]->append(tokens[i]);
  return logits;
}

Tensor Runner::feed(Sequence& seq, std::span<const int32_t> tokens, bool all_logits) {
  if (tokens.empty()) fail("[runner] nothing to feed");
  const int64_t n = int64_t(tokens.size()), n_vocab = model_->info().n_vocab;
  Tensor out = Tensor::empty(DType::F32, {all_logits ? n : 1, n_vocab});
  Sequence* seqs[] = {&seq};
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

GenerateResult generate(Runner& runner, Sequence& seq, std::span<const int32_t> prompt,
                        const GenerateOptions& opts) {
  if (prompt.empty()) fail("[generate] the prompt is empty");
  if (opts.max_tokens < 0) fail("[generate] max_tokens must be >= 0");
  GenerateResult res;
  res.n_prompt = int64_t(prompt.size());
  Sampler sampler(opts.sampling);
  const int64_t n_vocab = runner.model().info().n_vocab;
  const std::vector<int32_t> prompt_ids(prompt.begin(), prompt.end());

  auto t0 = std::chrono::steady_clock::now();
  Tensor logits = runner.feed(seq, prompt, opts.prompt_logits);
  res.prefill_seconds = seconds_since(t0);
  if (opts.prompt_logits) res.prompt_logits = logits;
  // The next-token logits: the last row either way.
  std::vector<float> row(static_cast<size_t>(n_vocab));
  std::memcpy(row.data(), logits.data<float>() + (logits.dim(0) - 1) * n_vocab, size_t(n_vocab) * 4);

  res.finish_reason = "length";
  t0 = std::chrono::steady_clock::now();
  while (int64_t(res.ids.size()) < opts.max_tokens) {
    const int32_t tok = sampler.sample(row, prompt_ids, res.ids);
    res.ids.push_back(tok);
    bool stop = false;
    for (int32_t s : opts.stop_ids) stop |= (s == tok);
    if (opts.on_token && !opts.on_token(tok)) stop = true;
    if (stop) {
      res.finish_reason = "stop";
      break;
    }
    if (int64_t(res.ids.size()) == opts.max_tokens) break;
    Tensor next = runner.feed(seq, std::span<const int32_t>(&res.ids.back(), 1));
    std::memcpy(row.data(), next.data<float>(), size_t(n_vocab) * 4);
    ++res.n_decode_steps;
  }
  res.decode_seconds = seconds_since(t0);
  return res;
}

}  // namespace augur
