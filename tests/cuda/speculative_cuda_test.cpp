// Speculative decoding on CUDA (run on a GPU machine by
// scripts/cuda_device_test.sh; CI only compiles this file): for every family
// fixture and augur-tiny, greedy output with drafts (replayed with errors,
// n-gram, a draft model, the target itself, and the MTP heads of the hybrids)
// is plain greedy's on the same device, token for token over 256 tokens.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <random>

#include "backend/device.h"
#include "io/quantization.h"
#include "runtime/runner.h"
#include "runtime/draft_fixtures.h"
#include "runtime/engine.h"
#include "runtime/perplexity.h"
#include "families.h"

namespace augur {
namespace {

std::string dir_of(const std::string& name) { return name == "augur-tiny" ? kDraftTiny : kDraftData + "/" + name; }

std::vector<int32_t> prompt_ids(int64_t n_vocab, uint32_t seed, int n) {
  std::mt19937 rng(seed);
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (auto& t : ids) t = int32_t(rng() % uint32_t(n_vocab));
  return ids;
}

struct Outcome {
  std::vector<int32_t> ids;
  DraftStats drafts;
};

Outcome generate(Engine& e, const std::vector<int32_t>& prompt, int64_t n, const std::string& draft, int32_t k,
                 const std::vector<int32_t>& replay = {}) {
  RequestParams p;
  p.ignore_eos = true;
  p.max_tokens = n;
  p.speculation.draft = draft;
  p.speculation.k = k;
  p.speculation.adaptive = false;
  p.speculation.replay = replay;
  Outcome o;
  const Event fin = e.run(e.submit(Prompt::of_ids(prompt), p),
                          [&](const Event& ev) { o.ids.insert(o.ids.end(), ev.ids.begin(), ev.ids.end()); });
  o.drafts = fin.drafts;
  return o;
}

// The first position where two outputs differ, or -1.
long first_difference(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i)
    if (a[i] != b[i]) return long(i);
  return a.size() == b.size() ? -1 : long(std::min(a.size(), b.size()));
}

class CudaSpeculative : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (!device_available(Device::CUDA)) GTEST_SKIP() << "no CUDA device";
  }
};

TEST_P(CudaSpeculative, GreedyWithDraftsEqualsPlainGreedy) {
  const std::string name = GetParam();
  test::TempDir with_head, perturbed;
  const bool hybrid = name != "llama" && name != "qwen3";
  std::string target = dir_of(name);
  if (hybrid && name != "augur-tiny") {
    write_with_mtp(name, with_head);
    target = with_head.path().string();
  }
  if (name == "augur-tiny")
    write_truncated_tiny(4, perturbed);
  else
    write_perturbed(name, 0.3f, perturbed);
  EngineOptions eo;
  eo.max_cached_tokens = 4096;
  eo.max_sequences = 2;
  Engine e(load_model(target, Device::CUDA), std::nullopt, eo);
  const int64_t V = e.info().n_vocab;
  const auto prompt = prompt_ids(V, 5, 20);
  const Outcome plain = generate(e, prompt, 256, "", 4);
  ASSERT_EQ(plain.ids.size(), 256u);
  std::vector<int32_t> record = prompt;
  for (size_t i = 0; i < plain.ids.size(); ++i)
    record.push_back(i % 9 == 4 ? int32_t((plain.ids[i] + 1) % V) : plain.ids[i]);
  std::vector<std::pair<std::string, Outcome>> runs;
  for (int32_t k : {1, 4}) runs.emplace_back("replay k=" + std::to_string(k), generate(e, prompt, 256, "replay", k, record));
  runs.emplace_back("ngram k=4", generate(e, prompt, 256, "ngram", 4));
  runs.emplace_back("draft model k=3", generate(e, prompt, 256, perturbed.path().string(), 3));
  runs.emplace_back("itself k=3", generate(e, prompt, 256, target, 3));
  if (hybrid) runs.emplace_back("mtp k=2", generate(e, prompt, 256, "mtp", 2));
  for (const auto& [what, o] : runs) {
    const DraftStats& d = o.drafts;
    std::printf("[cuda spec] %s %s: %lld of %lld drafts accepted in %lld rounds (%lld whole); first difference %ld\n",
                name.c_str(), what.c_str(), (long long)d.accepted, (long long)d.drafted, (long long)d.rounds,
                (long long)d.full_rounds, first_difference(o.ids, plain.ids));
    EXPECT_EQ(o.ids, plain.ids) << what;
    EXPECT_GT(d.rounds - d.full_rounds + (what.rfind("itself", 0) == 0 ? 1 : 0), 0) << what << ": no rejection";
  }
  // The target's rollbacks replay the recurrence from the windows' kept inputs.
  EXPECT_EQ(e.runner().refed_tokens(), 0);
}

