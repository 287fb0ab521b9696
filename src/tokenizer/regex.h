// Regular expressions for Split, Replace and ByteLevel: PCRE2 (UTF + UCP,
// JIT-compiled) standing in for the Oniguruma engine Hugging Face tokenizers
// uses, with the pattern translated where the two disagree.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

#include "tokenizer/function_ref.h"

namespace augur::tok {

class Regex {
 public:
  // Compiles an Oniguruma-syntax pattern; `where` leads the error message of
  // a pattern that does not compile ("[tokenizer] file: Split").
  static Regex compile(std::string_view pattern, const std::string& where);
  // Matches `text` literally.
  static Regex literal(std::string_view text);

  // Calls on_match(start, end) for each successive non-overlapping match of
  // valid UTF-8 `s`, with the find_iter rule of the Rust regex and onig
  // crates: an empty match right where the previous match ended is skipped.
  void find_all(std::string_view s, FunctionRef<void(size_t, size_t)> on_match) const;

  struct Compiled;

 private:
  std::shared_ptr<const Compiled> re_;  // null for a literal
  std::string literal_;
};

// Rewrites the Oniguruma constructs whose meaning differs in PCRE2: \s and \S
// (Oniguruma's \s is Unicode White_Space, which includes U+0085), \h and \H
// (hex digits in Oniguruma's Ruby syntax) and \uHHHH escapes.
std::string onig_to_pcre2(std::string_view pattern);

}  // namespace augur::tok
