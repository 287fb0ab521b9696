#include "tokenizer/jinja/template.h"

#include <utility>

#include "tokenizer/jinja/ast.h"
#include "tokenizer/jinja/errors.h"
#include "tokenizer/jinja/interpreter.h"
#include "tokenizer/jinja/lexer.h"
#include "tokenizer/jinja/parser.h"

namespace augur {

TemplateError::TemplateError(std::string template_name, int line, std::string reason)
    : Error("[" + template_name + "] line " + std::to_string(line) + ": " + reason),
      template_name_(std::move(template_name)),
      line_(line),
      reason_(std::move(reason)) {}

namespace jinja {

struct Template::Parsed {
  Body body;
};

Template::Template(std::string_view source, std::string name) : name_(std::move(name)) {
  try {
    auto parsed = std::make_shared<Parsed>();
    parsed->body = parse(tokenize(source));
    parsed_ = std::move(parsed);
  } catch (const LocatedError& e) {
    throw TemplateError(name_, e.line(), e.what());
  }
}

std::string Template::render(const nlohmann::ordered_json& context) const {
  if (!context.is_object()) {
    throw TemplateError(name_, 0, std::string("render context must be a JSON object, got ") +
                                      context.type_name());
  }
  try {
    const Value ctx = Value::from_json(context);
    Interpreter interpreter(ctx.as_dict());
    return interpreter.render(parsed_->body);
  } catch (const LocatedError& e) {
    throw TemplateError(name_, e.line(), e.what());
  } catch (const EvalError& e) {
    throw TemplateError(name_, 0, e.what());
  }
}

}  // namespace jinja
}  // namespace augur
