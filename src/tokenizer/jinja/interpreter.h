// Tree-walking evaluator for a parsed template, with jinja2's scoping: a
// for-loop iteration and a macro call get their own scope (a `set` inside
// them does not leak out), an if-block does not.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tokenizer/jinja/ast.h"
#include "tokenizer/jinja/value.h"

namespace augur::jinja {

class Interpreter {
 public:
  // `context`: the template's variables (messages, add_generation_prompt, ...),
  // which shadow the globals.
  explicit Interpreter(const Dict& context);
  ~Interpreter();
  Interpreter(const Interpreter&) = delete;
  Interpreter& operator=(const Interpreter&) = delete;

  // Throws LocatedError.
  std::string render(const Body& body);

  Value eval(const Expr& e);
  Value call(const Value& callee, CallArgs& args);
  Value getattr(const Value& obj, std::string_view name);
  Value getitem(const Value& obj, const Value& key);
  // Python iter(): the items of a list, the keys of a dict, the characters
  // of a str; Undefined iterates as empty.
  std::vector<Value> iterate(const Value& v);

  // By name, for filters such as map('upper') and select('odd').
  Value apply_filter(std::string_view name, const Value& input, CallArgs& args);
  bool apply_test(std::string_view name, const Value& input, CallArgs& args);

  // A namespace() made during this render; emptied when the render ends, so
  // that one holding itself (`set ns.me = ns`) is not a leaked cycle.
  void track(std::shared_ptr<Namespace> ns) { namespaces_.push_back(std::move(ns)); }

 private:
  struct Scope {
    std::vector<std::pair<std::string, Value>> vars;
    std::shared_ptr<Scope> parent;

    Value* find(std::string_view name);
    void set(const std::string& name, Value v);
  };
  enum class Flow { Normal, Break, Continue };

  Flow render_body(const Body& body, std::string& out);
  Flow render_stmt(const Stmt& s, std::string& out);
  Flow render_for(const ForStmt& s, std::string& out);
  void assign(const Target& target, Value v);
  Value apply_filter_chain(const Expr& filter, Value input);
  Value call_macro(const MacroStmt& m, const std::shared_ptr<Scope>& closure, CallArgs& args);
  Value eval_inner(const Expr& e);
  Value eval_args_call(const CallExpr& c);
  CallArgs eval_args(const Arguments& a);
  Value lookup(const std::string& name);

  std::shared_ptr<Scope> root_;
  std::shared_ptr<Scope> scope_;
  int call_depth_ = 0;
  std::vector<std::shared_ptr<Namespace>> namespaces_;
};

}  // namespace augur::jinja
