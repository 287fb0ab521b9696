#include "tokenizer/jinja/parser.h"

#include <algorithm>
#include <string_view>

#include "tokenizer/jinja/builtins.h"
#include "tokenizer/jinja/errors.h"

namespace augur::jinja {

namespace {

// Deep enough for any real template, shallow enough that a hostile one
// cannot overflow the stack.
constexpr int kMaxNesting = 200;

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
  void expect_op(std::string_view op) {
    if (!skip_op(op)) unexpected("'" + std::string(op) + "'");
  }
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
  void expect_end_tag(std::string_view name) {
    if (!skip_name(name)) unexpected("'" + std::string(name) + "'");
    expect_block_end();
  }

  // Statements until a `{% end... %}` (or other tag) in `ends`, which is left
  // unconsumed with the cursor on its name.
  Body parse_body(std::initializer_list<std::string_view> ends, std::string_view open_tag,
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

  StmtPtr parse_statement(std::initializer_list<std::string_view> ends) {
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

  StmtPtr parse_if() {
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
  Target parse_for_target() {
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

  StmtPtr parse_for() {
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

  StmtPtr parse_set() {
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

  StmtPtr parse_macro() {
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

  StmtPtr parse_generation() {
    auto node = std::make_unique<BodyStmt>(Stmt::Kind::Generation, cur().line);
    const int line = cur().line;
    advance();
    expect_block_end();
    node->body = parse_body({"endgeneration"}, "generation", line);
    expect_end_tag("endgeneration");
    return node;
  }

  StmtPtr parse_filter_block() {
    auto node = std::make_unique<FilterBlockStmt>(cur().line);
    const int line = cur().line;
    advance();
    node->filter = parse_filter(nullptr, true);
    expect_block_end();
    node->body = parse_body({"endfilter"}, "filter", line);
    expect_end_tag("endfilter");
    return node;
  }

  // ---- expressions, in jinja2's precedence order ----

  bool is_tuple_end(std::initializer_list<std::string_view> extra_end) const {
    const Token& t = cur();
    if (t.type == TokenType::VarEnd || t.type == TokenType::BlockEnd) return true;
    if (t.type == TokenType::Operator && t.value == ")") return true;
    return t.type == TokenType::Name &&
           std::find(extra_end.begin(), extra_end.end(), t.value) != extra_end.end();
  }

  // `a, b` is a tuple wherever jinja2 allows one: print, set, for, parens.
  ExprPtr parse_tuple(bool with_condexpr, bool explicit_parens,
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

  ExprPtr parse_expression(bool with_condexpr) {
    return with_condexpr ? parse_condexpr() : parse_or();
  }

  ExprPtr parse_condexpr() {
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

  ExprPtr parse_or() {
    ExprPtr left = parse_and();
    while (is_name("or")) {
      const int line = cur().line;
      advance();
      left = std::make_unique<BinaryExpr>(line, BinaryOp::Or, std::move(left), parse_and());
    }
    return left;
  }

  ExprPtr parse_and() {
    ExprPtr left = parse_not();
    while (is_name("and")) {
      const int line = cur().line;
      advance();
      left = std::make_unique<BinaryExpr>(line, BinaryOp::And, std::move(left), parse_not());
    }
    return left;
  }

  ExprPtr parse_not() {
    if (is_name("not")) {
      const int line = cur().line;
      Nest nest(*this, line);
      advance();
      return std::make_unique<UnaryExpr>(Expr::Kind::Not, line, parse_not());
    }
    return parse_compare();
  }

  ExprPtr parse_compare() {
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

  ExprPtr parse_math1() {
    ExprPtr left = parse_concat();
    while (is_op("+") || is_op("-")) {
      const int line = cur().line;
      const BinaryOp op = cur().value == "+" ? BinaryOp::Add : BinaryOp::Sub;
      advance();
      left = std::make_unique<BinaryExpr>(line, op, std::move(left), parse_concat());
    }
    return left;
  }

  ExprPtr parse_concat() {
    ExprPtr left = parse_math2();
    while (is_op("~")) {
      const int line = cur().line;
      advance();
      left = std::make_unique<BinaryExpr>(line, BinaryOp::Concat, std::move(left), parse_math2());
    }
    return left;
  }

  ExprPtr parse_math2() {
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

  ExprPtr parse_pow() {
    ExprPtr left = parse_unary(true);
    while (is_op("**")) {
      const int line = cur().line;
      advance();
      left = std::make_unique<BinaryExpr>(line, BinaryOp::Pow, std::move(left), parse_unary(true));
    }
    return left;
  }

  ExprPtr parse_unary(bool with_filter) {
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

  ExprPtr parse_primary() {
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

  ExprPtr parse_postfix(ExprPtr node) {
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

  ExprPtr parse_filter_expr(ExprPtr node) {
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

  ExprPtr parse_subscript(ExprPtr node) {
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

  void parse_call_args(Arguments& args) {
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

  ExprPtr parse_call(ExprPtr node) {
    auto call = std::make_unique<CallExpr>(cur().line, std::move(node));
    parse_call_args(call->args);
    return call;
  }

  std::string parse_dotted_name() {
    std::string name = expect_name();
    while (is_op(".") && peek().type == TokenType::Name) {
      advance();
      name += '.';
      name += expect_name();
    }
    return name;
  }

  // `| f(args) | g` after the first `|` has been consumed.
  ExprPtr parse_filter(ExprPtr node, bool first) {
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

  ExprPtr parse_test(ExprPtr node) {
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

  const std::vector<Token>& t_;
  size_t i_ = 0;
  int loop_depth_ = 0;
  int depth_ = 0;
};

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
  Body body = Parser(tokens).parse_template();
  check_names(body, false);
  return body;
}

}  // namespace augur::jinja
