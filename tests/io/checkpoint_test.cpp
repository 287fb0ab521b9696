#include "io/checkpoint.h"

#include <gtest/gtest.h>

#include <cstring>

#include "io/safetensors_writer.h"
#include "io_test_util.h"

namespace augur {
namespace {

using test::TempDir;
using test::write_text;

// A [n] F32 tensor holding first, first + 1, ...
Tensor iota(int64_t n, float first) {
  Tensor t = Tensor::empty(DType::F32, {n});
  for (int64_t i = 0; i < n; ++i) t.data<float>()[i] = first + float(i);
  return t;
}

constexpr const char* kShard1 = "model-00001-of-00002.safetensors";
constexpr const char* kShard2 = "model-00002-of-00002.safetensors";

// Two shards: a, b in the first; c in the second.
void write_sharded(const TempDir& dir) {
  write_safetensors(dir.file(kShard1), {{"a", iota(4, 0)}, {"b", iota(2, 10)}});
  write_safetensors(dir.file(kShard2), {{"c", iota(3, 100)}});
}

std::string index_json(const std::string& c_shard = kShard2) {
  return R"({"metadata": {"total_size": 36}, "weight_map": {"a": ")" + std::string(kShard1) +
         R"(", "b": ")" + kShard1 + R"(", "c": ")" + c_shard + R"("}})";
}

TEST(Checkpoint, SingleFile) {
  TempDir dir;
  write_safetensors(dir.file("model.safetensors"), {{"x", iota(5, 1)}, {"y", iota(1, 7)}});
  Checkpoint ck = Checkpoint::open(dir.path().string());
  EXPECT_EQ(ck.dir(), dir.path().string());
  EXPECT_EQ(ck.names(), (std::vector<std::string>{"x", "y"}));
  EXPECT_TRUE(ck.has("x"));
  EXPECT_FALSE(ck.has("z"));
  EXPECT_EQ(ck.total_bytes(), 24u);
  EXPECT_EQ(ck.info("x").shape, (std::vector<int64_t>{5}));
  Tensor x = ck.get("x");
  EXPECT_EQ(x.data<float>()[4], 5.0f);
  EXPECT_EQ(ck.files().size(), 1u);
}

TEST(Checkpoint, TwoShards) {
  TempDir dir;
  write_sharded(dir);
  write_text(dir.file("model.safetensors.index.json"), index_json());
  Checkpoint ck = Checkpoint::open(dir.path().string());
  EXPECT_EQ(ck.names(), (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_EQ(ck.total_bytes(), 36u);
  EXPECT_EQ(ck.files().size(), 2u);
  EXPECT_EQ(ck.info("a").file, dir.file(kShard1));
  EXPECT_EQ(ck.info("c").file, dir.file(kShard2));
  EXPECT_EQ(ck.get("b").data<float>()[1], 11.0f);
  Tensor c = ck.get("c");
  EXPECT_EQ(c.shape_str(), "[3]");
  EXPECT_EQ(c.data<float>()[2], 102.0f);
  // Views outlive the Checkpoint that made them.
  Tensor a;
  { a = Checkpoint::open(dir.path().string()).get("a"); }
  EXPECT_EQ(a.data<float>()[3], 3.0f);
}

TEST(Checkpoint, SingleFilePreferredOverIndex) {
  TempDir dir;
  write_safetensors(dir.file("model.safetensors"), {{"only", iota(2, 0)}});
  write_text(dir.file("model.safetensors.index.json"), index_json());  // shards absent
  EXPECT_EQ(Checkpoint::open(dir.path().string()).names(), (std::vector<std::string>{"only"}));
}

TEST(Checkpoint, MissingShardNamesIndexAndShard) {
  TempDir dir;
  write_sharded(dir);
  write_text(dir.file("model.safetensors.index.json"),
             index_json("model-00003-of-00002.safetensors"));
  EXPECT_ERROR_HAS(Checkpoint::open(dir.path().string()),
                   "[checkpoint] " + dir.file("model.safetensors.index.json") + ": ",
                   "shard 'model-00003-of-00002.safetensors'", "'c'", "not found");
}

TEST(Checkpoint, TensorAbsentFromItsShard) {
  TempDir dir;
  write_sharded(dir);
  // c is in shard 2, but the index says shard 1.
  write_text(dir.file("model.safetensors.index.json"), index_json(kShard1));
  EXPECT_ERROR_HAS(Checkpoint::open(dir.path().string()),
                   dir.file("model.safetensors.index.json"),
                   "tensor 'c' is mapped to shard '" + std::string(kShard1) + "'",
                   "has no such tensor");
}

TEST(Checkpoint, BadIndex) {
  TempDir dir;
  write_sharded(dir);
  const std::string index = dir.file("model.safetensors.index.json");
  write_text(index, R"({"weight_map": )");
  EXPECT_ERROR_HAS(Checkpoint::open(dir.path().string()), index, "bad JSON", "line 1");
  write_text(index, R"({"metadata": {}})");
  EXPECT_ERROR_HAS(Checkpoint::open(dir.path().string()), index, "missing 'weight_map'");
  write_text(index, R"({"weight_map": ["a"]})");
  EXPECT_ERROR_HAS(Checkpoint::open(dir.path().string()), index,
                   "'weight_map' must be an object, got array");
  write_text(index, R"({"weight_map": {"a": 1}})");
  EXPECT_ERROR_HAS(Checkpoint::open(dir.path().string()), index,
                   "weight_map entry for 'a' must be a file name, got number");
}

TEST(Checkpoint, BadShardIsReportedByPath) {
  TempDir dir;
  write_sharded(dir);
  write_text(dir.file(kShard2), "garbage");
  write_text(dir.file("model.safetensors.index.json"), index_json());
  EXPECT_ERROR_HAS(Checkpoint::open(dir.path().string()), "[safetensors] " + dir.file(kShard2));
}

TEST(Checkpoint, DirectoryWithoutWeights) {
  TempDir dir;
  write_text(dir.file("config.json"), "{}");
  EXPECT_ERROR_HAS(Checkpoint::open(dir.path().string()),
                   "[checkpoint] " + dir.path().string() + ": ",
                   "no model.safetensors or model.safetensors.index.json");
  EXPECT_ERROR_HAS(Checkpoint::open(dir.file("missing")), "[checkpoint] " + dir.file("missing"),
                   "not a directory");
}

TEST(Checkpoint, UnknownTensorName) {
  TempDir dir;
  write_safetensors(dir.file("model.safetensors"), {{"x", iota(1, 0)}});
  Checkpoint ck = Checkpoint::open(dir.path().string());
  EXPECT_ERROR_HAS(ck.info("lm_head.weight"),
                   "[checkpoint] " + dir.path().string() + ": no tensor named lm_head.weight");
  EXPECT_ERROR_HAS(ck.get("lm_head.weight"), "no tensor named lm_head.weight");
}

TEST(Checkpoint, RealFixture) {
  Checkpoint ck = Checkpoint::open(std::string(AUGUR_TEST_DATA) + "/qwen3");
  EXPECT_EQ(ck.names().size(), 24u);
  EXPECT_EQ(ck.info("model.embed_tokens.weight").shape, (std::vector<int64_t>{512, 64}));
  EXPECT_EQ(ck.get("model.embed_tokens.weight").dtype(), DType::BF16);
  // Every tensor's bytes add up to the data section.
  size_t sum = 0;
  for (const auto& n : ck.names()) sum += ck.info(n).nbytes;
  EXPECT_EQ(ck.total_bytes(), sum);
  EXPECT_GT(sum, 512u * 64u * 2u);
}

}  // namespace
}  // namespace augur
