// Small helpers for the io layer's JSON messages (internal to io).
#pragma once

#include <exception>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace augur::io_detail {

// "integer", "float", or nlohmann's name for the other kinds ("string", ...).
inline std::string kind_of(const nlohmann::json& j) {
  if (j.is_number_integer()) return "integer";
  if (j.is_number_float()) return "float";
  return j.type_name();
}

// nlohmann's message without its "[json.exception.parse_error.101] " prefix.
inline std::string parser_message(const std::exception& e) {
  std::string_view m = e.what();
  if (m.starts_with("[json.exception.")) {
    size_t p = m.find("] ");
    if (p != std::string_view::npos) m.remove_prefix(p + 2);
  }
  return std::string(m);
}

}  // namespace augur::io_detail
