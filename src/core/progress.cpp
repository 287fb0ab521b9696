#include "core/progress.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>

namespace augur {

Progress::Progress(std::string label, int64_t total) : label_(std::move(label)), total_(total) {
  enabled_ = isatty(STDERR_FILENO) || std::getenv("AUGUR_PROGRESS") != nullptr;
  if (std::getenv("AUGUR_QUIET")) enabled_ = false;
}

Progress::~Progress() { finish(); }

void Progress::update(int64_t done) {
  if (!enabled_ || total_ <= 0) return;
  int64_t pct = done * 100 / total_;
  if (pct == last_pct_) return;
  last_pct_ = pct;
  std::fprintf(stderr, "\r%s: %3lld%% (%lld/%lld)", label_.c_str(), (long long)pct,
               (long long)done, (long long)total_);
  std::fflush(stderr);
}

void Progress::finish() {
  if (finished_) return;
  finished_ = true;
  if (enabled_ && last_pct_ >= 0) std::fprintf(stderr, "\n");
}

}  // namespace augur
