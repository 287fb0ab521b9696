#include "io/json_config.h"

#include <gtest/gtest.h>

#include "io_test_util.h"

namespace augur {
namespace {

using test::TempDir;

constexpr const char* kText = R"({
  "hidden_size": 64,
  "rms_norm_eps": 1e-06,
  "rope_theta": 10000,
  "tie_word_embeddings": true,
  "model_type": "qwen3",
  "sliding_window": null,
  "eos_token_id": [151645, 151643],
  "bos_token_id": 151643,
  "layer_types": ["full_attention", "linear_attention"],
  "long_factor": [1, 1.5],
  "huge": 18446744073709551615,
  "rope_parameters": {"rope_type": "yarn", "factor": 4.0, "inner": {"beta": null}},
  "name_as_int": "64"
})";

JsonConfig cfg() { return JsonConfig::parse(kText, "cfg.json"); }

TEST(JsonConfig, TypedReads) {
  JsonConfig c = cfg();
  EXPECT_EQ(c.path(), "cfg.json");
  EXPECT_EQ(c.get_int("hidden_size"), 64);
  EXPECT_DOUBLE_EQ(c.get_float("rms_norm_eps"), 1e-6);
  EXPECT_DOUBLE_EQ(c.get_float("rope_theta"), 10000.0);  // integers read as floats
  EXPECT_TRUE(c.get_bool("tie_word_embeddings"));
  EXPECT_EQ(c.get_string("model_type"), "qwen3");
  EXPECT_EQ(c.get_int_list("eos_token_id"), (std::vector<int64_t>{151645, 151643}));
  EXPECT_EQ(c.get_int_list("bos_token_id"), (std::vector<int64_t>{151643}));  // scalar as list
  EXPECT_EQ(c.get_string_list("layer_types"),
            (std::vector<std::string>{"full_attention", "linear_attention"}));
  EXPECT_EQ(c.get_string_list("model_type"), (std::vector<std::string>{"qwen3"}));
  EXPECT_EQ(c.get_float_list("long_factor"), (std::vector<double>{1.0, 1.5}));
}

TEST(JsonConfig, PresenceNullAndFallbacks) {
  JsonConfig c = cfg();
  EXPECT_TRUE(c.has("sliding_window"));
  EXPECT_TRUE(c.is_null("sliding_window"));
  EXPECT_FALSE(c.is_null("hidden_size"));
  EXPECT_FALSE(c.has("absent"));
  EXPECT_FALSE(c.is_null("absent"));
  // Missing or null gives the fallback.
  EXPECT_EQ(c.get_int("sliding_window", 4096), 4096);
  EXPECT_EQ(c.get_int("absent", 7), 7);
  EXPECT_EQ(c.get_int("hidden_size", 7), 64);
  EXPECT_DOUBLE_EQ(c.get_float("absent", 0.5), 0.5);
  EXPECT_FALSE(c.get_bool("absent", false));
  EXPECT_EQ(c.get_string("absent", "silu"), "silu");
  EXPECT_EQ(c.get_string("model_type", "llama"), "qwen3");
}

TEST(JsonConfig, MissingField) {
  EXPECT_ERROR_HAS(cfg().get_int("num_hidden_layers"),
                   "[config] cfg.json: missing field 'num_hidden_layers'");
  EXPECT_ERROR_HAS(cfg().get_int_list("absent"), "[config] cfg.json: missing field 'absent'");
  EXPECT_ERROR_HAS(cfg().sub("absent"), "[config] cfg.json: missing field 'absent'");
}

TEST(JsonConfig, WrongTypes) {
  JsonConfig c = cfg();
  EXPECT_ERROR_HAS(c.get_int("name_as_int"),
                   "[config] cfg.json: field 'name_as_int' must be an integer, got string");
  EXPECT_ERROR_HAS(c.get_int("rms_norm_eps"), "field 'rms_norm_eps' must be an integer, got float");
  EXPECT_ERROR_HAS(c.get_int("sliding_window"), "field 'sliding_window' must be an integer, got null");
  EXPECT_ERROR_HAS(c.get_float("model_type"), "field 'model_type' must be a number, got string");
  EXPECT_ERROR_HAS(c.get_bool("hidden_size"), "field 'hidden_size' must be a boolean, got integer");
  EXPECT_ERROR_HAS(c.get_string("hidden_size"), "field 'hidden_size' must be a string, got integer");
  EXPECT_ERROR_HAS(c.get_int("huge"), "field 'huge' is out of the 64-bit integer range");
  EXPECT_ERROR_HAS(c.get_string("tie_word_embeddings"), "must be a string, got boolean");
  // A fallback does not excuse a present value of the wrong type.
  EXPECT_ERROR_HAS(c.get_int("name_as_int", 3), "field 'name_as_int' must be an integer, got string");
}

