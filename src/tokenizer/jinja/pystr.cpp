#include "tokenizer/jinja/pystr.h"

#include <utf8proc.h>

#include <algorithm>

#include "tokenizer/jinja/errors.h"

namespace augur::jinja::pystr {

namespace {

constexpr char32_t kEscapeBase = 0xDC00;

// Decodes one code point at s[i], advancing i; invalid bytes decode to
// U+DC00+byte one at a time.
char32_t next_code_point(std::string_view s, size_t& i) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  if (b0 < 0x80) {
    ++i;
    return b0;
  }
  int n = 0;
  char32_t c = 0;
  char32_t min = 0;
  if ((b0 & 0xE0) == 0xC0) {
    n = 1, c = b0 & 0x1F, min = 0x80;
  } else if ((b0 & 0xF0) == 0xE0) {
    n = 2, c = b0 & 0x0F, min = 0x800;
  } else if ((b0 & 0xF8) == 0xF0) {
    n = 3, c = b0 & 0x07, min = 0x10000;
  } else {
    ++i;
    return kEscapeBase + b0;
  }
  if (i + static_cast<size_t>(n) >= s.size()) {
    ++i;
    return kEscapeBase + b0;
  }
  for (int k = 1; k <= n; ++k) {
    const auto b = static_cast<unsigned char>(s[i + k]);
    if ((b & 0xC0) != 0x80) {
      ++i;
      return kEscapeBase + b0;
    }
    c = (c << 6) | (b & 0x3F);
  }
  if (c < min || c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF)) {
    ++i;
    return kEscapeBase + b0;
  }
  i += n + 1;
  return c;
}

// Line boundaries of str.splitlines().
bool is_line_break(char32_t c) {
  switch (c) {
    case 0x0A: case 0x0B: case 0x0C: case 0x0D: case 0x1C: case 0x1D: case 0x1E:
    case 0x85: case 0x2028: case 0x2029:
      return true;
    default:
      return false;
  }
}

template <typename F>
std::string map_code_points(std::string_view s, F f) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) append_utf8(out, f(next_code_point(s, i)));
  return out;
}

}  // namespace

void append_utf8(std::string& out, char32_t c) {
  if (c < 0x80) {
    out += static_cast<char>(c);
  } else if (c >= kEscapeBase + 0x80 && c <= kEscapeBase + 0xFF) {
    out += static_cast<char>(c - kEscapeBase);
  } else if (c < 0x800) {
    out += static_cast<char>(0xC0 | (c >> 6));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    out += static_cast<char>(0xE0 | (c >> 12));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (c >> 18));
    out += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  }
}

std::u32string decode(std::string_view s) {
  std::u32string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) out += next_code_point(s, i);
  return out;
}

std::string encode(std::u32string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char32_t c : s) append_utf8(out, c);
  return out;
}

bool is_ascii(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return static_cast<unsigned char>(c) < 0x80; });
}

int64_t length(std::string_view s) {
  int64_t n = 0;
  size_t i = 0;
  while (i < s.size()) {
    next_code_point(s, i);
    ++n;
  }
  return n;
}

bool is_space(char32_t c) {
  if (c < 0x80) return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20);
  return c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 ||
         c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

bool is_word(char32_t c) {
  if (c < 0x80) return c == '_' || (c >= '0' && c <= '9') || ((c | 0x20) >= 'a' && (c | 0x20) <= 'z');
  if (c > 0x10FFFF) return false;
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(c))) {
    case UTF8PROC_CATEGORY_LU: case UTF8PROC_CATEGORY_LL: case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM: case UTF8PROC_CATEGORY_LO: case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL: case UTF8PROC_CATEGORY_NO:
      return true;
    default:
      return false;
  }
}

bool is_cased(char32_t c) {
  if (c > 0x10FFFF) return false;
  const auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(c));
  return cat == UTF8PROC_CATEGORY_LU || cat == UTF8PROC_CATEGORY_LL || cat == UTF8PROC_CATEGORY_LT;
}

char32_t to_upper(char32_t c) {
  if (c < 0x80) return (c >= 'a' && c <= 'z') ? c - 32 : c;
  if (c > 0x10FFFF) return c;
  return static_cast<char32_t>(utf8proc_toupper(static_cast<utf8proc_int32_t>(c)));
}

