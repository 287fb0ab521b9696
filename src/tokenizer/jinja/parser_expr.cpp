// The expression half of the parser, in jinja2's precedence order.
#include <algorithm>
#include <string_view>

#include "tokenizer/jinja/builtins.h"
#include "tokenizer/jinja/errors.h"
#include "tokenizer/jinja/parser_impl.h"

namespace augur::jinja::detail {

bool Parser::is_tuple_end(std::initializer_list<std::string_view> extra_end) const {
  const Token& t = cur();
  if (t.type == TokenType::VarEnd || t.type == TokenType::BlockEnd) return true;
  if (t.type == TokenType::Operator && t.value == ")") return true;
  return t.type == TokenType::Name &&
         std::find(extra_end.begin(), extra_end.end(), t.value) != extra_end.end();
}

// `a, b` is a tuple wherever jinja2 allows one: print, set, for, parens.
ExprPtr Parser::parse_tuple(bool with_condexpr, bool explicit_parens,
                           std::initializer_list<std::string_view> extra_end) {
  const int line = cur().line;
  std::vector<ExprPtr> items;
  bool is_tuple = false;
  while (true) {
    if (!items.empty()) expect_op(",");
    if (is_tuple_end(extra_end)) break;
    items.push_back(parse_expression(with_condexpr));
    if (is_op(",")) {
      is_tuple = true;
    } else {
      break;
    }
  }
  if (!is_tuple) {
    if (!items.empty()) return std::move(items[0]);
    if (!explicit_parens) unexpected("an expression");
  }
  auto node = std::make_unique<ListExpr>(line, true);
  node->items = std::move(items);
  return node;
}

ExprPtr Parser::parse_expression(bool with_condexpr) {
  return with_condexpr ? parse_condexpr() : parse_or();
}

ExprPtr Parser::parse_condexpr() {
  ExprPtr expr = parse_or();
  while (is_name("if")) {
    const int line = cur().line;
    advance();
    ExprPtr cond = parse_or();
    ExprPtr otherwise;
    if (skip_name("else")) otherwise = parse_condexpr();
    expr = std::make_unique<ConditionalExpr>(line, std::move(cond), std::move(expr),
                                             std::move(otherwise));
  }
  return expr;
}

ExprPtr Parser::parse_or() {
  ExprPtr left = parse_and();
  while (is_name("or")) {
    const int line = cur().line;
    advance();
    left = std::make_unique<BinaryExpr>(line, BinaryOp::Or, std::move(left), parse_and());
  }
  return left;
}

ExprPtr Parser::parse_and() {
  ExprPtr left = parse_not();
  while (is_name("and")) {
    const int line = cur().line;
    advance();
    left = std::make_unique<BinaryExpr>(line, BinaryOp::And, std::move(left), parse_not());
  }
  return left;
}

ExprPtr Parser::parse_not() {
  if (is_name("not")) {
    const int line = cur().line;
    Nest nest(*this, line);
    advance();
    return std::make_unique<UnaryExpr>(Expr::Kind::Not, line, parse_not());
  }
  return parse_compare();
}

ExprPtr Parser::parse_compare() {
  const int line = cur().line;
  ExprPtr first = parse_math1();
  std::unique_ptr<CompareExpr> node;
  while (true) {
    CompareOp op;
    if (is_op("==")) {
      op = CompareOp::Eq;
    } else if (is_op("!=")) {
      op = CompareOp::Ne;
    } else if (is_op("<")) {
      op = CompareOp::Lt;
    } else if (is_op("<=")) {
      op = CompareOp::Le;
    } else if (is_op(">")) {
      op = CompareOp::Gt;
    } else if (is_op(">=")) {
      op = CompareOp::Ge;
    } else if (is_name("in")) {
      op = CompareOp::In;
    } else if (is_name("not") && peek().type == TokenType::Name && peek().value == "in") {
      advance();
      op = CompareOp::NotIn;
    } else {
      break;
    }
    advance();
    if (!node) node = std::make_unique<CompareExpr>(line, std::move(first));
    node->rest.emplace_back(op, parse_math1());
  }
  if (node) return node;
  return first;
}

ExprPtr Parser::parse_math1() {
  ExprPtr left = parse_concat();
  while (is_op("+") || is_op("-")) {
    const int line = cur().line;
    const BinaryOp op = cur().value == "+" ? BinaryOp::Add : BinaryOp::Sub;
    advance();
    left = std::make_unique<BinaryExpr>(line, op, std::move(left), parse_concat());
  }
  return left;
}

ExprPtr Parser::parse_concat() {
  ExprPtr left = parse_math2();
  while (is_op("~")) {
    const int line = cur().line;
    advance();
    left = std::make_unique<BinaryExpr>(line, BinaryOp::Concat, std::move(left), parse_math2());
  }
  return left;
}

ExprPtr Parser::parse_math2() {
  ExprPtr left = parse_pow();
  while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
    const int line = cur().line;
    const std::string& v = cur().value;
    const BinaryOp op = v == "*"    ? BinaryOp::Mul
                        : v == "/"  ? BinaryOp::Div
                        : v == "//" ? BinaryOp::FloorDiv
                                    : BinaryOp::Mod;
    advance();
    left = std::make_unique<BinaryExpr>(line, op, std::move(left), parse_pow());
  }
  return left;
}

