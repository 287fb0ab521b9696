// Draft sources for speculative decoding: each proposes up to k tokens that
// may continue a row; one target forward over [pending token + drafts]
// verifies them (runtime/engine.cpp), and the row keeps the longest prefix
// the target agrees with plus the target's own next token.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace augur {

class DraftSource {
 public:
  virtual ~DraftSource() = default;
  // Up to k tokens to follow `history` (the row's every token, prompt and
  // generated, the one about to be fed last); fewer or none where it has no
  // guess.
  virtual std::vector<int32_t> propose(std::span<const int32_t> history, int32_t k) = 0;
};

// Prompt lookup: the longest suffix of the history, max_n tokens down to
// min_n, that occurred earlier in it; proposes what followed its first
// occurrence. It keeps no state.
struct NgramOptions {
  int32_t max_n = 3;
  int32_t min_n = 1;
};

class NgramDraft final : public DraftSource {
 public:
  explicit NgramDraft(const NgramOptions& opts);
  std::vector<int32_t> propose(std::span<const int32_t> history, int32_t k) override;

 private:
  NgramOptions opts_;
};

// Replays a recorded token sequence (a first run's prompt and greedy
// continuation) by position: proposes the record's tokens after the
// history's length.
// Every draft is then accepted, which bounds what speculation can gain; with
// tokens of the record altered, the drafts there are rejected.
class ReplayDraft final : public DraftSource {
 public:
  explicit ReplayDraft(std::vector<int32_t> record) : record_(std::move(record)) {}
  std::vector<int32_t> propose(std::span<const int32_t> history, int32_t k) override;

 private:
  std::vector<int32_t> record_;
};

// The speculative-sampling rule for one draft token from a deterministic
// source (its proposal distribution one-hot): the draft is kept with
// probability p(draft), else a token is drawn from p without it,
// renormalised; the token that comes out is distributed as p. weights: the
// target's (ops::sample_weights; the draft's is zeroed on a rejection);
// u_accept, u_draw: independent uniforms in [0, 1).
int32_t verify_draft(std::span<float> weights, int32_t draft, float u_accept, float u_draw, bool* accepted);

// What a request asks of speculation (RequestParams::speculation).
struct SpeculationParams {
  std::string draft;    // "" (none), "ngram" or "replay"
  int32_t k = 4;        // most draft tokens a step
  NgramOptions ngram;
  std::vector<int32_t> replay;  // "replay": the record (prompt, then continuation)
};
// Throws augur::Error naming the field when a parameter is out of range.
void validate(const SpeculationParams& p);
// The source a request's parameters name (null for none).
std::unique_ptr<DraftSource> make_draft_source(const SpeculationParams& p);

}  // namespace augur