char32_t to_lower(char32_t c) {
  if (c < 0x80) return (c >= 'A' && c <= 'Z') ? c + 32 : c;
  if (c > 0x10FFFF) return c;
  return static_cast<char32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(c)));
}

char32_t to_title(char32_t c) {
  if (c < 0x80) return to_upper(c);
  if (c > 0x10FFFF) return c;
  return static_cast<char32_t>(utf8proc_totitle(static_cast<utf8proc_int32_t>(c)));
}

std::string strip(std::string_view s, const std::optional<std::string>& chars, bool left,
                  bool right) {
  std::u32string set;
  if (chars) set = decode(*chars);
  auto strippable = [&](char32_t c) {
    return chars ? set.find(c) != std::u32string::npos : is_space(c);
  };
  if (is_ascii(s) && (!chars || is_ascii(*chars))) {
    size_t b = 0, e = s.size();
    if (left)
      while (b < e && strippable(static_cast<unsigned char>(s[b]))) ++b;
    if (right)
      while (e > b && strippable(static_cast<unsigned char>(s[e - 1]))) --e;
    return std::string(s.substr(b, e - b));
  }
  const std::u32string u = decode(s);
  size_t b = 0, e = u.size();
  if (left)
    while (b < e && strippable(u[b])) ++b;
  if (right)
    while (e > b && strippable(u[e - 1])) --e;
  return encode(std::u32string_view(u).substr(b, e - b));
}

std::vector<std::string> split(std::string_view s, const std::optional<std::string>& sep,
                               int64_t maxsplit) {
  std::vector<std::string> out;
  if (sep) {
    if (sep->empty()) eval_fail("empty separator");
    size_t start = 0;
    while (maxsplit < 0 || static_cast<int64_t>(out.size()) < maxsplit) {
      const size_t at = s.find(*sep, start);
      if (at == std::string_view::npos) break;
      out.emplace_back(s.substr(start, at - start));
      start = at + sep->size();
    }
    out.emplace_back(s.substr(start));
    return out;
  }
  const std::u32string u = decode(s);
  size_t i = 0;
  while (true) {
    while (i < u.size() && is_space(u[i])) ++i;
    if (i == u.size()) break;
    if (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) {
      out.push_back(encode(std::u32string_view(u).substr(i)));
      break;
    }
    size_t j = i;
    while (j < u.size() && !is_space(u[j])) ++j;
    out.push_back(encode(std::u32string_view(u).substr(i, j - i)));
    i = j;
  }
  return out;
}

std::vector<std::string> rsplit(std::string_view s, const std::optional<std::string>& sep,
                                int64_t maxsplit) {
  std::vector<std::string> out;
  if (sep) {
    if (sep->empty()) eval_fail("empty separator");
    size_t end = s.size();
    while (maxsplit < 0 || static_cast<int64_t>(out.size()) < maxsplit) {
      if (end < sep->size()) break;
      const size_t at = s.rfind(*sep, end - sep->size());
      if (at == std::string_view::npos) break;
      out.emplace_back(s.substr(at + sep->size(), end - at - sep->size()));
      end = at;
    }
    out.emplace_back(s.substr(0, end));
    std::reverse(out.begin(), out.end());
    return out;
  }
  const std::u32string u = decode(s);
  size_t e = u.size();
  while (true) {
    while (e > 0 && is_space(u[e - 1])) --e;
    if (e == 0) break;
    if (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) {
      out.push_back(encode(std::u32string_view(u).substr(0, e)));
      break;
    }
    size_t b = e;
    while (b > 0 && !is_space(u[b - 1])) --b;
    out.push_back(encode(std::u32string_view(u).substr(b, e - b)));
    e = b;
  }
  std::reverse(out.begin(), out.end());
  return out;
}

std::vector<std::string> splitlines(std::string_view s, bool keepends) {
  const std::u32string u = decode(s);
  std::vector<std::string> out;
  size_t start = 0, i = 0;
  while (i < u.size()) {
    if (!is_line_break(u[i])) {
      ++i;
      continue;
    }
    size_t eol = i + 1;
    if (u[i] == '\r' && eol < u.size() && u[eol] == '\n') ++eol;
    out.push_back(encode(std::u32string_view(u).substr(start, (keepends ? eol : i) - start)));
    start = i = eol;
  }
  if (start < u.size()) out.push_back(encode(std::u32string_view(u).substr(start)));
  return out;
}

