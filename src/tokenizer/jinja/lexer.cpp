#include "tokenizer/jinja/lexer.h"

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <optional>

#include "tokenizer/jinja/errors.h"
#include "tokenizer/jinja/pystr.h"

namespace augur::jinja {

namespace {

bool is_name_start(char c) { return c == '_' || ((c | 0x20) >= 'a' && (c | 0x20) <= 'z'); }
bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_name_char(char c) { return is_name_start(c) || is_digit(c); }
bool is_hex(char c) { return is_digit(c) || ((c | 0x20) >= 'a' && (c | 0x20) <= 'f'); }

// jinja2's lexer normalises every newline sequence to "\n" and, without
// keep_trailing_newline, drops one trailing newline.
std::string normalize(std::string_view source) {
  std::string s;
  s.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      s += '\n';
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      s += source[i];
    }
  }
  if (!s.empty() && s.back() == '\n') s.pop_back();
  return s;
}

// Python's "unicode-escape" decoding of a string literal's body, which is
// what jinja2 applies; non-ASCII text passes through unchanged.
std::string unescape(std::string_view body, int line) {
  std::string out;
  out.reserve(body.size());
  for (size_t i = 0; i < body.size(); ++i) {
    const char c = body[i];
    if (c != '\\' || i + 1 == body.size()) {
      out += c;
      continue;
    }
    const char e = body[++i];
    auto hex = [&](int n) -> char32_t {
      if (i + static_cast<size_t>(n) >= body.size())
        fail_at(line, "truncated \\", e, " escape in string literal");
      char32_t v = 0;
      for (int k = 1; k <= n; ++k) {
        const char h = body[i + k];
        if (!is_hex(h)) fail_at(line, "truncated \\", e, " escape in string literal");
        v = v * 16 + static_cast<char32_t>(is_digit(h) ? h - '0' : (h | 0x20) - 'a' + 10);
      }
      i += n;
      return v;
    };
    switch (e) {
      case '\n': break;  // line continuation
      case '\\': out += '\\'; break;
      case '\'': out += '\''; break;
      case '"': out += '"'; break;
      case 'a': out += '\a'; break;
      case 'b': out += '\b'; break;
      case 'f': out += '\f'; break;
      case 'n': out += '\n'; break;
      case 'r': out += '\r'; break;
      case 't': out += '\t'; break;
      case 'v': out += '\v'; break;
      case 'x': pystr::append_utf8(out, hex(2)); break;
      case 'u': {
        char32_t v = hex(4);
        // Join a UTF-16 surrogate pair written as two escapes.
        if (v >= 0xD800 && v < 0xDC00 && i + 2 < body.size() && body[i + 1] == '\\' &&
            body[i + 2] == 'u') {
          size_t save = i;
          i += 2;
          const char32_t lo = hex(4);
          if (lo >= 0xDC00 && lo <= 0xDFFF) {
            v = 0x10000 + ((v - 0xD800) << 10) + (lo - 0xDC00);
          } else {
            i = save;
          }
        }
        if (v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) v = 0xFFFD;
        pystr::append_utf8(out, v);
        break;
      }
      case 'U': {
        char32_t v = hex(8);
        if (v > 0x10FFFF) fail_at(line, "illegal Unicode character in string literal");
        if (v >= 0xD800 && v <= 0xDFFF) v = 0xFFFD;
        pystr::append_utf8(out, v);
        break;
      }
      default:
        if (e >= '0' && e <= '7') {
          char32_t v = static_cast<char32_t>(e - '0');
          for (int k = 0; k < 2 && i + 1 < body.size() && body[i + 1] >= '0' && body[i + 1] <= '7'; ++k)
            v = v * 8 + static_cast<char32_t>(body[++i] - '0');
          pystr::append_utf8(out, v);
        } else {
          out += '\\';  // unknown escapes stay as written
          out += e;
        }
    }
  }
  return out;
}

class Lexer {
 public:
  explicit Lexer(std::string_view source) : src_(normalize(source)) {}

