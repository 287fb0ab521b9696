// Running a forward over a flattened batch on a device. The model layer
// writes its forward as a body of ops over a BatchPlan and a Scratch; the
// executor uploads the batch layout, owns the activation buffers and, where
// the device records work (CUDA graphs, cuda_settings().graphs), records each
// decode step's shape once and replays it.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include "backend/device.h"
#include "backend/kv_cache.h"
#include "backend/ops.h"
#include "core/tensor.h"

namespace augur {

// The flattened batch: tokens of all rows back to back.
struct BatchPlan {
  std::vector<int32_t> tokens;        // [n_tokens]
  std::vector<int32_t> positions;     // [n_tokens]
  std::vector<ops::AttnRow> rows;     // one per row
  std::vector<int32_t> logit_tokens;  // [n_out] batch indices whose logits are returned
  ops::DeviceBatch device;            // the layout uploaded to an accelerator, if any
  int64_t n_tokens() const { return int64_t(tokens.size()); }
  ops::BatchView view() const { return {rows, positions, device.tokens.defined() ? &device : nullptr}; }
};

// Reusable activation buffers on one device, keyed by a slot name; a buffer
// is reallocated only when a larger shape is asked for, so the addresses of a
// decode step repeat (as a recorded graph needs).
class Scratch {
 public:
  // growth > 1: a buffer that must grow takes at least `growth` times its
  // size, so that shapes growing one by one reallocate it a few times, not
  // at each.
  explicit Scratch(Device device = Device::CPU, double growth = 1.0) : device_(device), growth_(growth) {}
  Tensor get(const std::string& slot, std::initializer_list<int64_t> shape);
  // Counts the (re)allocations: a recording made at another generation may
  // address a freed buffer.
  uint64_t generation() const { return generation_; }
  size_t bytes() const;

 private:
  Device device_;
  double growth_;
  std::map<std::string, Tensor> buffers_;
  uint64_t generation_ = 0;
};

// Intermediate tensors of a forward, recorded by name and layer
// ("attn_out.3") as host copies, for comparing a model with its reference
// layer by layer. A forward with taps runs eagerly.
class Taps {
 public:
  void record(const std::string& name, int64_t layer, const Tensor& t);
  // Keyed "name.layer"; undefined where nothing was recorded.
  Tensor get(const std::string& key) const;
  const std::map<std::string, Tensor>& all() const { return tensors_; }

 private:
  std::map<std::string, Tensor> tensors_;
};

// The most tokens a row of a recorded step (a verify of 1 + 7 drafts).
inline constexpr int64_t kMaxRecordedTokens = 8;
// The most recorded steps an executor keeps: a server's batch changes shape
// at every join and leave (rows x tokens a row x context bucket), and each
// recording holds device memory; past this the least recently used goes.
inline constexpr int64_t kMaxRecordedSteps = 96;

class Executor {
 public:
  // The ops of a forward: reads plan (its view() and tokens), writes the
  // logits of plan.logit_tokens into `logits` ([n_out, n_vocab] f32 on the
  // executor's device), takes its buffers from `scratch`. It must queue the
  // same work for the same shapes (it may be recorded and replayed).
  using Body = std::function<void(const BatchPlan& plan, Scratch& scratch, const Tensor& logits)>;

  // max_steps: recorded steps kept (kMaxRecordedSteps; tests use fewer).
  explicit Executor(Device device, int64_t max_steps = kMaxRecordedSteps);
  Device device() const { return device_; }

  // Runs `body` over `plan` for cache `kv` and leaves the logits in `logits`
  // ([n_out, n_vocab] f32 on the host or this device). ids: the plan's token
  // ids already on this device ([n_tokens] i32: a previous step's samples),
  // or undefined (plan.tokens holds them). bound: device addresses outside
  // its scratch that the body reads or writes (hidden states in and out); a
  // recording replays only for the same ones. eager: never record (a body
  // with host work of its own per step, such as taps).
  // Decode steps (every row one token, one logit) and uniform steps of
  // several tokens a row (every row the same 1 + k tokens, up to
  // kMaxRecordedTokens, with each token's logits or the last one's) are
  // recorded once per (cache, rows, tokens a row, logits, context bucket)
  // with one scratch they share (each buffer the largest any of them asked,
  // or half as much again, so that addresses stop moving once the largest
  // have run), and replayed
  // with the new layout; a step recorded before the scratch last grew
  // records again.
  void run(BatchPlan& plan, const KvCache& kv, const Tensor& logits, const Tensor& ids, const Body& body,
           std::vector<const void*> bound = {}, bool eager = false);
  // Steps recorded so far (a test's window on when a step records again).
  int64_t recordings() const { return recordings_; }
  // Recorded steps held now, and the bytes of the scratch they share.
  int64_t recorded_steps() const { return int64_t(steps_.size()); }
  size_t recorded_scratch_bytes() const { return recorded_scratch_.bytes(); }

 private:
  struct Step {
    BatchPlan plan;  // the recorded layout; refilled before each replay
    std::unique_ptr<CapturedWork> work;
    // What the recording addresses besides its scratch: the logits it writes
    // (the caller's device tensor, or null: its scratch, copied out) and the
    // ids it embeds (null: the uploaded ones). Others record it again.
    const void* logits_at = nullptr;
    const void* ids_at = nullptr;
    std::vector<const void*> bound;
    uint64_t scratch_generation = 0;  // the device's shared scratch when recorded (scratch_generation)
    uint64_t own_generation = 0;      // recorded_scratch_'s when recorded
    uint64_t last_used = 0;           // use_clock_ at its last run
  };
  using StepKey = std::tuple<uint64_t, int64_t, int64_t, int64_t, int64_t>;
  void evict_beyond(int64_t keep);
  Device device_;
  bool graphs_;
  int64_t max_steps_;
  Scratch scratch_;           // forwards that are not recorded
  Scratch recorded_scratch_;  // every recorded step's buffers
  std::map<StepKey, std::unique_ptr<Step>> steps_;
  uint64_t use_clock_ = 0;
  int64_t recordings_ = 0;
};

}  // namespace augur
