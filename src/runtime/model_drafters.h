// Drafters that run a model of their own, batched over the rows that draft
// in a step, greedy (their proposal distribution one-hot, as verify_draft
// assumes):
//   - a checkpoint's MTP head (Model::mtp()): fed the target's final hidden
//     state at t with token t + 1, it predicts t + 2; drafts after the first
//     chain on the head's own output in place of the target's hidden state.
//     Its K/V cache keeps the entries that read the target's hidden states;
//     the chained ones are dropped at the next round.
//   - a draft model: any model of the target's vocabulary, its sequence kept
//     in step with the target's by longest common prefix at each round
//     (rolled back by truncation, or capture and replay for recurrent
//     state), so rejected drafts and rewound sessions cost only the
//     replayed tokens.
#pragma once

#include <memory>
#include <span>

#include "model/model.h"
#include "runtime/draft.h"
#include "runtime/runner.h"

namespace augur {

// vocab: a draft vocabulary (token ids; the head scores only those), or
// empty for every token.

// head: the target's Model::mtp(), outliving the drafter.
std::unique_ptr<Drafter> make_mtp_drafter(Model& head, std::span<const int32_t> vocab, const RunnerOptions& opts);

// An error naming both when the draft model's vocabulary size differs from
// the target's.
std::unique_ptr<Drafter> make_model_drafter(std::unique_ptr<Model> draft, const ModelInfo& target,
                                            std::span<const int32_t> vocab, const RunnerOptions& opts);

}  // namespace augur
