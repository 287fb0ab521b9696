#include "runtime/engine.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>

#include "backend/device.h"
#include "core/error.h"
#include "runtime/model_drafters.h"
#include "tokenizer/stream.h"

namespace augur {

namespace {

using Clock = std::chrono::steady_clock;

double seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

bool has_penalties(const SamplingParams& p) {
  return p.repetition_penalty != 1.0f || p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f;
}

}  // namespace

Prompt Prompt::of_ids(std::vector<int32_t> ids) {
  Prompt p;
  p.kind = Kind::Ids;
  p.ids = std::move(ids);
  return p;
}

Prompt Prompt::of_text(std::string text) {
  Prompt p;
  p.kind = Kind::Text;
  p.text = std::move(text);
  return p;
}

Prompt Prompt::of_chat(nlohmann::ordered_json messages, bool add_generation_prompt,
                       nlohmann::ordered_json chat_extra) {
  Prompt p;
  p.kind = Kind::Chat;
  p.messages = std::move(messages);
  p.add_generation_prompt = add_generation_prompt;
  p.chat_extra = std::move(chat_extra);
  return p;
}

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::Stop: return "stop";
    case FinishReason::Length: return "length";
    case FinishReason::Cancelled: return "cancelled";
  }
  return "?";
}

// A sequence kept between the requests of one conversation.
struct Engine::Session {
  std::unique_ptr<Sequence> seq;
  bool busy = false;  // a live request is using it
  // The draft state of its last request's source (Drafter::keeps_rows), in
  // step with seq.
  Drafter* drafter = nullptr;
  SpeculationParams draft_params;  // of the request that opened it
  std::unique_ptr<DraftRow> draft;
  // With recurrent state, after a speculating request: the state at the end
  // of its prompt. Its verify steps moved the sequence's capture on (each
  // captures before it verifies), and a next turn that leaves the reply
  // before the last of them (a template rendering the reply otherwise)
  // resumes here instead of feeding the whole conversation again.
  SequenceSnapshot prompt_end;
};

// One request in flight.
struct Engine::Live {
  RequestId id = 0;
  RequestParams params;
  std::vector<int32_t> prompt;    // every prompt id
  // What prefill feeds: the prompt, or after a preemption the prompt and
  // every token generated (the last one's logits give the next token).
  std::vector<int32_t> input;
  bool parked = false;            // preempted: no sequence until room frees up
  std::unique_ptr<Sequence> own;  // without a session
  Session* session = nullptr;
  Sequence* seq = nullptr;
  size_t fed = 0;                 // prompt ids in the sequence
  int64_t cached = 0;             // of those, held before the request
  int64_t split_at = -1;          // a prompt chunk ends here (a state for the prefix cache)
  Sampler sampler;
  std::vector<int32_t> stop_ids;
  std::vector<int32_t> generated;
  int32_t pending = -1;           // sampled, not yet fed
  Drafter* drafter = nullptr;     // speculation's source, when asked for
  DraftRow* draft = nullptr;      // its state for this request (own_draft, or the session's)
  std::unique_ptr<DraftRow> own_draft;
  std::vector<int32_t> feed;      // this step's tokens of a decoding row: pending, then drafts
  DraftStats stats;
  int32_t k_now = 0;              // drafts the next round asks for (adaptive)
  double acceptance = -1;         // moving average of the drafts kept a round (-1: none yet)
  int32_t pause = 0;              // steps left without drafting
  std::optional<StreamDecoder> decoder;
  std::optional<StopMatcher> stopper;
  Tensor prompt_logits;
  bool done = false;
  bool cancelled = false;
  bool started = false;
  Clock::time_point t_start, t_first, t_last;
  Event event;                    // what this step settled for it

  explicit Live(const SamplingParams& p) : sampler(p) {}
  bool prefilling() const { return fed < input.size(); }
};

// A forward whose sampled ids are still on their way to the host.
struct Engine::Inflight {
  std::vector<RequestId> rows;     // the sampled rows' requests, in order
  std::vector<int32_t> n_ids;      // per row, its sampled logits: 1, or 1 + drafts (a verify)
  std::vector<int64_t> pos0;       // per decoding row, its sequence's length before the forward (-1: a prompt's)
  std::vector<int64_t> token_at;   // per row, its first token in the forward
  ops::SampledIds ids;
  Tensor host_logits;              // the sampled rows' logits when on the host (logprobs)
  Tensor hidden;                   // [n_tokens, d_model] host: final hidden states, for drafters that read them
};

Engine::Engine(std::unique_ptr<Model> model, std::optional<TextModel> text, const EngineOptions& opts)
    : model_(std::move(model)), text_(std::move(text)), opts_(opts) {
  if (!model_) fail("[engine] no model");
  if (opts.step_tokens <= 0) fail("[engine] step_tokens must be positive");
  if (opts.block_size < 1 || opts.block_size > 4096) fail("[engine] block_size must be in [1, 4096], got ", opts.block_size);
  if (opts.max_cached_tokens <= 0) fail("[engine] max_cached_tokens must be positive");
  RunnerOptions ro;
  ro.max_cached_tokens = opts.max_cached_tokens;
  ro.block_size = opts.block_size;
  ro.prefill_chunk = opts.step_tokens;
  ro.max_sequences = opts.max_sequences;
  runner_ = std::make_unique<Runner>(*model_, ro);
  // An accelerator's first forward of each length loads kernels and picks
  // algorithms (tens of ms on CUDA); do it now. On the CPU there is nothing
  // of the kind to pay.
  if (info().placement.device() != Device::CPU) runner_->warm_up(opts.step_tokens);
  if (opts.prefix_cache) prefix_ = std::make_unique<PrefixCache>(runner_->pool(), runner_->kv(), opts.prefix_states);
}

