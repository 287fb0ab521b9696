#include "tokenizer/normalizer.h"

#include <vector>

#include "core/error.h"
#include "tokenizer/json_util.h"
#include "tokenizer/regex.h"
#include "tokenizer/unicode.h"

namespace augur::tok {

namespace {

class UnicodeForm final : public Normalizer {
 public:
  explicit UnicodeForm(NormForm form) : form_(form) {}
  void normalize(std::string& s) const override { s = normalize_form(s, form_); }

 private:
  NormForm form_;
};

class Lowercase final : public Normalizer {
 public:
  void normalize(std::string& s) const override { s = to_lower(s); }
};

// Replaces every match of a pattern (HF NormalizedString::replace).
class Replace final : public Normalizer {
 public:
  Replace(Regex pattern, std::string content)
      : pattern_(std::move(pattern)), content_(std::move(content)) {}
  void normalize(std::string& s) const override {
    std::string out;
    size_t prev = 0;
    bool matched = false;
    pattern_.find_all(s, [&](size_t start, size_t end) {
      out.append(s, prev, start - prev);
      out += content_;
      prev = end;
      matched = true;
    });
    if (!matched) return;
    out.append(s, prev, std::string::npos);
    s = std::move(out);
  }

 private:
  Regex pattern_;
  std::string content_;
};

class Prepend final : public Normalizer {
 public:
  explicit Prepend(std::string prefix) : prefix_(std::move(prefix)) {}
  void normalize(std::string& s) const override {
    if (!s.empty()) s.insert(0, prefix_);
  }

 private:
  std::string prefix_;
};

class Strip final : public Normalizer {
 public:
  Strip(bool left, bool right) : left_(left), right_(right) {}
  void normalize(std::string& s) const override {
    size_t begin = 0, end = s.size();
    if (left_) {
      size_t i = 0;
      while (i < end) {
        size_t next = i;
        if (!is_white_space(next_cp(s, next))) break;
        i = next;
      }
      begin = i;
    }
    if (right_) {
      while (end > begin) {
        size_t start = end - 1;
        while (start > begin && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
        size_t tmp = start;
        if (!is_white_space(next_cp(s, tmp))) break;
        end = start;
      }
    }
    s = s.substr(begin, end - begin);
  }

 private:
  bool left_, right_;
};

// Drops combining marks (HF StripAccents, meant to follow NFD).
class StripAccents final : public Normalizer {
 public:
  void normalize(std::string& s) const override {
    std::string out;
    out.reserve(s.size());
    size_t i = 0;
    while (i < s.size()) {
      const size_t start = i;
      if (!is_mark(next_cp(s, i))) out.append(s, start, i - start);
    }
    s = std::move(out);
  }
};

// Maps every byte to its GPT-2 character (HF normalizers::ByteLevel).
class ByteLevelNormalizer final : public Normalizer {
 public:
  void normalize(std::string& s) const override {
    const auto& chars = byte_level_chars();
    std::string out;
    out.reserve(s.size() * 2);
    for (unsigned char b : s) append_utf8(out, chars[b]);
    s = std::move(out);
  }
};

class Sequence final : public Normalizer {
 public:
  explicit Sequence(std::vector<std::unique_ptr<Normalizer>> steps) : steps_(std::move(steps)) {}
  void normalize(std::string& s) const override {
    for (const auto& step : steps_) step->normalize(s);
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> steps_;
};

}  // namespace

std::unique_ptr<Normalizer> make_normalizer(const nlohmann::json& j, const std::string& where) {
  if (j.is_null()) return nullptr;
  const std::string type = type_of(j, where, "normalizer");
  if (type == "NFC") return std::make_unique<UnicodeForm>(NormForm::kNfc);
  if (type == "NFD") return std::make_unique<UnicodeForm>(NormForm::kNfd);
  if (type == "NFKC") return std::make_unique<UnicodeForm>(NormForm::kNfkc);
  if (type == "NFKD") return std::make_unique<UnicodeForm>(NormForm::kNfkd);
  if (type == "Lowercase") return std::make_unique<Lowercase>();
  if (type == "StripAccents") return std::make_unique<StripAccents>();
  if (type == "ByteLevel") return std::make_unique<ByteLevelNormalizer>();
  if (type == "Replace") {
    return std::make_unique<Replace>(
        pattern_of(required(j, "pattern", where, "Replace normalizer"), where,
                   "Replace normalizer"),
        required(j, "content", where, "Replace normalizer").get<std::string>());
  }
  if (type == "Prepend") {
    return std::make_unique<Prepend>(
        required(j, "prepend", where, "Prepend normalizer").get<std::string>());
  }
  if (type == "Strip") {
    return std::make_unique<Strip>(value_or(j, "strip_left", true),
                                   value_or(j, "strip_right", true));
  }
  if (type == "Sequence") {
    std::vector<std::unique_ptr<Normalizer>> steps;
    for (const auto& step : required(j, "normalizers", where, "Sequence normalizer")) {
      if (auto n = make_normalizer(step, where)) steps.push_back(std::move(n));
    }
    return std::make_unique<Sequence>(std::move(steps));
  }
  fail(where, ": unsupported normalizer type '", type, "'");
}

}  // namespace augur::tok
