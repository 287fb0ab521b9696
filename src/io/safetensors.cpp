#include "io/safetensors.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/json_text.h"

namespace augur {

namespace {

using json = nlohmann::json;

using io_detail::kind_of;
using io_detail::parser_message;

std::string shape_str(const std::vector<int64_t>& shape) {
  std::ostringstream os;
  os << '[';
  for (size_t i = 0; i < shape.size(); ++i) os << (i ? ", " : "") << shape[i];
  os << ']';
  return os.str();
}

// A JSON integer that is >= 0 and fits int64; false otherwise.
bool as_count(const json& j, int64_t* out) {
  if (j.is_number_unsigned()) {
    uint64_t u = j.get<uint64_t>();
    if (u > uint64_t(std::numeric_limits<int64_t>::max())) return false;
    *out = int64_t(u);
    return true;
  }
  if (j.is_number_integer()) {
    int64_t v = j.get<int64_t>();
    if (v < 0) return false;
    *out = v;
    return true;
  }
  return false;
}

// nlohmann keeps the last of repeated keys; a repeated tensor name is a
// corrupt header, so the parse callback tracks the keys of each open object.
class DuplicateKeyCheck {
 public:
  explicit DuplicateKeyCheck(const std::string& path) : path_(path) {}

  bool operator()(int /*depth*/, json::parse_event_t event, json& parsed) {
    switch (event) {
      case json::parse_event_t::object_start: open_.emplace_back(); break;
      case json::parse_event_t::object_end: open_.pop_back(); break;
      case json::parse_event_t::key: {
        const auto& key = parsed.get_ref<const std::string&>();
        if (!open_.back().insert(key).second) {
          if (open_.size() == 1) fail("[safetensors] ", path_, ": duplicate tensor name '", key, "'");
          fail("[safetensors] ", path_, ": duplicate key '", key, "' in header");
        }
        break;
      }
      default: break;
    }
    return true;
  }

 private:
  const std::string& path_;
  std::vector<std::set<std::string>> open_;  // one key set per open object
};

}  // namespace

std::shared_ptr<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  std::shared_ptr<SafetensorsFile> st(new SafetensorsFile());
  st->path_ = path;
  st->file_ = MappedFile::open(path);
  const size_t file_size = st->file_->size();
  const unsigned char* base = st->file_->data();
  auto bad = [&](auto&&... parts) { fail("[safetensors] ", path, ": ", parts...); };

  if (file_size < 8) bad("file is ", file_size, " bytes, shorter than the 8-byte header length");
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | base[i];  // little-endian
  if (header_len > file_size - 8)
    bad("header length ", header_len, " exceeds file size ", file_size);
  const size_t data_start = 8 + size_t(header_len);
  const size_t data_size = file_size - data_start;