std::string replace(std::string_view s, std::string_view old, std::string_view repl,
                    int64_t count) {
  std::string out;
  if (old.empty()) {
    // Python inserts repl before every code point and at the end.
    size_t i = 0;
    int64_t n = 0;
    while (i < s.size()) {
      if (count < 0 || n < count) {
        out += repl;
        ++n;
      }
      const size_t b = i;
      next_code_point(s, i);
      out += s.substr(b, i - b);
    }
    if (count < 0 || n < count) out += repl;
    return out;
  }
  size_t start = 0;
  int64_t n = 0;
  while (count < 0 || n < count) {
    const size_t at = s.find(old, start);
    if (at == std::string_view::npos) break;
    out += s.substr(start, at - start);
    out += repl;
    start = at + old.size();
    ++n;
  }
  out += s.substr(start);
  return out;
}

namespace {

// The unconditional one-to-many mappings of SpecialCasing.txt that Python
// applies and utf8proc's one-to-one mappings lack (the common ones).
enum class Case { Upper, Lower, Title };

const char* special_case(char32_t c, Case mode) {
  switch (c) {
    case 0x00DF: return mode == Case::Upper ? "SS" : mode == Case::Title ? "Ss" : nullptr;  // ß
    case 0x0130: return mode == Case::Lower ? "i\xCC\x87" : nullptr;                        // İ
    case 0xFB00: return mode == Case::Upper ? "FF" : mode == Case::Title ? "Ff" : nullptr;
    case 0xFB01: return mode == Case::Upper ? "FI" : mode == Case::Title ? "Fi" : nullptr;
    case 0xFB02: return mode == Case::Upper ? "FL" : mode == Case::Title ? "Fl" : nullptr;
    case 0xFB03: return mode == Case::Upper ? "FFI" : mode == Case::Title ? "Ffi" : nullptr;
    case 0xFB04: return mode == Case::Upper ? "FFL" : mode == Case::Title ? "Ffl" : nullptr;
    case 0xFB05:
    case 0xFB06: return mode == Case::Upper ? "ST" : mode == Case::Title ? "St" : nullptr;
    default: return nullptr;
  }
}

void append_cased(std::string& out, char32_t c, Case mode) {
  if (c >= 0x80) {
    if (const char* special = special_case(c, mode)) {
      out += special;
      return;
    }
  }
  append_utf8(out, mode == Case::Upper ? to_upper(c) : mode == Case::Lower ? to_lower(c) : to_title(c));
}

template <typename F>
std::string map_case(std::string_view s, F mode_of) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    const char32_t c = next_code_point(s, i);
    append_cased(out, c, mode_of(c));
  }
  return out;
}

}  // namespace

std::string upper(std::string_view s) {
  if (is_ascii(s)) return map_code_points(s, to_upper);
  return map_case(s, [](char32_t) { return Case::Upper; });
}

std::string lower(std::string_view s) {
  if (is_ascii(s)) return map_code_points(s, to_lower);
  return map_case(s, [](char32_t) { return Case::Lower; });
}

std::string capitalize(std::string_view s) {
  bool first = true;
  return map_case(s, [&](char32_t) {
    const Case m = first ? Case::Title : Case::Lower;
    first = false;
    return m;
  });
}

std::string title(std::string_view s) {
  bool prev_cased = false;
  return map_case(s, [&](char32_t c) {
    const Case m = prev_cased ? Case::Lower : Case::Title;
    prev_cased = is_cased(c);
    return m;
  });
}

std::string upper_char(char32_t c) {
  std::string out;
  append_cased(out, c, Case::Upper);
  return out;
}

std::string lower_char(char32_t c) {
  std::string out;
  append_cased(out, c, Case::Lower);
  return out;
}

int64_t find(std::string_view s, std::string_view sub) {
  const size_t at = s.find(sub);
  return at == std::string_view::npos ? -1 : length(s.substr(0, at));
}

int64_t rfind(std::string_view s, std::string_view sub) {
  const size_t at = s.rfind(sub);
  return at == std::string_view::npos ? -1 : length(s.substr(0, at));
}

int64_t count(std::string_view s, std::string_view sub) {
  if (sub.empty()) return length(s) + 1;
  int64_t n = 0;
  for (size_t at = s.find(sub); at != std::string_view::npos; at = s.find(sub, at + sub.size())) ++n;
  return n;
}

}  // namespace augur::jinja::pystr
