#include "runtime/draft.h"

#include <algorithm>
#include <climits>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "backend/ops.h"
#include "core/error.h"
#include "model/model.h"

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
  if (!p.draft_vocab.empty() && (p.draft.empty() || p.draft == "ngram" || p.draft == "replay"))
    fail("[speculation] a draft vocabulary needs a draft that scores tokens (mtp or a draft model), not '", p.draft,
         "'");
  if (p.draft == "replay" && p.replay.empty()) fail("[speculation] the replay draft needs a record");
  if (p.k < 1 || p.k > 16) fail("[speculation] draft tokens must be in [1, 16], got ", p.k);
  if (p.ngram.min_n < 1 || p.ngram.max_n < p.ngram.min_n)
    fail("[speculation] n-gram lengths need 1 <= min (", p.ngram.min_n, ") <= max (", p.ngram.max_n, ")");
}

void check_draft_source(const std::string& draft, const Model* target) {
  if (draft == "ngram" || draft == "replay") return;
  if (draft == "mtp") {
    if (target && !target->mtp())
      fail("[speculation] draft 'mtp': this ", target->info().model_type,
           " checkpoint has no MTP head (no mtp.* tensors, or mtp_num_hidden_layers is 0)");
    return;
  }
  if (!std::filesystem::is_directory(draft))
    fail("[speculation] draft '", draft, "' is none of ngram, mtp, replay or a model directory");
}

std::vector<int32_t> read_draft_vocab(const std::string& path) {
  if (std::filesystem::is_directory(path))
    fail("[draft vocabulary] '", path, "' is a directory, not a file of token ids");
  std::ifstream in(path);
  if (!in) fail("[draft vocabulary] cannot read '", path, "'");
  std::stringstream buf;
  buf << in.rdbuf();
  std::string text = buf.str();
  std::replace(text.begin(), text.end(), ',', ' ');
  std::istringstream words(text);
  std::vector<int32_t> ids;
  std::string w;
  while (words >> w) {
    size_t used = 0;
    long long v = -1;
    try {
      v = std::stoll(w, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != w.size() || v < 0 || v > INT32_MAX)
      fail("[draft vocabulary] ", path, ": '", w, "' (entry ", ids.size() + 1, ") is not a token id");
    ids.push_back(int32_t(v));
  }
  if (ids.empty()) fail("[draft vocabulary] ", path, " lists no token ids");
  return ids;
}

void DraftRow::restore(const DraftState& state, int64_t covers) {
  if (state.empty()) fail("[speculation] restoring a ", schema(), " draft row from an empty draft state");
  if (state.schema() != schema())
    fail("[speculation] a ", state.schema(), " draft state cannot be restored into a ", schema(), " draft row");
  if (state.covers() != covers)
    fail("[speculation] the ", schema(), " draft state covers ", state.covers(),
         " tokens but is restored beside a sequence of ", covers);
  load(state.payload());
}

namespace {

// A row of a lookup drafter: its proposer, which keeps nothing between steps.
class LookupRow final : public DraftRow {
 public:
  LookupRow(const char* schema, std::unique_ptr<DraftSource> source) : schema_(schema), source_(std::move(source)) {}
  const char* schema() const override { return schema_; }
  void rewind(int64_t) override {}
  DraftSource& source() { return *source_; }

 private:
  const char* schema_;
  std::unique_ptr<DraftSource> source_;
};

class LookupDrafter final : public Drafter {
 public:
  explicit LookupDrafter(const char* schema) : schema_(schema) {}
  const char* schema() const override { return schema_; }
  std::unique_ptr<DraftRow> open(const SpeculationParams& p) override {
    if (std::string(schema_) == "ngram") return std::make_unique<LookupRow>(schema_, std::make_unique<NgramDraft>(p.ngram));
    return std::make_unique<LookupRow>(schema_, std::make_unique<ReplayDraft>(p.replay));
  }
  void propose(std::span<DraftRow* const> rows, std::span<const std::span<const int32_t>> history,
               std::span<const int32_t> k, std::vector<std::vector<int32_t>>& drafts) override {
    drafts.resize(rows.size());
    for (size_t i = 0; i < rows.size(); ++i)
      drafts[i] = static_cast<LookupRow*>(rows[i])->source().propose(history[i], k[i]);
  }

 private:
  const char* schema_;
};

}  // namespace

std::unique_ptr<Drafter> make_lookup_drafter(const std::string& name) {
  if (name == "ngram") return std::make_unique<LookupDrafter>("ngram");
  if (name == "replay") return std::make_unique<LookupDrafter>("replay");
  return nullptr;
}

}  // namespace augur
