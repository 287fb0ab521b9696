#include "tokenizer/unicode.h"

#include <utf8proc.h>

#include <cstdlib>
#include <cstring>
#include <memory>

#include "core/error.h"

namespace augur::tok {

namespace {

// Classifies the sequence at p[0..n): returns its length when well-formed;
// otherwise sets `bad` and returns the length of the maximal well-formed
// prefix (at least 1), which is what one U+FFFD replaces.
size_t scan_seq(const unsigned char* p, size_t n, bool& bad) {
  bad = false;
  const unsigned char c = p[0];
  if (c < 0x80) return 1;
  size_t need;
  unsigned char lo = 0x80, hi = 0xBF;  // range of the second byte
  if (c >= 0xC2 && c <= 0xDF) {
    need = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    need = 3;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    need = 4;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else {
    bad = true;
    return 1;
  }
  for (size_t k = 1; k < need; ++k) {
    if (k >= n) {
      bad = true;
      return k;
    }
    const unsigned char b = p[k];
    const bool ok = k == 1 ? (b >= lo && b <= hi) : (b >= 0x80 && b <= 0xBF);
    if (!ok) {
      bad = true;
      return k;
    }
  }
  return need;
}

}  // namespace

size_t find_invalid_utf8(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  size_t i = 0;
  while (i < n) {
    // ASCII fast path, 8 bytes at a time.
    while (i + 8 <= n) {
      uint64_t w;
      std::memcpy(&w, p + i, 8);
      if (w & 0x8080808080808080ull) break;
      i += 8;
    }
    if (i >= n) break;
    if (p[i] < 0x80) {
      ++i;
      continue;
    }
    bool bad;
    const size_t len = scan_seq(p + i, n - i, bad);
    if (bad) return i;
    i += len;
  }
  return std::string_view::npos;
}

std::string utf8_lossy(std::string_view bytes) {
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  const size_t n = bytes.size();
  std::string out;
  out.reserve(n);
  size_t i = 0;
  while (i < n) {
    bool bad;
    const size_t len = scan_seq(p + i, n - i, bad);
    if (bad) {
      out += "\xEF\xBF\xBD";
    } else {
      out.append(bytes.data() + i, len);
    }
    i += len;
  }
  return out;
}

bool is_white_space(char32_t c) {
  if (c <= 0x20) return c == 0x20 || (c >= 0x09 && c <= 0x0D);
  if (c < 0x85) return false;
  return c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) ||
         c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

bool is_numeric(char32_t c) {
  if (c < 0x80) return c >= '0' && c <= '9';
  const auto cat = utf8proc_category(utf8proc_int32_t(c));
  return cat == UTF8PROC_CATEGORY_ND || cat == UTF8PROC_CATEGORY_NL ||
         cat == UTF8PROC_CATEGORY_NO;
}

bool is_punctuation(char32_t c) {
  if (c < 0x80) {
    return (c >= 0x21 && c <= 0x2F) || (c >= 0x3A && c <= 0x40) || (c >= 0x5B && c <= 0x60) ||
           (c >= 0x7B && c <= 0x7E);
  }
  const auto cat = utf8proc_category(utf8proc_int32_t(c));
  return cat >= UTF8PROC_CATEGORY_PC && cat <= UTF8PROC_CATEGORY_PO;
}

bool is_mark(char32_t c) {
  if (c < 0x300) return false;
  const auto cat = utf8proc_category(utf8proc_int32_t(c));
  return cat == UTF8PROC_CATEGORY_MN || cat == UTF8PROC_CATEGORY_MC ||
         cat == UTF8PROC_CATEGORY_ME;
}

bool is_word_char(char32_t c) {
  if (c < 0x80) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
           c == '_';
  }
  if (c == 0x200C || c == 0x200D) return true;  // Join_Control
  const auto cat = utf8proc_category(utf8proc_int32_t(c));
  return (cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_LO) ||
         (cat >= UTF8PROC_CATEGORY_MN && cat <= UTF8PROC_CATEGORY_ME) ||
         cat == UTF8PROC_CATEGORY_ND || cat == UTF8PROC_CATEGORY_NL ||
         cat == UTF8PROC_CATEGORY_PC;
}

namespace {

std::string utf8proc_apply(std::string_view s, NormForm form) {
  int options = UTF8PROC_STABLE;
  switch (form) {
    case NormForm::kNfc: options |= UTF8PROC_COMPOSE; break;
    case NormForm::kNfd: options |= UTF8PROC_DECOMPOSE; break;
    case NormForm::kNfkc: options |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT; break;
    case NormForm::kNfkd: options |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT; break;
  }
  utf8proc_uint8_t* out = nullptr;
  const auto n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()),
                              utf8proc_ssize_t(s.size()), &out, utf8proc_option_t(options));
  std::unique_ptr<utf8proc_uint8_t, decltype(&std::free)> hold(out, &std::free);
  if (n < 0) fail("[tokenizer] normalize: ", utf8proc_errmsg(n));
  return std::string(reinterpret_cast<const char*>(out), size_t(n));
}

}  // namespace

std::string normalize_form(std::string_view s, NormForm form) {
  // ASCII characters never compose, decompose or reorder, and none is the
  // second half of a composition, so the text splits into independent
  // segments before each ASCII character: only segments holding non-ASCII
  // bytes go through utf8proc.
  std::string out;
  out.reserve(s.size() + s.size() / 8);
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  size_t i = 0;
  while (i < n) {
    size_t j = i;
    while (j < n && p[j] < 0x80) ++j;
    if (j == n) {
      out.append(s.data() + i, n - i);
      break;
    }
    // [seg, end): the ASCII character before the run (it may take a
    // combining mark) and the run of non-ASCII characters.
    size_t seg = j > i ? j - 1 : j;
    out.append(s.data() + i, seg - i);
    size_t end = j;
    while (end < n && p[end] >= 0x80) ++end;
    out += utf8proc_apply(s.substr(seg, end - seg), form);
    i = end;
  }
  return out;
}

std::string to_lower(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char b = s[i];
    if (b < 0x80) {
      out.push_back(b >= 'A' && b <= 'Z' ? char(b + 32) : char(b));
      ++i;
      continue;
    }
    const char32_t c = next_cp(s, i);
    if (c == 0x130) {  // the one unconditional multi-character lowercase
      out += "i\xCC\x87";
      continue;
    }
    append_utf8(out, char32_t(utf8proc_tolower(utf8proc_int32_t(c))));
  }
  return out;
}

namespace {

struct ByteLevelTables {
  std::array<char32_t, 256> to_char{};
  std::array<int16_t, 512> to_byte{};  // indexed by code point < 512
  ByteLevelTables() {
    to_byte.fill(-1);
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      to_char[b] = printable ? char32_t(b) : next++;
      to_byte[to_char[b]] = int16_t(b);
    }
  }
};

const ByteLevelTables& byte_level_tables() {
  static const ByteLevelTables tables;
  return tables;
}

}  // namespace

const std::array<char32_t, 256>& byte_level_chars() { return byte_level_tables().to_char; }

int byte_level_byte(char32_t cp) {
  return cp < 512 ? byte_level_tables().to_byte[cp] : -1;
}

}  // namespace augur::tok
