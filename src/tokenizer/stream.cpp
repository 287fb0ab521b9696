#include "tokenizer/stream.h"

#include <algorithm>
#include <utility>

#include "core/error.h"
#include "tokenizer/decoder.h"
#include "tokenizer/tokenizer_impl.h"
#include "tokenizer/unicode.h"

namespace augur {

namespace {

constexpr size_t kContextTokens = 4;
constexpr std::string_view kReplacement = "\xEF\xBF\xBD";

}  // namespace

StreamDecoder::StreamDecoder(const Tokenizer& tokenizer, bool skip_special)
    : impl_(tokenizer.impl_),
      skip_special_(skip_special),
      hold_byte_tokens_(impl_->decoder && impl_->decoder->joins_byte_tokens()) {}

std::string StreamDecoder::window_text(size_t n) const {
  std::vector<std::string> tokens(context_);
  tokens.insert(tokens.end(), window_.begin(), window_.begin() + std::ptrdiff_t(n));
  std::string text = impl_->decode_tokens(tokens);
  // The context ends where its text was settled, so its text is a prefix.
  AUGUR_ASSERT(text.starts_with(context_text_), "stream decoder context is not a prefix");
  return text.substr(context_text_.size());
}

std::string StreamDecoder::push(int32_t id) {
  std::string_view token;
  // decode() drops these too, before its decoder runs.
  if (!impl_->token_text(id, skip_special_, token)) return {};
  window_.emplace_back(token);

  // An open run of byte tokens may still turn into U+FFFDs.
  size_t settled = window_.size();
  if (hold_byte_tokens_) {
    while (settled > 0 && tok::byte_fallback_value(window_[settled - 1]) >= 0) --settled;
  }
  std::string text = window_text(settled);
  // A trailing U+FFFD may be the start of a character still arriving.
  size_t stable = text.size();
  while (stable >= kReplacement.size() &&
         std::string_view(text).substr(stable - kReplacement.size()) == kReplacement) {
    stable -= kReplacement.size();
  }
  std::string out;
  if (stable > emitted_) {
    out = text.substr(emitted_, stable - emitted_);
    emitted_ = stable;
  }
  if (settled == window_.size() && stable == text.size()) {
    // Everything so far is final: later tokens only append to it.
    for (auto& t : window_) context_.push_back(std::move(t));
    window_.clear();
    emitted_ = 0;
    if (context_.size() > kContextTokens) {
      context_.erase(context_.begin(), context_.end() - std::ptrdiff_t(kContextTokens));
    }
    std::vector<std::string> tokens(context_);
    context_text_ = impl_->decode_tokens(tokens);
  }
  return out;
}

std::string StreamDecoder::flush() {
  std::string text = window_text(window_.size());
  std::string out = text.size() > emitted_ ? text.substr(emitted_) : std::string();
  context_.clear();
  context_text_.clear();
  window_.clear();
  emitted_ = 0;
  return out;
}

std::string StreamDecoder::pending() const {
  if (window_.empty()) return {};
  std::string text = window_text(window_.size());
  return text.size() > emitted_ ? text.substr(emitted_) : std::string();
}

StopMatcher::StopMatcher(std::vector<std::string> stops) {
  for (auto& s : stops) {
    if (s.empty()) continue;
    max_len_ = std::max(max_len_, s.size());
    stops_.push_back(std::move(s));
  }
}

StopMatcher::Result StopMatcher::feed(std::string_view text) {
  if (stopped_) return {"", true};
  std::string buf = std::move(held_);
  held_.clear();
  buf += text;
  size_t first = std::string::npos;
  for (const auto& s : stops_) first = std::min(first, buf.find(s));
  if (first != std::string::npos) {
    stopped_ = true;
    buf.resize(first);
    return {std::move(buf), true};
  }
  // Hold back the longest tail that begins some stop string.
  size_t hold = 0;
  const size_t limit = max_len_ > 0 ? max_len_ - 1 : 0;
  for (size_t len = std::min(buf.size(), limit); len > 0 && hold == 0; --len) {
    const std::string_view tail = std::string_view(buf).substr(buf.size() - len);
    for (const auto& s : stops_) {
      if (std::string_view(s).starts_with(tail)) {
        hold = len;
        break;
      }
    }
  }
  held_ = buf.substr(buf.size() - hold);
  buf.resize(buf.size() - hold);
  return {std::move(buf), false};
}

bool StopMatcher::would_stop(std::string_view text) const {
  if (stopped_) return true;
  if (text.empty()) return false;
  const std::string buf = held_ + std::string(text);
  return std::any_of(stops_.begin(), stops_.end(), [&](const std::string& s) { return buf.find(s) != std::string::npos; });
}

std::string StopMatcher::flush() {
  if (stopped_) return {};
  return std::exchange(held_, std::string());
}

}  // namespace augur
