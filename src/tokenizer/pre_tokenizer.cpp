#include "tokenizer/pre_tokenizer.h"

#include <vector>

#include "core/error.h"
#include "tokenizer/json_util.h"
#include "tokenizer/regex.h"
#include "tokenizer/unicode.h"

namespace augur::tok {

namespace {

// HF SplitDelimiterBehavior.
enum class Behavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

Behavior behavior_of(const nlohmann::json& j, const std::string& where,
                     std::string_view component) {
  const std::string b = j.get<std::string>();
  if (b == "Removed") return Behavior::kRemoved;
  if (b == "Isolated") return Behavior::kIsolated;
  if (b == "MergedWithPrevious") return Behavior::kMergedWithPrevious;
  if (b == "MergedWithNext") return Behavior::kMergedWithNext;
  if (b == "Contiguous") return Behavior::kContiguous;
  fail(where, ": ", component, ": unsupported split behavior '", b, "'");
}

// A stretch of the piece: a match of the split pattern or the gap between two.
struct Seg {
  size_t start, end;
  bool is_match;
};

// Turns matches into segments covering the whole text (HF Pattern::find_matches).
class SegmentBuilder {
 public:
  SegmentBuilder(std::vector<Seg>& segs, size_t size, bool invert)
      : segs_(segs), size_(size), invert_(invert) {}
  void match(size_t start, size_t end) {
    if (start != prev_) segs_.push_back({prev_, start, invert_});
    segs_.push_back({start, end, !invert_});
    prev_ = end;
  }
  void finish() {
    if (prev_ != size_) segs_.push_back({prev_, size_, invert_});
  }

 private:
  std::vector<Seg>& segs_;
  size_t size_;
  bool invert_;
  size_t prev_ = 0;
};

// HF NormalizedString::split: folds the segments by behavior and emits the
// kept, non-empty ranges of `text`.
void emit_splits(std::string_view text, bool first, std::vector<Seg>& segs, Behavior behavior,
                 PieceSink sink) {
  auto emit = [&](size_t start, size_t end) {
    if (end > start) sink(Piece{text.substr(start, end - start), first && start == 0});
  };
  switch (behavior) {
    case Behavior::kIsolated:
      for (const Seg& s : segs) emit(s.start, s.end);
      return;
    case Behavior::kRemoved:
      for (const Seg& s : segs) {
        if (!s.is_match) emit(s.start, s.end);
      }
      return;
    case Behavior::kMergedWithPrevious:
    case Behavior::kContiguous: {
      const bool contiguous = behavior == Behavior::kContiguous;
      bool have = false, previous_match = false;
      size_t cur_start = 0, cur_end = 0;
      for (const Seg& s : segs) {
        const bool merge =
            contiguous ? s.is_match == previous_match : (s.is_match && !previous_match);
        if (merge && have) {
          cur_end = s.end;
        } else {
          if (have) emit(cur_start, cur_end);
          cur_start = s.start;
          cur_end = s.end;
          have = true;
        }
        previous_match = s.is_match;
      }
      if (have) emit(cur_start, cur_end);
      return;
    }
    case Behavior::kMergedWithNext: {
      // Folded from the back: a match joins the piece after it unless that
      // piece is itself a match.
      std::vector<std::pair<size_t, size_t>> out;
      bool previous_match = false;
      for (auto it = segs.rbegin(); it != segs.rend(); ++it) {
        if (it->is_match && !previous_match && !out.empty()) {
          out.back().first = it->start;
        } else {
          out.emplace_back(it->start, it->end);
        }
        previous_match = it->is_match;
      }
      for (auto it = out.rbegin(); it != out.rend(); ++it) emit(it->first, it->second);
      return;
    }
  }
}

template <typename Pred>
void split_chars(Piece piece, Pred pred, Behavior behavior, PieceSink sink) {
  std::vector<Seg> segs;
  SegmentBuilder builder(segs, piece.text.size(), false);
  size_t i = 0;
  while (i < piece.text.size()) {
    const size_t start = i;
    if (pred(next_cp(piece.text, i))) builder.match(start, i);
  }
  builder.finish();
  emit_splits(piece.text, piece.first, segs, behavior, sink);
}

void split_regex(Piece piece, const Regex& re, bool invert, Behavior behavior, PieceSink sink) {
  std::vector<Seg> segs;
  SegmentBuilder builder(segs, piece.text.size(), invert);
  re.find_all(piece.text, [&](size_t start, size_t end) { builder.match(start, end); });
  builder.finish();
  emit_splits(piece.text, piece.first, segs, behavior, sink);
}

class Split final : public PreTokenizer {
 public:
  Split(Regex pattern, Behavior behavior, bool invert)
      : pattern_(std::move(pattern)), behavior_(behavior), invert_(invert) {}
  void pre_tokenize(Piece piece, PieceSink sink) const override {
    split_regex(piece, pattern_, invert_, behavior_, sink);
  }

