// Loading: files and directories, tokenizer_config.json, the lookup API, and
// errors for what the loader does not support.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <unistd.h>

#include "core/error.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer_test_util.h"

namespace augur {
namespace {

namespace fs = std::filesystem;

// A tiny working tokenizer.json; tests break one part of it at a time.
nlohmann::json tiny() {
  return nlohmann::json::parse(R"({
    "version": "1.0", "truncation": null, "padding": null,
    "added_tokens": [
      {"id": 5, "content": "<eos>", "single_word": false, "lstrip": false, "rstrip": false,
       "normalized": false, "special": true}],
    "normalizer": {"type": "NFC"},
    "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false,
                      "use_regex": true},
    "post_processor": null,
    "decoder": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false,
                "use_regex": true},
    "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2, "\u0120": 3, "\u0120ab": 4},
              "merges": ["a b", ["\u0120", "ab"]]}
  })");
}

class TempDir {
 public:
  TempDir() {
    path_ = fs::temp_directory_path() /
            ("augur_tok_" + std::to_string(::getpid()) + "_" +
             testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string write(const std::string& name, const std::string& text) const {
    const fs::path p = path_ / name;
    std::ofstream(p, std::ios::binary) << text;
    return p.string();
  }
  std::string str() const { return path_.string(); }

 private:
  fs::path path_;
};

// The Error message of loading `j` from a file, or "" when it loads.
std::string load_error(const nlohmann::json& j, std::string* file = nullptr) {
  TempDir dir;
  const std::string path = dir.write("tokenizer.json", j.dump());
  if (file) *file = path;
  try {
    Tokenizer::load(path);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// token_bytes under a SentencePiece-style decoder (Llama 2, Mistral:
// "▁" to a space, byte fallback, the text's leading space stripped): a
// token's bytes as it adds them mid-text, its leading space kept, and the
// raw byte of a byte-fallback token, where decode gives "Hello" and U+FFFD.
TEST(TokenizerLoad, TokenBytesUnderAStrippingByteFallbackDecoder) {
  const Tokenizer tok = Tokenizer::from_json(nlohmann::json::parse(R"({
    "model": {"type": "BPE", "byte_fallback": true, "merges": [],
              "vocab": {"\u2581Hello": 0, "<0xE4>": 1, "<0xB8>": 2, "<0xAD>": 3, "a": 4}},
    "decoder": {"type": "Sequence", "decoders": [
      {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
      {"type": "ByteFallback"}, {"type": "Fuse"},
      {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}
  })"));
  EXPECT_EQ(tok.decode(std::vector<int32_t>{0}), "Hello");
  EXPECT_EQ(tok.token_bytes(0), " Hello");
  EXPECT_EQ(tok.decode(std::vector<int32_t>{1}), "\xEF\xBF\xBD");
  EXPECT_EQ(tok.token_bytes(1), "\xE4");
  std::string all;
  for (int32_t id : {0, 1, 2, 3, 4}) all += tok.token_bytes(id);
  EXPECT_EQ(all, " Hello\xE4\xB8\xAD" "a");
  EXPECT_EQ(tok.decode(std::vector<int32_t>{0, 1, 2, 3, 4}), "Hello\xE4\xB8\xAD" "a");
  EXPECT_EQ(tok.token_bytes(99), "");
}

TEST(TokenizerLoad, TinyTokenizerWorks) {
  const Tokenizer tok = Tokenizer::from_json(tiny());
  EXPECT_EQ(tok.encode("ab ab<eos>"), (std::vector<int32_t>{2, 4, 5}));
  EXPECT_EQ(tok.decode(std::vector<int32_t>{2, 4, 5}), "ab ab<eos>");
  EXPECT_EQ(tok.decode(std::vector<int32_t>{2, 4, 5}, true), "ab ab");
  EXPECT_EQ(tok.vocab_size(), 6u);
  EXPECT_TRUE(tok.is_special(5));
  EXPECT_FALSE(tok.is_special(2));
  EXPECT_EQ(tok.token_to_id("\xC4\xA0" "ab"), 4);
  EXPECT_EQ(tok.token_to_id("<eos>"), 5);
  EXPECT_EQ(tok.token_to_id("zz"), -1);
  EXPECT_EQ(tok.id_to_token(2), "ab");
  EXPECT_EQ(tok.id_to_token(99), "");
  EXPECT_TRUE(tok.config().is_object());
  EXPECT_TRUE(tok.config().empty());
}

TEST(TokenizerLoad, DirectoryReadsConfig) {
  TempDir dir;
  dir.write("tokenizer.json", tiny().dump());
  dir.write("tokenizer_config.json", R"({"eos_token": "<eos>", "chat_template": "{{ x }}"})");
  const Tokenizer from_dir = Tokenizer::load(dir.str());
  EXPECT_EQ(from_dir.config().at("eos_token"), "<eos>");
  const Tokenizer from_file = Tokenizer::load(dir.str() + "/tokenizer.json");
  EXPECT_EQ(from_file.config().at("chat_template"), "{{ x }}");
  EXPECT_EQ(from_file.path(), dir.str() + "/tokenizer.json");
}

TEST(TokenizerLoad, RealTokenizerApi) {
  const Tokenizer& qwen = test::family("qwen3");
  EXPECT_EQ(qwen.vocab_size(), 151669u);
  EXPECT_EQ(qwen.token_to_id("<|im_end|>"), 151645);
  EXPECT_TRUE(qwen.is_special(151645));
  EXPECT_FALSE(qwen.is_special(151657));  // <tool_call>: added, not special
  EXPECT_EQ(qwen.id_to_token(9707), "Hello");
  EXPECT_EQ(qwen.config().at("eos_token"), "<|im_end|>");
  EXPECT_TRUE(qwen.config().at("chat_template").is_string());

  const Tokenizer& gemma = test::family("gemma3");
  EXPECT_EQ(gemma.token_to_id("<bos>"), 2);
  EXPECT_EQ(gemma.token_to_id("<0x0A>"), gemma.token_to_id("<0x0A>"));
  EXPECT_GE(gemma.token_to_id("<0x0A>"), 0);
  EXPECT_EQ(gemma.config().at("bos_token"), "<bos>");
}

TEST(TokenizerLoad, MissingFile) {
  TempDir dir;
  try {
    Tokenizer::load(dir.str());
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tokenizer.json: no such file"), std::string::npos)
        << e.what();
  }
}

TEST(TokenizerLoad, MalformedJson) {
  TempDir dir;
  const std::string path = dir.write("tokenizer.json", "{\"model\": ");
  try {
    Tokenizer::load(path);
    FAIL() << "no error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("[tokenizer] " + path + ": invalid JSON"), std::string::npos) << msg;
  }
}

struct Unsupported {
  const char* part;       // top-level key to replace
  const char* json;       // its new value
  const char* expected;   // what the message must say
};

class UnsupportedComponent : public testing::TestWithParam<Unsupported> {};

TEST_P(UnsupportedComponent, IsAnErrorNamingComponentAndFile) {
  const Unsupported& u = GetParam();
  nlohmann::json j = tiny();
  j[u.part] = nlohmann::json::parse(u.json);
  std::string file;
  const std::string msg = load_error(j, &file);
  ASSERT_FALSE(msg.empty()) << "loaded despite " << u.json;
  EXPECT_NE(msg.find("[tokenizer] " + file + ": "), std::string::npos) << msg;
  EXPECT_NE(msg.find(u.expected), std::string::npos) << msg;
}

INSTANTIATE_TEST_SUITE_P(
    Parts, UnsupportedComponent,
    testing::Values(
        Unsupported{"normalizer", R"({"type": "Bogus"})", "unsupported normalizer type 'Bogus'"},
        Unsupported{"normalizer", R"({"type": "Sequence", "normalizers": [{"type": "Precompiled"}]})",
                    "unsupported normalizer type 'Precompiled'"},
        Unsupported{"pre_tokenizer", R"({"type": "UnicodeScripts"})",
                    "unsupported pre_tokenizer type 'UnicodeScripts'"},
        Unsupported{"pre_tokenizer",
                    R"({"type": "Split", "pattern": {"Regex": "a"}, "behavior": "Sideways"})",
                    "unsupported split behavior 'Sideways'"},
        Unsupported{"pre_tokenizer",
                    R"({"type": "Split", "pattern": {"Regex": "(a"}, "behavior": "Isolated"})",
                    "Split: bad regex '(a'"},
        Unsupported{"model", R"({"type": "Unigram", "vocab": []})", "unsupported model type 'Unigram'"},
        Unsupported{"model", R"({"type": "WordPiece", "vocab": {}})",
                    "unsupported model type 'WordPiece'"},
        Unsupported{"model", R"({"type": "BPE", "vocab": {"a": 0}, "merges": ["a b"]})",
                    "token 'b' is not in the vocab"},
        Unsupported{"decoder", R"({"type": "CTC"})", "unsupported decoder type 'CTC'"},
        Unsupported{"decoder", R"({"type": "Sequence", "decoders": [{"type": "WordPiece"}]})",
                    "unsupported decoder type 'WordPiece'"},
        Unsupported{"post_processor", R"({"type": "Mystery"})",
                    "unsupported post_processor type 'Mystery'"},
        Unsupported{"normalizer", R"({"kind": "NFC"})", "normalizer without a type"},
        Unsupported{"model", R"({"type": "BPE", "vocab": {"a": "zero"}, "merges": []})",
                    "malformed"}));

}  // namespace
}  // namespace augur
