#include "io/checkpoint.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/progress.h"

namespace augur {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

constexpr const char* kSingle = "model.safetensors";
constexpr const char* kIndex = "model.safetensors.index.json";

// Reads the index's weight_map as (tensor name -> shard file), in name order.
std::map<std::string, std::string> read_weight_map(const std::string& index_path) {
  auto bad = [&](auto&&... parts) { fail("[checkpoint] ", index_path, ": ", parts...); };
  std::ifstream in(index_path, std::ios::binary);
  if (!in) bad("cannot open");
  std::ostringstream text;
  text << in.rdbuf();
  json index;
  try {
    index = json::parse(text.str());
  } catch (const json::exception& e) {
    std::string m = e.what();
    size_t p = m.find("] ");
    bad("bad JSON: ", p == std::string::npos ? m : m.substr(p + 2));
  }
  if (!index.is_object()) bad("index must be a JSON object, got ", index.type_name());
  auto wm = index.find("weight_map");
  if (wm == index.end()) bad("missing 'weight_map'");
  if (!wm->is_object()) bad("'weight_map' must be an object, got ", wm->type_name());
  std::map<std::string, std::string> out;
  for (const auto& [name, shard] : wm->items()) {
    if (!shard.is_string())
      bad("weight_map entry for '", name, "' must be a file name, got ", shard.type_name());
    out.emplace(name, shard.get<std::string>());
  }
  return out;
}

}  // namespace

Checkpoint Checkpoint::open(const std::string& dir) {
  Checkpoint ck;
  ck.dir_ = dir;
  const fs::path root(dir);
  std::error_code ec;
  if (!fs::is_directory(root, ec)) fail("[checkpoint] ", dir, ": not a directory");

  const fs::path single = root / kSingle;
  if (fs::exists(single, ec)) {
    auto file = SafetensorsFile::open(single.string());
    for (const auto& t : file->tensors()) ck.entries_.emplace(t.name, Entry{&t, 0});
    ck.files_.push_back(std::move(file));
    return ck;
  }

  const fs::path index_path = root / kIndex;
  if (!fs::exists(index_path, ec))
    fail("[checkpoint] ", dir, ": no ", kSingle, " or ", kIndex, " in this directory");
  const std::string index = index_path.string();
  const auto weight_map = read_weight_map(index);

  // Shards in file-name order (model-00001-of-N first); check all exist before
  // mapping any, so a missing shard is reported before slow work.
  std::map<std::string, std::string> first_tensor;  // shard -> a tensor it holds
  for (const auto& [name, shard] : weight_map) first_tensor.emplace(shard, name);
  std::map<std::string, size_t> shard_slot;
  std::vector<std::string> shards;
  for (const auto& [shard, name] : first_tensor) {
    if (!fs::is_regular_file(root / shard, ec))
      fail("[checkpoint] ", index, ": shard '", shard, "' (holding '", name, "') not found in ",
           dir);
    shard_slot.emplace(shard, shards.size());
    shards.push_back(shard);
  }

  Progress progress("opening " + dir, int64_t(shards.size()));
  for (size_t i = 0; i < shards.size(); ++i) {
    ck.files_.push_back(SafetensorsFile::open((root / shards[i]).string()));
    progress.update(int64_t(i + 1));
  }
  progress.finish();

  // The index is the authority: exactly its names, each found in its shard.
  for (const auto& [name, shard] : weight_map) {
    size_t slot = shard_slot.at(shard);
    const TensorInfo* t = ck.files_[slot]->find(name);
    if (!t)
      fail("[checkpoint] ", index, ": tensor '", name, "' is mapped to shard '", shard,
           "' but that file has no such tensor");
    ck.entries_.emplace(name, Entry{t, slot});
  }
  return ck;
}

bool Checkpoint::has(std::string_view name) const { return entries_.find(name) != entries_.end(); }

const TensorInfo& Checkpoint::info(std::string_view name) const {
  auto it = entries_.find(name);
  if (it == entries_.end()) fail("[checkpoint] ", dir_, ": no tensor named ", name);
  return *it->second.info;
}

Tensor Checkpoint::get(std::string_view name) const {
  auto it = entries_.find(name);
  if (it == entries_.end()) fail("[checkpoint] ", dir_, ": no tensor named ", name);
  return files_[it->second.file]->tensor(*it->second.info);
}

std::vector<std::string> Checkpoint::names() const {
  std::vector<std::string> out;
  out.reserve(entries_.size());
  for (const auto& [name, e] : entries_) out.push_back(name);
  return out;
}

size_t Checkpoint::total_bytes() const {
  size_t total = 0;
  for (const auto& [name, e] : entries_) total += e.info->nbytes;
  return total;
}

}  // namespace augur