  std::vector<Token> run() {
    while (pos_ < src_.size()) {
      const size_t tag = find_tag(pos_);
      if (tag == std::string::npos) {
        push_text(src_.substr(pos_), line_);
        advance_to(src_.size());
        break;
      }
      const char kind = src_[tag + 1];
      const char mod = (tag + 2 < src_.size() && (src_[tag + 2] == '-' || src_[tag + 2] == '+'))
                           ? src_[tag + 2]
                           : '\0';
      std::string text = src_.substr(pos_, tag - pos_);
      const int text_line = line_;
      strip_before_tag(text, mod, kind != '{');
      push_text(std::move(text), text_line);
      advance_to(tag);
      size_t raw_body = 0;
      if (kind == '#') {
        lex_comment(tag, mod);
      } else if (kind == '%' && is_raw_begin(tag, mod, raw_body)) {
        lex_raw(raw_body);
      } else {
        lex_tag(tag, kind, mod);
      }
    }
    tokens_.push_back(Token{TokenType::End, line_, {}});
    return std::move(tokens_);
  }

 private:
  size_t find_tag(size_t from) const {
    for (size_t i = src_.find('{', from); i != std::string::npos; i = src_.find('{', i + 1)) {
      if (i + 1 < src_.size() && (src_[i + 1] == '{' || src_[i + 1] == '%' || src_[i + 1] == '#'))
        return i;
    }
    return std::string::npos;
  }

  void advance_to(size_t p) {
    for (; pos_ < p; ++pos_)
      if (src_[pos_] == '\n') ++line_;
  }

  bool starts_with(size_t p, std::string_view s) const {
    return src_.compare(p, s.size(), s) == 0;
  }

  // After `-%}`, `-}}` or `-#}`: all whitespace that follows goes.
  void skip_whitespace_after() {
    size_t p = pos_;
    while (p < src_.size()) {
      const auto b = static_cast<unsigned char>(src_[p]);
      if (b < 0x80) {
        if (!pystr::is_space(b)) break;
        ++p;
        continue;
      }
      // a multi-byte code point: decode just it
      size_t len = b >= 0xF0 ? 4 : b >= 0xE0 ? 3 : 2;
      len = std::min(len, src_.size() - p);
      const std::u32string cp = pystr::decode(std::string_view(src_).substr(p, len));
      if (cp.size() != 1 || !pystr::is_space(cp[0])) break;
      p += len;
    }
    advance_to(p);
  }

  // trim_blocks: the first newline after a block or comment tag goes.
  void trim_newline() {
    if (pos_ < src_.size() && src_[pos_] == '\n') advance_to(pos_ + 1);
  }

  bool line_starting() const { return pos_ == 0 || src_[pos_ - 1] == '\n'; }

  // `{%-` strips all whitespace before the tag; otherwise lstrip_blocks
  // strips the spaces between a line's start and a block or comment tag.
  void strip_before_tag(std::string& text, char mod, bool lstrip) const {
    if (mod == '-') {
      text = pystr::strip(text, std::nullopt, false, true);
      return;
    }
    if (mod == '+' || !lstrip) return;
    const size_t nl = text.rfind('\n');
    const size_t line_pos = nl == std::string::npos ? 0 : nl + 1;
    if (nl == std::string::npos && !line_starting()) return;
    if (line_pos == text.size()) return;
    const std::string tail = text.substr(line_pos);
    if (pystr::strip(tail, std::nullopt, true, true).empty()) text.resize(line_pos);
  }

  void push_text(std::string text, int line) {
    if (!text.empty()) tokens_.push_back(Token{TokenType::Text, line, std::move(text)});
  }

  void lex_comment(size_t tag, char mod) {
    const int begin_line = line_;
    const size_t body = tag + 2 + (mod ? 1 : 0);
    const size_t end = src_.find("#}", body);
    if (end == std::string::npos) fail_at(begin_line, "missing end of comment tag");
    const bool dash = end > body && src_[end - 1] == '-';
    advance_to(end + 2);
    if (dash) {
      skip_whitespace_after();
    } else {
      trim_newline();
    }
  }

  size_t skip_spaces(size_t p) const {
    while (p < src_.size() && (src_[p] == ' ' || src_[p] == '\t' || src_[p] == '\n' ||
                               src_[p] == '\f' || src_[p] == '\v'))
      ++p;
    return p;
  }

