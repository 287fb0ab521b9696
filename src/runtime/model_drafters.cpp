#include "runtime/model_drafters.h"

#include <algorithm>
#include <cstring>

#include "backend/device.h"
#include "core/error.h"

namespace augur {

namespace {

// Each logits row's greedy token (through the head's rows where it is cut
// to a draft vocabulary), drawn where the logits are: only the ids cross
// to the host.
std::vector<int32_t> greedy(Runner& runner, const Tensor& logits) {
  const ModelInfo& info = runner.model().info();
  const std::vector<ops::SampleRow> rows(size_t(logits.dim(0)));  // temperature 0: argmax
  ops::SampledIds sampled = runner.sample(logits, rows);
  const auto ids = sampled.host();
  std::vector<int32_t> out(ids.begin(), ids.end());
  if (!info.head_rows.empty())
    for (int32_t& id : out) id = info.head_rows[size_t(id)];
  return out;
}

// The model drafts run on: `model`, or its head cut to a draft vocabulary.
Model& cut(Model& model, std::span<const int32_t> vocab, std::unique_ptr<Model>& keep) {
  if (vocab.empty()) return model;
  keep = model.with_head_rows(vocab);
  return *keep;
}

// A host buffer of rows as a tensor.
Tensor host_rows(const std::vector<float>& rows, int64_t d) {
  const int64_t n = int64_t(rows.size()) / d;
  Tensor t = Tensor::empty(DType::F32, {n, d});
  std::memcpy(t.data<float>(), rows.data(), rows.size() * sizeof(float));
  return t;
}

// ------------------------------------------------------------------ MTP head

// MTP entry e of a row reads the target's hidden state at position base + e
// and the token after it; the K/V cache's index is e (RoPE scores depend
// only on differences of positions, so the offset base does not matter).
class MtpRow final : public DraftRow {
 public:
  explicit MtpRow(std::unique_ptr<Sequence> seq) : seq(std::move(seq)) {}
  const char* schema() const override { return "mtp"; }
  void rewind(int64_t keep) override {
    if (base >= 0 && keep == committed()) return;  // the next request continues where this one ended
    reset();
  }
  // Target positions whose hidden states this row has been given.
  int64_t committed() const { return base + n_valid + int64_t(pending.size()) / d; }
  struct Saved {
    SequenceSnapshot seq;
    int64_t base, n_valid;
    std::vector<float> pending;
  };
  std::shared_ptr<const void> save() const override {
    return std::make_shared<const Saved>(Saved{seq->capture(), base, n_valid, pending});
  }
  void load(const void* payload) override {
    const auto& s = *static_cast<const Saved*>(payload);
    seq->restore(s.seq);
    base = s.base, n_valid = s.n_valid, pending = s.pending;
  }
  void reset() {
    seq->truncate(0);
    base = -1;
    n_valid = 0;
    pending.clear();
  }

  std::unique_ptr<Sequence> seq;
  int64_t d = 1;
  int64_t base = -1;            // target position of entry 0 (-1: nothing yet)
  int64_t n_valid = 0;          // entries that read the target's hidden states
  std::vector<float> pending;   // hidden states of positions [base + n_valid, committed()), d each
};

class MtpDrafter final : public Drafter {
 public:
  MtpDrafter(Model& head, std::span<const int32_t> vocab, const RunnerOptions& opts)
      : runner_(cut(head, vocab, cut_), opts) {}
  const char* schema() const override { return "mtp"; }
  bool reads_hidden() const override { return true; }
  bool keeps_rows() const override { return true; }

  // A round's first forward feeds the entries committed since the last
  // round (up to k + 1: a verify's accepted tokens), then chains one token.
  // A prompt's entries come in chunks of the prefill length.
  void warm_up(int64_t tokens, int32_t k) override { runner_.warm_up(tokens, k + 1); }

  std::unique_ptr<DraftRow> open(const SpeculationParams&) override {
    auto row = std::make_unique<MtpRow>(runner_.new_sequence());
    row->d = runner_.model().info().d_model;
    return row;
  }

  void commit(DraftRow& r, int64_t pos0, int64_t n, const float* hidden) override {
    auto& row = static_cast<MtpRow&>(r);
    AUGUR_ASSERT(hidden != nullptr, "the MTP drafter reads the target's hidden states");
    if (row.base < 0 || pos0 != row.committed()) {  // a gap (rewound session): start over here
      row.reset();
      row.base = pos0;
    }
    row.pending.insert(row.pending.end(), hidden, hidden + n * row.d);
  }

