// augur-tiny's MTP head against the module that trained it
// (tools/train/train_tiny.py's MtpHead over transformers' trunk, f32, CPU),
// teacher-forced over the held-out window: reference written by
// tools/fixtures/mtp_reference.py into tests/data/augur_tiny/mtp_reference.safetensors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "io/safetensors.h"
#include "runtime/perplexity.h"
#include "runtime/runner.h"

namespace augur {
namespace {

const std::string kData = AUGUR_TEST_DATA;
const std::string kTiny = kData + "/../../models/augur-tiny";

std::vector<int32_t> ids_of(const SafetensorsFile& f, const char* name) {
  const Tensor t = f.tensor(*f.find(name));
  return std::vector<int32_t>(t.data<int32_t>(), t.data<int32_t>() + t.numel());
}

TEST(MtpGolden, AugurTinyHeadMatchesTheTrainingModule) {
  auto ref = SafetensorsFile::open(kData + "/augur_tiny/mtp_reference.safetensors");
  const std::vector<int32_t> window = ids_of(*ref, "window_ids");
  const std::vector<int32_t> ref_guess = ids_of(*ref, "mtp_argmax");
  const Tensor ref_logits = ref->tensor(*ref->find("mtp_logits"));  // [64, V]
  auto model = load_model(kTiny);
  ASSERT_NE(model->mtp(), nullptr);
  const int64_t T = int64_t(window.size()) - 1, d = model->info().d_model, V = model->info().n_vocab;
  RunnerOptions ro;
  ro.max_cached_tokens = T + 1;
  ro.prefill_chunk = T + 1;
  ro.max_sequences = 1;
  Runner target(*model, ro), head(*model->mtp(), ro);
  // The trunk over the window's inputs (its final hidden states), then the
  // head over (hidden t, token t + 1).
  auto seq = target.new_sequence();
  Sequence* seqs[] = {seq.get()};
  const std::span<const int32_t> input(window.data(), size_t(T));
  const std::span<const int32_t> rows[] = {input};
  const int32_t none[] = {0};
  HiddenIo io;
  io.out = Tensor::empty(DType::F32, {T, d});
  target.step(seqs, rows, none, LogitsOn::Host, io);
  auto mseq = head.new_sequence();
  Sequence* mseqs[] = {mseq.get()};
  HiddenIo mio;
  mio.in = io.out.slice_rows(0, T - 1);
  const std::span<const int32_t> next[] = {input.subspan(1)};
  const int32_t all[] = {int32_t(T - 1)};
  const Tensor logits = head.step(mseqs, next, all, LogitsOn::Host, mio);  // [T - 1, V]
  ASSERT_EQ(int64_t(ref_guess.size()), T - 1);

  float worst = 0;
  for (int64_t i = 0; i < ref_logits.numel(); ++i)
    worst = std::max(worst, std::fabs(logits.data<float>()[i] - ref_logits.data<float>()[i]));
  int64_t same = 0;
  for (int64_t t = 0; t + 1 < T; ++t) {
    const float* row = logits.data<float>() + t * V;
    same += int32_t(std::max_element(row, row + V) - row) == ref_guess[size_t(t)];
  }
  std::printf("[mtp golden] logits max |augur - reference| = %.3g over 64 positions; top-1 equal at %lld of %lld\n",
              worst, (long long)same, (long long)(T - 1));
  EXPECT_LT(worst, 1e-4);
  EXPECT_GE(same, T - 1 - 3);  // near-ties may fall either way

  // The agreement rate the training script reports for this window.
  const std::vector<int32_t> trunk = ids_of(*ref, "trunk_argmax");
  int64_t ref_agree = 0;
  for (int64_t t = 0; t + 1 < T; ++t) ref_agree += ref_guess[size_t(t)] == trunk[size_t(t + 1)];
  const MtpAgreement a = mtp_agreement(*model, window, PerplexityOptions{});
  std::printf("[mtp golden] agreement with the greedy choice: augur %lld, reference %lld of %lld\n",
              (long long)a.agree, (long long)ref_agree, (long long)a.positions);
  EXPECT_EQ(a.positions, T - 1);
  EXPECT_NEAR(double(a.agree), double(ref_agree), 3.0);
}

}  // namespace
}  // namespace augur