 private:
  Regex pattern_;
  Behavior behavior_;
  bool invert_;
};

const Regex& gpt2_regex() {
  static const Regex re = Regex::compile(
      R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)",
      "[tokenizer] ByteLevel");
  return re;
}

// HF pre_tokenizers::ByteLevel: optional prefix space, the GPT-2 split, then
// every byte becomes its printable stand-in character.
class ByteLevel final : public PreTokenizer {
 public:
  ByteLevel(bool add_prefix_space, bool use_regex)
      : add_prefix_space_(add_prefix_space), use_regex_(use_regex) {
    const auto& chars = byte_level_chars();
    for (int b = 0; b < 256; ++b) {
      std::string s = utf8_of(chars[b]);
      encoded_[b][0] = uint8_t(s.size());
      for (size_t k = 0; k < s.size(); ++k) encoded_[b][1 + k] = uint8_t(s[k]);
    }
  }

  void pre_tokenize(Piece piece, PieceSink sink) const override {
    std::string prefixed;
    if (add_prefix_space_ && piece.text[0] != ' ') {
      prefixed.reserve(piece.text.size() + 1);
      prefixed += ' ';
      prefixed += piece.text;
      piece.text = prefixed;
    }
    std::string mapped;
    auto map_emit = [&](Piece p) {
      mapped.clear();
      for (unsigned char b : p.text) {
        mapped.append(reinterpret_cast<const char*>(&encoded_[b][1]), encoded_[b][0]);
      }
      sink(Piece{mapped, p.first});
    };
    if (use_regex_) {
      split_regex(piece, gpt2_regex(), false, Behavior::kIsolated, map_emit);
    } else {
      map_emit(piece);
    }
  }

 private:
  bool add_prefix_space_, use_regex_;
  uint8_t encoded_[256][3];  // [byte] -> {length, utf8 bytes of its character}
};

enum class PrependScheme { kFirst, kNever, kAlways };

// HF pre_tokenizers::Metaspace: spaces become the replacement character,
// which is prepended per the scheme and then starts each word.
class Metaspace final : public PreTokenizer {
 public:
  Metaspace(char32_t replacement, PrependScheme scheme, bool split)
      : replacement_(replacement), rep_(utf8_of(replacement)), scheme_(scheme), split_(split) {}

  void pre_tokenize(Piece piece, PieceSink sink) const override {
    std::string s;
    s.reserve(piece.text.size() + rep_.size());
    const bool prepend = (scheme_ == PrependScheme::kAlways ||
                          (scheme_ == PrependScheme::kFirst && piece.first)) &&
                         !piece.text.starts_with(rep_) && piece.text[0] != ' ';
    if (prepend) s += rep_;
    for (char c : piece.text) {
      if (c == ' ') {
        s += rep_;
      } else {
        s += c;
      }
    }
    if (!split_) {
      sink(Piece{s, piece.first});
      return;
    }
    split_chars(Piece{s, piece.first}, [&](char32_t c) { return c == replacement_; },
                Behavior::kMergedWithNext, sink);
  }

 private:
  char32_t replacement_;
  std::string rep_;
  PrependScheme scheme_;
  bool split_;
};

class CharSplit final : public PreTokenizer {
 public:
  enum class Kind { kDigits, kWhitespace, kPunctuation, kDelimiter };
  CharSplit(Kind kind, Behavior behavior, char32_t delimiter = 0)
      : kind_(kind), behavior_(behavior), delimiter_(delimiter) {}
  void pre_tokenize(Piece piece, PieceSink sink) const override {
    switch (kind_) {
      case Kind::kDigits: split_chars(piece, is_numeric, behavior_, sink); break;
      case Kind::kWhitespace: split_chars(piece, is_white_space, behavior_, sink); break;
      case Kind::kPunctuation: split_chars(piece, is_punctuation, behavior_, sink); break;
      case Kind::kDelimiter:
        split_chars(piece, [&](char32_t c) { return c == delimiter_; }, behavior_, sink);
        break;
    }
  }

 private:
  Kind kind_;
  Behavior behavior_;
  char32_t delimiter_;
};

// HF Whitespace: keeps runs of word characters and runs of other
// non-space characters (`\w+|[^\w\s]+` in the regex crate's Unicode terms).
class Whitespace final : public PreTokenizer {
 public:
  void pre_tokenize(Piece piece, PieceSink sink) const override {
    static const Regex re = Regex::compile(
        R"([\p{L}\p{M}\p{Nd}\p{Nl}\p{Pc}\x{200C}\x{200D}]+|[^\p{L}\p{M}\p{Nd}\p{Nl}\p{Pc}\x{200C}\x{200D}\s]+)",
        "[tokenizer] Whitespace");
    split_regex(piece, re, true, Behavior::kRemoved, sink);
  }
};

// HF BertPreTokenizer: whitespace removed, punctuation isolated.
class Bert final : public PreTokenizer {
 public:
  void pre_tokenize(Piece piece, PieceSink sink) const override {
    split_chars(piece, is_white_space, Behavior::kRemoved, [&](Piece p) {
      split_chars(p, is_punctuation, Behavior::kIsolated, sink);
    });
  }
};

class Sequence final : public PreTokenizer {
 public:
  explicit Sequence(std::vector<std::unique_ptr<PreTokenizer>> steps)
      : steps_(std::move(steps)) {}
  void pre_tokenize(Piece piece, PieceSink sink) const override { run(0, piece, sink); }