INSTANTIATE_TEST_SUITE_P(Families, CudaSpeculative, test::every_family(), test::family_test_name);

// augur-tiny's MTP head on the device agrees with its greedy choice as often
// as on the CPU (held-out window, teacher-forced).
TEST(CudaMtp, AgreementAsOnTheCpu) {
  if (!device_available(Device::CUDA)) GTEST_SKIP() << "no CUDA device";
  auto ref = SafetensorsFile::open(kDraftData + "/augur_tiny/reference.safetensors");
  const Tensor t = ref->tensor(*ref->find("window_ids"));
  const std::vector<int32_t> window(t.data<int32_t>(), t.data<int32_t>() + t.numel());
  auto cpu = load_model(kDraftTiny);
  auto gpu = load_model(kDraftTiny, Device::CUDA);
  const MtpAgreement a = mtp_agreement(*cpu, window, PerplexityOptions{});
  const MtpAgreement b = mtp_agreement(*gpu, window, PerplexityOptions{});
  std::printf("[cuda mtp] agreement: CPU %lld / %lld, CUDA %lld / %lld\n", (long long)a.agree, (long long)a.positions,
              (long long)b.agree, (long long)b.positions);
  EXPECT_EQ(a.positions, b.positions);
  EXPECT_NEAR(a.rate, b.rate, 0.01);
}

// augur-tiny quantized to 4 bits (augur quantize's layout) on the device,
// where each matrix is dequantized as it is placed: its prompt logits are the
// CPU's (which reads the packed weights) within the CUDA path's rounding,
// and nowhere near the unquantized model's.
TEST(CudaQuantized, FourBitAugurTinyAsOnTheCpu) {
  if (!device_available(Device::CUDA)) GTEST_SKIP() << "no CUDA device";
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("augur-cuda-q4-" + std::to_string(getpid()));
  std::filesystem::remove_all(dir);
  quantize_checkpoint(kDraftTiny, dir.string(), {4, 64});
  const std::vector<int32_t> prompt = prompt_ids(1000, 5, 48);
  auto logits = [&](const std::string& d, Device dev) {
    auto model = load_model(d, dev);
    Runner r(*model, {});
    const Tensor l = r.feed(*r.new_sequence(), prompt, true);
    return std::vector<float>(l.data<float>(), l.data<float>() + l.numel());
  };
  const auto gpu = logits(dir.string(), Device::CUDA), cpu = logits(dir.string(), Device::CPU);
  const auto plain = logits(kDraftTiny, Device::CPU);
  std::filesystem::remove_all(dir);
  ASSERT_EQ(gpu.size(), cpu.size());
  float on_device = 0.f, from_plain = 0.f;
  for (size_t i = 0; i < gpu.size(); ++i) {
    on_device = std::max(on_device, std::fabs(gpu[i] - cpu[i]));
    from_plain = std::max(from_plain, std::fabs(cpu[i] - plain[i]));
  }
  std::printf("[cuda quantized] 4-bit augur-tiny: max |CUDA - CPU| = %.4f; max |4-bit - bf16| = %.4f\n", on_device,
              from_plain);
  EXPECT_LT(on_device, 0.1f);
  EXPECT_GT(from_plain, 0.5f);
}

}  // namespace
}  // namespace augur
