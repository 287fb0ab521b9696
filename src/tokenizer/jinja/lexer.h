// Splits a template into text and tag tokens, applying jinja2's whitespace
// rules as transformers configures them: trim_blocks, lstrip_blocks, `-` and
// `+` modifiers, newlines normalised to "\n", one trailing newline dropped.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace augur::jinja {

enum class TokenType : uint8_t {
  Text,
  VarBegin,    // {{
  VarEnd,      // }}
  BlockBegin,  // {%
  BlockEnd,    // %}
  Name,
  String,      // value: the decoded literal
  Integer,
  Float,
  Operator,    // value: the operator text, e.g. "//", "(", "|"
  End,
};

struct Token {
  TokenType type;
  int line;
  std::string value;
  int64_t integer = 0;
  double number = 0.0;
};

// Throws LocatedError on a malformed tag or literal.
std::vector<Token> tokenize(std::string_view source);

}  // namespace augur::jinja
