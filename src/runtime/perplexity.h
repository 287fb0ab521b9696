// Perplexity of a model on a token stream: the protocol of
// tools/train/train_tiny.py's evaluate(), so that figures from augur and from
// transformers can be set side by side.
//   The stream is cut into windows of `window` predicted tokens (window + 1
//   ids, consecutive windows sharing one id; the last may be shorter). Each
//   window is a fresh sequence; every token but its first is predicted from
//   the ones before it in the window. NLL is summed in double over all
//   predicted tokens; ppl = exp(mean NLL).
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "runtime/engine.h"

namespace augur {

struct PerplexityResult {
  int64_t windows = 0;
  int64_t tokens = 0;           // predicted tokens
  double mean_nll = 0;          // nats per token
  double ppl = 0;
  double seconds = 0;
  std::vector<float> token_nll; // per predicted token, in stream order (when asked for)
};

struct PerplexityOptions {
  int64_t window = 1024;
  int64_t max_windows = 0;      // 0: all
  bool keep_token_nll = false;
  std::function<void(int64_t done, int64_t total)> on_window;
};

// Each window is one request of the engine, which must hold window + 1 tokens.
PerplexityResult perplexity(Engine& engine, std::span<const int32_t> ids, const PerplexityOptions& opts);

// A model's MTP head against the model itself, teacher-forced over the same
// windows (train_tiny.py's mtp_top1_vs_trunk_greedy): at each position t + 2
// of a window (t + 2 within it), whether the head's top-1 from (the model's
// hidden state at t, token t + 1) equals the model's own top-1 after token
// t + 1. That rate is what a one-token MTP draft is accepted at under greedy
// decoding on such text.
struct MtpAgreement {
  int64_t positions = 0;
  int64_t agree = 0;
  double rate = 0;
};
MtpAgreement mtp_agreement(Model& model, std::span<const int32_t> ids, const PerplexityOptions& opts);

}  // namespace augur