Engine::~Engine() {
  // Sequences go back to the runners' pools before the runners go.
  inflight_.reset();
  live_.clear();
  sessions_.clear();
  drafters_.clear();
}

std::unique_ptr<Model> Engine::release() {
  inflight_.reset();
  live_.clear();
  sessions_.clear();
  drafters_.clear();
  prefix_.reset();
  runner_.reset();
  return std::move(model_);
}

std::vector<int32_t> Engine::encode(const Prompt& prompt) const {
  switch (prompt.kind) {
    case Prompt::Kind::Ids: return prompt.ids;
    case Prompt::Kind::Text:
      if (!text_) fail("[engine] a text prompt needs the checkpoint's tokenizer");
      return text_->encode_prompt(prompt.text);
    case Prompt::Kind::Chat:
      if (!text_) fail("[engine] chat messages need the checkpoint's tokenizer");
      return text_->encode_chat(prompt.messages, prompt.add_generation_prompt, prompt.chat_extra);
  }
  return {};
}

int64_t Engine::open_session() {
  const int64_t s = next_session_++;
  sessions_[s] = std::make_unique<Session>();
  return s;
}

void Engine::close_session(int64_t session) {
  idle_session(session);
  sessions_.erase(session);
}

Engine::Session& Engine::idle_session(int64_t session) {
  auto it = sessions_.find(session);
  if (it == sessions_.end()) fail("[engine] no session ", session);
  if (it->second->busy) fail("[engine] session ", session, " has a request in flight");
  return *it->second;
}

Engine::SessionCheckpoint Engine::checkpoint(int64_t session) {
  Session& s = idle_session(session);
  if (!s.seq) s.seq = runner_->new_sequence();
  SessionCheckpoint c;
  c.seq = s.seq->capture();
  if (s.draft) {
    c.drafter = s.drafter;
    c.draft_params = s.draft_params;
    c.draft = s.draft->capture(s.seq->length());
  }
  return c;
}

void Engine::restore(int64_t session, const SessionCheckpoint& c) {
  Session& s = idle_session(session);
  if (c.drafter != nullptr) {
    bool ours = false;
    for (const auto& [name, d] : drafters_) ours = ours || d.get() == c.drafter;
    if (!ours) fail("[engine] the checkpoint's draft source is not this engine's");
  }
  if (!s.seq) s.seq = runner_->new_sequence();
  s.seq->restore(c.seq);
  s.prompt_end = SequenceSnapshot();
  if (c.drafter == nullptr) {
    s.drafter = nullptr;
    s.draft.reset();
    return;
  }
  if (s.drafter != c.drafter || !s.draft) {
    s.draft = c.drafter->open(c.draft_params);
    s.drafter = c.drafter;
    s.draft_params = c.draft_params;
  }
  s.draft->restore(c.draft, s.seq->length());
}

