// Golden tests: ids and texts must equal what Hugging Face tokenizers gives.
//  - tests/data/tokenizer/reference.json: the four real tokenizers;
//  - tests/data/tokenizer/synthetic_reference.json: small tokenizers built by
//    scripts/gen_synthetic_tokenizers.py covering the components the real
//    four do not use (regenerate with scripts/gen_synthetic_reference.sh).
#include <gtest/gtest.h>

#include "tokenizer/stream.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer_test_util.h"

namespace augur {
namespace {

const nlohmann::json& reference() {
  static const nlohmann::json j =
      test::read_json_file(std::string(AUGUR_TEST_DATA) + "/tokenizer/reference.json");
  return j;
}

std::string stream_decode(const Tokenizer& tok, const std::vector<int32_t>& ids, bool skip) {
  StreamDecoder stream(tok, skip);
  std::string text;
  for (int32_t id : ids) text += stream.push(id);
  return text + stream.flush();
}

class Golden : public testing::TestWithParam<std::string> {};

TEST_P(Golden, EncodeMatchesHuggingFace) {
  const Tokenizer& tok = test::family(GetParam());
  const auto& cases = reference().at(GetParam());
  ASSERT_GT(cases.size(), 0u);
  for (const auto& c : cases) {
    const std::string text = c.at("text").get<std::string>();
    EXPECT_EQ(tok.encode(text), c.at("ids").get<std::vector<int32_t>>()) << "text: " << text;
  }
}

TEST_P(Golden, DecodeMatchesHuggingFace) {
  const Tokenizer& tok = test::family(GetParam());
  for (const auto& c : reference().at(GetParam())) {
    const auto ids = c.at("ids").get<std::vector<int32_t>>();
    const std::string expected = c.at("decoded").get<std::string>();
    EXPECT_EQ(tok.decode(ids), expected);
    EXPECT_EQ(stream_decode(tok, ids, false), expected);
  }
}

INSTANTIATE_TEST_SUITE_P(Families, Golden,
                         testing::Values("qwen3", "llama3", "deepseek_v3", "gemma3"));

// The four families' special-token handling beyond the reference file.
TEST(GoldenExtra, GemmaAddsBosOnlyWhenAsked) {
  const Tokenizer& tok = test::family("gemma3");
  EXPECT_EQ(tok.encode("Hello, world!", true),
            (std::vector<int32_t>{2, 9259, 236764, 1902, 236888}));
  EXPECT_EQ(tok.encode("Hello, world!", false), (std::vector<int32_t>{9259, 236764, 1902, 236888}));
}

TEST(GoldenExtra, SkipSpecialTokens) {
  const Tokenizer& tok = test::family("qwen3");
  const auto ids = tok.encode("<|im_start|>user\nhi<|im_end|>");
  EXPECT_EQ(tok.decode(ids, true), "user\nhi");
  EXPECT_EQ(stream_decode(tok, ids, true), "user\nhi");
  // <tool_call> is an added token that is not special: kept.
  const auto tool = tok.encode("<tool_call>x");
  EXPECT_EQ(tool.front(), tok.token_to_id("<tool_call>"));
  EXPECT_EQ(tok.decode(tool, true), "<tool_call>x");
}

const nlohmann::json& synthetic() {
  static const nlohmann::json j = test::read_json_file(std::string(AUGUR_TEST_DATA) +
                                                       "/tokenizer/synthetic_reference.json");
  return j;
}

std::vector<std::string> synthetic_variants() {
  std::vector<std::string> names;
  for (const auto& [name, v] : synthetic().at("variants").items()) names.push_back(name);
  return names;
}

class Synthetic : public testing::TestWithParam<std::string> {};

TEST_P(Synthetic, MatchesHuggingFace) {
  const auto& v = synthetic().at("variants").at(GetParam());
  const Tokenizer tok = Tokenizer::from_json(v.at("tokenizer"), nlohmann::json::object(),
                                             GetParam() + ".json");
  const auto& cases = synthetic().at("cases");
  const auto& results = v.at("results");
  ASSERT_EQ(cases.size(), results.size());
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::string text = cases[i].get<std::string>();
    const auto& r = results[i];
    const auto ids_special = r.at("ids_special").get<std::vector<int32_t>>();
    EXPECT_EQ(tok.encode(text, false), r.at("ids").get<std::vector<int32_t>>()) << text;
    EXPECT_EQ(tok.encode(text, true), ids_special) << text;
    EXPECT_EQ(tok.decode(ids_special, false), r.at("decoded").get<std::string>()) << text;
    EXPECT_EQ(tok.decode(ids_special, true), r.at("decoded_skip").get<std::string>()) << text;
    EXPECT_EQ(stream_decode(tok, ids_special, false), r.at("decoded").get<std::string>()) << text;
    EXPECT_EQ(stream_decode(tok, ids_special, true), r.at("decoded_skip").get<std::string>())
        << text;
  }
}

INSTANTIATE_TEST_SUITE_P(Variants, Synthetic, testing::ValuesIn(synthetic_variants()),
                         [](const testing::TestParamInfo<std::string>& info) {
                           return info.param;
                         });

}  // namespace
}  // namespace augur

namespace augur {
namespace {

// augur-tiny's own tokenizer (byte-level BPE trained by tools/train/): the
// start of its held-out text encodes as Hugging Face tokenizers encoded it.
TEST(AugurTinyTokenizer, HeldOutTextMatchesHuggingFace) {
  const std::string dir = std::string(AUGUR_TEST_DATA) + "/../../models/augur-tiny";
  const nlohmann::json ref = test::read_json_file(std::string(AUGUR_TEST_DATA) + "/augur_tiny/tokenizer_reference.json");
  const Tokenizer tok = Tokenizer::load(dir + "/tokenizer.json");
  const std::string text = ref.at("text").get<std::string>();
  const auto ids = ref.at("ids").get<std::vector<int32_t>>();
  EXPECT_EQ(tok.encode(text), ids);
  EXPECT_EQ(tok.decode(ids), text);
  // The special tokens are whole tokens wherever they appear.
  std::vector<int32_t> turn = {1};
  for (int32_t id : tok.encode("user\nhi")) turn.push_back(id);
  turn.push_back(2);
  EXPECT_EQ(tok.encode("<|im_start|>user\nhi<|im_end|>"), turn);
}

}  // namespace
}  // namespace augur
