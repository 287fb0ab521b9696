// Internal error types of the Jinja interpreter. Builtins throw EvalError
// (they do not know where they were called from); the interpreter attaches the
// template line and rethrows LocatedError; jinja::Template turns that into the
// public TemplateError, which names the template.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace augur::jinja {

class EvalError : public std::runtime_error {
 public:
  explicit EvalError(const std::string& what) : std::runtime_error(what) {}
};

class LocatedError : public std::runtime_error {
 public:
  LocatedError(int line, const std::string& reason) : std::runtime_error(reason), line_(line) {}
  int line() const { return line_; }

 private:
  int line_;
};

template <typename... Parts>
[[noreturn]] void eval_fail(Parts&&... parts) {
  std::ostringstream os;
  (os << ... << std::forward<Parts>(parts));
  throw EvalError(os.str());
}

template <typename... Parts>
[[noreturn]] void fail_at(int line, Parts&&... parts) {
  std::ostringstream os;
  (os << ... << std::forward<Parts>(parts));
  throw LocatedError(line, os.str());
}

}  // namespace augur::jinja
