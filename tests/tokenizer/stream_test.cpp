// StreamDecoder on characters split across tokens, and StopMatcher.
#include <gtest/gtest.h>

#include <random>

#include "tokenizer/stream.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer_test_util.h"

namespace augur {
namespace {

TEST(StreamDecoder, HoldsBackAByteLevelCharacterUntilComplete) {
  const Tokenizer& tok = test::family("qwen3");
  // A rare CJK Extension B character: several byte-level tokens.
  const std::string ch = "\xF0\xA0\x80\x8B";
  const auto ids = tok.encode(ch + ch);
  ASSERT_GT(ids.size(), 2u);
  StreamDecoder stream(tok);
  std::vector<std::string> pieces;
  for (int32_t id : ids) pieces.push_back(stream.push(id));
  EXPECT_EQ(pieces.front(), "");  // the first token is part of a character
  std::string all;
  for (const auto& p : pieces) {
    EXPECT_TRUE(p.empty() || p == ch || p == ch + ch) << "partial character emitted";
    all += p;
  }
  EXPECT_EQ(all + stream.flush(), ch + ch);
}

TEST(StreamDecoder, HoldsBackAByteFallbackRunUntilItCloses) {
  const Tokenizer& tok = test::family("gemma3");
  const int32_t e4 = tok.token_to_id("<0xE4>"), b8 = tok.token_to_id("<0xB8>"),
                ad = tok.token_to_id("<0xAD>"), a = tok.token_to_id("a");
  ASSERT_GE(e4, 0);
  ASSERT_GE(a, 0);
  {
    // Complete: 中 then "a".
    StreamDecoder stream(tok);
    EXPECT_EQ(stream.push(e4), "");
    EXPECT_EQ(stream.push(b8), "");
    EXPECT_EQ(stream.push(ad), "");  // the run could still grow
    EXPECT_EQ(stream.push(a), "\xE4\xB8\xAD" "a");
    EXPECT_EQ(stream.flush(), "");
  }
  {
    // A run that never completes: one U+FFFD per byte, as decode gives.
    const std::vector<int32_t> ids = {e4, b8, a};
    EXPECT_EQ(tok.decode(ids), "\xEF\xBF\xBD\xEF\xBF\xBD" "a");
    StreamDecoder stream(tok);
    std::string out;
    for (int32_t id : ids) out += stream.push(id);
    EXPECT_EQ(out + stream.flush(), tok.decode(ids));
  }
  {
    // Flush mid-character gives what decode gives for the prefix.
    StreamDecoder stream(tok);
    EXPECT_EQ(stream.push(a), "a");
    EXPECT_EQ(stream.push(e4), "");
    EXPECT_EQ(stream.flush(), "\xEF\xBF\xBD");
  }
}

TEST(StreamDecoder, SkipsSpecialTokensLikeDecode) {
  const Tokenizer& tok = test::family("llama3");
  const auto ids = tok.encode("<|begin_of_text|>Hi there<|eot_id|>");
  StreamDecoder stream(tok, /*skip_special=*/true);
  std::string out;
  for (int32_t id : ids) out += stream.push(id);
  EXPECT_EQ(out + stream.flush(), "Hi there");
}

TEST(StopMatcher, StopSplitAcrossFeeds) {
  StopMatcher m({"</s>", "STOP"});
  auto r = m.feed("Hello </");
  EXPECT_EQ(r.text, "Hello ");
  EXPECT_FALSE(r.stopped);
  r = m.feed("s> more");
  EXPECT_EQ(r.text, "");
  EXPECT_TRUE(r.stopped);
  EXPECT_TRUE(m.stopped());
  r = m.feed("later");
  EXPECT_EQ(r.text, "");
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(m.flush(), "");
}

TEST(StopMatcher, FalseAlarmIsReleased) {
  StopMatcher m({"STOP"});
  EXPECT_EQ(m.feed("ab ST").text, "ab ");
  EXPECT_EQ(m.feed("O").text, "");
  EXPECT_EQ(m.feed("P!").text, "");  // hit
  StopMatcher n({"STOP"});
  EXPECT_EQ(n.feed("ab STO").text, "ab ");
  auto r = n.feed("x");
  EXPECT_EQ(r.text, "STOx");
  EXPECT_FALSE(r.stopped);
  EXPECT_EQ(n.feed("ST").text, "");
  EXPECT_EQ(n.flush(), "ST");
}

TEST(StopMatcher, EarliestStopWinsAndTextBeforeIsKept) {
  StopMatcher m({"bcd", "abc"});
  auto r = m.feed("xxabcd");
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.text, "xx");
  StopMatcher cjk({"\xE3\x80\x82"});  // 。
  r = cjk.feed("\xE4\xBD\xA0\xE5\xA5\xBD\xE3\x80\x82\xE5\x86\x8D");
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.text, "\xE4\xBD\xA0\xE5\xA5\xBD");
}

TEST(StopMatcher, NoStopsPassesEverythingThrough) {
  StopMatcher m({"", ""});
  EXPECT_EQ(m.feed("abc").text, "abc");
  EXPECT_EQ(m.flush(), "");
}

// Any chunking of a text gives the text up to the first stop.
TEST(StopMatcher, RandomChunkingProperty) {
  const std::vector<std::string> stops = {"ab", "aab", "ba!", "\xC3\xA9" "z"};
  std::mt19937 rng(11);
  const std::string alphabet[] = {"a", "b", "!", "z", "\xC3\xA9", " "};
  for (int iter = 0; iter < 2000; ++iter) {
    std::string text;
    const int n = int(rng() % 12);
    for (int i = 0; i < n; ++i) text += alphabet[rng() % 6];
    size_t first = std::string::npos;
    for (const auto& s : stops) first = std::min(first, text.find(s));
    const std::string expected = first == std::string::npos ? text : text.substr(0, first);

    StopMatcher m(stops);
    std::string out;
    bool stopped = false;
    size_t pos = 0;
    while (pos < text.size() && !stopped) {
      const size_t len = 1 + rng() % 4;
      const auto r = m.feed(std::string_view(text).substr(pos, len));
      out += r.text;
      stopped = r.stopped;
      pos += len;
    }
    if (!stopped) out += m.flush();
    ASSERT_EQ(out, expected) << text;
    ASSERT_EQ(stopped, first != std::string::npos) << text;
  }
}

}  // namespace
}  // namespace augur
