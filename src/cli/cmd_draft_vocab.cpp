// augur draft-vocab [MODEL_DIR] -f CORPUS [-n N] [-o FILE]: a draft vocabulary
// for speculative decoding (--draft-vocab): the N token ids that occur most
// often in a text corpus under the model's tokenizer, most frequent first
// (ties by id), one per line. A draft head (MTP or a draft model) then scores
// only those tokens; the output stays exact whatever the file holds.
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "commands.h"
#include "core/error.h"
#include "runtime/text_model.h"

namespace augur::cli {

namespace {

struct DraftVocabArgs {
  std::string model = AUGUR_DEFAULT_MODEL;
  std::string file;
  int64_t size = 32768;
  std::string out;
};

int draft_vocab(const DraftVocabArgs& a) {
  if (a.size < 1) fail("[cli] draft-vocab: -n must be at least 1");
  std::ifstream in(a.file, std::ios::binary);
  if (!in) fail("[cli] draft-vocab: cannot read '", a.file, "'");
  std::ostringstream text;
  text << in.rdbuf();
  const TextModel tm = TextModel::load(a.model);
  const std::vector<int32_t> ids = tm.tokenizer.encode(text.str(), /*add_special_tokens=*/false);
  if (ids.empty()) fail("[cli] draft-vocab: '", a.file, "' encodes to no tokens");
  std::vector<int64_t> count;
  for (int32_t id : ids) {
    if (size_t(id) >= count.size()) count.resize(size_t(id) + 1, 0);
    ++count[size_t(id)];
  }
  std::vector<int32_t> order;
  for (size_t id = 0; id < count.size(); ++id)
    if (count[id] > 0) order.push_back(int32_t(id));
  std::stable_sort(order.begin(), order.end(), [&](int32_t x, int32_t y) { return count[size_t(x)] > count[size_t(y)]; });
  if (int64_t(order.size()) > a.size) order.resize(size_t(a.size));
  std::ostringstream body;
  for (int32_t id : order) body << id << "\n";
  if (a.out.empty()) {
    std::fwrite(body.str().data(), 1, body.str().size(), stdout);
  } else {
    std::ofstream f(a.out, std::ios::binary);
    if (!(f << body.str())) fail("[cli] draft-vocab: cannot write '", a.out, "'");
  }
  std::fprintf(stderr, "draft vocabulary: %zu of the %zu distinct tokens of %zu in '%s'\n", order.size(),
               size_t(std::count_if(count.begin(), count.end(), [](int64_t c) { return c > 0; })), ids.size(),
               a.file.c_str());
  return 0;
}

}  // namespace

Handler add_draft_vocab(CLI::App& app) {
  auto a = std::make_shared<DraftVocabArgs>();
  CLI::App* cmd = app.add_subcommand(
      "draft-vocab", "Write a draft vocabulary (the most frequent tokens of a corpus) for --draft-vocab");
  cmd->add_option("model", a->model, "Model directory (with tokenizer.json)")->capture_default_str();
  cmd->add_option("-f,--file", a->file, "Text corpus")->required();
  cmd->add_option("-n,--size", a->size, "Most token ids to keep")->capture_default_str();
  cmd->add_option("-o,--out", a->out, "Output file (default: standard output)");
  return [a] { return draft_vocab(*a); };
}

}  // namespace augur::cli
