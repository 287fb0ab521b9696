// Golden tests: logits and greedy continuations against the transformers
// reference (tests/data/<family>/reference.safetensors, made by
// shared/tools/make_fixtures.py with transformers 5.17 in float32).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>

#include "backend/cpu/matmul.h"
#include "io/safetensors.h"
#include "model/model.h"

namespace augur {
namespace {

const std::string kData = AUGUR_TEST_DATA;

struct Reference {
  std::shared_ptr<SafetensorsFile> file;
  Tensor get(const std::string& name) const {
    const TensorInfo* info = file->find(name);
    EXPECT_NE(info, nullptr) << name;
    return file->tensor(*info);
  }
  std::vector<int32_t> ids(const std::string& name) const {
    Tensor t = get(name);
    return std::vector<int32_t>(t.data<int32_t>(), t.data<int32_t>() + t.numel());
  }
};

// Logits at every position of `prompt` (one row, one forward).
Tensor forward_all(Model& model, const std::vector<int32_t>& prompt, int64_t block_size = 16) {
  const int64_t n = int64_t(prompt.size());
  KvCache kv(model.info().kv, (n + block_size - 1) / block_size, block_size, model.info().recurrent, 1);
  std::vector<int32_t> table(size_t(kv.n_blocks()));
  std::iota(table.begin(), table.end(), 0);
  ForwardRow row{prompt, 0, table, int32_t(n), 0};
  Tensor logits = Tensor::empty(DType::F32, {n, model.info().n_vocab});
  Executor executor(Device::CPU);
  model.forward(executor, {&row, 1}, kv, logits);
  return logits;
}

float max_abs_diff(const float* a, const float* b, int64_t n) {
  float m = 0;
  for (int64_t i = 0; i < n; ++i) m = std::max(m, std::fabs(a[i] - b[i]));
  return m;
}

// Greedy continuation by incremental decode over the paged cache (and, for
// hybrid models, the recurrent state carried in slot 0).
std::vector<int32_t> greedy(Model& model, std::vector<int32_t> prompt, int steps) {
  const int64_t bs = 4;  // small blocks: continuations cross block boundaries
  const int64_t cap = int64_t(prompt.size()) + steps;
  KvCache kv(model.info().kv, (cap + bs - 1) / bs, bs, model.info().recurrent, 1);
  std::vector<int32_t> table(size_t(kv.n_blocks()));
  std::iota(table.begin(), table.end(), 0);
  const int64_t V = model.info().n_vocab;
  std::vector<int32_t> out;
  std::vector<int32_t> feed = prompt;
  int32_t pos = 0;
  Executor executor(Device::CPU);
  for (int s = 0; s < steps; ++s) {
    ForwardRow row{feed, pos, table, 1, 0};  // slot 0 carries any recurrent state
    Tensor logits = Tensor::empty(DType::F32, {1, V});
    model.forward(executor, {&row, 1}, kv, logits);
    pos += int32_t(feed.size());
    const float* l = logits.data<float>();
    int32_t best = int32_t(std::max_element(l, l + V) - l);
    out.push_back(best);
    feed = {best};
  }
  return out;
}

class Golden : public ::testing::TestWithParam<std::string> {};

TEST_P(Golden, PromptLogitsMatchReference) {
  const std::string dir = kData + "/" + GetParam();
  auto model = load_model(dir);
  Reference ref{SafetensorsFile::open(dir + "/reference.safetensors")};
  const int64_t V = model->info().n_vocab;
  for (int i = 0; ref.file->find("prompt_" + std::to_string(i)); ++i) {
    auto prompt = ref.ids("prompt_" + std::to_string(i));
    Tensor want = ref.get("logits_" + std::to_string(i));
    ASSERT_EQ(want.dim(0), int64_t(prompt.size()));
    ASSERT_EQ(want.dim(1), V);
    Tensor got = forward_all(*model, prompt);
    float err = max_abs_diff(got.data<float>(), want.data<float>(), want.numel());
    EXPECT_LT(err, 1e-3f) << GetParam() << " case " << i;
    RecordProperty("max_abs_err_case_" + std::to_string(i), std::to_string(err));
    std::printf("[golden] %s case %d: max |logit - reference| = %.3g\n", GetParam().c_str(), i, err);
  }
}

TEST_P(Golden, GreedyContinuationsMatchReference) {
  const std::string dir = kData + "/" + GetParam();
  auto model = load_model(dir);
  Reference ref{SafetensorsFile::open(dir + "/reference.safetensors")};
  int n_cases = 0;
  for (int i = 0; ref.file->find("prompt_" + std::to_string(i)); ++i, ++n_cases) {
    auto want = ref.ids("greedy_" + std::to_string(i));
    auto got = greedy(*model, ref.ids("prompt_" + std::to_string(i)), int(want.size()));
    EXPECT_EQ(got, want) << GetParam() << " case " << i;
  }
  EXPECT_GE(n_cases, 1);
}

TEST_P(Golden, LongPromptLastLogitsMatchReference) {
  const std::string dir = kData + "/" + GetParam();
  Reference ref{SafetensorsFile::open(dir + "/reference.safetensors")};
  if (!ref.file->find("prompt_long")) GTEST_SKIP() << "no long prompt in this fixture";
  auto model = load_model(dir);
  auto prompt = ref.ids("prompt_long");
  Tensor want = ref.get("logits_long_last8");  // [8, n_vocab]
  Tensor got = forward_all(*model, prompt);
  const int64_t V = model->info().n_vocab, n = int64_t(prompt.size());
  float err = max_abs_diff(got.data<float>() + (n - 8) * V, want.data<float>(), 8 * V);
  std::printf("[golden] %s long (%lld tokens): max |logit - reference| over the last 8 = %.3g\n",
              GetParam().c_str(), (long long)n, err);
  EXPECT_LT(err, 1e-3f);
}

// Layer by layer against the reference's hidden states (hidden_0: the
// embeddings, then each layer's output, the last one after the final norm;
// layer_out_0: each decoder layer's raw output, from hooks), through the
// model's taps: when a family breaks, the first layer that diverges is named.
TEST_P(Golden, LayerOutputsMatchReference) {
  const std::string dir = kData + "/" + GetParam();
  Reference ref{SafetensorsFile::open(dir + "/reference.safetensors")};
  ASSERT_TRUE(ref.file->find("layer_out_0")) << "regenerate with tools/fixtures/make_fixtures.py --augment";
  auto model = load_model(dir);
  const auto prompt = ref.ids("prompt_0");
  const int64_t n = int64_t(prompt.size()), d = model->info().d_model, L = model->info().n_layer;
  KvCache kv(model->info().kv, (n + 15) / 16, 16, model->info().recurrent, 1);
  std::vector<int32_t> table(size_t(kv.n_blocks()));
  std::iota(table.begin(), table.end(), 0);
  ForwardRow row{prompt, 0, table, 1, 0};
  Tensor logits = Tensor::empty(DType::F32, {1, model->info().n_vocab});
  Executor executor(Device::CPU);
  Taps taps;
  model->forward(executor, {&row, 1}, kv, logits, Tensor(), &taps);

  const Tensor hidden = ref.get("hidden_0"), layer_out = ref.get("layer_out_0");  // [L+1, n, d], [L, n, d]
  ASSERT_EQ(layer_out.dim(0), L);
  auto check = [&](const std::string& key, const float* want) {
    const Tensor got = taps.get(key);
    if (!got.defined()) return std::string("no tap ") + key;
    if (got.numel() != n * d) return key + " has " + std::to_string(got.numel()) + " values";
    float scale = 1;
    for (int64_t i = 0; i < n * d; ++i) scale = std::max(scale, std::fabs(want[i]));
    const float err = max_abs_diff(got.data<float>(), want, n * d);
    std::printf("[golden] %s %s: max |tap - reference| = %.3g (values up to %.3g)\n", GetParam().c_str(),
                key.c_str(), err, scale);
    return err < 1e-4f * scale ? std::string() : key + " diverges: max error " + std::to_string(err);
  };
  std::string first = check("embed.0", hidden.data<float>());
  for (int64_t i = 0; i < L && first.empty(); ++i) first = check("hidden." + std::to_string(i), layer_out.data<float>() + i * n * d);
  EXPECT_EQ(first, "") << GetParam() << ": the first diverging tap";
  for (const char* name : {"attn_out", "mlp_out"})
    for (int64_t i = 0; i < L; ++i) EXPECT_TRUE(taps.get(std::string(name) + "." + std::to_string(i)).defined());
  // hidden_0's entries between the first and the last are the same layer outputs.
  for (int64_t i = 0; i + 1 < L; ++i)
    EXPECT_EQ(max_abs_diff(hidden.data<float>() + (i + 1) * n * d, layer_out.data<float>() + i * n * d, n * d), 0.0f);
  // A forward with taps is the same forward: its logits are the untapped ones.
  Tensor plain = forward_all(*model, prompt);
  EXPECT_LT(max_abs_diff(logits.data<float>(), plain.data<float>() + (n - 1) * model->info().n_vocab,
                         model->info().n_vocab), 1e-5f);
}

INSTANTIATE_TEST_SUITE_P(Families, Golden,
                         ::testing::Values("llama", "qwen3", "qwen3_5", "qwen3_5_moe", "qwen3_next"));

}  // namespace
}  // namespace augur

