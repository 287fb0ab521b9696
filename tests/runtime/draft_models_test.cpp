// Drafters that run a model: a checkpoint's MTP head (augur-tiny's trained
// one, and random mtp.* tensors added here to the hybrid fixtures) and draft
// models (another model of the same vocabulary, and the target itself).
// Greedy output with their drafts is plain greedy's, token for token, over
// 256 generated tokens, alone, batched and across a session's turns.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>

#include "core/error.h"
#include "io/io_test_util.h"
#include "io/safetensors.h"
#include "runtime/draft_fixtures.h"
#include "runtime/engine.h"
#include "runtime/perplexity.h"

namespace augur {
namespace {

using test::TempDir;

const std::string kData = AUGUR_TEST_DATA;
const std::string kTiny = kData + "/../../models/augur-tiny";

std::string dir_of(const std::string& name) { return name == "augur-tiny" ? kTiny : kData + "/" + name; }

std::vector<int32_t> prompt_ids(int64_t n_vocab, uint32_t seed, int n) {
  std::mt19937 rng(seed);
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (auto& t : ids) t = int32_t(rng() % uint32_t(n_vocab));
  return ids;
}

struct Outcome {
  std::vector<int32_t> ids;
  DraftStats drafts;
  int64_t cached = 0;  // prompt tokens the session held
};

// Speculation with a fixed k (adaptive k and resting rows would draft less:
// the tests want every round drafted).
std::vector<Outcome> generate(Engine& e, const std::vector<std::vector<int32_t>>& prompts, int64_t n,
                              const std::string& draft, int32_t k = 4, int64_t session = -1, bool adaptive = false) {
  RequestParams p;
  p.ignore_eos = true;
  p.max_tokens = n;
  p.speculation.draft = draft;
  p.speculation.k = k;
  p.speculation.adaptive = adaptive;
  p.session = session;
  std::vector<RequestId> ids;
  for (const auto& prompt : prompts) ids.push_back(e.submit(Prompt::of_ids(prompt), p));
  std::map<RequestId, Outcome> got;
  while (!e.idle())
    for (Event& ev : e.step()) {
      auto& o = got[ev.id];
      o.ids.insert(o.ids.end(), ev.ids.begin(), ev.ids.end());
      if (ev.done) o.drafts = ev.drafts, o.cached = ev.usage.cached_tokens;
    }
  std::vector<Outcome> out;
  for (RequestId id : ids) out.push_back(got[id]);
  return out;
}

std::unique_ptr<Engine> engine_at(const std::string& dir, int64_t max_sequences = 1) {
  EngineOptions eo;
  eo.max_cached_tokens = 8192;
  eo.max_sequences = max_sequences;
  return std::make_unique<Engine>(load_model(dir), std::nullopt, eo);
}

void print_stats(const std::string& what, const DraftStats& d) {
  std::printf("[spec] %s: %lld of %lld drafts accepted in %lld rounds (%lld whole)\n", what.c_str(),
              (long long)d.accepted, (long long)d.drafted, (long long)d.rounds, (long long)d.full_rounds);
}

// Where the hybrid (with an MTP head) lives for a test: augur-tiny's own
// checkpoint, or a fixture with mtp.* written into `tmp`.
std::string hybrid_with_mtp(const std::string& name, const TempDir& tmp) {
  if (name == "augur-tiny") return kTiny;
  write_with_mtp(name, tmp);
  return tmp.path().string();
}

class Mtp : public ::testing::TestWithParam<std::string> {};

TEST_P(Mtp, GreedyEqualsPlainGreedy) {
  TempDir tmp;
  auto e = engine_at(hybrid_with_mtp(GetParam(), tmp));
  ASSERT_NE(e->model().mtp(), nullptr);
  const auto prompt = prompt_ids(e->info().n_vocab, 5, 20);
  const Outcome plain = generate(*e, {prompt}, 256, "")[0];
  ASSERT_EQ(plain.ids.size(), 256u);
  for (int32_t k : {1, 2, 4}) {
    const Outcome spec = generate(*e, {prompt}, 256, "mtp", k)[0];
    EXPECT_EQ(spec.ids, plain.ids) << "k = " << k;
    print_stats(GetParam() + " mtp k=" + std::to_string(k), spec.drafts);
    // A random head on a random model agrees with it by chance only (1 in
    // 512): only the trained head makes whole rounds happen.
    if (GetParam() == "augur-tiny") {
      EXPECT_GT(spec.drafts.full_rounds, 0) << "no round accepted every draft, k = " << k;
    }
    EXPECT_GT(spec.drafts.rounds, 50) << "k = " << k;
    EXPECT_GT(spec.drafts.rounds - spec.drafts.full_rounds, 0) << "no round rejected a draft, k = " << k;
  }
}

TEST_P(Mtp, BatchAndSessionsEqualEachAlone) {
  TempDir tmp;
  auto e = engine_at(hybrid_with_mtp(GetParam(), tmp), 8);
  std::vector<std::vector<int32_t>> prompts;
  for (uint32_t i = 0; i < 8; ++i) prompts.push_back(prompt_ids(e->info().n_vocab, 40 + i, 6 + 5 * int(i)));
  const auto together = generate(*e, prompts, 40, "mtp", 3);
  for (size_t i = 0; i < prompts.size(); ++i)
    EXPECT_EQ(together[i].ids, generate(*e, {prompts[i]}, 40, "")[0].ids) << "row " << i;
  // Two turns of a session: the second continues the first's sequence and
  // MTP state, and gives what a fresh request for the whole prompt gives.
  const int64_t s = e->open_session();
  std::vector<int32_t> history = prompts[0];
  const auto first = generate(*e, {history}, 30, "mtp", 3, s)[0];
  history.insert(history.end(), first.ids.begin(), first.ids.end());
  history.push_back(7);
  const auto second = generate(*e, {history}, 30, "mtp", 3, s)[0];
  EXPECT_EQ(second.ids, generate(*e, {history}, 30, "")[0].ids);
  EXPECT_GT(second.drafts.rounds, 0);
  e->close_session(s);
}

std::vector<int32_t> joined(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// A session's checkpoint holds its sequence and its MTP row: restored (into
// the same session after it moved on, or into another), the next turn
// drafts and outputs exactly what it did straight after the checkpoint, and
// prefills only its new tokens.
TEST_P(Mtp, SessionCheckpointsRestoreTheSequenceAndTheDraftState) {
  TempDir tmp;
  auto e = engine_at(hybrid_with_mtp(GetParam(), tmp), 4);
  const int64_t s = e->open_session();
  std::vector<int32_t> history = prompt_ids(e->info().n_vocab, 60, 12);
  history = joined(history, generate(*e, {history}, 30, "mtp", 3, s)[0].ids);
  const Engine::SessionCheckpoint c = e->checkpoint(s);
  EXPECT_EQ(c.draft.schema(), "mtp");
  EXPECT_EQ(c.draft.covers(), c.seq.length());
  EXPECT_EQ(c.seq.length(), int64_t(history.size()) - 1);  // the last sampled token is not fed yet
  const std::vector<int32_t> turn = joined(history, {7});
  const Outcome straight = generate(*e, {turn}, 30, "mtp", 3, s)[0];
  EXPECT_EQ(straight.ids, generate(*e, {turn}, 30, "")[0].ids);
  EXPECT_EQ(straight.cached, c.seq.length());
  generate(*e, {joined(history, {9, 10})}, 20, "mtp", 3, s);  // the session moves on
  e->restore(s, c);
  const Outcome again = generate(*e, {turn}, 30, "mtp", 3, s)[0];
  EXPECT_EQ(again.ids, straight.ids);
  EXPECT_EQ(again.cached, straight.cached);
  EXPECT_EQ(again.drafts.drafted, straight.drafts.drafted);
  EXPECT_EQ(again.drafts.accepted, straight.drafts.accepted);
  const int64_t s2 = e->open_session();
  e->restore(s2, c);
  const Outcome branch = generate(*e, {turn}, 30, "mtp", 3, s2)[0];
  EXPECT_EQ(branch.ids, straight.ids);
  EXPECT_EQ(branch.drafts.accepted, straight.drafts.accepted);
  e->close_session(s);
  e->close_session(s2);
}

// A next turn that leaves the last reply at its first token (a template
// rendering the reply otherwise) resumes from the end of the last prompt:
// the captures speculation takes before each verify do not cost the
// conversation its prefill.
TEST_P(Mtp, ANextTurnLeavingTheReplyResumesAtThePromptsEnd) {
  TempDir tmp;
  auto e = engine_at(hybrid_with_mtp(GetParam(), tmp), 2);
  const int64_t V = e->info().n_vocab;
  const auto prompt = prompt_ids(V, 70, 14);
  const int64_t s = e->open_session();
  const Outcome first = generate(*e, {prompt}, 24, "mtp", 3, s)[0];
  ASSERT_GT(first.drafts.rounds, 0);
  std::vector<int32_t> turn = prompt;
  turn.push_back(int32_t((first.ids[0] + 1) % V));
  turn.insert(turn.end(), first.ids.begin() + 1, first.ids.end());
  turn.push_back(7);
  const Outcome second = generate(*e, {turn}, 24, "mtp", 3, s)[0];
  e->close_session(s);
  EXPECT_EQ(second.cached, int64_t(prompt.size()));
  EXPECT_EQ(second.ids, generate(*e, {turn}, 24, "")[0].ids);
}

// A prompt longer than a step's tokens reaches the MTP head a chunk at a
// time, as the target fed it: the head drafts what it drafts from one
// forward over the prompt, and the output stays plain greedy's.
TEST_P(Mtp, ALongPromptReachesTheHeadInChunks) {
  TempDir tmp;
  const std::string dir = hybrid_with_mtp(GetParam(), tmp);
  const auto prompt = prompt_ids(load_model(dir)->info().n_vocab, 80, 150);
  std::vector<Outcome> runs;
  for (int64_t step_tokens : {int64_t(512), int64_t(32)}) {
    EngineOptions eo;
    eo.max_cached_tokens = 8192;
    eo.max_sequences = 1;
    eo.step_tokens = step_tokens;
    Engine e(load_model(dir), std::nullopt, eo);
    runs.push_back(generate(e, {prompt}, 24, "mtp", 3)[0]);
    EXPECT_EQ(runs.back().ids, generate(e, {prompt}, 24, "")[0].ids) << "step_tokens " << step_tokens;
  }
  EXPECT_GT(runs[0].drafts.rounds, 0);
  EXPECT_EQ(runs[1].drafts.drafted, runs[0].drafts.drafted);
  EXPECT_EQ(runs[1].drafts.accepted, runs[0].drafts.accepted);
}

INSTANTIATE_TEST_SUITE_P(Hybrids, Mtp, ::testing::Values("qwen3_5", "qwen3_5_moe", "qwen3_next", "augur-tiny"),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (char& c : n)
                             if (c == '-') c = '_';
                           return n;
                         });

// The families' draft models: another model of the same vocabulary (a
// fixture with its last layer perturbed; augur-tiny's own first four
// layers), and the target itself, whose drafts are all accepted.
class DraftModel : public ::testing::TestWithParam<std::pair<std::string, std::string>> {};

TEST_P(DraftModel, GreedyEqualsPlainGreedy) {
  const auto& [target, other] = GetParam();
  TempDir tmp;
  if (other == "tiny-4")
    write_truncated_tiny(4, tmp);
  else
    write_perturbed(target, 0.3f, tmp);
  const std::string draft_dir = tmp.path().string();
  auto e = engine_at(dir_of(target), 2);
  const auto prompt = prompt_ids(e->info().n_vocab, 9, 16);
  const Outcome plain = generate(*e, {prompt}, 256, "")[0];
  const Outcome other_spec = generate(*e, {prompt}, 256, draft_dir, 3)[0];
  EXPECT_EQ(other_spec.ids, plain.ids);
  print_stats(target + " drafted by " + other, other_spec.drafts);
  EXPECT_GT(other_spec.drafts.full_rounds, 0);
  EXPECT_GT(other_spec.drafts.rounds - other_spec.drafts.full_rounds, 0);
  // The target drafting for itself agrees with itself.
  const Outcome self_spec = generate(*e, {prompt}, 256, dir_of(target), 3)[0];
  EXPECT_EQ(self_spec.ids, plain.ids);
  print_stats(target + " drafted by itself", self_spec.drafts);
  EXPECT_GT(self_spec.drafts.rounds, 0);
  EXPECT_EQ(self_spec.drafts.accepted, self_spec.drafts.drafted);
  // Batched: rows with different prompts keep their own draft sequences.
  const auto two = generate(*e, {prompt, prompt_ids(e->info().n_vocab, 10, 9)}, 64, draft_dir, 3);
  EXPECT_EQ(two[0].ids, std::vector<int32_t>(plain.ids.begin(), plain.ids.begin() + 64));
  EXPECT_EQ(two[1].ids, generate(*e, {prompt_ids(e->info().n_vocab, 10, 9)}, 64, "")[0].ids);
}

INSTANTIATE_TEST_SUITE_P(Families, DraftModel,
                         ::testing::Values(std::pair<std::string, std::string>{"llama", "perturbed"},
                                           std::pair<std::string, std::string>{"qwen3", "perturbed"},
                                           std::pair<std::string, std::string>{"qwen3_5", "perturbed"},
                                           std::pair<std::string, std::string>{"qwen3_5_moe", "perturbed"},
                                           std::pair<std::string, std::string>{"qwen3_next", "perturbed"},
                                           std::pair<std::string, std::string>{"augur-tiny", "tiny-4"}),
                         [](const auto& info) {
                           std::string n = info.param.first;
                           for (char& c : n)
                             if (c == '-') c = '_';
                           return n;
                         });

// A draft model whose positions end before the target's drafts while its
// positions last, then no more: the output stays plain greedy's.
TEST(DraftModelLimits, DraftsStopWhereTheDraftModelsPositionsEnd) {
  TempDir tmp;
  write_perturbed("qwen3", 0.3f, tmp);
  nlohmann::json cfg = nlohmann::json::parse(std::ifstream(tmp.file("config.json")));
  cfg["max_position_embeddings"] = 32;
  std::ofstream(tmp.file("config.json")) << cfg.dump(2);
  auto e = engine_at(dir_of("qwen3"), 2);
  const auto prompt = prompt_ids(e->info().n_vocab, 9, 16);
  const Outcome plain = generate(*e, {prompt}, 64, "")[0];
  const Outcome spec = generate(*e, {prompt}, 64, tmp.path().string(), 3)[0];
  EXPECT_EQ(spec.ids, plain.ids);
  EXPECT_GT(spec.drafts.rounds, 0);
  EXPECT_LE(spec.drafts.drafted, 3 * (32 - 16 + 1));
}

// A hybrid draft model in a session on an engine of one sequence: a turn
// that leaves the draft row's history before the row's recurrent-state
// capture starts the row afresh, giving its slot back first (the runner has
// no other), and outputs what plain greedy does.
TEST(DraftModelLimits, AHybridDraftRowRestartsInItsOwnSlot) {
  auto e = engine_at(kData + "/qwen3_5", 1);
  const auto prompt = prompt_ids(e->info().n_vocab, 31, 10);
  const int64_t s = e->open_session();
  const Outcome first = generate(*e, {prompt}, 20, kData + "/qwen3_5", 3, s)[0];
  ASSERT_GT(first.drafts.rounds, 0);
  std::vector<int32_t> turn = prompt;
  turn.insert(turn.end(), first.ids.begin(), first.ids.begin() + 5);
  turn.push_back(5);
  const Outcome second = generate(*e, {turn}, 20, kData + "/qwen3_5", 3, s)[0];
  e->close_session(s);
  EXPECT_EQ(second.ids, generate(*e, {turn}, 20, "")[0].ids);
  EXPECT_GT(second.drafts.rounds, 0);
}

// Adaptive k: rows ask for fewer drafts where they are rejected (and rest
// where drafting does not pay); the output stays plain greedy's.
TEST(AdaptiveK, DraftsLessWhereDraftsFailWithTheSameOutput) {
  auto e = engine_at(kData + "/qwen3_5");
  const auto prompt = prompt_ids(e->info().n_vocab, 21, 40);
  const Outcome plain = generate(*e, {prompt}, 128, "")[0];
  const Outcome fixed = generate(*e, {prompt}, 128, "ngram", 6)[0];
  const Outcome adaptive = generate(*e, {prompt}, 128, "ngram", 6, -1, true)[0];
  print_stats("qwen3_5 ngram k=6 fixed", fixed.drafts);
  print_stats("qwen3_5 ngram k=6 adaptive", adaptive.drafts);
  EXPECT_EQ(fixed.ids, plain.ids);
  EXPECT_EQ(adaptive.ids, plain.ids);
  EXPECT_LT(adaptive.drafts.drafted, fixed.drafts.drafted);
}

// A draft vocabulary: the head scores only the listed tokens (in the file's
// order), the drafts are mapped back to token ids, and the output is still
// plain greedy's.
TEST(DraftVocabulary, TheCutHeadScoresItsTokensAndTheOutputStaysExact) {
  auto e = engine_at(kTiny);
  std::vector<int32_t> ids;
  for (int32_t t = 8191; t >= 0; t -= 3) ids.push_back(t);  // ~2,700 tokens, in descending order
  auto cut = e->model().mtp()->with_head_rows(ids);
  EXPECT_EQ(cut->info().n_logits(), int64_t(ids.size()));
  EXPECT_EQ(cut->info().head_rows, ids);
  EXPECT_EQ(cut->info().n_vocab, 8192);
  TempDir tmp;
  {
    std::ofstream f(tmp.file("vocab.txt"));
    for (int32_t t : ids) f << t << ",\n";
  }
  EXPECT_EQ(read_draft_vocab(tmp.file("vocab.txt")), ids);
  const auto prompt = prompt_ids(8192, 3, 12);
  const Outcome plain = generate(*e, {prompt}, 96, "")[0];
  RequestParams p;
  p.ignore_eos = true;
  p.max_tokens = 96;
  p.speculation.draft = "mtp";
  p.speculation.k = 2;
  p.speculation.adaptive = false;
  p.speculation.draft_vocab = tmp.file("vocab.txt");
  std::vector<int32_t> out;
  const Event fin = e->run(e->submit(Prompt::of_ids(prompt), p),
                           [&](const Event& ev) { out.insert(out.end(), ev.ids.begin(), ev.ids.end()); });
  EXPECT_EQ(out, plain.ids);
  print_stats("augur-tiny mtp, a third of the vocabulary", fin.drafts);
  EXPECT_GT(fin.drafts.rounds, 0);
  std::ofstream(tmp.file("bad.txt")) << "1 2 x3";
  EXPECT_THROW(read_draft_vocab(tmp.file("bad.txt")), Error);
  EXPECT_THROW(e->model().mtp()->with_head_rows(std::vector<int32_t>{1, 2, 1}), Error);
  EXPECT_THROW(e->model().mtp()->with_head_rows(std::vector<int32_t>{8192}), Error);
}

TEST(MtpHead, LoadedOnlyWhereTheCheckpointHasOne) {
  EXPECT_EQ(load_model(kData + "/qwen3_5")->mtp(), nullptr);
  EXPECT_EQ(load_model(kData + "/llama")->mtp(), nullptr);
  auto tiny = load_model(kTiny);
  ASSERT_NE(tiny->mtp(), nullptr);
  EXPECT_TRUE(tiny->mtp()->reads_hidden());
  EXPECT_EQ(tiny->mtp()->info().kv.n_layer, 1);
  EXPECT_EQ(tiny->mtp()->info().n_vocab, tiny->info().n_vocab);
}

// Runner::warm_up over a draft head (what Drafter::warm_up runs on an
// accelerator) feeds hidden states beside its tokens, gives back every block
// and slot, and leaves the head's next forward as a cold runner computes it.
TEST(MtpHead, WarmUpLeavesNothingBehind) {
  auto tiny = load_model(kTiny);
  Model& head = *tiny->mtp();
  RunnerOptions ro;
  ro.max_cached_tokens = 128;
  ro.block_size = 16;
  ro.prefill_chunk = 64;
  const int64_t n = 9, d = head.info().d_model;
  const auto ids = prompt_ids(head.info().n_vocab, 3, int(n));
  HiddenIo io;
  io.in = Tensor::empty(DType::F32, {n, d});
  std::mt19937 rng(11);
  std::normal_distribution<float> normal;
  for (int64_t i = 0; i < io.in.numel(); ++i) io.in.data<float>()[i] = normal(rng);
  auto forward = [&](Runner& runner) {
    auto seq = runner.new_sequence();
    Sequence* seqs[] = {seq.get()};
    const std::span<const int32_t> tokens[] = {ids};
    const int32_t wants[] = {int32_t(n)};
    return runner.step(seqs, tokens, wants, LogitsOn::Host, io);
  };
  Runner cold(head, ro), warm(head, ro);
  warm.warm_up(64, 5);
  EXPECT_EQ(warm.pool().n_free(), warm.pool().n_blocks());
  EXPECT_EQ(warm.slots().n_free(), warm.slots().n_slots());
  const Tensor want = forward(cold), got = forward(warm);
  ASSERT_EQ(got.shape(), want.shape());
  ASSERT_EQ(0, std::memcmp(got.raw(), want.raw(), want.nbytes()));
}

// Draft states are tagged with their source and the tokens they cover; a
// draft model's checkpoint (recurrent state and all) restores its row.
TEST(DraftState, ASourceOrLengthMismatchIsAnError) {
  TempDir tmp;
  const std::string dir = hybrid_with_mtp("qwen3_5", tmp);
  auto e = engine_at(dir, 4);
  const int64_t s = e->open_session();
  std::vector<int32_t> history = prompt_ids(e->info().n_vocab, 61, 10);
  history = joined(history, generate(*e, {history}, 20, dir, 3, s)[0].ids);  // drafted by itself
  const Engine::SessionCheckpoint c = e->checkpoint(s);
  ASSERT_EQ(c.draft.schema(), "model");
  const std::vector<int32_t> turn = joined(history, {5});
  const Outcome straight = generate(*e, {turn}, 20, dir, 3, s)[0];
  e->restore(s, c);
  const Outcome again = generate(*e, {turn}, 20, dir, 3, s)[0];
  EXPECT_EQ(again.ids, straight.ids);
  EXPECT_EQ(again.drafts.drafted, straight.drafts.drafted);

  const int64_t m = e->open_session();
  generate(*e, {history}, 4, "mtp", 2, m);
  const Engine::SessionCheckpoint mc = e->checkpoint(m);
  ASSERT_EQ(mc.draft.schema(), "mtp");
  auto error = [](auto&& f) {
    try {
      f();
    } catch (const Error& err) {
      return std::string(err.what());
    }
    return std::string("no error");
  };
  // The drafters' rows themselves: another source's state, another length.
  Drafter* model_drafter = c.drafter;
  auto row = model_drafter->open(c.draft_params);
  const std::string wrong_source = error([&] { row->restore(mc.draft, mc.draft.covers()); });
  EXPECT_NE(wrong_source.find("a mtp draft state cannot be restored into a model draft row"), std::string::npos)
      << wrong_source;
  const std::string wrong_length = error([&] { row->restore(c.draft, c.draft.covers() + 1); });
  EXPECT_NE(wrong_length.find("covers " + std::to_string(c.draft.covers()) + " tokens"), std::string::npos)
      << wrong_length;
  EXPECT_NE(error([&] { row->restore(DraftState(), 0); }).find("empty draft state"), std::string::npos);
  // A checkpoint of another engine's source.
  auto other = engine_at(dir, 2);
  const int64_t o = other->open_session();
  EXPECT_NE(error([&] { other->restore(o, c); }).find("not this engine's"), std::string::npos);
}

// A request's draft source, or one prepared ahead of any request (what
// run, chat and serve do at start), that cannot be made is an error naming it.
TEST(DraftErrors, NameWhatIsWrong) {
  auto e = engine_at(kData + "/llama");
  for (const bool ahead : {false, true}) {
    RequestParams p;
    p.max_tokens = 4;
    auto message = [&](const std::string& draft) {
      p.speculation.draft = draft;
      try {
        if (ahead)
          e->prepare_speculation(p.speculation);
        else
          e->submit(Prompt::of_ids({1, 2, 3}), p);
      } catch (const Error& err) {
        return std::string(err.what());
      }
      return std::string("no error");
    };
    EXPECT_NE(message("mtp").find("no MTP head"), std::string::npos) << message("mtp");
    EXPECT_NE(message("/no/such/dir").find("none of ngram, mtp, replay"), std::string::npos);
    EXPECT_NE(message(kTiny).find("vocabulary of 8192 tokens"), std::string::npos) << message(kTiny);
    p.speculation.k = 0;
    EXPECT_NE(message("ngram").find("draft tokens"), std::string::npos) << message("ngram");
  }
  EXPECT_TRUE(e->idle());
}

// A draft vocabulary names its file and entry when it is wrong; a replay
// record's ids are checked as a prompt's are.
TEST(DraftErrors, ADraftVocabularyOrReplayRecordNamesWhatIsWrong) {
  TempDir tmp;
  auto e = engine_at(kData + "/qwen3_5");
  auto message = [&](const std::string& draft, const std::string& vocab, std::vector<int32_t> replay = {}) {
    RequestParams p;
    p.max_tokens = 4;
    p.speculation.draft = draft;
    p.speculation.draft_vocab = vocab;
    p.speculation.replay = std::move(replay);
    try {
      e->submit(Prompt::of_ids({1, 2, 3}), p);
    } catch (const Error& err) {
      return std::string(err.what());
    }
    return std::string("no error");
  };
  const std::string draft = kData + "/qwen3_5";
  std::ofstream(tmp.file("far.txt")) << "1 2 512 3";
  EXPECT_NE(message(draft, tmp.file("far.txt")).find("far.txt: token id 512 (entry 3) is outside"), std::string::npos)
      << message(draft, tmp.file("far.txt"));
  std::ofstream(tmp.file("twice.txt")) << "1, 2, 1";
  EXPECT_NE(message(draft, tmp.file("twice.txt")).find("twice.txt: token id 1 is listed twice"), std::string::npos)
      << message(draft, tmp.file("twice.txt"));
  EXPECT_NE(message(draft, tmp.path().string()).find("is a directory"), std::string::npos);
  EXPECT_NE(message("replay", "", {1, 2, 3, 4, 512}).find("replay record token id 512"), std::string::npos)
      << message("replay", "", {1, 2, 3, 4, 512});
  EXPECT_TRUE(e->idle());
}

}  // namespace
}  // namespace augur
