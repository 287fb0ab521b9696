// Turns a row of logits into a token: penalties, then temperature, top-k,
// top-p, min-p (the order of transformers' logits processors), then a draw.
// Temperature 0 is greedy. Same seed, same output. The Sampler holds a
// request's parameters and random stream; the draw itself is ops::sample on
// whichever device holds the logits.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "backend/ops.h"

namespace augur {

struct SamplingParams {
  float temperature = 0.0f;        // 0: greedy (argmax)
  int32_t top_k = 0;               // 0: off
  float top_p = 1.0f;              // 1: off
  float min_p = 0.0f;              // 0: off
  float repetition_penalty = 1.0f; // over prompt + generated tokens (transformers)
  float presence_penalty = 0.0f;   // over generated tokens (OpenAI)
  float frequency_penalty = 0.0f;  // over generated tokens (OpenAI)
  uint64_t seed = 0;
};

// Throws augur::Error naming the field when a parameter is out of range.
void validate(const SamplingParams& p);

// Index of the largest logit (the first on ties, as torch.argmax).
int32_t argmax(std::span<const float> logits);

// The k largest (value, index), sorted descending; ties by lower index.
std::vector<std::pair<float, int32_t>> top_k(std::span<const float> logits, int32_t k);

class Sampler {
 public:
  explicit Sampler(const SamplingParams& p);
  // logits: [n_vocab] on the host, penalised in place. prompt/generated: the
  // row's history. device_row, apply_penalties and ops::sample on the host.
  int32_t sample(std::span<float> logits, std::span<const int32_t> prompt,
                 std::span<const int32_t> generated);
  const SamplingParams& params() const { return p_; }

  // The same step for logits on a device (ops::sample): appends this row's
  // penalties to `penalties` and returns its parameters, drawing the uniform
  // from the same stream as sample() (one draw when temperature > 0).
  // Penalties apply before the draw (ops::apply_penalties).
  ops::SampleRow device_row(int32_t row, int32_t n_vocab, std::span<const int32_t> prompt,
                            std::span<const int32_t> generated, std::vector<ops::PenaltyEntry>& penalties);
  // Another uniform in [0, 1) from the same stream, as a float below 1
  // (speculative verification's accept and redraw).
  float draw();

 private:
  double uniform();  // [0, 1)
  SamplingParams p_;
  std::mt19937_64 rng_;
};

}  // namespace augur
