// Shared helpers for the io tests: a scratch directory, raw file writing, and
// checks on augur::Error messages.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"

namespace augur::test {

// A fresh directory under the system temp dir, removed with everything in it.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "augur_io_XXXXXX").string();
    if (!mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp failed");
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  std::string file(std::string_view name) const { return (path_ / name).string(); }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

inline void write_text(const std::string& path, std::string_view text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(text.data(), std::streamsize(text.size()));
  ASSERT_TRUE(out.good()) << path;
}

// A hand-built safetensors file: the u64 header length (the real one unless
// given), the header text, then `data`.
inline void write_raw_safetensors(const std::string& path, std::string_view header,
                                  std::string_view data, uint64_t header_len = UINT64_MAX) {
  if (header_len == UINT64_MAX) header_len = header.size();
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[size_t(i)] = char(uint8_t(header_len >> (8 * i)));
  bytes.append(header);
  bytes.append(data);
  write_text(path, bytes);
}

// Runs `f`, which must throw augur::Error; returns the message ("" if it did not throw).
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const augur::Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected an augur::Error";
  return "";
}

// Expects `f` to throw augur::Error whose message contains every part.
// (The parts are copied into strings first: a part may be a temporary.)
#define EXPECT_ERROR_HAS(stmt, ...)                                                  \
  do {                                                                               \
    const std::vector<std::string> parts_{__VA_ARGS__};                              \
    std::string msg_ = ::augur::test::error_of([&] { (void)(stmt); });               \
    for (const std::string& part_ : parts_)                                          \
      EXPECT_NE(msg_.find(part_), std::string::npos)                                 \
          << "message: " << msg_ << "\nmissing: " << part_;                          \
  } while (0)

}  // namespace augur::test