RequestId Engine::submit(const Prompt& prompt, const RequestParams& params) {
  validate(params.sampling);
  validate(params.speculation);
  if (params.max_tokens < 0) fail("[engine] max_tokens must be >= 0, got ", params.max_tokens);
  if (!params.stop.empty() && !text_) fail("[engine] stop strings need the checkpoint's tokenizer");
  if (params.logprobs > 20) fail("[engine] logprobs must be at most 20, got ", params.logprobs);
  std::vector<int32_t> ids = encode(prompt);
  if (ids.empty()) fail("[engine] the prompt is empty");
  const int64_t n_vocab = info().n_vocab;
  for (int32_t t : ids)
    if (t < 0 || t >= n_vocab) fail("[engine] prompt token id ", t, " is outside the vocabulary [0, ", n_vocab, ")");
  if (info().max_position > 0 && int64_t(ids.size()) > info().max_position)
    fail("[engine] the prompt (", ids.size(), " tokens) is longer than the model's ", info().max_position,
         " positions (max_position_embeddings)");
  for (int32_t t : params.speculation.replay)
    if (t < 0 || t >= n_vocab)
      fail("[engine] replay record token id ", t, " is outside the vocabulary [0, ", n_vocab, ")");

  auto r = std::make_unique<Live>(params.sampling);
  r->id = next_id_++;
  r->params = params;
  r->prompt = std::move(ids);
  r->input = r->prompt;
  if (!params.speculation.draft.empty()) {
    r->drafter = &drafter(params.speculation.draft, params.speculation.draft_vocab);
    r->k_now = params.speculation.k;
    // Until a plain step has been timed, a new request's first steps are plain
    // (adapt() weighs speculative steps against them).
    if (params.speculation.adaptive && plain_step_s_ <= 0) r->pause = 2;
  }
  if (!params.ignore_eos) r->stop_ids = info().eos_ids;
  r->stop_ids.insert(r->stop_ids.end(), params.stop_ids.begin(), params.stop_ids.end());
  if (text_) {
    r->decoder.emplace(text_->tokenizer, /*skip_special=*/true);
    r->stopper.emplace(params.stop);
  }
  if (params.session >= 0) {
    auto it = sessions_.find(params.session);
    if (it == sessions_.end()) fail("[engine] no session ", params.session);
    Session& s = *it->second;
    if (s.busy) fail("[engine] session ", params.session, " has a request in flight");
    if (!s.seq) s.seq = runner_->new_sequence();
    // Keep the longest prefix the session holds (at least one id is fed, for
    // the next-token logits). Recurrent state rewinds only to its last
    // capture (taken at the end of each prompt): further back starts over.
    const auto& held = s.seq->tokens();
    size_t keep = 0;
    while (keep < held.size() && keep < r->prompt.size() && held[keep] == r->prompt[keep]) ++keep;
    if (keep == r->prompt.size()) --keep;
    if (keep < held.size() && s.seq->state_slot() >= 0) {
      const int64_t mark = s.seq->marked_length();
      const std::vector<int32_t>& end = s.prompt_end.tokens();
      if (mark >= 0 && size_t(mark) <= keep) {
        keep = size_t(mark);
      } else if (!end.empty() && end.size() <= keep && std::equal(end.begin(), end.end(), r->prompt.begin())) {
        keep = end.size();
        s.seq->restore(s.prompt_end);
      } else {
        keep = 0;
      }
    }
    s.prompt_end = SequenceSnapshot();
    if (keep == 0) {
      s.seq.reset();
      s.seq = runner_->new_sequence();
    } else if (int64_t(keep) < s.seq->length()) {
      s.seq->truncate(int64_t(keep));
    }
    r->session = &s;
    r->seq = s.seq.get();
    r->fed = keep;
    r->cached = int64_t(keep);
    if (r->drafter && r->drafter->keeps_rows()) {
      // The session's draft state follows its sequence, for the same source.
      if (s.drafter == r->drafter && s.draft)
        s.draft->rewind(int64_t(keep));
      else
        s.draft = r->drafter->open(params.speculation);
      s.drafter = r->drafter;
      s.draft_params = params.speculation;
      r->draft = s.draft.get();
    }
  } else {
    r->own = runner_->new_sequence();
    r->seq = r->own.get();
    // Resume from the cache (at least the last prompt id is fed, for the
    // next-token logits). Not for requests that want every prompt logit,
    // nor for draft sources that keep per-row state over the prompt (an
    // MTP head's or a draft model's K/V, which the cache does not hold).
    r->cached = resume(*r);
  }
  if (r->drafter && !r->draft) {
    r->own_draft = r->drafter->open(params.speculation);
    r->draft = r->own_draft.get();
  }
  if (params.prompt_logits)
    r->prompt_logits = Tensor::empty(DType::F32, {int64_t(r->prompt.size() - r->fed), n_vocab});
  // Busy only once nothing above can throw: a failed submit leaves the
  // session free for the next.
  if (r->session) r->session->busy = true;
  const RequestId id = r->id;
  live_[id] = std::move(r);
  return id;
}

void Engine::cancel(RequestId id) {
  auto it = live_.find(id);
  if (it != live_.end()) it->second->cancelled = true;
}

bool Engine::idle() const { return live_.empty() && !inflight_; }

void Engine::finish(Live& r, FinishReason why, std::vector<Event>& out) {
  if (r.done) return;
  r.done = true;
  Event& e = r.event;
  e.id = r.id;
  if (r.stopper && !r.stopper->stopped()) {
    e.text += r.stopper->feed(r.decoder->flush()).text;
    if (!r.stopper->stopped()) e.text += r.stopper->flush();
  }
  e.done = true;
  e.finish = why;
  e.usage = {int64_t(r.prompt.size()), int64_t(r.generated.size()), r.cached};
  const Clock::time_point now = Clock::now();
  if (!r.started) r.t_start = now;
  if (r.generated.empty()) r.t_first = r.t_last = now;
  e.timings.prefill_s = seconds(r.t_start, r.t_first);
  e.timings.decode_s = seconds(r.t_first, r.t_last);
  e.timings.prefill_tokens = int64_t(r.prompt.size()) - r.cached;
  e.timings.decode_tokens = std::max<int64_t>(int64_t(r.generated.size()) - 1, 0);
  e.drafts = r.stats;
  e.prompt_ids = r.prompt;
  e.prompt_logits = r.prompt_logits;
  out.push_back(std::move(e));
  r.event = Event();
  if (r.session) r.session->busy = false;
  // What the request's sequence holds (its prompt and what it generated)
  // stays for later requests.
  if (prefix_ && r.seq) prefix_->insert(*r.seq, /*keep_end=*/true);
}

void Engine::accept(Live& r, int32_t token, const float* logits_row, std::vector<Event>& out) {
  r.t_last = Clock::now();
  if (r.generated.empty()) r.t_first = r.t_last;
  r.generated.push_back(token);
  Event& e = r.event;
  e.id = r.id;
  e.ids.push_back(token);
  if (r.params.logprobs >= 0 && logits_row) {
    const int64_t n_vocab = info().n_vocab;
    const std::span<const float> row(logits_row, size_t(n_vocab));
    const float mx = *std::max_element(row.begin(), row.end());
    double z = 0;
    for (float l : row) z += std::exp(double(l) - double(mx));
    const float lse = float(std::log(z)) + mx;
    TokenLogprob lp;
    lp.id = token;
    lp.logprob = row[size_t(token)] - lse;
    for (const auto& [l, id] : top_k(row, r.params.logprobs)) lp.top.emplace_back(id, l - lse);
    e.logprobs.push_back(std::move(lp));
  }
  bool stopped = false;
  if (r.stopper) {
    const StopMatcher::Result t = r.stopper->feed(r.decoder->push(token));
    e.text += t.text;
    // The decoder holds back an open run of byte tokens (it may still grow,
    // and HF decodes a run whole); where the run as it stands completes a
    // stop string, the request stops on this token, and the run grows no
    // more, so finish's flush finds the stop in the same text.
    stopped = t.stopped || (!r.stopper->empty() && r.stopper->would_stop(r.decoder->pending()));
  }
  for (int32_t s : r.stop_ids)
    if (s == token) stopped = e.stop_token = true;
  // A sequence ends where the model's positions do (prompt and generated
  // tokens within max_position_embeddings, as the server's admission counts
  // them), with finish "length", not with a failed forward.
  const int64_t total = int64_t(r.prompt.size() + r.generated.size());
  if (stopped)
    finish(r, FinishReason::Stop, out);
  else if (int64_t(r.generated.size()) >= r.params.max_tokens || (info().max_position > 0 && total >= info().max_position))
    finish(r, FinishReason::Length, out);
}