TEST(JsonConfig, ListElementsAreNamed) {
  JsonConfig c = JsonConfig::parse(R"({"ids": [1, "2"], "names": ["a", 3], "obj": {}})", "x.json");
  EXPECT_ERROR_HAS(c.get_int_list("ids"), "[config] x.json: field 'ids[1]' must be an integer, got string");
  EXPECT_ERROR_HAS(c.get_string_list("names"), "field 'names[1]' must be a string, got integer");
  EXPECT_ERROR_HAS(c.get_int_list("obj"),
                   "field 'obj' must be an integer or a list of them, got object");
}

TEST(JsonConfig, NestedObjects) {
  JsonConfig rope = cfg().sub("rope_parameters");
  EXPECT_EQ(rope.path(), "cfg.json");
  EXPECT_EQ(rope.get_string("rope_type"), "yarn");
  EXPECT_DOUBLE_EQ(rope.get_float("factor"), 4.0);
  EXPECT_EQ(rope.keys(), (std::vector<std::string>{"factor", "inner", "rope_type"}));
  EXPECT_ERROR_HAS(rope.get_int("rope_type"),
                   "[config] cfg.json: field 'rope_parameters.rope_type' must be an integer, got string");
  EXPECT_ERROR_HAS(rope.get_int("original_max_position_embeddings"),
                   "missing field 'rope_parameters.original_max_position_embeddings'");
  JsonConfig inner = rope.sub("inner");
  EXPECT_TRUE(inner.is_null("beta"));
  EXPECT_ERROR_HAS(inner.get_float("beta"), "field 'rope_parameters.inner.beta' must be a number, got null");
  EXPECT_ERROR_HAS(cfg().sub("sliding_window"), "field 'sliding_window' must be an object, got null");
  EXPECT_ERROR_HAS(cfg().sub("eos_token_id"), "field 'eos_token_id' must be an object, got array");
}

TEST(JsonConfig, SubOutlivesParent) {
  JsonConfig inner = JsonConfig::parse(R"({"a": {"b": {"c": 3}}})", "x.json").sub("a").sub("b");
  EXPECT_EQ(inner.get_int("c"), 3);
  EXPECT_EQ(inner.field_name("c"), "a.b.c");
}

TEST(JsonConfig, ErrorNamesTheField) {
  JsonConfig c = cfg();
  EXPECT_ERROR_HAS(c.error("hidden_size", "must be divisible by num_attention_heads (5)"),
                   "[config] cfg.json: field 'hidden_size' must be divisible by num_attention_heads (5)");
  EXPECT_ERROR_HAS(c.sub("rope_parameters").error("factor", "must be >= 1"),
                   "field 'rope_parameters.factor' must be >= 1");
}

TEST(JsonConfig, LoadErrors) {
  TempDir dir;
  const std::string missing = dir.file("config.json");
  EXPECT_ERROR_HAS(JsonConfig::load(missing), "[config] " + missing + ": cannot open");

  const std::string bad = dir.file("bad.json");
  test::write_text(bad, "{\n  \"a\": 1,\n  \"b\": ,\n}");
  EXPECT_ERROR_HAS(JsonConfig::load(bad), "[config] " + bad + ": bad JSON", "line 3, column");

  const std::string list = dir.file("list.json");
  test::write_text(list, "[1, 2]");
  EXPECT_ERROR_HAS(JsonConfig::load(list), "[config] " + list + ": must be a JSON object, got array");
}

TEST(JsonConfig, RealFixture) {
  const std::string path = std::string(AUGUR_TEST_DATA) + "/qwen3/config.json";
  JsonConfig c = JsonConfig::load(path);
  EXPECT_EQ(c.path(), path);
  EXPECT_EQ(c.get_string("model_type"), "qwen3");
  EXPECT_EQ(c.get_int("hidden_size"), 64);
  EXPECT_EQ(c.get_int("num_hidden_layers"), 2);
  EXPECT_EQ(c.get_int("head_dim"), 16);
  EXPECT_DOUBLE_EQ(c.get_float("rms_norm_eps"), 1e-6);
  EXPECT_TRUE(c.get_bool("tie_word_embeddings"));
  EXPECT_TRUE(c.is_null("eos_token_id"));
  EXPECT_EQ(c.get_string_list("layer_types").size(), 2u);
  EXPECT_DOUBLE_EQ(c.sub("rope_parameters").get_float("rope_theta"), 1e6);
  EXPECT_EQ(c.sub("rope_parameters").get_string("rope_type"), "default");
}

}  // namespace
}  // namespace augur
