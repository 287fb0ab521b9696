// augur: run | chat | serve | inspect | bench | tokenize | perplexity | draft-vocab | quantize
#include <cstdio>
#include <exception>
#include <map>

#include "commands.h"
#include "core/error.h"

int main(int argc, char** argv) {
  CLI::App app{"augur: run open-weight language models from their Hugging Face checkpoints"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "augur 0.1.0");
  std::map<CLI::App*, augur::cli::Handler> handlers;
  auto add = [&](augur::cli::Handler (*fn)(CLI::App&)) {
    size_t before = app.get_subcommands({}).size();
    augur::cli::Handler h = fn(app);
    handlers[app.get_subcommands({})[before]] = std::move(h);
  };
  add(augur::cli::add_run);
  add(augur::cli::add_inspect);
  add(augur::cli::add_bench);
  add(augur::cli::add_tokenize);
  add(augur::cli::add_chat);
  add(augur::cli::add_perplexity);
  add(augur::cli::add_draft_vocab);
  add(augur::cli::add_serve);
  add(augur::cli::add_quantize);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    for (auto& [sub, handler] : handlers)
      if (sub->parsed()) return handler();
  } catch (const augur::Error& e) {
    std::fprintf(stderr, "augur: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "augur: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