namespace augur {
namespace {

// augur-tiny, the default model shipped in models/augur-tiny, against
// transformers (f32, CPU) on its held-out text: reference written by
// tools/train/train_tiny.py into tests/data/augur_tiny/reference.safetensors.
const std::string kTiny = kData + "/../../models/augur-tiny";

Reference tiny_reference() { return {SafetensorsFile::open(kData + "/augur_tiny/reference.safetensors")}; }

TEST(AugurTiny, HeldOutLogitsMatchTransformers) {
  auto model = load_model(kTiny);
  const Reference ref = tiny_reference();
  Tensor want = ref.get("logits_0");
  Tensor got = forward_all(*model, ref.ids("prompt_0"));
  ASSERT_EQ(got.numel(), want.numel());
  const float err = max_abs_diff(got.data<float>(), want.data<float>(), want.numel());
  std::printf("[golden] augur-tiny held-out (%lld tokens): max |logit - reference| = %.3g\n",
              (long long)want.dim(0), err);
  EXPECT_LT(err, 1e-3f);
}

TEST(AugurTiny, GreedyMatchesTransformers) {
  auto model = load_model(kTiny);
  const Reference ref = tiny_reference();
  const auto want = ref.ids("greedy_0");
  EXPECT_EQ(greedy(*model, ref.ids("greedy_prompt"), int(want.size())), want);
}

// Per-token NLL over a 1024-token held-out window (the perplexity protocol's
// unit): each within 1e-3 nats, the mean within 1e-4 relative (so the
// perplexities agree far inside 0.1%).
TEST(AugurTiny, HeldOutWindowNllMatchesTransformers) {
  auto model = load_model(kTiny);
  const Reference ref = tiny_reference();
  const auto ids = ref.ids("window_ids");
  Tensor want = ref.get("window_nll");
  ASSERT_EQ(int64_t(ids.size()), want.numel() + 1);
  const std::vector<int32_t> input(ids.begin(), ids.end() - 1);
  Tensor logits = forward_all(*model, input, 64);
  const int64_t V = model->info().n_vocab;
  double sum_got = 0, sum_want = 0, worst = 0;
  for (int64_t t = 0; t < int64_t(input.size()); ++t) {
    const float* row = logits.data<float>() + t * V;
    const double mx = *std::max_element(row, row + V);
    double z = 0;
    for (int64_t v = 0; v < V; ++v) z += std::exp(double(row[v]) - mx);
    const double nll = std::log(z) + mx - double(row[ids[size_t(t + 1)]]);
    const double w = want.data<float>()[t];
    worst = std::max(worst, std::fabs(nll - w));
    sum_got += nll;
    sum_want += w;
  }
  std::printf("[golden] augur-tiny window: mean NLL %.6f vs reference %.6f, worst token %.3g\n",
              sum_got / double(input.size()), sum_want / double(input.size()), worst);
  EXPECT_LT(worst, 1e-3);
  EXPECT_NEAR(sum_got / sum_want, 1.0, 1e-4);
}

}  // namespace
}  // namespace augur