  void propose(std::span<DraftRow* const> rows, std::span<const std::span<const int32_t>> history,
               std::span<const int32_t> k, std::vector<std::vector<int32_t>>& drafts) override {
    drafts.assign(rows.size(), {});
    const int64_t d = runner_.model().info().d_model;
    // The first draft: each row's entries for the positions committed since
    // its last round (the target's hidden state at e with token e + 1), the
    // last entry's logits giving the token after the pending one.
    std::vector<size_t> live;  // rows drafting
    std::vector<Sequence*> seqs;
    std::vector<std::vector<int32_t>> tokens;
    std::vector<float> hidden_in;
    for (size_t i = 0; i < rows.size(); ++i) {
      auto& row = *static_cast<MtpRow*>(rows[i]);
      const int64_t pending_at = int64_t(history[i].size()) - 1;
      if (k[i] <= 0 || row.base < 0 || row.committed() != pending_at || row.pending.empty()) continue;
      row.seq->truncate(row.n_valid);  // the last round's chained entries
      const int64_t first = row.base + row.n_valid;
      const std::span<const int32_t> run = history[i].subspan(size_t(first + 1));
      // A long run (a prompt's entries, committed chunk by chunk) goes
      // through the head a prefill chunk at a time, as the target fed it,
      // all but its last chunk here: one forward over a whole long prompt
      // would need activations for all of it.
      const int64_t chunk = runner_.options().prefill_chunk;
      int64_t lead = 0;
      for (; int64_t(run.size()) - lead > chunk; lead += chunk) {
        Sequence* one[] = {row.seq.get()};
        const std::span<const int32_t> part[] = {run.subspan(size_t(lead), size_t(chunk))};
        const int32_t none[] = {0};
        HiddenIo io;
        io.in = host_rows({row.pending.begin() + lead * d, row.pending.begin() + (lead + chunk) * d}, d);
        runner_.step(one, part, none, LogitsOn::Device, io);
      }
      tokens.emplace_back(run.begin() + lead, run.end());
      hidden_in.insert(hidden_in.end(), row.pending.begin() + lead * d, row.pending.end());
      row.n_valid += int64_t(run.size());
      row.pending.clear();
      live.push_back(i);
      seqs.push_back(row.seq.get());
    }
    for (int32_t step = 0; !live.empty(); ++step) {
      std::vector<std::span<const int32_t>> spans(tokens.begin(), tokens.end());
      const std::vector<int32_t> wants(live.size(), 1);
      const int64_t n_tokens = int64_t(hidden_in.size()) / d;
      HiddenIo io;
      io.in = host_rows(hidden_in, d);
      io.out = Tensor::empty(DType::F32, {n_tokens, d});
      const std::vector<int32_t> best = greedy(runner_, runner_.step(seqs, spans, wants, LogitsOn::Device, io));
      const Tensor& out = io.out;
      // Rows wanting more chain on the head's own output at their last token.
      std::vector<size_t> next_live;
      std::vector<Sequence*> next_seqs;
      std::vector<std::vector<int32_t>> next_tokens;
      std::vector<float> next_hidden;
      int64_t end = 0;
      for (size_t r = 0; r < live.size(); ++r) {
        end += int64_t(tokens[r].size());
        const size_t i = live[r];
        drafts[i].push_back(best[r]);
        if (int32_t(drafts[i].size()) >= k[i]) continue;
        next_live.push_back(i);
        next_seqs.push_back(seqs[r]);
        next_tokens.push_back({drafts[i].back()});
        const float* last = out.data<float>() + (end - 1) * d;
        next_hidden.insert(next_hidden.end(), last, last + d);
      }
      live = std::move(next_live);
      seqs = std::move(next_seqs);
      tokens = std::move(next_tokens);
      hidden_in = std::move(next_hidden);
    }
  }

 private:
  std::unique_ptr<Model> cut_;  // the head cut to a draft vocabulary, if any
  Runner runner_;
};

// --------------------------------------------------------------- draft model

class ModelRow final : public DraftRow {
 public:
  explicit ModelRow(std::unique_ptr<Sequence> seq) : seq(std::move(seq)) {}
  const char* schema() const override { return "model"; }
  void rewind(int64_t) override {}  // propose() aligns by common prefix
  std::shared_ptr<const void> save() const override { return std::make_shared<const SequenceSnapshot>(seq->capture()); }
  void load(const void* payload) override { seq->restore(*static_cast<const SequenceSnapshot*>(payload)); }
  std::unique_ptr<Sequence> seq;
};

class ModelDrafter final : public Drafter {
 public:
  ModelDrafter(std::unique_ptr<Model> model, std::span<const int32_t> vocab, const RunnerOptions& opts)
      : model_(std::move(model)), runner_(cut(*model_, vocab, cut_), opts) {}
  const char* schema() const override { return "model"; }
  bool keeps_rows() const override { return true; }

  // A round's first forward feeds what the row's sequence lacks (up to
  // k + 1 tokens after a verify, a prompt's chunk), then one token a draft.
  void warm_up(int64_t tokens, int32_t k) override { runner_.warm_up(tokens, k + 1); }

  std::unique_ptr<DraftRow> open(const SpeculationParams&) override {
    return std::make_unique<ModelRow>(runner_.new_sequence());
  }