ExprPtr Parser::parse_pow() {
  ExprPtr left = parse_unary(true);
  while (is_op("**")) {
    const int line = cur().line;
    advance();
    left = std::make_unique<BinaryExpr>(line, BinaryOp::Pow, std::move(left), parse_unary(true));
  }
  return left;
}

ExprPtr Parser::parse_unary(bool with_filter) {
  const int line = cur().line;
  Nest nest(*this, line);
  ExprPtr node;
  if (skip_op("-")) {
    node = std::make_unique<UnaryExpr>(Expr::Kind::Neg, line, parse_unary(false));
  } else if (skip_op("+")) {
    node = std::make_unique<UnaryExpr>(Expr::Kind::Pos, line, parse_unary(false));
  } else {
    node = parse_primary();
  }
  node = parse_postfix(std::move(node));
  if (with_filter) node = parse_filter_expr(std::move(node));
  return node;
}

ExprPtr Parser::parse_primary() {
  const Token& t = cur();
  const int line = t.line;
  switch (t.type) {
    case TokenType::Name: {
      const std::string& n = t.value;
      ExprPtr e;
      if (n == "true" || n == "True") {
        e = std::make_unique<LiteralExpr>(line, Value(true));
      } else if (n == "false" || n == "False") {
        e = std::make_unique<LiteralExpr>(line, Value(false));
      } else if (n == "none" || n == "None") {
        e = std::make_unique<LiteralExpr>(line, Value::none());
      } else {
        e = std::make_unique<NameExpr>(line, n);
      }
      advance();
      return e;
    }
    case TokenType::String: {
      std::string s;
      while (cur().type == TokenType::String) {  // adjacent literals concatenate
        s += cur().value;
        advance();
      }
      return std::make_unique<LiteralExpr>(line, Value(std::move(s)));
    }
    case TokenType::Integer: {
      auto e = std::make_unique<LiteralExpr>(line, Value(t.integer));
      advance();
      return e;
    }
    case TokenType::Float: {
      auto e = std::make_unique<LiteralExpr>(line, Value(t.number));
      advance();
      return e;
    }
    case TokenType::Operator:
      if (t.value == "(") {
        advance();
        ExprPtr e = parse_tuple(true, true, {});
        expect_op(")");
        return e;
      }
      if (t.value == "[") {
        advance();
        auto list = std::make_unique<ListExpr>(line, false);
        while (!is_op("]")) {
          if (!list->items.empty()) expect_op(",");
          if (is_op("]")) break;
          list->items.push_back(parse_expression(true));
        }
        expect_op("]");
        return list;
      }
      if (t.value == "{") {
        advance();
        auto dict = std::make_unique<DictExpr>(line);
        while (!is_op("}")) {
          if (!dict->items.empty()) expect_op(",");
          if (is_op("}")) break;
          ExprPtr key = parse_expression(true);
          expect_op(":");
          dict->items.emplace_back(std::move(key), parse_expression(true));
        }
        expect_op("}");
        return dict;
      }
      break;
    default:
      break;
  }
  unexpected("an expression");
}

ExprPtr Parser::parse_postfix(ExprPtr node) {
  while (true) {
    if (is_op(".") || is_op("[")) {
      node = parse_subscript(std::move(node));
    } else if (is_op("(")) {
      node = parse_call(std::move(node));
    } else {
      return node;
    }
  }
}

ExprPtr Parser::parse_filter_expr(ExprPtr node) {
  while (true) {
    if (is_op("|")) {
      advance();
      node = parse_filter(std::move(node), true);
    } else if (is_name("is")) {
      node = parse_test(std::move(node));
    } else if (is_op("(")) {
      node = parse_call(std::move(node));
    } else {
      return node;
    }
  }
}

