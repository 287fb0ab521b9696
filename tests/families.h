// The checkpoints that engine-level tests run on: the five family fixtures
// (tests/data) and the trained augur-tiny (models/augur-tiny).
#pragma once

#include <gtest/gtest.h>

#include <string>

namespace augur::test {

inline auto every_family() {
  return ::testing::Values("llama", "qwen3", "qwen3_5", "qwen3_5_moe", "qwen3_next", "augur-tiny");
}

// A parameter's name in gtest's output, which takes no '-'.
inline std::string family_test_name(const ::testing::TestParamInfo<std::string>& info) {
  std::string n = info.param;
  for (char& c : n)
    if (c == '-') c = '_';
  return n;
}

}  // namespace augur::test