// Whether the next decode step may be queued before the ids of the one in
// flight are read: on an accelerator, every live request decoding in the
// forward in flight and wanting more tokens after it, with nothing that
// needs the last token on the host first (penalties, logprobs). A request
// that then stops at one of those ids has had one step too many run: its
// sequence never records it, which only a model without recurrent state
// can afford.
// The chained step takes its tokens' blocks without make_room, so it runs
// only where the blocks free or held by the prefix cache alone (its
// allocator reclaims those) cover them; else the step goes the way that
// makes room (preempting the newest), where the chained one would have found
// the cache full and failed the engine.
bool Engine::can_chain() const {
  if (!inflight_ || info().placement.device() == Device::CPU || info().recurrent.n_layer > 0) return false;
  if (inflight_->rows.size() != live_.size()) return false;
  int64_t blocks = 0;
  for (RequestId id : inflight_->rows) {
    auto it = live_.find(id);
    if (it == live_.end()) return false;
    const Live& r = *it->second;
    if (r.done || r.cancelled || r.prefilling() || r.draft || r.params.logprobs >= 0 || r.params.prompt_logits ||
        has_penalties(r.params.sampling) || int64_t(r.generated.size()) + 1 >= r.params.max_tokens ||
        (info().max_position > 0 && int64_t(r.prompt.size() + r.generated.size()) + 1 >= info().max_position))
      return false;
    blocks += r.seq->blocks_needed(1);
  }
  const int64_t free = runner_->pool().n_free();
  return blocks <= free || (prefix_ && blocks <= free + prefix_->reclaimable());
}

void Engine::resolve(Inflight& f, std::vector<Event>& out) {
  const auto ids = f.ids.host();
  const int64_t n_vocab = info().n_vocab;
  std::vector<Sequence*> roll;  // rows that keep fewer drafts than they fed
  std::vector<int64_t> keep;
  size_t at = 0;
  for (size_t i = 0; i < f.rows.size(); at += size_t(f.n_ids[i]), ++i) {
    auto it = live_.find(f.rows[i]);
    if (it == live_.end() || it->second->done) continue;
    Live& r = *it->second;
    // The positions the row keeps, for a drafter that reads their hidden states.
    auto commit = [&](int64_t n) {
      if (r.draft && f.hidden.defined() && f.pos0[i] >= 0)
        r.drafter->commit(*r.draft, f.pos0[i], n, f.hidden.data<float>() + f.token_at[i] * info().d_model);
    };
    if (f.n_ids[i] == 1) {
      commit(1);
      r.pending = ids[at];
      accept(r, ids[at], f.host_logits.defined() ? f.host_logits.data<float>() + int64_t(at) * n_vocab : nullptr,
             out);
      continue;
    }
    // A verify: the target's token after the pending one and after each
    // draft. Greedy rows keep drafts while they equal its argmax; sampled
    // rows keep each with the target's probability of it (verify_draft);
    // the target's token at the first rejection (or after the last draft)
    // comes as well.
    const int64_t m = f.n_ids[i] - 1;
    int64_t j = 0;
    std::vector<int32_t> emit;
    if (r.params.sampling.temperature == 0.0f) {
      while (j < m && r.feed[size_t(1 + j)] == ids[at + size_t(j)]) ++j;
      emit.assign(ids.begin() + long(at), ids.begin() + long(at) + j + 1);
    } else {
      AUGUR_ASSERT(f.host_logits.defined(), "a sampled verify reads its logits on the host");
      const SamplingParams& sp = r.params.sampling;
      const ops::SampleRow rule{sp.temperature, sp.top_k, sp.top_p, sp.min_p, 0.0f};
      std::vector<float> w(static_cast<size_t>(n_vocab));
      for (; j < m; ++j) {
        const float* row = f.host_logits.data<float>() + int64_t(at + size_t(j)) * n_vocab;
        ops::sample_weights({row, size_t(n_vocab)}, rule, w);
        bool kept = false;
        const float u1 = r.sampler.draw(), u2 = r.sampler.draw();
        emit.push_back(verify_draft(w, r.feed[size_t(1 + j)], u1, u2, &kept));
        if (!kept) break;
      }
      if (j == m) emit.push_back(ids[at + size_t(m)]);  // every draft kept: the target's own draw after them
    }
    ++r.stats.rounds;
    r.stats.drafted += m;
    r.stats.accepted += j;
    r.stats.full_rounds += j == m;
    adapt(r, m, j);
    size_t emitted = 0;
    for (; emitted < emit.size() && !r.done; ++emitted) {  // token t was decided by logit row at + t
      r.pending = emit[emitted];
      accept(r, r.pending,
             f.host_logits.defined() ? f.host_logits.data<float>() + int64_t(at + emitted) * n_vocab : nullptr, out);
    }
    // The sequence keeps the fed tokens whose successors were emitted (the
    // pending token and the drafts kept, or fewer where the request stopped
    // among them), so that a session's next turn continues from exactly
    // what it output (a finished request without a session frees it instead).
    commit(int64_t(emitted));
    if (int64_t(emitted) < 1 + m && (!r.done || r.session)) {
      roll.push_back(r.seq);
      keep.push_back(r.seq->length() - (1 + m) + int64_t(emitted));
    }
  }
  if (!roll.empty()) runner_->rollback(roll, keep);
}

