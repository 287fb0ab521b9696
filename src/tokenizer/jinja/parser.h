// Recursive-descent parser for the jinja2 subset chat templates use, with
// jinja2's operator precedence. Throws LocatedError naming the line.
#pragma once

#include <vector>

#include "tokenizer/jinja/ast.h"
#include "tokenizer/jinja/lexer.h"

namespace augur::jinja {

Body parse(const std::vector<Token>& tokens);

}  // namespace augur::jinja
