// Reader for the safetensors format over a read-only memory mapping.
//
// Layout: [u64 little-endian header length N][N bytes of JSON header][data].
// The header maps each tensor name to {dtype, shape, data_offsets: [begin, end)}
// with offsets relative to the start of the data section, plus an optional
// "__metadata__" object of string -> string. Every check a malformed file could
// fail is an augur::Error "[safetensors] <path>: ...", never a crash.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"
#include "core/mmap.h"
#include "core/tensor.h"

namespace augur {

struct TensorInfo {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;  // 0 to kMaxDims dims; [] is a scalar
  size_t data_offset = 0;      // absolute byte offset in the file
  size_t nbytes = 0;
  std::string file;            // path of the file holding the bytes
};

class SafetensorsFile {
 public:
  // Maps and validates the whole header; throws augur::Error on any defect.
  static std::shared_ptr<SafetensorsFile> open(const std::string& path);

  // In data order (ascending data_offset).
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  // nullptr if absent.
  const TensorInfo* find(std::string_view name) const;
  // Zero-copy view of the mapped bytes; the view keeps the mapping alive.
  // The mapping is read-only: writing through the view faults.
  // Data is only as aligned as the file made it (offsets need not be aligned).
  Tensor tensor(const TensorInfo& info) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const std::string& path() const { return path_; }

 private:
  SafetensorsFile() = default;

  std::string path_;
  std::shared_ptr<MappedFile> file_;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, size_t, std::less<>> index_;  // name -> position in tensors_
  std::map<std::string, std::string> metadata_;
};

}  // namespace augur
