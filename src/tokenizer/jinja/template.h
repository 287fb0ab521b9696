// A parsed Jinja template: the jinja2 subset real chat templates use, with
// the environment transformers renders them in (ImmutableSandboxedEnvironment,
// trim_blocks, lstrip_blocks, loopcontrols, its `tojson`, `raise_exception`
// and `strftime_now`).
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace augur {

// A template that does not parse, or fails while rendering (including its
// own raise_exception): "[chat_template] line 12: unknown filter 'foo'".
class TemplateError : public Error {
 public:
  TemplateError(std::string template_name, int line, std::string reason);
  const std::string& template_name() const { return template_name_; }
  int line() const { return line_; }
  // The message without the name and line, e.g. raise_exception's text.
  const std::string& reason() const { return reason_; }

 private:
  std::string template_name_;
  int line_;
  std::string reason_;
};

namespace jinja {

class Template {
 public:
  // Parses `source`; `name` prefixes error messages. Throws TemplateError.
  explicit Template(std::string_view source, std::string name = "template");

  // Renders with the members of `context` (an object) as variables. Throws
  // TemplateError. Thread-safe: rendering keeps its state on the stack.
  std::string render(const nlohmann::ordered_json& context) const;

  const std::string& name() const { return name_; }

 private:
  struct Parsed;
  std::string name_;
  std::shared_ptr<const Parsed> parsed_;
};

}  // namespace jinja
}  // namespace augur
