#include "runtime/perplexity.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "core/error.h"

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

}  // namespace augur
