// The engine: owns a model, its tokenizer and chat template, the runner and
// the sampling of every request; the one request path from prompt to text.
//
// A request (token ids, raw text or chat messages; sampling; stop ids and
// strings; a token limit; logprobs) is submitted and yields events: new ids
// with their text delta (complete UTF-8, stop strings held back until
// decided), optional logprobs, and a final event with the finish reason,
// usage and timings. Several requests may be in flight: one step() is one
// flattened forward over every live request's rows (prefill chunks under a
// token budget, one token a decoding row). CLI, bench and server are clients.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "model/model.h"
#include "runtime/draft.h"
#include "runtime/prefix_cache.h"
#include "runtime/runner.h"
#include "runtime/sampler.h"
#include "runtime/text_model.h"

namespace augur {

using RequestId = int64_t;

// What a request continues: token ids as given, raw text (encoded with the
// tokenizer's special tokens) or chat messages (rendered by the template).
struct Prompt {
  enum class Kind { Ids, Text, Chat };
  Kind kind = Kind::Ids;
  std::vector<int32_t> ids;
  std::string text;
  nlohmann::ordered_json messages;
  bool add_generation_prompt = true;  // Chat
  // Chat: more variables of the template (tools, enable_thinking, ...).
  nlohmann::ordered_json chat_extra = nlohmann::ordered_json::object();
  static Prompt of_ids(std::vector<int32_t> ids);
  static Prompt of_text(std::string text);
  static Prompt of_chat(nlohmann::ordered_json messages, bool add_generation_prompt = true,
                        nlohmann::ordered_json chat_extra = nlohmann::ordered_json::object());
};

struct RequestParams {
  SamplingParams sampling;
  int64_t max_tokens = 16;
  // max_tokens is a default, not the client's: the scheduler cuts it to what
  // the context and the cache leave beside the prompt, instead of refusing.
  bool fit_max_tokens = false;
  bool ignore_eos = false;            // else the model's EOS ids stop generation
  std::vector<int32_t> stop_ids;      // more ids that end generation (emitted)
  std::vector<std::string> stop;      // stop strings (the text before them is kept)
  // -1: none; 0: the chosen token's log-probability; n > 0: and the n most
  // likely tokens'. Taken from log_softmax of the logits after penalties.
  int32_t logprobs = -1;
  bool prompt_logits = false;         // the final event carries every prompt position's logits
  // A session keeps its sequence after the request: the next request of the
  // session feeds only what follows the longest prefix it already holds.
  int64_t session = -1;
  // Speculative decoding: drafts verified by the target; greedy output
  // unchanged, sampled output distributed as plain sampling's.
  SpeculationParams speculation;
};

enum class FinishReason { Stop, Length, Cancelled };
const char* finish_reason_name(FinishReason r);

struct TokenLogprob {
  int32_t id = 0;
  float logprob = 0;
  std::vector<std::pair<int32_t, float>> top;  // (id, logprob), most likely first
};

struct Usage {
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  int64_t cached_tokens = 0;  // prompt tokens the session already held
};

// What speculation did for a request: verify rounds with at least one draft,
// drafts proposed, drafts the target agreed with, and the rounds in which it
// agreed with every one.
struct DraftStats {
  int64_t rounds = 0;
  int64_t drafted = 0;
  int64_t accepted = 0;
  int64_t full_rounds = 0;
};

struct Timings {
  double prefill_s = 0;    // first forward of the request to its first token on the host
  double decode_s = 0;     // first token to the last
  int64_t prefill_tokens = 0;  // prompt tokens fed (cached ones excluded)
  int64_t decode_tokens = 0;   // tokens after the first
};

struct Event {
  RequestId id = -1;
  std::vector<int32_t> ids;  // new tokens
  std::string text;          // their text, as far as it is settled
  std::vector<TokenLogprob> logprobs;  // one per id, when asked for
  bool done = false;
  // The final event only:
  FinishReason finish = FinishReason::Length;
  bool stop_token = false;  // the last id is a stop id (EOS or stop_ids): no text of its own
  Usage usage;
  Timings timings;
  DraftStats drafts;
  std::vector<int32_t> prompt_ids;
  Tensor prompt_logits;  // [n_prompt fed, n_vocab] f32 on the host, when asked for
};

struct EngineOptions {
  int64_t max_cached_tokens = 4096;  // KV capacity over all sequences
  int64_t block_size = 16;
  int64_t step_tokens = 512;         // most prompt tokens one step feeds
  int64_t max_sequences = 16;        // live sequences (recurrent-state slots)
  // Requests without a session resume from the longest prefix an earlier
  // request left in the cache (runtime/prefix_cache.h), and leave theirs.
  bool prefix_cache = false;
  int64_t prefix_states = 16;        // recurrent-state copies the cache keeps (hybrid models)
};

class Engine {
 public:
  // text: the checkpoint's tokenizer, or none (ids in and out only).
  Engine(std::unique_ptr<Model> model, std::optional<TextModel> text, const EngineOptions& opts);
  ~Engine();
  Model& model() { return *model_; }
  const ModelInfo& info() const { return model_->info(); }
  const TextModel* text() const { return text_ ? &*text_ : nullptr; }
  Runner& runner() { return *runner_; }
  // Null unless EngineOptions::prefix_cache.
  const PrefixCache* prefix_cache() const { return prefix_.get(); }
  // Requests preempted so far: when a step's rows need more KV blocks than
  // are free, the newest requests give theirs back and are fed again later
  // (from the prefix cache where it still holds them). Greedy output is
  // unchanged by it.
  int64_t preemptions() const { return preemptions_; }
  // Ends every request and hands the model back (the engine is then empty).
  std::unique_ptr<Model> release();

