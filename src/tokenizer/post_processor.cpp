#include "tokenizer/post_processor.h"

#include <map>

#include "core/error.h"
#include "tokenizer/json_util.h"

namespace augur::tok {

namespace {

class Identity final : public PostProcessor {
 public:
  void process(std::vector<int32_t>&, bool) const override {}
};

// A single-sequence template, flattened to the special ids before and after
// the sequence.
class Template final : public PostProcessor {
 public:
  Template(std::vector<int32_t> before, std::vector<int32_t> after)
      : before_(std::move(before)), after_(std::move(after)) {}
  void process(std::vector<int32_t>& ids, bool add_special_tokens) const override {
    if (!add_special_tokens) return;
    ids.insert(ids.begin(), before_.begin(), before_.end());
    ids.insert(ids.end(), after_.begin(), after_.end());
  }

 private:
  std::vector<int32_t> before_, after_;
};

class Sequence final : public PostProcessor {
 public:
  explicit Sequence(std::vector<std::unique_ptr<PostProcessor>> steps)
      : steps_(std::move(steps)) {}
  void process(std::vector<int32_t>& ids, bool add_special_tokens) const override {
    for (const auto& s : steps_) s->process(ids, add_special_tokens);
  }

 private:
  std::vector<std::unique_ptr<PostProcessor>> steps_;
};

std::unique_ptr<PostProcessor> make_template(const nlohmann::json& j, const std::string& where) {
  std::map<std::string, std::vector<int32_t>> specials;
  if (j.contains("special_tokens") && j["special_tokens"].is_object()) {
    for (auto it = j["special_tokens"].begin(); it != j["special_tokens"].end(); ++it) {
      specials[it.key()] = required(it.value(), "ids", where, "TemplateProcessing special token")
                               .get<std::vector<int32_t>>();
    }
  }
  std::vector<int32_t> before, after;
  bool seen_sequence = false;
  for (const auto& item : required(j, "single", where, "TemplateProcessing")) {
    if (item.contains("Sequence")) {
      if (seen_sequence) fail(where, ": TemplateProcessing: single template repeats a sequence");
      seen_sequence = true;
      continue;
    }
    if (!item.contains("SpecialToken")) {
      fail(where, ": TemplateProcessing: unknown template item ", item.dump());
    }
    const std::string name = item["SpecialToken"]["id"].get<std::string>();
    auto it = specials.find(name);
    if (it == specials.end()) {
      fail(where, ": TemplateProcessing: special token '", name, "' is not defined");
    }
    auto& dst = seen_sequence ? after : before;
    dst.insert(dst.end(), it->second.begin(), it->second.end());
  }
  return std::make_unique<Template>(std::move(before), std::move(after));
}

// BertProcessing / RobertaProcessing for one sequence: [cls] A [sep].
std::unique_ptr<PostProcessor> make_cls_sep(const nlohmann::json& j, const std::string& where,
                                            const char* type) {
  const auto& cls = required(j, "cls", where, type);
  const auto& sep = required(j, "sep", where, type);
  return std::make_unique<Template>(std::vector<int32_t>{cls[1].get<int32_t>()},
                                    std::vector<int32_t>{sep[1].get<int32_t>()});
}

}  // namespace

std::unique_ptr<PostProcessor> make_post_processor(const nlohmann::json& j,
                                                   const std::string& where) {
  if (j.is_null()) return nullptr;
  const std::string type = type_of(j, where, "post_processor");
  if (type == "ByteLevel") return std::make_unique<Identity>();
  if (type == "TemplateProcessing") return make_template(j, where);
  if (type == "BertProcessing") return make_cls_sep(j, where, "BertProcessing");
  if (type == "RobertaProcessing") return make_cls_sep(j, where, "RobertaProcessing");
  if (type == "Sequence") {
    std::vector<std::unique_ptr<PostProcessor>> steps;
    for (const auto& step : required(j, "processors", where, "Sequence post_processor")) {
      if (auto p = make_post_processor(step, where)) steps.push_back(std::move(p));
    }
    return std::make_unique<Sequence>(std::move(steps));
  }
  fail(where, ": unsupported post_processor type '", type, "'");
}

}  // namespace augur::tok
