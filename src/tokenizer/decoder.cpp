#include "tokenizer/decoder.h"

#include "core/error.h"
#include "tokenizer/json_util.h"
#include "tokenizer/regex.h"
#include "tokenizer/unicode.h"

namespace augur::tok {

int byte_fallback_value(std::string_view t) {
  if (t.size() != 6 || !t.starts_with("<0x") || t[5] != '>') return -1;
  int v = 0;
  for (size_t i = 3; i < 5; ++i) {
    const char c = t[i];
    int d;
    if (c >= '0' && c <= '9') {
      d = c - '0';
    } else if (c >= 'a' && c <= 'f') {
      d = c - 'a' + 10;
    } else if (c >= 'A' && c <= 'F') {
      d = c - 'A' + 10;
    } else {
      return -1;
    }
    v = v * 16 + d;
  }
  return v;
}

namespace {

constexpr std::string_view kReplacementChar = "\xEF\xBF\xBD";

// Bytes back from GPT-2 characters; a token with any other character is
// taken as its raw text. The whole output is decoded lossily as one string.
class ByteLevel final : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override { tokens.assign(1, utf8_lossy(bytes_of(tokens))); }
  void decode_bytes(std::vector<std::string>& tokens) const override { tokens.assign(1, bytes_of(tokens)); }

 private:
  static std::string bytes_of(const std::vector<std::string>& tokens) {
    std::string bytes;
    for (const std::string& t : tokens) {
      const size_t mark = bytes.size();
      size_t i = 0;
      bool all = true;
      while (i < t.size()) {
        const int b = byte_level_byte(next_cp(t, i));
        if (b < 0) {
          all = false;
          break;
        }
        bytes.push_back(char(b));
      }
      if (!all) {
        bytes.resize(mark);
        bytes += t;
      }
    }
    return bytes;
  }
};

class ByteFallback final : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override { join(tokens, true); }
  void decode_bytes(std::vector<std::string>& tokens) const override { join(tokens, false); }
  bool joins_byte_tokens() const override { return true; }

 private:
  // Runs of "<0xXX>" tokens become their bytes; lossy: a run that is not
  // UTF-8 becomes one U+FFFD a byte (HF's rule).
  static void join(std::vector<std::string>& tokens, bool lossy) {
    std::vector<std::string> out;
    out.reserve(tokens.size());
    std::string bytes;
    auto flush = [&] {
      if (bytes.empty()) return;
      if (!lossy || find_invalid_utf8(bytes) == std::string::npos) {
        out.push_back(bytes);
      } else {
        for (size_t k = 0; k < bytes.size(); ++k) out.emplace_back(kReplacementChar);
      }
      bytes.clear();
    };
    for (std::string& t : tokens) {
      const int b = byte_fallback_value(t);
      if (b >= 0) {
        bytes.push_back(char(b));
        continue;
      }
      flush();
      out.push_back(std::move(t));
    }
    flush();
    tokens = std::move(out);
  }
};

class Fuse final : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::string all;
    for (const std::string& t : tokens) all += t;
    tokens.assign(1, std::move(all));
  }
};

// Removes up to `start` leading and `stop` trailing `content` characters
// from every token.
class Strip final : public Decoder {
 public:
  Strip(char32_t content, size_t start, size_t stop) : content_(content), start_(start), stop_(stop) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (std::string& t : tokens) {
      std::vector<size_t> starts;  // byte offset of each character
      size_t i = 0;
      std::vector<char32_t> chars;
      while (i < t.size()) {
        starts.push_back(i);
        chars.push_back(next_cp(t, i));
      }
      starts.push_back(t.size());
      size_t begin = 0;
      while (begin < start_ && begin < chars.size() && chars[begin] == content_) ++begin;
      size_t end = chars.size();
      for (size_t k = 0; k < stop_ && end > begin && chars[end - 1] == content_; ++k) --end;
      t = t.substr(starts[begin], starts[end] - starts[begin]);
    }
  }

 private:
  char32_t content_;
  size_t start_, stop_;
};

