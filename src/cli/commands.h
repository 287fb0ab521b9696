// augur's subcommands; each registers its options on the app and returns the
// handler to run when chosen.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <string>
#include <vector>

namespace augur::cli {

using Handler = std::function<int()>;

Handler add_run(CLI::App& app);
Handler add_inspect(CLI::App& app);
Handler add_bench(CLI::App& app);
Handler add_tokenize(CLI::App& app);
Handler add_chat(CLI::App& app);
Handler add_perplexity(CLI::App& app);
Handler add_draft_vocab(CLI::App& app);
Handler add_serve(CLI::App& app);
Handler add_quantize(CLI::App& app);

// "1,2,3" -> {1, 2, 3}; throws augur::Error naming the option on bad input.
std::vector<int32_t> parse_ids(const std::string& text, const char* option);

}  // namespace augur::cli
