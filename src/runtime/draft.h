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
  // "" (none), "ngram", "replay", "mtp" (the checkpoint's MTP head) or the
  // directory of a draft model (any supported checkpoint of the target's
  // vocabulary).
  std::string draft;
  int32_t k = 4;        // most draft tokens a step
  // A draft vocabulary for "mtp" and draft models: a file of token ids, most
  // frequent first (read_draft_vocab); the head then scores only those
  // tokens, so a draft step costs less. "": the whole vocabulary.
  std::string draft_vocab;
  // k follows each row's acceptance (the drafts it kept, plus one, at the
  // last rounds), and a row whose drafts keep failing stops speculating for
  // a while; false: always k.
  bool adaptive = true;
  NgramOptions ngram;
  std::vector<int32_t> replay;  // "replay": the record (prompt, then continuation)
};
// Throws augur::Error naming the field when a parameter is out of range.
void validate(const SpeculationParams& p);

class Model;
// Throws augur::Error unless `draft` names a source: ngram, replay, mtp (the
// target's MTP head, where `target` has one), or a model directory; with
// target null only the name is checked. Cheap: callers check before they
// load or time anything.
void check_draft_source(const std::string& draft, const Model* target);

// A row's drafting state as a value, captured beside its target sequence's
// (SequenceSnapshot): tagged with the source's schema and the number of
// target tokens it covers. Copies share the (immutable) captured state.
class DraftState {
 public:
  DraftState() = default;
  DraftState(std::string schema, int64_t covers, std::shared_ptr<const void> payload)
      : schema_(std::move(schema)), covers_(covers), payload_(std::move(payload)) {}
  bool empty() const { return schema_.empty(); }
  const std::string& schema() const { return schema_; }
  int64_t covers() const { return covers_; }
  // The source's own record (null for sources that keep nothing).
  const void* payload() const { return payload_.get(); }

 private:
  std::string schema_;
  int64_t covers_ = 0;
  std::shared_ptr<const void> payload_;
};

// One request's drafting state, made by its Drafter. A session keeps it
// between requests, tagged with the drafter's schema: a later request of the
// same drafter reuses it (rewound to the tokens the session keeps), another
// drafter's starts afresh.
class DraftRow {
 public:
  virtual ~DraftRow() = default;
  virtual const char* schema() const = 0;
  // The target's sequence is cut back to its first `keep` tokens (a
  // session's next request): forget what followed them.
  virtual void rewind(int64_t keep) = 0;
  // The row's state while its target sequence holds `covers` tokens.
  DraftState capture(int64_t covers) const { return DraftState(schema(), covers, save()); }
  // Back to a captured state, beside a target sequence of `covers` tokens.
  // A state of another source, or one that covers another number of tokens
  // than the sequence it is restored with, is an augur::Error naming both.
  void restore(const DraftState& state, int64_t covers);

 protected:
  virtual std::shared_ptr<const void> save() const { return nullptr; }
  virtual void load(const void* payload) { (void)payload; }
};

// A draft source over a group of rows: the rows that decode in one step draft
// together (one batched forward a draft token for sources that run a model).
class Drafter {
 public:
  virtual ~Drafter() = default;
  virtual const char* schema() const = 0;
  // Whether commit() needs the target's final hidden states (MTP heads).
  virtual bool reads_hidden() const { return false; }
  // Whether its rows hold state worth keeping between a session's requests.
  virtual bool keeps_rows() const { return false; }
  virtual std::unique_ptr<DraftRow> open(const SpeculationParams& p) = 0;
  // Up to k[i] drafts for row i into drafts[i] (fewer or none where it has no
  // guess); history[i]: the row's every token, prompt and generated, the one
  // about to be fed (the pending token) last.
  virtual void propose(std::span<DraftRow* const> rows, std::span<const std::span<const int32_t>> history,
                       std::span<const int32_t> k, std::vector<std::vector<int32_t>>& drafts) = 0;
  // The target's sequence of `row` keeps n tokens from position pos0 on (a
  // prompt chunk, or a verify's pending token and accepted drafts); hidden:
  // their final hidden states, [n, d_model] f32 on the host (reads_hidden
  // drafters), else null.
  virtual void commit(DraftRow& row, int64_t pos0, int64_t n, const float* hidden) {
    (void)row, (void)pos0, (void)n, (void)hidden;
  }
  // What a drafter that runs a model pays on an accelerator the first time
  // it sees each length (Runner::warm_up): paid now, for prompts of up to
  // `tokens` and drafts of up to k tokens a row.
  virtual void warm_up(int64_t tokens, int32_t k) { (void)tokens, (void)k; }
};

// A draft vocabulary file: token ids as decimal integers separated by
// whitespace or commas (`augur draft-vocab` writes one). Errors name the file
// and the offending text.
std::vector<int32_t> read_draft_vocab(const std::string& path);

// The drafter of "ngram" or "replay" (stateless rows over NgramDraft or
// ReplayDraft; null for other names).
std::unique_ptr<Drafter> make_lookup_drafter(const std::string& name);

}  // namespace augur