  void propose(std::span<DraftRow* const> rows, std::span<const std::span<const int32_t>> history,
               std::span<const int32_t> k, std::vector<std::vector<int32_t>>& drafts) override {
    drafts.assign(rows.size(), {});
    const int64_t chunk = runner_.options().prefill_chunk;
    // A row's drafts within the draft model's positions (which may end
    // before the target's): the history at 0..n-1 and the drafts fed after
    // it, all but the last, at n.., so at most max_position - n + 1.
    std::vector<int32_t> want(k.begin(), k.end());
    if (const int64_t max_pos = runner_.model().info().max_position; max_pos > 0)
      for (size_t i = 0; i < rows.size(); ++i)
        want[i] = int32_t(std::min<int64_t>(want[i], max_pos - int64_t(history[i].size()) + 1));
    // Align each row's sequence with its history: keep the longest common
    // prefix (short of the pending token, whose logits are needed), roll
    // back the rest.
    std::vector<size_t> live;
    std::vector<Sequence*> roll;
    std::vector<int64_t> keep;
    for (size_t i = 0; i < rows.size(); ++i) {
      if (want[i] <= 0) continue;
      auto& row = *static_cast<ModelRow*>(rows[i]);
      const auto& held = row.seq->tokens();
      const auto& h = history[i];
      int64_t c = 0;
      while (c < int64_t(held.size()) && c + 1 < int64_t(h.size()) && held[size_t(c)] == h[size_t(c)]) ++c;
      if (c < row.seq->length()) {
        // Recurrent state goes back only to the last capture, and no further.
        if (row.seq->state_slot() >= 0 && (row.seq->marked_length() < 0 || row.seq->marked_length() > c)) {
          row.seq.reset();  // its slot first: the runner may have no other
          row.seq = runner_.new_sequence();
        } else {
          roll.push_back(row.seq.get());
          keep.push_back(c);
        }
      }
      live.push_back(i);
    }
    if (!roll.empty()) runner_.rollback(roll, keep);
    // The tokens the sequences lack, all but the last chunk of a long run
    // (a new request's prompt) fed row by row.
    std::vector<Sequence*> seqs;
    std::vector<std::vector<int32_t>> tokens;
    for (size_t i : live) {
      Sequence& seq = *static_cast<ModelRow*>(rows[i])->seq;
      const auto& h = history[i];
      int64_t from = seq.length();
      const int64_t n = int64_t(h.size());
      if (n - from > chunk) {
        runner_.feed(seq, h.subspan(size_t(from), size_t(n - chunk - from)));
        from = n - chunk;
      }
      seqs.push_back(&seq);
      tokens.emplace_back(h.begin() + from, h.end());
    }
    for (int32_t step = 0; !live.empty(); ++step) {
      std::vector<std::span<const int32_t>> spans(tokens.begin(), tokens.end());
      const std::vector<int32_t> wants(live.size(), 1);
      const std::vector<int32_t> best = greedy(runner_, runner_.step(seqs, spans, wants, LogitsOn::Device));
      std::vector<size_t> next_live;
      std::vector<Sequence*> next_seqs;
      std::vector<std::vector<int32_t>> next_tokens;
      for (size_t r = 0; r < live.size(); ++r) {
        const size_t i = live[r];
        // After the pending token: the state the next round rolls back to.
        if (step == 0 && seqs[r]->state_slot() >= 0) seqs[r]->capture();
        drafts[i].push_back(best[r]);
        if (int32_t(drafts[i].size()) >= want[i]) continue;
        next_live.push_back(i);
        next_seqs.push_back(seqs[r]);
        next_tokens.push_back({drafts[i].back()});
      }
      live = std::move(next_live);
      seqs = std::move(next_seqs);
      tokens = std::move(next_tokens);
    }
  }

 private:
  std::unique_ptr<Model> model_;
  std::unique_ptr<Model> cut_;  // model_ with its head cut to a draft vocabulary, if any
  Runner runner_;
};

}  // namespace

std::unique_ptr<Drafter> make_mtp_drafter(Model& head, std::span<const int32_t> vocab, const RunnerOptions& opts) {
  return std::make_unique<MtpDrafter>(head, vocab, opts);
}

std::unique_ptr<Drafter> make_model_drafter(std::unique_ptr<Model> draft, const ModelInfo& target,
                                            std::span<const int32_t> vocab, const RunnerOptions& opts) {
  if (!draft) fail("[speculation] no draft model");
  if (draft->info().n_vocab != target.n_vocab)
    fail("[speculation] the draft model (", draft->info().model_type, ") has a vocabulary of ",
         draft->info().n_vocab, " tokens, the target (", target.model_type, ") ", target.n_vocab,
         ": a draft model needs the target's vocabulary");
  return std::make_unique<ModelDrafter>(std::move(draft), vocab, opts);
}

}  // namespace augur
