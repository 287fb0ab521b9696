#include "tokenizer/regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "core/error.h"
#include "tokenizer/unicode.h"

namespace augur::tok {

struct Regex::Compiled {
  pcre2_code* code = nullptr;
  bool jit = false;
  ~Compiled() { pcre2_code_free(code); }
};

namespace {

// Per-thread match state: a Regex is shared between threads, its match data
// and JIT stack are not.
struct MatchState {
  pcre2_match_data* data = nullptr;
  pcre2_match_context* context = nullptr;
  pcre2_jit_stack* stack = nullptr;
  MatchState() {
    data = pcre2_match_data_create(1, nullptr);
    context = pcre2_match_context_create(nullptr);
    // Long runs of one class (a page of spaces) need more than the default
    // 32 KiB of JIT stack.
    stack = pcre2_jit_stack_create(32 * 1024, 16 * 1024 * 1024, nullptr);
    AUGUR_ASSERT(data && context && stack, "pcre2 allocation failed");
    pcre2_jit_stack_assign(context, nullptr, stack);
  }
  ~MatchState() {
    pcre2_jit_stack_free(stack);
    pcre2_match_context_free(context);
    pcre2_match_data_free(data);
  }
  MatchState(const MatchState&) = delete;
  MatchState& operator=(const MatchState&) = delete;
};

MatchState& match_state() {
  thread_local MatchState state;
  return state;
}

std::string pcre2_message(int code) {
  PCRE2_UCHAR buf[256];
  pcre2_get_error_message(code, buf, sizeof(buf));
  return reinterpret_cast<const char*>(buf);
}

}  // namespace

std::string onig_to_pcre2(std::string_view p) {
  std::string out;
  out.reserve(p.size() + 16);
  int class_depth = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    const char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      const char e = p[++i];
      const bool in_class = class_depth > 0;
      switch (e) {
        case 's': out += in_class ? "\\s\\x{85}" : "[\\s\\x{85}]"; break;
        case 'S':
          // Inside a class there is no spelling of "not \s" short of a
          // rewrite of the class; \S there keeps PCRE2's meaning.
          out += in_class ? "\\S" : "[^\\s\\x{85}]";
          break;
        case 'h': out += in_class ? "0-9a-fA-F" : "[0-9a-fA-F]"; break;
        case 'H': out += in_class ? "\\H" : "[^0-9a-fA-F]"; break;
        case 'u':
          if (i + 4 < p.size()) {
            out += "\\x{";
            out.append(p.substr(i + 1, 4));
            out += "}";
            i += 4;
          } else {
            out += "\\u";
          }
          break;
        default:
          out += c;
          out += e;
      }
      continue;
    }
    if (c == '[') {
      ++class_depth;
    } else if (c == ']' && class_depth > 0) {
      --class_depth;
    }
    out += c;
  }
  return out;
}

Regex Regex::compile(std::string_view pattern, const std::string& where) {
  const std::string translated = onig_to_pcre2(pattern);
  int err = 0;
  PCRE2_SIZE err_off = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()),
                                   translated.size(), PCRE2_UTF | PCRE2_UCP | PCRE2_MULTILINE,
                                   &err, &err_off, nullptr);
  if (!code) {
    fail(where, ": bad regex '", pattern, "': ", pcre2_message(err), " at offset ", err_off);
  }
  auto compiled = std::make_shared<Compiled>();
  compiled->code = code;
  compiled->jit = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
  Regex r;
  r.re_ = std::move(compiled);
  return r;
}

Regex Regex::literal(std::string_view text) {
  Regex r;
  r.literal_ = std::string(text);
  return r;
}

void Regex::find_all(std::string_view s, FunctionRef<void(size_t, size_t)> on_match) const {
  if (!re_) {
    // An empty literal matches nothing (HF's Pattern for &str).
    if (literal_.empty()) return;
    size_t pos = 0;
    while ((pos = s.find(literal_, pos)) != std::string_view::npos) {
      on_match(pos, pos + literal_.size());
      pos += literal_.size();
    }
    return;
  }
  MatchState& st = match_state();
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(s.data());
  const size_t n = s.size();
  size_t pos = 0;
  size_t last_end = std::string_view::npos;
  while (pos <= n) {
    const int rc = re_->jit ? pcre2_jit_match(re_->code, subject, n, pos, 0, st.data, st.context)
                            : pcre2_match(re_->code, subject, n, pos, PCRE2_NO_UTF_CHECK,
                                          st.data, st.context);
    if (rc == PCRE2_ERROR_NOMATCH) return;
    if (rc < 0) fail("[tokenizer] regex match failed: ", pcre2_message(rc));
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(st.data);
    const size_t start = ov[0], end = ov[1];
    if (start == end && end == last_end) {
      if (pos >= n) return;
      pos += utf8_seq_len(static_cast<unsigned char>(s[pos]));
      continue;
    }
    on_match(start, end);
    last_end = end;
    pos = end;
  }
}

}  // namespace augur::tok