namespace augur {
namespace {

// What rounding the GEMM inputs to f16 alone does (the CUDA tensor-core path's
// one rounding of activations; cpu::detail::round_inputs_to_f16 emulates it):
// the trained augur-tiny stays within bf16 tolerance of transformers, while
// the random-weight hybrid fixtures amplify it (their Gated DeltaNet
// recurrences magnify input error), which is why tests/cuda holds those
// fixtures to this measured sensitivity rather than to a fixed 2e-2.
TEST(F16Inputs, TrainedModelStaysWithinBf16ToleranceRandomHybridsAmplify) {
  bool& round = cpu::detail::round_inputs_to_f16();
  // Max |logit - reference| over the reference's rows (the last ones of the
  // prompt when the reference keeps only those).
  auto error = [&](const std::string& dir, const Reference& ref, const std::string& prompt, const std::string& logits) {
    auto model = load_model(dir);
    Tensor want = ref.get(logits);
    round = true;
    Tensor got = forward_all(*model, ref.ids(prompt));
    round = false;
    const int64_t skip = got.numel() - want.numel();
    return max_abs_diff(got.data<float>() + skip, want.data<float>(), want.numel());
  };
  const float tiny = error(kTiny, tiny_reference(), "prompt_0", "logits_0");
  std::printf("[golden] f16 GEMM inputs: augur-tiny max |logit - reference| = %.3g\n", tiny);
  EXPECT_LT(tiny, 2e-2f);
  float fixtures = 0;
  for (const char* family : {"qwen3_5", "qwen3_5_moe", "qwen3_next"}) {
    const Reference ref{SafetensorsFile::open(kData + "/" + family + "/reference.safetensors")};
    for (int i = 0; ref.file->find("prompt_" + std::to_string(i)); ++i) {
      const float e = error(kData + "/" + family, ref, "prompt_" + std::to_string(i), "logits_" + std::to_string(i));
      std::printf("[golden] f16 GEMM inputs: %s case %d max |logit - reference| = %.3g\n", family, i, e);
      fixtures = std::max(fixtures, e);
    }
    if (ref.file->find("prompt_long")) {
      const float e = error(kData + "/" + family, ref, "prompt_long", "logits_long_last8");
      std::printf("[golden] f16 GEMM inputs: %s long (last 8) max |logit - reference| = %.3g\n", family, e);
      fixtures = std::max(fixtures, e);
    }
  }
  EXPECT_GT(fixtures, 10 * tiny) << "the hybrid fixtures no longer amplify input rounding: tighten tests/cuda";
}

}  // namespace
}  // namespace augur
