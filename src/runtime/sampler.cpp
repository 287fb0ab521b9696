#include "runtime/sampler.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace augur {

void validate(const SamplingParams& p) {
  if (!(p.temperature >= 0.0f) || !std::isfinite(p.temperature))
    fail("[sampling] temperature must be >= 0, got ", p.temperature);
  if (p.top_k < 0) fail("[sampling] top_k must be >= 0, got ", p.top_k);
  if (!(p.top_p > 0.0f && p.top_p <= 1.0f)) fail("[sampling] top_p must be in (0, 1], got ", p.top_p);
  if (!(p.min_p >= 0.0f && p.min_p <= 1.0f)) fail("[sampling] min_p must be in [0, 1], got ", p.min_p);
  if (!(p.repetition_penalty > 0.0f) || !std::isfinite(p.repetition_penalty))
    fail("[sampling] repetition_penalty must be > 0, got ", p.repetition_penalty);
  if (!std::isfinite(p.presence_penalty) || !std::isfinite(p.frequency_penalty))
    fail("[sampling] presence/frequency penalties must be finite");
}

int32_t argmax(std::span<const float> logits) {
  int32_t best = 0;
  for (size_t i = 1; i < logits.size(); ++i)
    if (logits[i] > logits[size_t(best)]) best = int32_t(i);
  return best;
}

std::vector<std::pair<float, int32_t>> top_k(std::span<const float> logits, int32_t k) {
  std::vector<std::pair<float, int32_t>> all(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) all[i] = {logits[i], int32_t(i)};
  const size_t n = std::min(all.size(), size_t(std::max(k, 0)));
  auto before = [](const auto& a, const auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); };
  std::partial_sort(all.begin(), all.begin() + long(n), all.end(), before);
  all.resize(n);
  return all;
}

Sampler::Sampler(const SamplingParams& p) : p_(p), rng_(p.seed) { validate(p); }

float Sampler::draw() { return std::min(float(uniform()), 0x1.fffffep-1f); }

double Sampler::uniform() { return double(rng_() >> 11) * 0x1.0p-53; }

ops::SampleRow Sampler::device_row(int32_t row, int32_t n_vocab, std::span<const int32_t> prompt,
                                   std::span<const int32_t> generated, std::vector<ops::PenaltyEntry>& penalties) {
  const bool rep = p_.repetition_penalty != 1.0f;
  const bool pres = p_.presence_penalty != 0.0f || p_.frequency_penalty != 0.0f;
  if (rep || pres) {
    // Distinct tokens of the history, each with its count in `generated`.
    std::vector<std::pair<int32_t, int32_t>> seen;  // (token, generated count)
    for (int32_t t : prompt)
      if (t >= 0 && t < n_vocab) seen.emplace_back(t, 0);
    for (int32_t t : generated)
      if (t >= 0 && t < n_vocab) seen.emplace_back(t, 1);
    std::sort(seen.begin(), seen.end());
    for (size_t i = 0; i < seen.size();) {
      const int32_t t = seen[i].first;
      int32_t count = 0;
      for (; i < seen.size() && seen[i].first == t; ++i) count += seen[i].second;
      ops::PenaltyEntry e;
      e.row = row;
      e.token = t;
      e.repetition = rep ? p_.repetition_penalty : 1.0f;  // prompt and generated tokens alike
      if (pres && count > 0) e.subtract = p_.presence_penalty + p_.frequency_penalty * float(count);
      if (e.repetition != 1.0f || count > 0) penalties.push_back(e);
    }
  }
  ops::SampleRow r;
  r.temperature = p_.temperature;
  r.top_k = p_.top_k;
  r.top_p = p_.top_p;
  r.min_p = p_.min_p;
  // float(u) may round up to 1: keep it below.
  if (p_.temperature != 0.0f) r.uniform = std::min(float(uniform()), 0x1.fffffep-1f);
  return r;
}

int32_t Sampler::sample(std::span<float> logits, std::span<const int32_t> prompt,
                        std::span<const int32_t> generated) {
  // The host draw is the device draw on CPU logits: one sampling path.
  const int32_t n_vocab = int32_t(logits.size());
  std::vector<ops::PenaltyEntry> penalties;
  const ops::SampleRow row = device_row(0, n_vocab, prompt, generated, penalties);
  Tensor t = Tensor::empty(DType::F32, {1, int64_t(n_vocab)});
  std::copy(logits.begin(), logits.end(), t.data<float>());
  ops::apply_penalties(t, penalties);
  std::copy(t.data<float>(), t.data<float>() + n_vocab, logits.begin());
  int32_t id = 0;
  ops::sample(t, {&row, 1}, {&id, 1});
  return id;
}

}  // namespace augur