// A request without a session resumes from the prefix cache (at least its
// last input id is fed, for the next-token logits). Not one that wants every
// prompt logit, nor one whose draft source keeps per-row state over the
// prompt (an MTP head's or a draft model's K/V, which the cache does not
// hold). Returns the ids resumed.
int64_t Engine::resume(Live& r) {
  const bool drafter_rows = r.drafter && r.drafter->keeps_rows();
  if (!prefix_ || r.params.prompt_logits || drafter_rows) return 0;
  int64_t shared = 0;
  const SequenceSnapshot hit = prefix_->lookup(r.input, int64_t(r.input.size()) - 1, &shared);
  if (hit.length() > 0) {
    r.own->restore(hit);
    r.fed = size_t(hit.length());
  }
  if (shared > hit.length() && shared < int64_t(r.input.size())) r.split_at = shared;
  return hit.length();
}

// Preemption by recompute: the request gives back its sequence (kept by the
// prefix cache, from which it resumes unless evicted meanwhile) and waits,
// parked, to feed its prompt and what it generated again.
void Engine::preempt(Live& r) {
  AUGUR_ASSERT(!r.session && !r.params.prompt_logits, "only a request without a session is preempted");
  if (prefix_) prefix_->insert(*r.seq, /*keep_end=*/true);
  r.own.reset();
  r.seq = nullptr;
  r.input = r.prompt;
  r.input.insert(r.input.end(), r.generated.begin(), r.generated.end());
  r.fed = 0;
  r.pending = -1;
  r.split_at = -1;
  r.parked = true;
  if (r.draft && r.drafter->keeps_rows()) {
    r.own_draft.reset();  // its sequence (and recurrent-state slot) first
    r.own_draft = r.drafter->open(r.params.speculation);
    r.draft = r.own_draft.get();
  }
  ++preemptions_;
}

// Before a launch: the blocks this step's rows will write (decoding rows one
// token and their drafts, prompt chunks under the step's budget, each with a
// copy-on-write where it starts in a shared block) must be free or held by
// the prefix cache alone. Else the newest requests are preempted; parked
// ones come back, oldest first, when their whole input fits beside.
void Engine::make_room() {
  const int64_t bs = opts_.block_size;
  BlockPool& pool = runner_->pool();
  auto available = [&] { return pool.n_free() + (prefix_ ? prefix_->reclaimable() : 0); };
  auto need = [&] {
    int64_t n = 0, budget = opts_.step_tokens;
    for (auto& [id, r] : live_) {
      if (r->done || r->parked) continue;
      if (!r->prefilling()) {
        n += r->seq->blocks_needed(1 + draft_cap(*r));
      } else if (budget > 0) {
        const int64_t c = int64_t(chunk_length(*r, budget));
        budget -= c;
        n += r->seq->blocks_needed(c);
      }
    }
    return n;
  };
  int64_t wanted = need();
  bool parked_any = false;
  for (auto& [id, r] : live_) parked_any |= r->parked;
  if (!parked_any && wanted <= pool.n_free()) return;
  for (;;) {
    if (wanted <= available()) break;
    Live* victim = nullptr;
    int64_t runnable = 0;
    for (auto& [id, r] : live_) {
      if (r->done || r->parked) continue;
      ++runnable;
      if (!r->session && !r->params.prompt_logits) victim = r.get();  // the newest
    }
    // The one request left runnable is never preempted: if it does not fit
    // alone the forward reports the cache full.
    if (!victim || runnable < 2) break;
    preempt(*victim);
    wanted = need();
  }
  for (auto& [id, r] : live_) {
    if (r->done || !r->parked) continue;
    const int64_t blocks = (int64_t(r->input.size()) + bs - 1) / bs + 1;
    if (wanted + blocks > available()) break;  // in order: the oldest first
    r->own = runner_->new_sequence();
    r->seq = r->own.get();
    r->parked = false;
    resume(*r);
    wanted += blocks;
  }
}

Drafter& Engine::drafter(const std::string& name, const std::string& vocab_file) {
  const std::string key = name + "\n" + vocab_file;
  auto it = drafters_.find(key);
  if (it != drafters_.end()) return *it->second;
  check_draft_source(name, model_.get());
  std::unique_ptr<Drafter> d = make_lookup_drafter(name);
  const std::vector<int32_t> vocab = vocab_file.empty() ? std::vector<int32_t>() : read_draft_vocab(vocab_file);
  for (size_t i = 0; i < vocab.size(); ++i)
    if (vocab[i] >= info().n_vocab)
      fail("[draft vocabulary] ", vocab_file, ": token id ", vocab[i], " (entry ", i + 1,
           ") is outside the model's vocabulary [0, ", info().n_vocab, ")");
  std::vector<int32_t> sorted = vocab;
  std::sort(sorted.begin(), sorted.end());
  if (const auto twice = std::adjacent_find(sorted.begin(), sorted.end()); twice != sorted.end())
    fail("[draft vocabulary] ", vocab_file, ": token id ", *twice, " is listed twice");
  if (!d && name == "mtp") d = make_mtp_drafter(*model_->mtp(), vocab, runner_->options());
  if (!d) d = make_model_drafter(load_model(name, info().placement), info(), vocab, runner_->options());
  return *(drafters_[key] = std::move(d));
}