class Replace final : public Decoder {
 public:
  Replace(Regex pattern, std::string content)
      : pattern_(std::move(pattern)), content_(std::move(content)) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (std::string& t : tokens) {
      std::string out;
      size_t prev = 0;
      bool matched = false;
      pattern_.find_all(t, [&](size_t start, size_t end) {
        out.append(t, prev, start - prev);
        out += content_;
        prev = end;
        matched = true;
      });
      if (!matched) continue;
      out.append(t, prev, std::string::npos);
      t = std::move(out);
    }
  }

 private:
  Regex pattern_;
  std::string content_;
};

// The replacement character becomes a space, except in the first token,
// where it is dropped unless the prepend scheme is "never" (HF Metaspace).
class Metaspace final : public Decoder {
 public:
  Metaspace(char32_t replacement, bool strip_first)
      : rep_(utf8_of(replacement)), strip_first_(strip_first) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (size_t k = 0; k < tokens.size(); ++k) {
      std::string& t = tokens[k];
      if (t.find(rep_) == std::string::npos) continue;
      const std::string_view with = (k == 0 && strip_first_) ? "" : " ";
      std::string out;
      size_t prev = 0, pos;
      while ((pos = t.find(rep_, prev)) != std::string::npos) {
        out.append(t, prev, pos - prev);
        out += with;
        prev = pos + rep_.size();
      }
      out.append(t, prev, std::string::npos);
      t = std::move(out);
    }
  }

 private:
  std::string rep_;
  bool strip_first_;
};

class Sequence final : public Decoder {
 public:
  explicit Sequence(std::vector<std::unique_ptr<Decoder>> steps) : steps_(std::move(steps)) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (const auto& s : steps_) s->decode_chain(tokens);
  }
  void decode_bytes(std::vector<std::string>& tokens) const override {
    for (const auto& s : steps_) s->decode_bytes(tokens);
  }
  bool joins_byte_tokens() const override {
    for (const auto& s : steps_) {
      if (s->joins_byte_tokens()) return true;
    }
    return false;
  }

 private:
  std::vector<std::unique_ptr<Decoder>> steps_;
};

char32_t one_char(const std::string& s, const std::string& where, const char* component) {
  size_t i = 0;
  if (s.empty() || find_invalid_utf8(s) != std::string::npos) {
    fail(where, ": ", component, ": expected one character, got '", s, "'");
  }
  const char32_t c = next_cp(s, i);
  if (i != s.size()) fail(where, ": ", component, ": expected one character, got '", s, "'");
  return c;
}

}  // namespace

std::unique_ptr<Decoder> make_decoder(const nlohmann::json& j, const std::string& where) {
  if (j.is_null()) return nullptr;
  const std::string type = type_of(j, where, "decoder");
  if (type == "ByteLevel") return std::make_unique<ByteLevel>();
  if (type == "ByteFallback") return std::make_unique<ByteFallback>();
  if (type == "Fuse") return std::make_unique<Fuse>();
  if (type == "Strip") {
    return std::make_unique<Strip>(
        one_char(required(j, "content", where, "Strip decoder").get<std::string>(), where,
                 "Strip decoder"),
        value_or<size_t>(j, "start", 0), value_or<size_t>(j, "stop", 0));
  }
  if (type == "Replace") {
    return std::make_unique<Replace>(
        pattern_of(required(j, "pattern", where, "Replace decoder"), where, "Replace decoder"),
        required(j, "content", where, "Replace decoder").get<std::string>());
  }
  if (type == "Metaspace") {
    const char32_t rep = one_char(
        required(j, "replacement", where, "Metaspace decoder").get<std::string>(), where,
        "Metaspace decoder");
    bool strip_first = value_or<std::string>(j, "prepend_scheme", "always") != "never";
    if (j.contains("add_prefix_space") && j["add_prefix_space"].is_boolean()) {
      strip_first = strip_first && j["add_prefix_space"].get<bool>();
    }
    return std::make_unique<Metaspace>(rep, strip_first);
  }
  if (type == "Sequence") {
    std::vector<std::unique_ptr<Decoder>> steps;
    for (const auto& step : required(j, "decoders", where, "Sequence decoder")) {
      if (auto d = make_decoder(step, where)) steps.push_back(std::move(d));
    }
    return std::make_unique<Sequence>(std::move(steps));
  }
  fail(where, ": unsupported decoder type '", type, "'");
}

}  // namespace augur::tok
