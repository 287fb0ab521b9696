// Syntax tree of a parsed template. Every node carries the template line it
// came from, so that a runtime error can name it.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tokenizer/jinja/value.h"

namespace augur::jinja {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

// Builtins are resolved when the template is parsed; an unknown one is null
// (an error at parse time or, inside an if, when it runs, as in jinja2).
using FilterFn = Value (*)(Interpreter&, const Value& input, CallArgs& args);
using TestFn = bool (*)(Interpreter&, const Value& input, CallArgs& args);

struct Arguments {
  std::vector<ExprPtr> positional;
  std::vector<std::pair<std::string, ExprPtr>> keyword;
};

enum class BinaryOp { And, Or, Add, Sub, Mul, Div, FloorDiv, Mod, Pow, Concat };
enum class CompareOp { Eq, Ne, Lt, Le, Gt, Ge, In, NotIn };

struct Expr {
  enum class Kind {
    Literal, Name, List, Dict, GetAttr, GetItem, Slice, Call, Filter, Test, Not, Neg, Pos,
    Binary, Compare, Conditional,
  };
  Expr(Kind k, int l) : kind(k), line(l) {}
  virtual ~Expr() = default;
  Kind kind;
  int line;
};

struct LiteralExpr : Expr {
  LiteralExpr(int l, Value v) : Expr(Kind::Literal, l), value(std::move(v)) {}
  Value value;
};

struct NameExpr : Expr {
  NameExpr(int l, std::string n) : Expr(Kind::Name, l), name(std::move(n)) {}
  std::string name;
};

struct ListExpr : Expr {  // [a, b] or (a, b)
  ListExpr(int l, bool t) : Expr(Kind::List, l), tuple(t) {}
  bool tuple;
  std::vector<ExprPtr> items;
};

struct DictExpr : Expr {
  explicit DictExpr(int l) : Expr(Kind::Dict, l) {}
  std::vector<std::pair<ExprPtr, ExprPtr>> items;
};

struct GetAttrExpr : Expr {  // obj.name
  GetAttrExpr(int l, ExprPtr o, std::string n)
      : Expr(Kind::GetAttr, l), object(std::move(o)), name(std::move(n)) {}
  ExprPtr object;
  std::string name;
};

struct GetItemExpr : Expr {  // obj[index]
  GetItemExpr(int l, ExprPtr o, ExprPtr i)
      : Expr(Kind::GetItem, l), object(std::move(o)), index(std::move(i)) {}
  ExprPtr object;
  ExprPtr index;
};

struct SliceExpr : Expr {  // obj[start:stop:step], each part optional
  SliceExpr(int l, ExprPtr o) : Expr(Kind::Slice, l), object(std::move(o)) {}
  ExprPtr object, start, stop, step;
};

struct CallExpr : Expr {
  CallExpr(int l, ExprPtr c) : Expr(Kind::Call, l), callee(std::move(c)) {}
  ExprPtr callee;
  Arguments args;
};

struct FilterExpr : Expr {  // operand | name(args); operand is null inside {% filter %}
  FilterExpr(int l, ExprPtr o, std::string n, FilterFn f)
      : Expr(Kind::Filter, l), operand(std::move(o)), name(std::move(n)), fn(f) {}
  ExprPtr operand;
  std::string name;
  FilterFn fn;
  Arguments args;
};

struct TestExpr : Expr {  // operand is [not] name(args)
  TestExpr(int l, ExprPtr o, std::string n, TestFn f, bool neg)
      : Expr(Kind::Test, l), operand(std::move(o)), name(std::move(n)), fn(f), negated(neg) {}
  ExprPtr operand;
  std::string name;
  TestFn fn;
  bool negated;
  Arguments args;
};

struct UnaryExpr : Expr {  // not x, -x, +x
  UnaryExpr(Kind k, int l, ExprPtr o) : Expr(k, l), operand(std::move(o)) {}
  ExprPtr operand;
};

struct BinaryExpr : Expr {
  BinaryExpr(int l, BinaryOp o, ExprPtr a, ExprPtr b)
      : Expr(Kind::Binary, l), op(o), left(std::move(a)), right(std::move(b)) {}
  BinaryOp op;
  ExprPtr left, right;
};

struct CompareExpr : Expr {  // a < b < c chains
  CompareExpr(int l, ExprPtr f) : Expr(Kind::Compare, l), first(std::move(f)) {}
  ExprPtr first;
  std::vector<std::pair<CompareOp, ExprPtr>> rest;
};

struct ConditionalExpr : Expr {  // then if cond else otherwise
  ConditionalExpr(int l, ExprPtr c, ExprPtr t, ExprPtr o)
      : Expr(Kind::Conditional, l), cond(std::move(c)), then(std::move(t)), otherwise(std::move(o)) {}
  ExprPtr cond, then, otherwise;  // otherwise may be null
};

struct Stmt;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

struct Stmt {
  enum class Kind { Text, Print, If, For, Set, SetBlock, Macro, Generation, Break, Continue, FilterBlock };
  Stmt(Kind k, int l) : kind(k), line(l) {}
  virtual ~Stmt() = default;
  Kind kind;
  int line;
};

struct TextStmt : Stmt {
  TextStmt(int l, std::string t) : Stmt(Kind::Text, l), text(std::move(t)) {}
  std::string text;
};

struct PrintStmt : Stmt {
  PrintStmt(int l, ExprPtr e) : Stmt(Kind::Print, l), expr(std::move(e)) {}
  ExprPtr expr;
};

struct IfStmt : Stmt {
  explicit IfStmt(int l) : Stmt(Kind::If, l) {}
  std::vector<std::pair<ExprPtr, Body>> branches;  // if, elif...
  Body otherwise;
};

// Where `{% for %}` and `{% set %}` store: one name, names to unpack a
// sequence into, or a namespace attribute (`ns.attr`, set only).
struct Target {
  std::vector<std::string> names;
  bool unpack = false;
  std::string attribute;  // non-empty: names[0].attribute
};

struct ForStmt : Stmt {
  explicit ForStmt(int l) : Stmt(Kind::For, l) {}
  Target target;
  ExprPtr iterable;
  ExprPtr filter;  // `for x in xs if cond`, may be null
  Body body;
  Body otherwise;  // for-else: runs when nothing was iterated
};

struct SetStmt : Stmt {
  explicit SetStmt(int l) : Stmt(Kind::Set, l) {}
  Target target;
  ExprPtr value;
};

struct SetBlockStmt : Stmt {  // {% set x %}...{% endset %}
  explicit SetBlockStmt(int l) : Stmt(Kind::SetBlock, l) {}
  Target target;
  ExprPtr filter;  // `{% set x | f %}`: a FilterExpr chain with a null innermost operand
  Body body;
};

struct MacroStmt : Stmt {
  explicit MacroStmt(int l) : Stmt(Kind::Macro, l) {}
  std::string name;
  std::vector<std::pair<std::string, ExprPtr>> params;  // default may be null
  Body body;
};

struct BodyStmt : Stmt {  // {% generation %}
  BodyStmt(Kind k, int l) : Stmt(k, l) {}
  Body body;
};

struct FilterBlockStmt : Stmt {  // {% filter f %}...{% endfilter %}
  explicit FilterBlockStmt(int l) : Stmt(Kind::FilterBlock, l) {}
  ExprPtr filter;  // as in SetBlockStmt
  Body body;
};

}  // namespace augur::jinja