void Engine::prepare_speculation(const SpeculationParams& params) {
  validate(params);
  if (params.draft.empty()) return;
  Drafter& d = drafter(params.draft, params.draft_vocab);
  if (info().placement.device() == Device::CPU) return;
  d.warm_up(opts_.step_tokens, params.k);
  runner_->warm_up(0, 1 + params.k);  // the target's verify windows
}

// The tokens of a prefilling row's next chunk, under what is left of the
// step's budget. make_room counts blocks for exactly these chunks (a chunk
// cut short leaves budget to the rows after it).
size_t Engine::chunk_length(const Live& r, int64_t budget) const {
  size_t n = std::min(r.input.size() - r.fed, size_t(budget));
  // With recurrent state the cache can resume only where a state was kept:
  // a chunk that is not the prompt's last ends on a block boundary.
  if (prefix_ && r.seq->state_slot() >= 0 && r.fed + n < r.input.size()) {
    const size_t bs = size_t(opts_.block_size), end = (r.fed + n) / bs * bs;
    if (end > r.fed) n = end - r.fed;
  }
  if (r.split_at > int64_t(r.fed) && r.split_at < int64_t(r.fed + n)) n = size_t(r.split_at) - r.fed;
  return n;
}

// The most drafts a decoding row may take this step: room for them and the
// bonus token within its max_tokens, positions within the model's, and its
// adaptive k (none while it rests). make_room reserves blocks for this many;
// draft_budget asks the source for as many.
int32_t Engine::draft_cap(const Live& r) const {
  if (!r.draft) return 0;
  const SpeculationParams& p = r.params.speculation;
  int64_t room = r.params.max_tokens - int64_t(r.generated.size()) - 1;
  if (info().max_position > 0) room = std::min(room, info().max_position - r.seq->length() - 1);
  if (room <= 0) return 0;
  if (!p.adaptive) return int32_t(std::min<int64_t>(room, p.k));
  if (r.pause > 0) return 0;
  return int32_t(std::min<int64_t>(room, r.k_now));
}

int32_t Engine::draft_budget(Live& r) {
  const int32_t k = draft_cap(r);
  if (r.params.speculation.adaptive && r.pause > 0) --r.pause;
  return k;
}

// After a round of `drafted` drafts that kept `accepted`: the next round asks
// for one more after a full accept, else for what was kept plus one; a row
// whose expected gain is below the measured cost of a speculative step
// against a plain one rests for a while, then tries again with one draft.
void Engine::adapt(Live& r, int64_t drafted, int64_t accepted) {
  const SpeculationParams& p = r.params.speculation;
  if (!p.adaptive || drafted <= 0) return;
  // Per-draft acceptance: drafts kept over drafts tried (the first rejected
  // one included).
  const double rate = double(accepted) / double(std::min(accepted + 1, drafted));
  r.acceptance = r.acceptance < 0 ? rate : 0.75 * r.acceptance + 0.25 * rate;
  r.k_now = accepted == drafted ? std::min(p.k, r.k_now + 1) : int32_t(std::max<int64_t>(1, accepted + 1));
  if (plain_step_s_ <= 0 || draft_step_s_ <= 0 || r.stats.rounds < 4) return;
  // Tokens a round of k_now drafts yields: 1 + a + a^2 + ... + a^k_now.
  double expected = 0, power = 1;
  for (int32_t i = 0; i <= r.k_now; ++i, power *= r.acceptance) expected += power;
  if (expected < draft_step_s_ / plain_step_s_) {
    r.pause = 16;
    r.k_now = 1;
  }
}