  json header;
  try {
    const char* h = reinterpret_cast<const char*>(base + 8);
    header = json::parse(h, h + header_len, DuplicateKeyCheck(path));
  } catch (const json::exception& e) {
    bad("bad JSON header: ", parser_message(e));
  }
  if (!header.is_object()) bad("header must be a JSON object, got ", kind_of(header));

  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      if (!entry.is_object()) bad("__metadata__ must be an object, got ", kind_of(entry));
      for (const auto& [k, v] : entry.items()) {
        if (!v.is_string())
          bad("__metadata__ value for '", k, "' must be a string, got ", kind_of(v));
        st->metadata_[k] = v.get<std::string>();
      }
      continue;
    }
    auto bad_tensor = [&](auto&&... parts) { bad("tensor '", name, "': ", parts...); };
    if (!entry.is_object()) bad_tensor("entry must be an object, got ", kind_of(entry));

    TensorInfo info;
    info.name = name;
    info.file = path;

    auto dt = entry.find("dtype");
    if (dt == entry.end()) bad_tensor("missing 'dtype'");
    if (!dt->is_string()) bad_tensor("'dtype' must be a string, got ", kind_of(*dt));
    const auto& tag = dt->get_ref<const std::string&>();
    if (!parse_dtype(tag, &info.dtype)) bad_tensor("unknown dtype '", tag, "'");

    auto sh = entry.find("shape");
    if (sh == entry.end()) bad_tensor("missing 'shape'");
    if (!sh->is_array()) bad_tensor("'shape' must be an array, got ", kind_of(*sh));
    if (sh->size() > size_t(kMaxDims))
      bad_tensor("has ", sh->size(), " dims, more than the supported ", kMaxDims);
    for (size_t i = 0; i < sh->size(); ++i) {
      int64_t d = 0;
      if (!as_count((*sh)[i], &d))
        bad_tensor("shape dim ", i, " must be a non-negative integer, got ", (*sh)[i].dump());
      info.shape.push_back(d);
    }

    auto off = entry.find("data_offsets");
    if (off == entry.end()) bad_tensor("missing 'data_offsets'");
    if (!off->is_array() || off->size() != 2)
      bad_tensor("'data_offsets' must be an array [begin, end], got ", off->dump());
    int64_t begin = 0, end = 0;
    if (!as_count((*off)[0], &begin) || !as_count((*off)[1], &end))
      bad_tensor("'data_offsets' must be non-negative integers, got ", off->dump());
    if (begin > end) bad_tensor("data_offsets [", begin, ", ", end, "] have begin > end");
    if (uint64_t(end) > data_size)
      bad_tensor("data_offsets [", begin, ", ", end, "] lie outside the data section of ",
                 data_size, " bytes");

    // numel * element size, refusing to wrap.
    size_t need = dtype_size(info.dtype);
    bool overflow = false;
    for (int64_t d : info.shape) overflow = overflow || __builtin_mul_overflow(need, size_t(d), &need);
    const size_t span = size_t(end - begin);
    if (overflow || need != span)
      bad_tensor("shape ", shape_str(info.shape), " of ", dtype_name(info.dtype), " needs ",
                 overflow ? std::string("more than 2^64") : std::to_string(need),
                 " bytes but data_offsets [", begin, ", ", end, "] span ", span);

    info.data_offset = data_start + size_t(begin);
    info.nbytes = span;
    st->tensors_.push_back(std::move(info));
  }

  // Data order; empty tensors occupy no bytes and cannot overlap anything.
  auto& ts = st->tensors_;
  std::sort(ts.begin(), ts.end(), [](const TensorInfo& a, const TensorInfo& b) {
    return a.data_offset != b.data_offset ? a.data_offset < b.data_offset : a.name < b.name;
  });
  const TensorInfo* last = nullptr;  // the non-empty tensor reaching furthest so far
  for (const auto& t : ts) {
    if (t.nbytes == 0) continue;
    if (last && t.data_offset < last->data_offset + last->nbytes)
      bad("tensors '", last->name, "' and '", t.name, "' have overlapping data ranges");
    if (!last || t.data_offset + t.nbytes > last->data_offset + last->nbytes) last = &t;
  }
  for (size_t i = 0; i < ts.size(); ++i) st->index_.emplace(ts[i].name, i);
  return st;
}

const TensorInfo* SafetensorsFile::find(std::string_view name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

Tensor SafetensorsFile::tensor(const TensorInfo& info) const {
  AUGUR_ASSERT(info.file == path_, "TensorInfo belongs to another file");
  AUGUR_ASSERT(info.data_offset + info.nbytes <= file_->size(), "TensorInfo outside the file");
  // The mapping is PROT_READ; Buffer's interface is mutable, so cast away const.
  void* p = const_cast<unsigned char*>(file_->data()) + info.data_offset;
  auto buf = std::make_shared<BorrowedBuffer>(file_, p, info.nbytes);
  return Tensor::view_of(std::move(buf), 0, info.dtype, info.shape.data(), int(info.shape.size()));
}

}  // namespace augur
