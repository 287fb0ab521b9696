// Property tests over random input (fixed seeds): byte-level tokenizers
// round-trip any valid UTF-8; the streaming decoder always agrees with
// decode; invalid UTF-8 is an Error, never a crash.
#include <gtest/gtest.h>

#include <cstdio>
#include <random>

#include "core/error.h"
#include "tokenizer/stream.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"
#include "tokenizer_test_util.h"

namespace augur {
namespace {

void append_cp(std::string& s, char32_t c) {
  if (c < 0x80) {
    s += char(c);
  } else if (c < 0x800) {
    s += char(0xC0 | (c >> 6));
    s += char(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    s += char(0xE0 | (c >> 12));
    s += char(0x80 | ((c >> 6) & 0x3F));
    s += char(0x80 | (c & 0x3F));
  } else {
    s += char(0xF0 | (c >> 18));
    s += char(0x80 | ((c >> 12) & 0x3F));
    s += char(0x80 | ((c >> 6) & 0x3F));
    s += char(0x80 | (c & 0x3F));
  }
}

bool valid_utf8(const std::string& s) {
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = s[i];
    size_t n = c < 0x80 ? 1 : c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 0;
    if (n == 0 || i + n > s.size()) return false;
    for (size_t k = 1; k < n; ++k) {
      if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return false;
    }
    i += n;
  }
  return true;
}

// Mixed scripts, emoji (with ZWJ and variation selectors), combining marks,
// control characters, unusual spaces, and text that looks like special tokens.
std::string random_text(std::mt19937& rng) {
  static const std::pair<char32_t, char32_t> kRanges[] = {
      {0x20, 0x7E},       {0x20, 0x7E},       {0x20, 0x7E},     {0x00, 0x1F},
      {0x7F, 0x9F},       {0xA0, 0xFF},       {0x100, 0x24F},   {0x300, 0x36F},
      {0x370, 0x3FF},     {0x400, 0x4FF},     {0x590, 0x5FF},   {0x600, 0x6FF},
      {0x900, 0x97F},     {0xE00, 0xE7F},     {0x1100, 0x11FF}, {0x2000, 0x206F},
      {0x2100, 0x214F},   {0x3000, 0x30FF},   {0x4E00, 0x9FFF}, {0xAC00, 0xD7A3},
      {0xFE00, 0xFE0F},   {0xFF00, 0xFFEF},   {0x1F300, 0x1F6FF}, {0x1F900, 0x1F9FF},
      {0x10000, 0x1007F}, {0x1D400, 0x1D7FF}, {0x20000, 0x2A6DF}, {0xE0000, 0xE007F},
  };
  static const char* const kSnippets[] = {
      " ",        "  ",        "\n",          "\r\n",     "\t",         "\xC2\x85",
      "\xC2\xA0", "\xE3\x80\x80", "\xE2\x80\x8B", "\xE2\x80\x8D", "'s",     "'LL",
      "1234567",  "...",       "<|im_start|>", "<|endoftext|>", "<bos>", "<|begin_of_text|>",
      "e\xCC\x81", "\xF0\x9F\x91\xA9\xE2\x80\x8D\xF0\x9F\x91\xA9", "\xE2\x96\x81", "Hello",
      " world",   "\xEF\xBF\xBD", "\xEF\xBB\xBF"};
  std::uniform_int_distribution<int> len_dist(0, 48);
  std::uniform_real_distribution<double> u(0, 1);
  std::string s;
  const int n = len_dist(rng);
  for (int i = 0; i < n; ++i) {
    if (u(rng) < 0.2) {
      s += kSnippets[rng() % std::size(kSnippets)];
      continue;
    }
    const auto [lo, hi] = kRanges[rng() % std::size(kRanges)];
    char32_t c = lo + char32_t(rng() % (hi - lo + 1));
    if (c >= 0xD800 && c <= 0xDFFF) c = 'x';
    append_cp(s, c);
  }
  return s;
}

std::string stream_decode(const Tokenizer& tok, const std::vector<int32_t>& ids, bool skip,
                          bool* all_pushes_valid = nullptr) {
  StreamDecoder stream(tok, skip);
  std::string text;
  for (int32_t id : ids) {
    const std::string piece = stream.push(id);
    if (all_pushes_valid && !valid_utf8(piece)) *all_pushes_valid = false;
    text += piece;
  }
  return text + stream.flush();
}

constexpr int kStrings = 300;

class ByteLevelRoundTrip : public testing::TestWithParam<std::string> {};

TEST_P(ByteLevelRoundTrip, DecodeEncodeIsIdentity) {
  const Tokenizer& tok = test::family(GetParam());
  // Qwen3 normalizes to NFC first (as HF does), so its round trip is the
  // identity on NFC text: "\u095E" comes back as "\u092B\u093C".
  const bool nfc = GetParam() == "qwen3";
  std::mt19937 rng(1234);
  for (int i = 0; i < kStrings; ++i) {
    const std::string s = random_text(rng);
    ASSERT_TRUE(valid_utf8(s));
    const std::string expected = nfc ? tok::normalize_form(s, tok::NormForm::kNfc) : s;
    ASSERT_EQ(tok.decode(tok.encode(s)), expected) << "string " << i;
    ASSERT_EQ(tok.decode(tok.encode(expected)), expected) << "string " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Families, ByteLevelRoundTrip,
                         testing::Values("qwen3", "llama3", "deepseek_v3"));

class Streaming : public testing::TestWithParam<std::string> {};

TEST_P(Streaming, PushesConcatenateToDecodeOfEncodedText) {
  const Tokenizer& tok = test::family(GetParam());
  std::mt19937 rng(99);
  for (int i = 0; i < kStrings; ++i) {
    const auto ids = tok.encode(random_text(rng), i % 2 == 0);
    for (bool skip : {false, true}) {
      bool valid = true;
      ASSERT_EQ(stream_decode(tok, ids, skip, &valid), tok.decode(ids, skip)) << "string " << i;
      EXPECT_TRUE(valid) << "a push returned incomplete UTF-8, string " << i;
    }
  }
}

// Random ids, most of them tokens that stand for single bytes or single
// characters, so that characters split and byte runs break in every way
// (invalid sequences included).
TEST_P(Streaming, PushesConcatenateToDecodeOfRandomIds) {
  const Tokenizer& tok = test::family(GetParam());
  std::vector<int32_t> small;  // byte-fallback and one-character tokens
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    if (const int32_t id = tok.token_to_id(name); id >= 0) small.push_back(id);
  }
  for (int32_t id = 0; id < int32_t(tok.vocab_size()) && small.size() < 2000; ++id) {
    const std::string t = tok.id_to_token(id);
    if (!t.empty() && t.size() <= 2) small.push_back(id);
  }
  ASSERT_GT(small.size(), 100u);
  std::mt19937 rng(7);
  for (int i = 0; i < kStrings; ++i) {
    std::vector<int32_t> ids(rng() % 24);
    for (auto& id : ids) {
      const unsigned r = rng() % 10;
      id = r < 7 ? small[rng() % small.size()]
                 : r < 9 ? int32_t(rng() % tok.vocab_size()) : int32_t(tok.vocab_size() + 5);
    }
    for (bool skip : {false, true}) {
      bool valid = true;
      ASSERT_EQ(stream_decode(tok, ids, skip, &valid), tok.decode(ids, skip)) << "case " << i;
      EXPECT_TRUE(valid) << "case " << i;
    }
  }
}

// A token's bytes (the logprobs' `bytes`) concatenate to the decoded text,
// where a token holding part of a character has that part's bytes, not
// U+FFFD. The first token keeps the space that decoders dropping a text's
// leading space (Metaspace, Strip) take off it.
TEST_P(Streaming, TokenBytesConcatenateToTheDecodedText) {
  const Tokenizer& tok = test::family(GetParam());
  std::mt19937 rng(31);
  int split = 0;
  for (int i = 0; i < kStrings; ++i) {
    const auto ids = tok.encode(random_text(rng));
    std::string bytes;
    for (int32_t id : ids) {
      const std::string b = tok.token_bytes(id);
      if (!valid_utf8(b)) ++split;
      bytes += b;
    }
    const std::string text = tok.decode(ids);
    if (bytes.size() == text.size() + 1 && bytes[0] == ' ') bytes.erase(0, 1);
    ASSERT_EQ(bytes, text) << "string " << i;
  }
  EXPECT_GT(split, 0) << "no token held part of a character";
}

INSTANTIATE_TEST_SUITE_P(Families, Streaming,
                         testing::Values("qwen3", "llama3", "deepseek_v3", "gemma3"));

class InvalidUtf8 : public testing::TestWithParam<std::string> {};

TEST_P(InvalidUtf8, IsAnErrorNamingTheByte) {
  const Tokenizer& tok = test::family(GetParam());
  const std::pair<std::string, size_t> cases[] = {
      {"\xFF", 0},
      {"ab\x80", 2},
      {"ok \xC3", 3},                  // truncated 2-byte sequence
      {"\xC3\x28", 0},                 // bad continuation
      {"x\xE2\x82", 1},                // truncated 3-byte sequence
      {"\xED\xA0\x80", 0},             // surrogate
      {"\xC0\xAF", 0},                 // overlong
      {"\xF4\x90\x80\x80", 0},         // beyond U+10FFFF
      {"<|im_start|>\xF8\x88", 12},
  };
  for (const auto& [text, offset] : cases) {
    try {
      tok.encode(text);
      ADD_FAILURE() << "no error for invalid UTF-8 at " << offset;
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("[tokenizer]"), std::string::npos) << msg;
      EXPECT_NE(msg.find("not valid UTF-8"), std::string::npos) << msg;
      EXPECT_NE(msg.find("(byte " + std::to_string(offset) + ")"), std::string::npos) << msg;
    }
  }
}

TEST_P(InvalidUtf8, RandomBytesNeverCrash) {
  const Tokenizer& tok = test::family(GetParam());
  std::mt19937 rng(5);
  for (int i = 0; i < kStrings; ++i) {
    std::string s(rng() % 32, '\0');
    for (char& c : s) c = char(rng() % 4 == 0 ? rng() % 128 : 0x80 + rng() % 128);
    if (valid_utf8(s)) {
      EXPECT_NO_THROW(tok.encode(s));
    } else {
      EXPECT_THROW(tok.encode(s), Error);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Families, InvalidUtf8,
                         testing::Values("qwen3", "llama3", "deepseek_v3", "gemma3"));

}  // namespace
}  // namespace augur
