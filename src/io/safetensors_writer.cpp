#include "io/safetensors_writer.h"

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <set>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace augur {

void write_safetensors(const std::string& path,
                       const std::vector<std::pair<std::string, Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  auto bad = [&](auto&&... parts) { fail("[safetensors] ", path, ": ", parts...); };

  // ordered_json keeps tensors in the caller's order, matching the data layout.
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::set<std::string_view> seen;
  size_t offset = 0;
  for (const auto& [name, t] : tensors) {
    if (name == "__metadata__") bad("'__metadata__' is reserved, not a tensor name");
    if (!seen.insert(name).second) bad("duplicate tensor name '", name, "'");
    if (!t.defined()) bad("tensor '", name, "' is undefined");
    if (t.device() != Device::CPU) bad("tensor '", name, "' is not on the host");
    if (!t.is_contiguous()) bad("tensor '", name, "' is not contiguous");
    std::vector<int64_t> shape(t.shape().begin(), t.shape().begin() + t.ndim());
    size_t n = t.nbytes();
    header[name] = {{"dtype", std::string(dtype_name(t.dtype()))},
                    {"shape", shape},
                    {"data_offsets", {offset, offset + n}}};
    offset += n;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');

  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) bad("cannot create: ", std::strerror(errno));
  unsigned char len[8];
  uint64_t n = text.size();
  for (int i = 0; i < 8; ++i) len[i] = uint8_t(n >> (8 * i));  // little-endian
  out.write(reinterpret_cast<const char*>(len), 8);
  out.write(text.data(), std::streamsize(text.size()));
  for (const auto& [name, t] : tensors)
    out.write(static_cast<const char*>(t.raw()), std::streamsize(t.nbytes()));
  out.flush();
  if (!out) bad("write failed: ", std::strerror(errno));
}

}  // namespace augur