  // `{% raw %}`: sets raw_body to where the raw text starts.
  bool is_raw_begin(size_t tag, char mod, size_t& raw_body) {
    size_t p = skip_spaces(tag + 2 + (mod ? 1 : 0));
    if (!starts_with(p, "raw")) return false;
    p = skip_spaces(p + 3);
    if (starts_with(p, "-%}")) {
      advance_to(p + 3);
      skip_whitespace_after();
    } else if (starts_with(p, "%}")) {
      advance_to(p + 2);  // no trim_blocks after raw, as jinja2
    } else {
      return false;
    }
    raw_body = pos_;
    return true;
  }

  void lex_raw(size_t body) {
    const int begin_line = line_;
    for (size_t q = src_.find("{%", body); q != std::string::npos; q = src_.find("{%", q + 1)) {
      size_t p = q + 2;
      const char mod = (p < src_.size() && (src_[p] == '-' || src_[p] == '+')) ? src_[p] : '\0';
      if (mod) ++p;
      p = skip_spaces(p);
      if (!starts_with(p, "endraw")) continue;
      p = skip_spaces(p + 6);
      char end_mod = '\0';
      if (starts_with(p, "-%}") || starts_with(p, "+%}")) {
        end_mod = src_[p];
        p += 3;
      } else if (starts_with(p, "%}")) {
        p += 2;
      } else {
        continue;
      }
      std::string text = src_.substr(body, q - body);
      strip_before_tag(text, mod, true);
      push_text(std::move(text), begin_line);
      advance_to(p);
      if (end_mod == '-') {
        skip_whitespace_after();
      } else if (end_mod == '\0') {
        trim_newline();
      }
      return;
    }
    fail_at(begin_line, "missing end of raw directive");
  }

  void lex_tag(size_t tag, char kind, char mod) {
    const int begin_line = line_;
    const bool var = kind == '{';
    tokens_.push_back(Token{var ? TokenType::VarBegin : TokenType::BlockBegin, line_, {}});
    advance_to(tag + 2 + (mod ? 1 : 0));
    std::string brackets;  // open ( [ { awaiting their close
    while (true) {
      advance_to(skip_spaces(pos_));
      if (pos_ >= src_.size())
        fail_at(begin_line, "unexpected end of template, expected '", var ? "}}" : "%}", "'");
      if (brackets.empty()) {
        if (var && (starts_with(pos_, "-}}") || starts_with(pos_, "}}"))) {
          const bool dash = src_[pos_] == '-';
          tokens_.push_back(Token{TokenType::VarEnd, line_, {}});
          advance_to(pos_ + (dash ? 3 : 2));
          if (dash) skip_whitespace_after();
          return;
        }
        if (!var && (starts_with(pos_, "-%}") || starts_with(pos_, "+%}") || starts_with(pos_, "%}"))) {
          const char m = src_[pos_] == '%' ? '\0' : src_[pos_];
          tokens_.push_back(Token{TokenType::BlockEnd, line_, {}});
          advance_to(pos_ + (m ? 3 : 2));
          if (m == '-') {
            skip_whitespace_after();
          } else if (m == '\0') {
            trim_newline();
          }
          return;
        }
      }
      const char c = src_[pos_];
      if (is_name_start(c)) {
        size_t e = pos_;
        while (e < src_.size() && is_name_char(src_[e])) ++e;
        tokens_.push_back(Token{TokenType::Name, line_, src_.substr(pos_, e - pos_)});
        advance_to(e);
      } else if (is_digit(c)) {
        lex_number();
      } else if (c == '\'' || c == '"') {
        lex_string(c);
      } else {
        lex_operator(brackets);
      }
    }
  }

