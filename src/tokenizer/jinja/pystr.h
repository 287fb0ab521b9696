// Python str semantics over UTF-8 std::string: what chat templates call
// (strip, split, replace, upper, title, ...) must index and classify by code
// point and use Python's whitespace set, or renders drift from transformers.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace augur::jinja::pystr {

// An invalid byte b decodes to U+DC00+b (Python's "surrogateescape") and
// encodes back to b, so decode/encode round-trips any byte string.
std::u32string decode(std::string_view s);
std::string encode(std::u32string_view s);
void append_utf8(std::string& out, char32_t c);

bool is_ascii(std::string_view s);
int64_t length(std::string_view s);  // in code points

bool is_space(char32_t c);  // str.isspace()
bool is_word(char32_t c);   // regex \w
bool is_cased(char32_t c);
char32_t to_upper(char32_t c);
char32_t to_lower(char32_t c);
char32_t to_title(char32_t c);

// chars == nullopt strips whitespace, as str.strip(None).
std::string strip(std::string_view s, const std::optional<std::string>& chars, bool left,
                  bool right);
// sep == nullopt splits on runs of whitespace, as str.split(None).
std::vector<std::string> split(std::string_view s, const std::optional<std::string>& sep,
                               int64_t maxsplit);
std::vector<std::string> rsplit(std::string_view s, const std::optional<std::string>& sep,
                                int64_t maxsplit);
std::vector<std::string> splitlines(std::string_view s, bool keepends);
std::string replace(std::string_view s, std::string_view old, std::string_view repl,
                    int64_t count);

std::string upper(std::string_view s);
std::string lower(std::string_view s);
std::string capitalize(std::string_view s);  // str.capitalize()
std::string title(std::string_view s);       // str.title()
// Case mapping of one code point, with Python's one-to-many special cases.
std::string upper_char(char32_t c);
std::string lower_char(char32_t c);

// Code-point index of the first (last) occurrence of sub, or -1.
int64_t find(std::string_view s, std::string_view sub);
int64_t rfind(std::string_view s, std::string_view sub);
int64_t count(std::string_view s, std::string_view sub);

}  // namespace augur::jinja::pystr