ExprPtr Parser::parse_subscript(ExprPtr node) {
  const int line = cur().line;
  if (skip_op(".")) {
    if (cur().type == TokenType::Name) {
      return std::make_unique<GetAttrExpr>(line, std::move(node), expect_name());
    }
    if (cur().type == TokenType::Integer) {
      auto index = std::make_unique<LiteralExpr>(line, Value(cur().integer));
      advance();
      return std::make_unique<GetItemExpr>(line, std::move(node), std::move(index));
    }
    unexpected("a name or number after '.'");
  }
  expect_op("[");
  ExprPtr start;
  if (!is_op(":")) {
    start = parse_expression(true);
    if (!is_op(":")) {
      if (is_op(",")) {  // x[a, b] indexes with a tuple
        auto tuple = std::make_unique<ListExpr>(line, true);
        tuple->items.push_back(std::move(start));
        while (skip_op(",")) {
          if (is_op("]")) break;
          tuple->items.push_back(parse_expression(true));
        }
        start = std::move(tuple);
      }
      expect_op("]");
      return std::make_unique<GetItemExpr>(line, std::move(node), std::move(start));
    }
  }
  auto slice = std::make_unique<SliceExpr>(line, std::move(node));
  slice->start = std::move(start);
  expect_op(":");
  if (!is_op("]") && !is_op(":")) slice->stop = parse_expression(true);
  if (skip_op(":")) {
    if (!is_op("]")) slice->step = parse_expression(true);
  }
  expect_op("]");
  return slice;
}

void Parser::parse_call_args(Arguments& args) {
  expect_op("(");
  bool first = true;
  while (!is_op(")")) {
    if (!first) expect_op(",");
    first = false;
    if (is_op(")")) break;
    if (is_op("*") || is_op("**")) fail_at(cur().line, "*args and **kwargs are not supported");
    if (cur().type == TokenType::Name && peek().type == TokenType::Operator && peek().value == "=") {
      std::string name = expect_name();
      advance();
      args.keyword.emplace_back(std::move(name), parse_expression(true));
    } else {
      if (!args.keyword.empty()) fail_at(cur().line, "positional argument follows keyword argument");
      args.positional.push_back(parse_expression(true));
    }
  }
  expect_op(")");
}

ExprPtr Parser::parse_call(ExprPtr node) {
  auto call = std::make_unique<CallExpr>(cur().line, std::move(node));
  parse_call_args(call->args);
  return call;
}

std::string Parser::parse_dotted_name() {
  std::string name = expect_name();
  while (is_op(".") && peek().type == TokenType::Name) {
    advance();
    name += '.';
    name += expect_name();
  }
  return name;
}

// `| f(args) | g` after the first `|` has been consumed.
ExprPtr Parser::parse_filter(ExprPtr node, bool first) {
  while (first || skip_op("|")) {
    first = false;
    const int line = cur().line;
    std::string name = parse_dotted_name();
    const FilterFn fn = find_filter(name);  // null: checked by check_names()
    auto f = std::make_unique<FilterExpr>(line, std::move(node), std::move(name), fn);
    if (is_op("(")) parse_call_args(f->args);
    node = std::move(f);
  }
  return node;
}

ExprPtr Parser::parse_test(ExprPtr node) {
  const int line = cur().line;
  advance();  // is
  const bool negated = skip_name("not");
  std::string name = parse_dotted_name();
  const TestFn fn = find_test(name);  // null: checked by check_names()
  auto test = std::make_unique<TestExpr>(line, std::move(node), std::move(name), fn, negated);
  if (is_op("(")) {
    parse_call_args(test->args);
  } else {
    // jinja2 takes one bare argument: `x is divisibleby 3`.
    const Token& t = cur();
    const bool starts_arg =
        t.type == TokenType::String || t.type == TokenType::Integer ||
        t.type == TokenType::Float || (t.type == TokenType::Operator && (t.value == "[" || t.value == "{")) ||
        (t.type == TokenType::Name && t.value != "else" && t.value != "or" && t.value != "and");
    if (starts_arg) {
      if (is_name("is")) fail_at(t.line, "cannot chain multiple tests with 'is'");
      test->args.positional.push_back(parse_postfix(parse_primary()));
    }
  }
  return test;
}

}  // namespace augur::jinja::detail
