// End-to-end tests of the text paths of the CLI: tokenize, run -p/--chat with
// stop strings, and multi-turn chat reusing the cached conversation.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

namespace {

namespace fs = std::filesystem;
const std::string kData = AUGUR_TEST_DATA;
const std::string kAugur = std::string(AUGUR_BINARY_DIR) + "/bin/augur";
const std::string kTiny = kData + "/tiny_chat";

struct Result {
  int status;
  std::string out;
};

Result run(const std::string& args, bool merge_stderr = true) {
  std::string cmd = kAugur + " " + args + (merge_stderr ? " 2>&1" : " 2>/dev/null");
  FILE* p = popen(cmd.c_str(), "r");
  Result r{-1, ""};
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  int st = pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

std::string quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

std::string write_temp(const std::string& name, const std::string& text) {
  fs::path p = fs::temp_directory_path() / (std::to_string(::getpid()) + "_" + name);
  std::ofstream(p) << text;
  return p.string();
}

nlohmann::json reference() {
  std::ifstream in(kData + "/tokenizer/reference.json");
  return nlohmann::json::parse(in);
}

TEST(TextCli, TokenizeMatchesHuggingFaceForRealTokenizers) {
  const auto ref = reference();
  for (const char* name : {"qwen3", "llama3", "deepseek_v3", "gemma3"}) {
    const std::string dir = kData + "/tokenizers/" + name;
    ASSERT_TRUE(fs::exists(dir + "/tokenizer.json")) << "run scripts/fetch_tokenizers.sh";
    int n = 0;
    for (const auto& c : ref[name]) {
      if (n++ == 4) break;  // a sample through the CLI; tests/tokenizer checks every case
      Result enc = run("tokenize " + dir + " --text " + quote(c["text"]) + " --json", false);
      ASSERT_EQ(enc.status, 0) << name << ": " << enc.out;
      EXPECT_EQ(nlohmann::json::parse(enc.out)["ids"], c["ids"]) << name << ": " << c["text"];
      if (c["ids"].empty()) continue;
      std::string ids;
      for (const auto& id : c["ids"]) {
        if (!ids.empty()) ids += ',';
        ids += std::to_string(id.get<int>());
      }
      Result dec = run("tokenize " + dir + " --decode " + ids + " --json", false);
      ASSERT_EQ(dec.status, 0) << dec.out;
      EXPECT_EQ(nlohmann::json::parse(dec.out)["text"], c["decoded"]) << name;
    }
  }
}

TEST(TextCli, MessagesRenderLikeTransformers) {
  const auto ref = reference();
  for (const char* name : {"qwen3", "llama3", "deepseek_v3", "gemma3"}) {
    int i = 0;
    for (const auto& c : ref[std::string("chat_") + name]) {
      const std::string file = write_temp(std::string("msgs_") + name + std::to_string(i++) + ".json", c["messages"].dump());
      std::string args = "tokenize " + kData + "/tokenizers/" + name + " --messages " + file + " --json";
      if (c["add_generation_prompt"].get<bool>()) args += " --add-generation-prompt";
      Result r = run(args, false);
      fs::remove(file);
      if (c.contains("tools") || c.contains("enable_thinking") || c.contains("extra")) continue;
      ASSERT_EQ(r.status, 0) << name << ": " << r.out;
      EXPECT_EQ(nlohmann::json::parse(r.out)["text"], c["rendered"]) << name;
    }
  }
}

TEST(TextCli, RunPromptPrintsTextAndStopsOnAStopString) {
  Result full = run("run " + kTiny + " -p 'Hello there' -n 24 --ignore-eos --json", false);
  ASSERT_EQ(full.status, 0) << full.out;
  const auto j = nlohmann::json::parse(full.out);
  const std::string text = j["text"];
  EXPECT_EQ(j["ids"].size(), 24u);
  EXPECT_EQ(j["prompt_ids"], nlohmann::json({72, 101, 108, 108, 111, 32, 116, 104, 101, 114, 101}));
  // Pick a stop string from the middle of the output: generation must end
  // there, with the text before it.
  ASSERT_GE(text.size(), 6u) << text;
  const size_t at = text.size() / 2;
  size_t start = at;
  while (start > 0 && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) --start;  // a char boundary
  const std::string stop = text.substr(start, 1);
  const size_t first = text.find(stop);
  Result cut = run("run " + kTiny + " -p 'Hello there' -n 24 --ignore-eos --json --stop " + quote(stop), false);
  ASSERT_EQ(cut.status, 0) << cut.out;
  const auto k = nlohmann::json::parse(cut.out);
  EXPECT_EQ(k["finish_reason"], "stop");
  EXPECT_EQ(k["text"], text.substr(0, first));
}

TEST(TextCli, RunChatUsesTheTemplate) {
  Result r = run("run " + kTiny + " --chat hi --system 'be brief' -n 4 --ignore-eos --json", false);
  ASSERT_EQ(r.status, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out);
  // <|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n
  const auto ids = j["prompt_ids"];
  EXPECT_EQ(ids[0], 257);
  EXPECT_EQ(ids[ids.size() - 1], 10);
  EXPECT_TRUE(j.contains("text"));
}

TEST(TextCli, TextPromptWithoutTokenizerIsAClearError) {
  Result r = run("run " + kData + "/qwen3 -p hello");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.out.find("no tokenizer.json"), std::string::npos) << r.out;
}

TEST(TextCli, ChatKeepsTheConversationBetweenTurns) {
  const std::string input = write_temp("chat_in.txt", "hello\nhow are you\n");
  Result r = run("chat " + kTiny + " -n 6 < " + input);
  fs::remove(input);
  ASSERT_EQ(r.status, 0) << r.out;
  // Turn 1 prefills the whole prompt; turn 2 reuses at least turn 1's prompt.
  const size_t t1 = r.out.find("[0 tokens reused");
  ASSERT_NE(t1, std::string::npos) << r.out;
  const size_t t2 = r.out.find(" tokens reused", t1 + 20);
  ASSERT_NE(t2, std::string::npos) << r.out;
  size_t b = r.out.rfind('[', t2);
  const int reused = std::stoi(r.out.substr(b + 1, t2 - b - 1));
  EXPECT_GE(reused, 24) << r.out;  // "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n"
}

// A turn that does not fit the context is refused and forgotten, and the
// conversation goes on; a reply that would pass the end is cut short there.
TEST(TextCli, ChatRefusesATurnBeyondTheContextAndGoesOn) {
  const std::string input =
      write_temp("chat_long.txt", "hello\n" + std::string(400, 'x') + "\nhi\n");
  Result r = run("chat " + kTiny + " -n 8 --ctx 64 < " + input);
  fs::remove(input);
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("leaves no room for a reply in 64 tokens (--ctx)"), std::string::npos) << r.out;
  // Three turns asked, two answered; the third reuses the first (the refused
  // turn left nothing behind).
  size_t answered = 0;
  for (size_t at = r.out.find(" tokens reused"); at != std::string::npos; at = r.out.find(" tokens reused", at + 1))
    ++answered;
  EXPECT_EQ(answered, 2u) << r.out;
  const size_t last = r.out.rfind(" tokens reused");
  EXPECT_GE(std::stoi(r.out.substr(r.out.rfind('[', last) + 1)), 10) << r.out;
}

}  // namespace