  void lex_number() {
    const size_t start = pos_;
    auto digits = [&](size_t p, auto pred) {
      // digits with single underscores between them, as Python literals
      size_t e = p;
      while (e < src_.size() && (pred(src_[e]) || (src_[e] == '_' && e + 1 < src_.size() && pred(src_[e + 1]) && e > p)))
        ++e;
      return e;
    };
    if (src_[start] == '0' && start + 1 < src_.size()) {
      const char b = static_cast<char>(src_[start + 1] | 0x20);
      int base = b == 'b' ? 2 : b == 'o' ? 8 : b == 'x' ? 16 : 0;
      if (base) {
        auto pred = [base](char ch) {
          if (base == 2) return ch == '0' || ch == '1';
          if (base == 8) return ch >= '0' && ch <= '7';
          return is_hex(ch);
        };
        size_t p = start + 2;
        if (p < src_.size() && src_[p] == '_') ++p;
        const size_t e = digits(p, pred);
        if (e > p) {
          std::string clean;
          for (size_t k = start + 2; k < e; ++k)
            if (src_[k] != '_') clean += src_[k];
          push_integer(clean, base, e);
          return;
        }
      }
    }
    size_t e = digits(start, is_digit);
    bool is_float = false;
    const bool after_dot = start > 0 && src_[start - 1] == '.';
    if (!after_dot && e + 1 < src_.size() && src_[e] == '.' && is_digit(src_[e + 1])) {
      e = digits(e + 1, is_digit);
      is_float = true;
    }
    if (!after_dot && e < src_.size() && (src_[e] | 0x20) == 'e') {
      size_t p = e + 1;
      if (p < src_.size() && (src_[p] == '+' || src_[p] == '-')) ++p;
      if (p < src_.size() && is_digit(src_[p])) {
        e = digits(p, is_digit);
        is_float = true;
      }
    }
    std::string clean;
    for (size_t k = start; k < e; ++k)
      if (src_[k] != '_') clean += src_[k];
    if (is_float) {
      Token t{TokenType::Float, line_, clean};
      t.number = std::strtod(clean.c_str(), nullptr);
      tokens_.push_back(std::move(t));
      advance_to(e);
    } else {
      push_integer(clean, 10, e);
    }
  }

  void push_integer(const std::string& digits, int base, size_t end) {
    Token t{TokenType::Integer, line_, digits};
    const auto res = std::from_chars(digits.data(), digits.data() + digits.size(), t.integer, base);
    if (res.ec != std::errc()) fail_at(line_, "integer literal '", digits, "' is out of range");
    tokens_.push_back(std::move(t));
    advance_to(end);
  }

  void lex_string(char quote) {
    const int line = line_;
    size_t p = pos_ + 1;
    while (p < src_.size() && src_[p] != quote) p += (src_[p] == '\\' && p + 1 < src_.size()) ? 2 : 1;
    if (p >= src_.size()) fail_at(line, "unterminated string literal");
    const std::string_view body = std::string_view(src_).substr(pos_ + 1, p - pos_ - 1);
    tokens_.push_back(Token{TokenType::String, line, unescape(body, line)});
    advance_to(p + 1);
  }

  void lex_operator(std::string& brackets) {
    static constexpr std::string_view kTwo[] = {"//", "**", "==", "!=", "<=", ">="};
    for (std::string_view op : kTwo) {
      if (starts_with(pos_, op)) {
        tokens_.push_back(Token{TokenType::Operator, line_, std::string(op)});
        advance_to(pos_ + 2);
        return;
      }
    }
    const char c = src_[pos_];
    static constexpr std::string_view kOne = "+-*/%~<>=()[]{}.,:|;";
    if (kOne.find(c) == std::string_view::npos) {
      std::string shown;
      const std::u32string cp = pystr::decode(std::string_view(src_).substr(pos_, 4));
      pystr::append_utf8(shown, cp.empty() ? U'?' : cp[0]);
      fail_at(line_, "unexpected char '", shown, "'");
    }
    if (c == '(' || c == '[' || c == '{') {
      brackets += c;
    } else if (c == ')' || c == ']' || c == '}') {
      const char open = c == ')' ? '(' : c == ']' ? '[' : '{';
      if (brackets.empty() || brackets.back() != open) fail_at(line_, "unexpected '", c, "'");
      brackets.pop_back();
    }
    tokens_.push_back(Token{TokenType::Operator, line_, std::string(1, c)});
    advance_to(pos_ + 1);
  }

  std::string src_;
  size_t pos_ = 0;
  int line_ = 1;
  std::vector<Token> tokens_;
};

}  // namespace

std::vector<Token> tokenize(std::string_view source) { return Lexer(source).run(); }

}  // namespace augur::jinja