void Engine::launch(std::vector<Event>& out) {
  make_room();
  std::vector<Sequence*> seqs;
  std::vector<std::span<const int32_t>> tokens;
  std::vector<int32_t> n_logits;
  std::vector<Live*> rows;
  std::vector<bool> samples;  // the row's last logit is sampled
  std::vector<bool> verify;   // every logit of the row is (a decoding row: pending and drafts)
  bool host_logits = info().placement.device() == Device::CPU;
  int64_t budget = opts_.step_tokens;
  // Decoding rows first (one token each, or a verify: the pending token and
  // its drafts), then prompt chunks in order of arrival.
  std::vector<Live*> decoding;
  std::map<Drafter*, std::vector<Live*>> drafting;  // rows by source, drafting together
  for (auto& [id, rp] : live_) {
    Live& r = *rp;
    if (r.done || r.prefilling()) continue;  // parked ones too: prefilling
    AUGUR_ASSERT(r.pending >= 0, "a decoding request without its next token");
    r.feed.assign(1, r.pending);
    decoding.push_back(&r);
    if (r.draft) drafting[r.drafter].push_back(&r);
  }
  for (auto& [source, group] : drafting) {
    std::vector<DraftRow*> states;
    std::vector<std::vector<int32_t>> histories;
    std::vector<int32_t> k;
    for (Live* r : group) {
      states.push_back(r->draft);
      histories.push_back(r->prompt);
      histories.back().insert(histories.back().end(), r->generated.begin(), r->generated.end());  // ends with pending
      k.push_back(draft_budget(*r));
    }
    std::vector<std::span<const int32_t>> spans(histories.begin(), histories.end());
    std::vector<std::vector<int32_t>> drafts;
    source->propose(states, spans, k, drafts);
    for (size_t i = 0; i < group.size(); ++i) {
      Live& r = *group[i];
      r.feed.insert(r.feed.end(), drafts[i].begin(), drafts[i].begin() + std::min<long>(long(drafts[i].size()), k[i]));
      launched_drafts_ |= r.feed.size() > 1;
      // Recurrent state goes back only to a capture: one before the verify.
      if (r.feed.size() > 1 && r.seq->state_slot() >= 0) r.seq->capture();
    }
  }
  bool reads_hidden = false;  // a row's drafter reads the forward's hidden states
  for (Live* rp : decoding) {
    Live& r = *rp;
    reads_hidden |= r.drafter && r.drafter->reads_hidden();
    rows.push_back(&r);
    seqs.push_back(r.seq);
    tokens.emplace_back(r.feed);
    n_logits.push_back(int32_t(r.feed.size()));
    samples.push_back(true);
    verify.push_back(true);
    host_logits |= r.feed.size() > 1 && r.params.sampling.temperature != 0.0f;  // verify_draft reads them
    host_logits |= r.params.logprobs >= 0;
  }
  for (auto& [id, rp] : live_) {
    Live& r = *rp;
    if (r.done || r.parked || !r.prefilling() || budget <= 0) continue;
    const size_t n = chunk_length(r, budget);
    budget -= int64_t(n);
    const bool last = r.fed + n == r.input.size();
    const bool sample = last && r.params.max_tokens > 0;
    rows.push_back(&r);
    seqs.push_back(r.seq);
    tokens.emplace_back(r.input.data() + r.fed, n);
    n_logits.push_back(r.params.prompt_logits ? int32_t(n) : int32_t(sample));
    samples.push_back(sample);
    verify.push_back(false);
    host_logits |= r.params.prompt_logits || (sample && r.params.logprobs >= 0);
    reads_hidden |= r.drafter && r.drafter->reads_hidden();
    launched_prompt_ = true;
  }
  if (rows.empty()) return;
  const Clock::time_point now = Clock::now();
  for (Live* r : rows)
    if (!r->started) {
      r->started = true;
      r->t_start = now;
    }
  std::vector<int64_t> pos0, token_at;
  int64_t n_tokens = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    pos0.push_back(seqs[i]->length());
    token_at.push_back(n_tokens);
    n_tokens += int64_t(tokens[i].size());
  }
  HiddenIo hidden;  // the drafters read them on the host
  if (reads_hidden) hidden.out = Tensor::empty(DType::F32, {n_tokens, info().d_model});
  const Tensor logits =
      runner_->step(seqs, tokens, n_logits, host_logits ? LogitsOn::Host : LogitsOn::Device, hidden);
  const Tensor hidden_host = hidden.out;
  for (Live* r : rows) {
    if (r->prefilling() || r->pending < 0) continue;
    r->pending = -1;  // fed by this step
  }
  // Prompt bookkeeping, kept prompt logits, and the rows to sample.
  const int64_t n_vocab = info().n_vocab;
  std::vector<int64_t> sample_at;  // logit row of each sampled row
  auto inflight = std::make_unique<Inflight>();
  int64_t at = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    Live& r = *rows[i];
    if (r.prefilling()) {
      if (r.draft && hidden_host.defined())
        r.drafter->commit(*r.draft, pos0[i], int64_t(tokens[i].size()),
                          hidden_host.data<float>() + token_at[i] * info().d_model);
      if (r.params.prompt_logits) {
        const int64_t begin = int64_t(r.fed) - r.cached;
        std::memcpy(r.prompt_logits.data<float>() + begin * n_vocab, logits.data<float>() + at * n_vocab,
                    size_t(n_logits[i]) * size_t(n_vocab) * sizeof(float));
      }
      r.fed += tokens[i].size();
      // The end of a session's prompt: its recurrent state is captured, so
      // that the next turn can rewind here.
      if (!r.prefilling() && r.session && r.seq->state_slot() >= 0) {
        SequenceSnapshot end = r.seq->capture();
        if (r.drafter) r.session->prompt_end = std::move(end);
      }
      // The chunk's blocks go to the prefix cache at once (requests arriving
      // meanwhile share them); with recurrent state, the state after it too
      // where it ends on a block boundary or ends the prompt.
      if (prefix_) {
        const bool recurrent = r.seq->state_slot() >= 0;
        const bool at_boundary = r.seq->length() % opts_.block_size == 0;
        prefix_->insert(*r.seq, /*keep_end=*/recurrent && (at_boundary || !r.prefilling()));
      }
    }
    at += n_logits[i];
    if (samples[i]) {
      // A decoding row samples each of its logits (a verify: 1 + drafts),
      // a prompt's last chunk its last.
      const int32_t n = verify[i] ? n_logits[i] : 1;
      for (int32_t t = n; t > 0; --t) sample_at.push_back(at - t);
      inflight->rows.push_back(r.id);
      inflight->n_ids.push_back(n);
      inflight->pos0.push_back(verify[i] ? pos0[i] : -1);  // a prompt's chunk was committed above
      inflight->token_at.push_back(token_at[i]);
    } else if (!r.prefilling() && r.params.max_tokens == 0) {
      finish(r, FinishReason::Length, out);
    }
  }
  if (sample_at.empty()) return;
  // The sampled rows' logits: the forward's own where they are all of its
  // rows, else gathered (on the host: only host forwards keep more rows).
  Tensor to_sample = logits;
  bool all = int64_t(sample_at.size()) == logits.dim(0);
  for (size_t i = 0; all && i < sample_at.size(); ++i) all = sample_at[i] == int64_t(i);
  if (!all) {
    AUGUR_ASSERT(logits.device() == Device::CPU, "gathered sample rows on the host only");
    to_sample = Tensor::empty(DType::F32, {int64_t(sample_at.size()), n_vocab});
    for (size_t i = 0; i < sample_at.size(); ++i)
      std::memcpy(to_sample.data<float>() + int64_t(i) * n_vocab, logits.data<float>() + sample_at[i] * n_vocab,
                  size_t(n_vocab) * sizeof(float));
  }
  std::vector<ops::SampleRow> srows;
  std::vector<ops::PenaltyEntry> penalties;
  for (size_t i = 0; i < inflight->rows.size(); ++i) {
    Live& r = *live_.at(inflight->rows[i]);
    // A verify's logit row t follows the drafts before it: its penalties
    // count them as generated.
    std::vector<int32_t> history = r.generated;
    for (int32_t t = 0; t < inflight->n_ids[i]; ++t) {
      if (t > 0) history.push_back(r.feed[size_t(t)]);
      srows.push_back(r.sampler.device_row(int32_t(srows.size()), int32_t(n_vocab), r.prompt, history, penalties));
    }
  }
  if (!penalties.empty()) ops::apply_penalties(to_sample, penalties);
  inflight->ids = runner_->sample(to_sample, srows);
  if (to_sample.device() == Device::CPU) inflight->host_logits = to_sample;
  inflight->hidden = hidden_host;
  inflight_ = std::move(inflight);
}