 private:
  // Depth first: each step splits every piece independently, so a piece can
  // go through all remaining steps before its neighbour is looked at.
  void run(size_t step, Piece piece, PieceSink sink) const {
    if (step == steps_.size()) {
      sink(piece);
      return;
    }
    steps_[step]->pre_tokenize(piece, [&](Piece p) { run(step + 1, p, sink); });
  }
  std::vector<std::unique_ptr<PreTokenizer>> steps_;
};

char32_t single_char(const std::string& s, const std::string& where, std::string_view component) {
  size_t i = 0;
  if (s.empty() || find_invalid_utf8(s) != std::string::npos) {
    fail(where, ": ", component, ": expected one character, got '", s, "'");
  }
  const char32_t c = next_cp(s, i);
  if (i != s.size()) fail(where, ": ", component, ": expected one character, got '", s, "'");
  return c;
}

}  // namespace

std::unique_ptr<PreTokenizer> make_pre_tokenizer(const nlohmann::json& j,
                                                 const std::string& where) {
  if (j.is_null()) return nullptr;
  const std::string type = type_of(j, where, "pre_tokenizer");
  if (type == "Split") {
    return std::make_unique<Split>(
        pattern_of(required(j, "pattern", where, "Split"), where, "Split"),
        behavior_of(required(j, "behavior", where, "Split"), where, "Split"),
        value_or(j, "invert", false));
  }
  if (type == "ByteLevel") {
    return std::make_unique<ByteLevel>(value_or(j, "add_prefix_space", true),
                                       value_or(j, "use_regex", true));
  }
  if (type == "Metaspace") {
    const char32_t rep = single_char(
        required(j, "replacement", where, "Metaspace").get<std::string>(), where, "Metaspace");
    PrependScheme scheme = PrependScheme::kAlways;
    const std::string s = value_or<std::string>(j, "prepend_scheme", "always");
    if (s == "first") {
      scheme = PrependScheme::kFirst;
    } else if (s == "never") {
      scheme = PrependScheme::kNever;
    } else if (s != "always") {
      fail(where, ": Metaspace: unsupported prepend_scheme '", s, "'");
    }
    // Older files say add_prefix_space instead of prepend_scheme.
    if (j.contains("add_prefix_space") && j["add_prefix_space"].is_boolean() &&
        !j["add_prefix_space"].get<bool>()) {
      scheme = PrependScheme::kNever;
    }
    return std::make_unique<Metaspace>(rep, scheme, value_or(j, "split", true));
  }
  if (type == "Digits") {
    return std::make_unique<CharSplit>(CharSplit::Kind::kDigits,
                                       value_or(j, "individual_digits", false)
                                           ? Behavior::kIsolated
                                           : Behavior::kContiguous);
  }
  if (type == "WhitespaceSplit") {
    return std::make_unique<CharSplit>(CharSplit::Kind::kWhitespace, Behavior::kRemoved);
  }
  if (type == "Punctuation") {
    const Behavior b = j.contains("behavior")
                           ? behavior_of(j["behavior"], where, "Punctuation")
                           : Behavior::kIsolated;
    return std::make_unique<CharSplit>(CharSplit::Kind::kPunctuation, b);
  }
  if (type == "CharDelimiterSplit") {
    const char32_t d =
        single_char(required(j, "delimiter", where, "CharDelimiterSplit").get<std::string>(),
                    where, "CharDelimiterSplit");
    return std::make_unique<CharSplit>(CharSplit::Kind::kDelimiter, Behavior::kRemoved, d);
  }
  if (type == "Whitespace") return std::make_unique<Whitespace>();
  if (type == "BertPreTokenizer") return std::make_unique<Bert>();
  if (type == "Sequence") {
    std::vector<std::unique_ptr<PreTokenizer>> steps;
    for (const auto& step : required(j, "pretokenizers", where, "Sequence pre_tokenizer")) {
      if (auto p = make_pre_tokenizer(step, where)) steps.push_back(std::move(p));
    }
    return std::make_unique<Sequence>(std::move(steps));
  }
  fail(where, ": unsupported pre_tokenizer type '", type, "'");
}

}  // namespace augur::tok
