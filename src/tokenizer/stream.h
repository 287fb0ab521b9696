// Streaming detokenization for generation: text as tokens arrive, always
// complete UTF-8, and stop strings found across token boundaries.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace augur {

// Turns ids into text one at a time. The concatenation of every push() and
// the final flush() equals tokenizer.decode(all ids, skip_special), byte for
// byte: text is held back while it may still change (a character split over
// byte-level tokens, an open run of byte-fallback "<0xXX>" tokens).
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tokenizer, bool skip_special = false);

  // The text that `id` completes; often empty while a character is split.
  std::string push(int32_t id);
  // The rest, including incomplete bytes as U+FFFD; the decoder then starts
  // a new stream.
  std::string flush();
  // What flush() would return now, the stream left as it is.
  std::string pending() const;

 private:
  // Text of context_ + window_[0, n), less the text of context_.
  std::string window_text(size_t n) const;

  std::shared_ptr<const Tokenizer::Impl> impl_;
  bool skip_special_;
  bool hold_byte_tokens_;
  // Token strings already fully emitted, kept as left context so that
  // decoders treating the first token specially (Metaspace, Strip) see the
  // window as the middle of the text.
  std::vector<std::string> context_;
  std::string context_text_;  // decode of context_
  std::vector<std::string> window_;  // token strings not yet settled
  size_t emitted_ = 0;  // bytes of window_text already returned
};

// Finds stop strings in streamed text. feed() returns the text that is safe
// to show: anything that could be the start of a stop string is held back
// until the next feed decides it.
class StopMatcher {
 public:
  explicit StopMatcher(std::vector<std::string> stops);

  struct Result {
    std::string text;  // safe to emit; on a stop, the text before it
    bool stopped = false;
  };
  // After a stop, every feed returns {"", true}.
  Result feed(std::string_view text);
  // The held-back text, when generation ends without a stop.
  std::string flush();
  // Whether feeding `text` would find a stop string (nothing is fed).
  bool would_stop(std::string_view text) const;
  bool empty() const { return stops_.empty(); }  // no stop strings
  bool stopped() const { return stopped_; }

 private:
  std::vector<std::string> stops_;
  size_t max_len_ = 0;
  std::string held_;
  bool stopped_ = false;
};

}  // namespace augur
