// The parser's class, shared by parser.cpp (template and statements) and
// parser_expr.cpp (expressions).
#pragma once

#include <algorithm>
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/jinja/ast.h"
#include "tokenizer/jinja/errors.h"
#include "tokenizer/jinja/lexer.h"

namespace augur::jinja::detail {

// Deep enough for any real template, shallow enough that a hostile one
// cannot overflow the stack.
constexpr int kMaxNesting = 200;

std::string describe(const Token& t);

class Parser {
 public:
  explicit Parser(const std::vector<Token>& tokens) : t_(tokens) {}

  Body parse_template() {
    Body body = parse_body({}, "", 0);
    return body;
  }

 private:
  // RAII nesting counter.
  struct Nest {
    Nest(Parser& p, int line) : p_(p) {
      if (++p_.depth_ > kMaxNesting) fail_at(line, "template nested too deeply");
    }
    ~Nest() { --p_.depth_; }
    Parser& p_;
  };

  const Token& cur() const { return t_[i_]; }
  const Token& peek(size_t n = 1) const { return t_[std::min(i_ + n, t_.size() - 1)]; }
  void advance() {
    if (i_ + 1 < t_.size()) ++i_;
  }
  bool is_op(std::string_view op) const {
    return cur().type == TokenType::Operator && cur().value == op;
  }
  bool is_name(std::string_view name) const {
    return cur().type == TokenType::Name && cur().value == name;
  }
  bool skip_op(std::string_view op) {
    if (!is_op(op)) return false;
    advance();
    return true;
  }
  bool skip_name(std::string_view name) {
    if (!is_name(name)) return false;
    advance();
    return true;
  }
  [[noreturn]] void unexpected(std::string_view expected) const {
    fail_at(cur().line, "expected ", expected, ", got ", describe(cur()));
  }
  void expect_op(std::string_view op);
  std::string expect_name() {
    if (cur().type != TokenType::Name) unexpected("a name");
    std::string n = cur().value;
    advance();
    return n;
  }
  void expect_block_end() {
    if (cur().type != TokenType::BlockEnd) unexpected("end of statement block '%}'");
    advance();
  }
  // Consumes `{% <name> %}` closing a block whose body parse_body stopped at.
  void expect_end_tag(std::string_view name);

  // ---- statements (parser.cpp) ----

  Body parse_body(std::initializer_list<std::string_view> ends, std::string_view open_tag,
                  int open_line);
  StmtPtr parse_statement(std::initializer_list<std::string_view> ends);
  StmtPtr parse_if();
  Target parse_for_target();
  StmtPtr parse_for();
  StmtPtr parse_set();
  StmtPtr parse_macro();
  StmtPtr parse_generation();
  StmtPtr parse_filter_block();

  // ---- expressions (parser_expr.cpp), in jinja2's precedence order ----

  bool is_tuple_end(std::initializer_list<std::string_view> extra_end) const;
  ExprPtr parse_tuple(bool with_condexpr, bool explicit_parens,
                      std::initializer_list<std::string_view> extra_end);
  ExprPtr parse_expression(bool with_condexpr);
  ExprPtr parse_condexpr();
  ExprPtr parse_or();
  ExprPtr parse_and();
  ExprPtr parse_not();
  ExprPtr parse_compare();
  ExprPtr parse_math1();
  ExprPtr parse_concat();
  ExprPtr parse_math2();
  ExprPtr parse_pow();
  ExprPtr parse_unary(bool with_filter);
  ExprPtr parse_primary();
  ExprPtr parse_postfix(ExprPtr node);
  ExprPtr parse_filter_expr(ExprPtr node);
  ExprPtr parse_subscript(ExprPtr node);
  void parse_call_args(Arguments& args);
  ExprPtr parse_call(ExprPtr node);
  std::string parse_dotted_name();
  ExprPtr parse_filter(ExprPtr node, bool first);
  ExprPtr parse_test(ExprPtr node);

  const std::vector<Token>& t_;
  size_t i_ = 0;
  int loop_depth_ = 0;
  int depth_ = 0;
};

}  // namespace augur::jinja::detail
