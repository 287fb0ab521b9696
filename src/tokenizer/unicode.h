// UTF-8 and Unicode helpers for the tokenizer: validation, Rust-compatible
// lossy decoding, the character classes Hugging Face tokenizers uses (Rust's
// char::is_whitespace and friends), normalization forms through utf8proc, and
// the GPT-2 byte <-> character table.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace augur::tok {

// Number of bytes of the UTF-8 sequence led by `lead` (1 for a stray byte).
inline size_t utf8_seq_len(unsigned char lead) {
  if (lead < 0x80) return 1;
  if (lead >= 0xF0) return 4;
  if (lead >= 0xE0) return 3;
  if (lead >= 0xC0) return 2;
  return 1;
}

// Decodes the code point at s[i] and advances i. `s` must be valid UTF-8.
inline char32_t next_cp(std::string_view s, size_t& i) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data()) + i;
  if (p[0] < 0x80) {
    i += 1;
    return p[0];
  }
  if (p[0] < 0xE0) {
    i += 2;
    return (char32_t(p[0] & 0x1F) << 6) | (p[1] & 0x3F);
  }
  if (p[0] < 0xF0) {
    i += 3;
    return (char32_t(p[0] & 0x0F) << 12) | (char32_t(p[1] & 0x3F) << 6) | (p[2] & 0x3F);
  }
  i += 4;
  return (char32_t(p[0] & 0x07) << 18) | (char32_t(p[1] & 0x3F) << 12) |
         (char32_t(p[2] & 0x3F) << 6) | (p[3] & 0x3F);
}

inline void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(char(cp));
  } else if (cp < 0x800) {
    out.push_back(char(0xC0 | (cp >> 6)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(char(0xE0 | (cp >> 12)));
    out.push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(char(0xF0 | (cp >> 18)));
    out.push_back(char(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  }
}

inline std::string utf8_of(char32_t cp) {
  std::string s;
  append_utf8(s, cp);
  return s;
}

// Offset of the first byte that does not start a well-formed UTF-8 sequence
// (overlongs, surrogates and > U+10FFFF rejected, as Rust's from_utf8 does),
// or npos when `s` is valid.
size_t find_invalid_utf8(std::string_view s);

// Rust's String::from_utf8_lossy: every maximal ill-formed subpart becomes
// one U+FFFD (the Unicode "substitution of maximal subparts" practice).
std::string utf8_lossy(std::string_view bytes);

// Unicode White_Space: Rust's char::is_whitespace and Oniguruma's \s.
bool is_white_space(char32_t cp);
// General category N* (Rust's char::is_numeric).
bool is_numeric(char32_t cp);
// General category P* or ASCII punctuation (HF's Punctuation pre-tokenizer).
bool is_punctuation(char32_t cp);
// The `regex` crate's \w: letters, marks, decimal and letter numbers, Pc.
bool is_word_char(char32_t cp);
// General category M* (combining marks).
bool is_mark(char32_t cp);

enum class NormForm { kNfc, kNfd, kNfkc, kNfkd };
// Unicode normalization of valid UTF-8 (ASCII runs pass through untouched).
std::string normalize_form(std::string_view s, NormForm form);
// Per-character full lowercase mapping, as Rust's char::to_lowercase.
std::string to_lower(std::string_view s);

// GPT-2's byte-to-character table used by ByteLevel: printable Latin-1 bytes
// map to themselves, the rest to U+0100 onwards.
const std::array<char32_t, 256>& byte_level_chars();
// The byte a byte-level character stands for, or -1.
int byte_level_byte(char32_t cp);

}  // namespace augur::tok
