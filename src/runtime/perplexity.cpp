#include "runtime/perplexity.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "backend/device.h"
#include "core/error.h"
#include "runtime/runner.h"

namespace augur {

PerplexityResult perplexity(Engine& engine, std::span<const int32_t> ids, const PerplexityOptions& opts) {
  if (opts.window < 1) fail("[perplexity] window must be at least 1 token");
  if (ids.size() < 2) fail("[perplexity] the text has ", ids.size(), " tokens; at least 2 are needed");
  const int64_t n = int64_t(ids.size());
  int64_t total = (n - 1 + opts.window - 1) / opts.window;
  if (opts.max_windows > 0) total = std::min(total, opts.max_windows);
  const int64_t n_vocab = engine.info().n_vocab;
  for (int32_t id : ids)
    if (id < 0 || id >= n_vocab) fail("[perplexity] token id ", id, " is outside the vocabulary (", n_vocab, ")");

  PerplexityResult r;
  const auto t0 = std::chrono::steady_clock::now();
  double sum = 0;
  for (int64_t w = 0; w < total; ++w) {
    const int64_t begin = w * opts.window;
    const int64_t end = std::min(n, begin + opts.window + 1);  // ids [begin, end)
    const std::span<const int32_t> input = ids.subspan(size_t(begin), size_t(end - begin - 1));
    RequestParams params;
    params.max_tokens = 0;
    params.prompt_logits = true;
    const Event done = engine.run(engine.submit(Prompt::of_ids({input.begin(), input.end()}), params));
    const Tensor& logits = done.prompt_logits;  // [len, n_vocab] f32, host
    const float* L = logits.data<float>();
    for (int64_t t = 0; t < int64_t(input.size()); ++t) {
      const float* row = L + t * n_vocab;
      const float mx = *std::max_element(row, row + n_vocab);
      double z = 0;
      for (int64_t v = 0; v < n_vocab; ++v) z += std::exp(double(row[v]) - double(mx));
      const double nll = std::log(z) + double(mx) - double(row[ids[size_t(begin + t + 1)]]);
      sum += nll;
      if (opts.keep_token_nll) r.token_nll.push_back(float(nll));
      ++r.tokens;
    }
    ++r.windows;
    if (opts.on_window) opts.on_window(w + 1, total);
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.mean_nll = sum / double(r.tokens);
  r.ppl = std::exp(r.mean_nll);
  return r;
}

MtpAgreement mtp_agreement(Model& model, std::span<const int32_t> ids, const PerplexityOptions& opts) {
  if (!model.mtp()) fail("[perplexity] ", model.info().model_type, " has no MTP head");
  Model& head = *model.mtp();
  const int64_t n = int64_t(ids.size()), n_vocab = model.info().n_vocab, d = model.info().d_model;
  int64_t total = (n - 1 + opts.window - 1) / opts.window;
  if (opts.max_windows > 0) total = std::min(total, opts.max_windows);
  RunnerOptions ro;
  ro.max_cached_tokens = opts.window + 1;
  ro.prefill_chunk = opts.window + 1;
  ro.max_sequences = 1;
  Runner target(model, ro), mtp(head, ro);
  const Device device = model.info().placement.device();
  auto argmax = [&](const Tensor& logits, int64_t row) {
    const float* r = logits.data<float>() + row * n_vocab;
    return int32_t(std::max_element(r, r + n_vocab) - r);
  };
  MtpAgreement a;
  for (int64_t w = 0; w < total; ++w) {
    const int64_t begin = w * opts.window;
    const int64_t end = std::min(n, begin + opts.window + 1);
    const int64_t T = end - begin - 1;  // the window's input tokens
    if (T < 2) continue;
    const std::span<const int32_t> input = ids.subspan(size_t(begin), size_t(T));
    // The model over the window: every position's logits and hidden state.
    auto seq = target.new_sequence();
    Sequence* seqs[] = {seq.get()};
    HiddenIo io;
    io.out = empty_on(device, DType::F32, {T, d});
    const std::span<const int32_t> rows[] = {input};
    const int32_t all[] = {int32_t(T)};
    const Tensor logits = target.step(seqs, rows, all, LogitsOn::Host, io);
    // The head over (hidden t, token t + 1), t = 0 .. T - 2.
    auto mseq = mtp.new_sequence();
    Sequence* mseqs[] = {mseq.get()};
    HiddenIo mio;
    mio.in = io.out.slice_rows(0, T - 1);
    const std::span<const int32_t> next[] = {input.subspan(1)};
    const int32_t all_next[] = {int32_t(T - 1)};
    const Tensor guesses = mtp.step(mseqs, next, all_next, LogitsOn::Host, mio);
    for (int64_t t = 0; t + 1 < T; ++t) {
      a.agree += argmax(guesses, t) == argmax(logits, t + 1);
      ++a.positions;
    }
    if (opts.on_window) opts.on_window(w + 1, total);
  }
  a.rate = a.positions > 0 ? double(a.agree) / double(a.positions) : 0.0;
  return a;
}

}  // namespace augur
