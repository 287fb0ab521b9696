// A one-line progress report on stderr for long work (loading, benchmarks).
// Silent when stderr is not a terminal unless forced, so logs stay clean.
#pragma once

#include <cstdint>
#include <string>

namespace augur {

class Progress {
 public:
  Progress(std::string label, int64_t total);
  ~Progress();
  void update(int64_t done);
  void finish();

 private:
  std::string label_;
  int64_t total_;
  int64_t last_pct_ = -1;
  bool enabled_;
  bool finished_ = false;
};

}  // namespace augur
