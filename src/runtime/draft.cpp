#include "runtime/draft.h"

#include <algorithm>

#include "backend/ops.h"
#include "core/error.h"

namespace augur {

NgramDraft::NgramDraft(const NgramOptions& opts) : opts_(opts) {}

std::vector<int32_t> NgramDraft::propose(std::span<const int32_t> history, int32_t k) {
  const int64_t L = int64_t(history.size());
  for (int64_t n = std::min<int64_t>(opts_.max_n, L - 1); n >= opts_.min_n; --n) {
    const auto suffix = history.subspan(size_t(L - n));
    // The first earlier occurrence: starts before the suffix's own.
    for (int64_t i = 0; i + n < L; ++i) {
      if (!std::equal(suffix.begin(), suffix.end(), history.begin() + i)) continue;
      const int64_t from = i + n, to = std::min<int64_t>(L, from + k);
      return std::vector<int32_t>(history.begin() + from, history.begin() + to);
    }
  }
  return {};
}

std::vector<int32_t> ReplayDraft::propose(std::span<const int32_t> history, int32_t k) {
  // By position: the record's tokens after the history's length.
  const size_t n = history.size();
  if (n >= record_.size()) return {};
  const size_t to = std::min(record_.size(), n + size_t(k));
  return std::vector<int32_t>(record_.begin() + long(n), record_.begin() + long(to));
}

int32_t verify_draft(std::span<float> weights, int32_t draft, float u_accept, float u_draw, bool* accepted) {
  AUGUR_ASSERT(draft >= 0 && size_t(draft) < weights.size(), "verify_draft: the draft is outside the vocabulary");
  float total = 0;  // in id order, as the walk sums them
  for (float w : weights) total += w;
  *accepted = u_accept * total < weights[size_t(draft)];
  if (*accepted) return draft;
  weights[size_t(draft)] = 0;
  return ops::sample_pick(weights, u_draw);
}

void validate(const SpeculationParams& p) {
  if (!p.draft.empty() && p.draft != "ngram" && p.draft != "replay")
    fail("[speculation] draft '", p.draft, "' is not supported (ngram, replay)");
  if (p.draft == "replay" && p.replay.empty()) fail("[speculation] the replay draft needs a record");
  if (p.k < 1 || p.k > 16) fail("[speculation] draft tokens must be in [1, 16], got ", p.k);
  if (p.ngram.min_n < 1 || p.ngram.max_n < p.ngram.min_n)
    fail("[speculation] n-gram lengths need 1 <= min (", p.ngram.min_n, ") <= max (", p.ngram.max_n, ")");
}

std::unique_ptr<DraftSource> make_draft_source(const SpeculationParams& p) {
  if (p.draft == "ngram") return std::make_unique<NgramDraft>(p.ngram);
  if (p.draft == "replay") return std::make_unique<ReplayDraft>(p.replay);
  return nullptr;
}

}  // namespace augur