  // The prompt's token ids as a request would feed them.
  std::vector<int32_t> encode(const Prompt& prompt) const;
  // Makes the draft source `params` names now rather than at the first
  // request that asks for it, so that a bad name, draft model or draft
  // vocabulary is an augur::Error here; on an accelerator also pays what
  // the first speculative request would (Drafter::warm_up, and the target's
  // verify windows of up to 1 + k tokens). Nothing to do without a draft.
  void prepare_speculation(const SpeculationParams& params);
  // Checks the request (bad input is an augur::Error naming it) and queues it.
  RequestId submit(const Prompt& prompt, const RequestParams& params);
  // Ends a request at once: its final event (FinishReason::Cancelled) comes
  // from the next step().
  void cancel(RequestId id);
  // A session: its sequence outlives each request (see RequestParams::session).
  int64_t open_session();
  void close_session(int64_t session);
  // A session's state as a value: its sequence (KV blocks, shared until
  // written, and recurrent state) and its draft source's row. restore() puts
  // it back into any session of this engine (a branch of a conversation, a
  // turn undone); the session's next request then feeds only what follows.
  struct SessionCheckpoint {
    SequenceSnapshot seq;
    Drafter* drafter = nullptr;  // the source of `draft` (null: none)
    SpeculationParams draft_params;
    DraftState draft;
  };
  SessionCheckpoint checkpoint(int64_t session);
  void restore(int64_t session, const SessionCheckpoint& c);

  bool idle() const;
  // One forward over every live request; returns the events it settled.
  std::vector<Event> step();
  // Steps until `id` finishes; each of its events goes to on_event (others'
  // are dropped); returns its final event.
  Event run(RequestId id, const std::function<void(const Event&)>& on_event = {});

 private:
  struct Live;
  struct Session;
  struct Inflight;
  Session& idle_session(int64_t session);
  void finish(Live& r, FinishReason why, std::vector<Event>& out);
  void accept(Live& r, int32_t token, const float* logits_row, std::vector<Event>& out);
  bool can_chain() const;
  void resolve(Inflight& f, std::vector<Event>& out);
  void launch(std::vector<Event>& out);
  int64_t resume(Live& r);
  void preempt(Live& r);
  void make_room();
  Drafter& drafter(const std::string& name, const std::string& vocab_file);
  size_t chunk_length(const Live& r, int64_t budget) const;
  int32_t draft_cap(const Live& r) const;
  int32_t draft_budget(Live& r);
  void adapt(Live& r, int64_t drafted, int64_t accepted);

  std::unique_ptr<Model> model_;
  std::optional<TextModel> text_;
  EngineOptions opts_;
  std::unique_ptr<Runner> runner_;
  std::unique_ptr<PrefixCache> prefix_;  // over runner_'s blocks
  // Draft sources by name and draft vocabulary (RequestParams::speculation),
  // made on first use.
  std::map<std::string, std::unique_ptr<Drafter>> drafters_;
  // Measured seconds of a step without drafts and of one with (propose and
  // verify), moving averages: what a speculative round costs against a plain one.
  double plain_step_s_ = 0, draft_step_s_ = 0;
  bool launched_drafts_ = false;  // the last launch fed drafts
  bool launched_prompt_ = false;  // the last launch fed a prompt chunk
  int64_t preemptions_ = 0;
  RequestId next_id_ = 0;
  int64_t next_session_ = 0;
  std::map<RequestId, std::unique_ptr<Live>> live_;  // in submission order
  std::map<int64_t, std::unique_ptr<Session>> sessions_;
  std::unique_ptr<Inflight> inflight_;  // a forward queued whose ids are not read yet
};

// Loads a checkpoint (weights, tokenizer where there is one) into an engine.
std::unique_ptr<Engine> load_engine(const std::string& dir, Device device, const EngineOptions& opts);

}  // namespace augur