std::vector<Event> Engine::step() {
  std::vector<Event> out;
  const Clock::time_point t0 = Clock::now();
  launched_drafts_ = launched_prompt_ = false;
  if (can_chain()) {
    // The next decode step goes to the device with the ids in flight, then
    // those ids are read: the device never waits for the host.
    std::unique_ptr<Inflight> prev = std::move(inflight_);
    std::vector<Sequence*> seqs;
    for (RequestId id : prev->rows) seqs.push_back(live_.at(id)->seq);
    const Tensor logits = runner_->step_ahead(seqs, prev->ids.device(), LogitsOn::Device);
    auto next = std::make_unique<Inflight>();
    next->rows = prev->rows;
    next->n_ids.assign(next->rows.size(), 1);
    std::vector<ops::SampleRow> srows;
    std::vector<ops::PenaltyEntry> none;
    for (size_t i = 0; i < next->rows.size(); ++i) {
      Live& r = *live_.at(next->rows[i]);
      srows.push_back(r.sampler.device_row(int32_t(i), int32_t(info().n_vocab), r.prompt, r.generated, none));
    }
    next->ids = runner_->sample(logits, srows);
    resolve(*prev, out);
    for (RequestId id : prev->rows) {
      Live& r = *live_.at(id);
      if (r.done) continue;
      r.seq->append({&r.pending, 1});  // fed by the step just queued
      r.pending = -1;
    }
    inflight_ = std::move(next);
  } else {
    if (inflight_) {
      std::unique_ptr<Inflight> prev = std::move(inflight_);
      resolve(*prev, out);
    }
    for (auto& [id, r] : live_)
      if (r->cancelled) finish(*r, FinishReason::Cancelled, out);
    // Finished requests (their final events are in out) give their blocks
    // back before launch makes room: make_room neither counts nor preempts
    // them, so a request cancelled while the cache was full made the forward
    // find no block and fail the engine.
    for (auto it = live_.begin(); it != live_.end();)
      it = it->second->done ? live_.erase(it) : std::next(it);
    // Events settled so far carry tokens of requests that still live: they
    // are gathered after the launch.
    launch(out);
    if (inflight_ && !can_chain()) {
      std::unique_ptr<Inflight> f = std::move(inflight_);
      resolve(*f, out);
      // A step that drafted (propose, verify, rollback) against one that did
      // not, for adapt().
      if (!launched_prompt_) {
        double& avg = launched_drafts_ ? draft_step_s_ : plain_step_s_;
        const double s = seconds(t0, Clock::now());
        avg = avg <= 0 ? s : 0.8 * avg + 0.2 * s;
      }
    }
  }
  for (auto& [id, r] : live_)
    if (!r->event.ids.empty() || !r->event.text.empty()) {
      r->event.id = id;
      out.push_back(std::move(r->event));
      r->event = Event();
    }
  for (auto it = live_.begin(); it != live_.end();)
    it = it->second->done ? live_.erase(it) : std::next(it);
  // Events of one request in order: its token events before its final one.
  std::stable_sort(out.begin(), out.end(), [](const Event& a, const Event& b) {
    return a.id < b.id || (a.id == b.id && !a.done && b.done);
  });
  return out;
}

Event Engine::run(RequestId id, const std::function<void(const Event&)>& on_event) {
  if (!live_.count(id)) fail("[engine] no request ", id, " in flight");
  for (;;) {
    for (Event& e : step()) {
      if (e.id != id) continue;
      if (on_event) on_event(e);
      if (e.done) return std::move(e);
    }
  }
}

std::unique_ptr<Engine> load_engine(const std::string& dir, Device device, const EngineOptions& opts) {
  std::optional<TextModel> text;
  if (TextModel::exists(dir)) text.emplace(TextModel::load(dir));
  return std::make_unique<Engine>(load_model(dir, device), std::move(text), opts);
}

}  // namespace augur
