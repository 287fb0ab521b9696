#include "tokenizer/jinja/parser.h"

#include <algorithm>
#include <string_view>

#include "tokenizer/jinja/errors.h"
#include "tokenizer/jinja/parser_impl.h"

namespace augur::jinja {

namespace detail {

std::string describe(const Token& t) {
  switch (t.type) {
    case TokenType::Text: return "template text";
    case TokenType::VarBegin: return "'{{'";
    case TokenType::VarEnd: return "end of print statement '}}'";
    case TokenType::BlockBegin: return "'{%'";
    case TokenType::BlockEnd: return "end of statement block '%}'";
    case TokenType::Name: return "'" + t.value + "'";
    case TokenType::String: return "string literal";
    case TokenType::Integer:
    case TokenType::Float: return "number " + t.value;
    case TokenType::Operator: return "'" + t.value + "'";
    case TokenType::End: return "end of template";
  }
  return "token";
}

void Parser::expect_op(std::string_view op) {
  if (!skip_op(op)) unexpected("'" + std::string(op) + "'");
}

void Parser::expect_end_tag(std::string_view name) {
  if (!skip_name(name)) unexpected("'" + std::string(name) + "'");
  expect_block_end();
}

// Statements until a `{% end... %}` (or other tag) in `ends`, which is left
// unconsumed with the cursor on its name.
Body Parser::parse_body(std::initializer_list<std::string_view> ends, std::string_view open_tag,
                        int open_line) {
  Nest nest(*this, cur().line);
  Body body;
  while (true) {
    const Token& t = cur();
    switch (t.type) {
      case TokenType::Text:
        body.push_back(std::make_unique<TextStmt>(t.line, t.value));
        advance();
        break;
      case TokenType::VarBegin: {
        const int line = t.line;
        advance();
        ExprPtr e = parse_tuple(true, false, {});
        if (cur().type != TokenType::VarEnd) unexpected("end of print statement '}}'");
        advance();
        body.push_back(std::make_unique<PrintStmt>(line, std::move(e)));
        break;
      }
      case TokenType::BlockBegin: {
        advance();
        if (cur().type == TokenType::Name &&
            std::find(ends.begin(), ends.end(), cur().value) != ends.end())
          return body;
        body.push_back(parse_statement(ends));
        break;
      }
      case TokenType::End:
        if (ends.size() != 0) {
          fail_at(t.line, "unexpected end of template: '", open_tag, "' block opened on line ",
                  open_line, " was never closed (expected '", *(ends.end() - 1), "')");
        }
        return body;
      default:
        unexpected("template text or a tag");
    }
  }
}

StmtPtr Parser::parse_statement(std::initializer_list<std::string_view> ends) {
  if (cur().type != TokenType::Name) unexpected("a tag name");
  const std::string& tag = cur().value;
  if (tag == "if") return parse_if();
  if (tag == "for") return parse_for();
  if (tag == "set") return parse_set();
  if (tag == "macro") return parse_macro();
  if (tag == "generation") return parse_generation();
  if (tag == "filter") return parse_filter_block();
  if (tag == "break" || tag == "continue") {
    const int line = cur().line;
    if (loop_depth_ == 0) fail_at(line, "'", tag, "' outside of a loop");
    const auto kind = tag == "break" ? Stmt::Kind::Break : Stmt::Kind::Continue;
    advance();
    expect_block_end();
    return std::make_unique<Stmt>(kind, line);
  }
  if (ends.size() != 0) {
    fail_at(cur().line, "unknown tag '", tag, "' (expected '", *(ends.end() - 1), "')");
  }
  fail_at(cur().line, "unknown tag '", tag, "'");
}

StmtPtr Parser::parse_if() {
  auto node = std::make_unique<IfStmt>(cur().line);
  const int line = cur().line;
  advance();
  ExprPtr cond = parse_expression(true);
  expect_block_end();
  node->branches.emplace_back(std::move(cond), parse_body({"elif", "else", "endif"}, "if", line));
  while (true) {
    if (skip_name("elif")) {
      ExprPtr c = parse_expression(true);
      expect_block_end();
      node->branches.emplace_back(std::move(c), parse_body({"elif", "else", "endif"}, "if", line));
    } else if (skip_name("else")) {
      expect_block_end();
      node->otherwise = parse_body({"endif"}, "if", line);
      expect_end_tag("endif");
      break;
    } else {
      expect_end_tag("endif");
      break;
    }
  }
  return node;
}

// `x`, `a, b` or `(a, b)`, for a for-loop.
Target Parser::parse_for_target() {
  Target target;
  const bool parens = skip_op("(");
  target.names.push_back(expect_name());
  while (skip_op(",")) {
    target.unpack = true;
    if (is_op(")") || is_name("in")) break;
    target.names.push_back(expect_name());
  }
  if (parens) {
    expect_op(")");
    target.unpack = true;
  }
  return target;
}

StmtPtr Parser::parse_for() {
  auto node = std::make_unique<ForStmt>(cur().line);
  const int line = cur().line;
  advance();
  node->target = parse_for_target();
  if (!skip_name("in")) unexpected("'in'");
  node->iterable = parse_tuple(false, false, {"recursive"});
  if (skip_name("if")) node->filter = parse_expression(true);
  if (is_name("recursive")) fail_at(cur().line, "recursive for-loops are not supported");
  expect_block_end();
  ++loop_depth_;
  node->body = parse_body({"else", "endfor"}, "for", line);
  --loop_depth_;
  if (skip_name("else")) {
    expect_block_end();
    node->otherwise = parse_body({"endfor"}, "for", line);
  }
  expect_end_tag("endfor");
  return node;
}

StmtPtr Parser::parse_set() {
  const int line = cur().line;
  advance();
  Target target;
  if (cur().type == TokenType::Name && peek().type == TokenType::Operator && peek().value == ".") {
    target.names.push_back(expect_name());
    advance();
    target.attribute = expect_name();
  } else {
    target = parse_for_target();
  }
  if (skip_op("=")) {
    auto node = std::make_unique<SetStmt>(line);
    node->target = std::move(target);
    node->value = parse_tuple(true, false, {});
    expect_block_end();
    return node;
  }
  auto node = std::make_unique<SetBlockStmt>(line);
  if (target.unpack) fail_at(line, "a block set assigns to one name");
  node->target = std::move(target);
  if (skip_op("|")) node->filter = parse_filter(nullptr, true);
  expect_block_end();
  node->body = parse_body({"endset"}, "set", line);
  expect_end_tag("endset");
  return node;
}

StmtPtr Parser::parse_macro() {
  auto node = std::make_unique<MacroStmt>(cur().line);
  const int line = cur().line;
  advance();
  node->name = expect_name();
  expect_op("(");
  while (!is_op(")")) {
    if (!node->params.empty()) expect_op(",");
    if (is_op(")")) break;
    std::string name = expect_name();
    ExprPtr def;
    if (skip_op("=")) def = parse_expression(true);
    node->params.emplace_back(std::move(name), std::move(def));
  }
  expect_op(")");
  expect_block_end();
  const int saved_loop_depth = loop_depth_;
  loop_depth_ = 0;
  node->body = parse_body({"endmacro"}, "macro", line);
  loop_depth_ = saved_loop_depth;
  expect_end_tag("endmacro");
  return node;
}

StmtPtr Parser::parse_generation() {
  auto node = std::make_unique<BodyStmt>(Stmt::Kind::Generation, cur().line);
  const int line = cur().line;
  advance();
  expect_block_end();
  node->body = parse_body({"endgeneration"}, "generation", line);
  expect_end_tag("endgeneration");
  return node;
}

StmtPtr Parser::parse_filter_block() {
  auto node = std::make_unique<FilterBlockStmt>(cur().line);
  const int line = cur().line;
  advance();
  node->filter = parse_filter(nullptr, true);
  expect_block_end();
  node->body = parse_body({"endfilter"}, "filter", line);
  expect_end_tag("endfilter");
  return node;
}

}  // namespace detail

namespace {

// jinja2 rejects an unknown filter or test when it compiles the template,
// except inside an if-statement or an inline if of the same scope, where
// the error waits until the filter runs (jinja2's "soft" frames).
void check_names(const Expr* e, bool soft);

void check_names(const Arguments& a, bool soft) {
  for (const auto& p : a.positional) check_names(p.get(), soft);
  for (const auto& [name, p] : a.keyword) check_names(p.get(), soft);
}

void check_names(const Expr* e, bool soft) {
  if (!e) return;
  using K = Expr::Kind;
  switch (e->kind) {
    case K::Literal:
    case K::Name:
      return;
    case K::List:
      for (const auto& item : static_cast<const ListExpr*>(e)->items) check_names(item.get(), soft);
      return;
    case K::Dict:
      for (const auto& [k, v] : static_cast<const DictExpr*>(e)->items) {
        check_names(k.get(), soft);
        check_names(v.get(), soft);
      }
      return;
    case K::GetAttr:
      check_names(static_cast<const GetAttrExpr*>(e)->object.get(), soft);
      return;
    case K::GetItem: {
      const auto* n = static_cast<const GetItemExpr*>(e);
      check_names(n->object.get(), soft);
      check_names(n->index.get(), soft);
      return;
    }
    case K::Slice: {
      const auto* n = static_cast<const SliceExpr*>(e);
      for (const Expr* part : {n->object.get(), n->start.get(), n->stop.get(), n->step.get()})
        check_names(part, soft);
      return;
    }
    case K::Call: {
      const auto* n = static_cast<const CallExpr*>(e);
      check_names(n->callee.get(), soft);
      check_names(n->args, soft);
      return;
    }
    case K::Filter: {
      const auto* n = static_cast<const FilterExpr*>(e);
      if (!n->fn && !soft) fail_at(n->line, "unknown filter '", n->name, "'");
      check_names(n->operand.get(), soft);
      check_names(n->args, soft);
      return;
    }
    case K::Test: {
      const auto* n = static_cast<const TestExpr*>(e);
      if (!n->fn && !soft) fail_at(n->line, "unknown test '", n->name, "'");
      check_names(n->operand.get(), soft);
      check_names(n->args, soft);
      return;
    }
    case K::Not:
    case K::Neg:
    case K::Pos:
      check_names(static_cast<const UnaryExpr*>(e)->operand.get(), soft);
      return;
    case K::Binary: {
      const auto* n = static_cast<const BinaryExpr*>(e);
      check_names(n->left.get(), soft);
      check_names(n->right.get(), soft);
      return;
    }
    case K::Compare: {
      const auto* n = static_cast<const CompareExpr*>(e);
      check_names(n->first.get(), soft);
      for (const auto& [op, x] : n->rest) check_names(x.get(), soft);
      return;
    }
    case K::Conditional: {
      const auto* n = static_cast<const ConditionalExpr*>(e);
      for (const Expr* part : {n->cond.get(), n->then.get(), n->otherwise.get()}) check_names(part, true);
      return;
    }
  }
}

void check_names(const Body& body, bool soft) {
  for (const auto& s : body) {
    switch (s->kind) {
      case Stmt::Kind::Text:
      case Stmt::Kind::Break:
      case Stmt::Kind::Continue:
        break;
      case Stmt::Kind::Print:
        check_names(static_cast<const PrintStmt&>(*s).expr.get(), soft);
        break;
      case Stmt::Kind::If: {
        const auto& n = static_cast<const IfStmt&>(*s);
        for (const auto& [cond, b] : n.branches) {
          check_names(cond.get(), true);
          check_names(b, true);
        }
        check_names(n.otherwise, true);
        break;
      }
      case Stmt::Kind::For: {
        // The body and the loop filter are a new (hard) scope; else is not.
        const auto& n = static_cast<const ForStmt&>(*s);
        check_names(n.iterable.get(), soft);
        check_names(n.filter.get(), false);
        check_names(n.body, false);
        check_names(n.otherwise, soft);
        break;
      }
      case Stmt::Kind::Set:
        check_names(static_cast<const SetStmt&>(*s).value.get(), soft);
        break;
      case Stmt::Kind::SetBlock: {
        const auto& n = static_cast<const SetBlockStmt&>(*s);
        check_names(n.filter.get(), soft);
        check_names(n.body, false);
        break;
      }
      case Stmt::Kind::Macro: {
        const auto& n = static_cast<const MacroStmt&>(*s);
        for (const auto& [name, def] : n.params) check_names(def.get(), false);
        check_names(n.body, false);
        break;
      }
      case Stmt::Kind::Generation:
        check_names(static_cast<const BodyStmt&>(*s).body, false);
        break;
      case Stmt::Kind::FilterBlock: {
        const auto& n = static_cast<const FilterBlockStmt&>(*s);
        check_names(n.filter.get(), soft);
        check_names(n.body, false);
        break;
      }
    }
  }
}

}  // namespace

Body parse(const std::vector<Token>& tokens) {
  Body body = detail::Parser(tokens).parse_template();
  check_names(body, false);
  return body;
}

}  // namespace augur::jinja
