// A model with its KV cache and block pool: runs forwards over sequences.
// Requests, sampling and text are the engine's (runtime/engine.h).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "model/model.h"
#include "runtime/sampler.h"
#include "runtime/sequence.h"

namespace augur {

struct RunnerOptions {
  int64_t max_cached_tokens = 4096;  // KV capacity over all sequences
  int64_t block_size = 16;           // tokens per KV block
  int64_t prefill_chunk = 512;       // longest run of tokens in one forward
  int64_t max_sequences = 16;        // live sequences at once (recurrent-state slots, hybrid models)
  int64_t max_recorded_steps = kMaxRecordedSteps;  // CUDA graphs of step shapes kept (device memory)
};

// Where Runner::step / feed leave the logits: on the host, or on the model's
// device (CUDA: no copy to the host; sample them there with ops::sample).
enum class LogitsOn { Host, Device };

class Runner {
 public:
  Runner(Model& model, const RunnerOptions& opts);
  Model& model() { return *model_; }
  KvCache& kv() { return kv_; }
  BlockPool& pool() { return pool_; }
  const RunnerOptions& options() const { return opts_; }

  std::unique_ptr<Sequence> new_sequence() { return std::make_unique<Sequence>(pool_, kv_, &slots_); }
  SlotPool& slots() { return slots_; }

  // One forward over several sequences: row i appends tokens[i] to seqs[i]
  // and asks for the logits of its last n_logits[i] tokens.
  // Returns [sum n_logits, n_vocab] f32, rows in order. On LogitsOn::Device
  // the tensor lives on the model's device and stays valid until the next
  // step or feed of this runner. hidden: hidden states read beside the
  // tokens or left beside the logits (Model::forward), rows as the tokens',
  // on the host or the model's device (on an accelerator they pass through
  // buffers of the runner's, so that such steps are recorded too).
  Tensor step(std::span<Sequence* const> seqs, std::span<const std::span<const int32_t>> tokens,
              std::span<const int32_t> n_logits, LogitsOn on = LogitsOn::Host, const HiddenIo& hidden = {});

  // A decode step of one token a row whose ids are still where a sample left
  // them (ops::SampledIds::device(), [seqs.size()] i32): the host queues it
  // without waiting for them. The sequences are not extended: append each id
  // once it is read. A model without recurrent state may instead drop it (a
  // stop token): its sequence is then as if the step had not run.
  Tensor step_ahead(std::span<Sequence* const> seqs, const Tensor& ids, LogitsOn on = LogitsOn::Host);

  // Rolls each sequence back to its first keep[i] tokens (rejected drafts):
  // K/V by truncation; recurrent state, which only follows the last token, by
  // going back to the sequence's last capture() (which must lie at or below
  // keep[i]) and replaying the recurrence over the kept tokens from the
  // inputs their verify window left (Sequence::rewind); where the window
  // kept none (longer than KvCache::kInputHistory, or not one window since
  // the capture), by feeding the kept tokens again, all such rows in one
  // forward. The state is then what feeding only the kept tokens leaves.
  void rollback(std::span<Sequence* const> seqs, std::span<const int64_t> keep);
  // Tokens rollbacks fed through the model again (no kept inputs covered them).
  int64_t refed_tokens() const { return refed_tokens_; }
  // Forwards recorded as device graphs so far (tests).
  int64_t recordings() const { return executor_.recordings() + replay_executor_.recordings(); }
  // Forwards' recorded steps held now, and the bytes of the scratch they share.
  int64_t recorded_steps() const { return executor_.recorded_steps(); }
  size_t recorded_scratch_bytes() const { return executor_.recorded_scratch_bytes(); }

  // ops::sample_async into this runner's ids buffer on the device (one
  // address, which the decode graphs of step_ahead read in place): device()
  // holds the ids until the next sample of this runner.
  ops::SampledIds sample(const Tensor& logits, std::span<const ops::SampleRow> rows);

  // Appends a run of tokens to one sequence in chunks of prefill_chunk.
  // Returns the logits of the last token [1, n_vocab], or of every token
  // [n_tokens, n_vocab] when all_logits (placed as step() places them).
  Tensor feed(Sequence& seq, std::span<const int32_t> tokens, bool all_logits = false,
              LogitsOn on = LogitsOn::Host);

  // Throwaway forwards of 16, 32, 64, ... tokens up to `tokens` (bounded by
  // the prefill chunk, 4096, the KV pool and the model's positions), then,
  // after the longest, forwards of few, few - 1, ..., 1 tokens asking for
  // every token's logits (verify windows of few tokens; the last a decode
  // step), on a sequence given back after: what the first forward of each
  // length would otherwise pay once per process is paid here, at load (on
  // CUDA: loading cuBLASLt's and our kernels, choosing cuBLASLt's algorithm
  // for each length's bucket, the caching allocator's first allocations).
  // A draft head's forwards read zero hidden states. Leaves no state
  // behind: its blocks and slot go back.
  void warm_up(int64_t tokens, int64_t few = 1);

 private:
  // step() and step_ahead(): the forward, with the ids on the device when given.
  Tensor run(std::span<Sequence* const> seqs, std::span<const std::span<const int32_t>> tokens,
             std::span<const int32_t> n_logits, LogitsOn on, const Tensor& ids, const HiddenIo& hidden = {});
  Model* model_;
  RunnerOptions opts_;
  Executor executor_;
  Executor replay_executor_;  // rollbacks' replays of the recurrence (recorded apart from forwards)
  KvCache kv_;
  BlockPool pool_;
  SlotPool slots_;
  Tensor device_logits_;  // LogitsOn::Device steps write here (grown on demand)
  Tensor device_ids_;     // sample() leaves ids here (grown on demand)
  Tensor hidden_in_, hidden_out_;  // hidden states of a step on the device (grown on demand)
  int64_t refed_tokens_ = 0;
};

}  // namespace augur
