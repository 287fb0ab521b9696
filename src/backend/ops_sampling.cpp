// The sampling ops: penalties, and one token a row drawn where the logits
// are (only ids cross to the host).
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <string>
#include <vector>

#include "backend/cpu/ops_cpu.h"
#include "backend/device.h"
#include "backend/ops_internal.h"

namespace augur::ops {

using namespace detail;

static_assert(sizeof(SampleRow) == sizeof(cuda::SampleRow) && offsetof(SampleRow, uniform) == offsetof(cuda::SampleRow, uniform),
              "ops::SampleRow and cuda::SampleRow share one layout");
static_assert(sizeof(PenaltyEntry) == sizeof(cuda::PenaltyEntry) &&
                  offsetof(PenaltyEntry, subtract) == offsetof(cuda::PenaltyEntry, subtract),
              "ops::PenaltyEntry and cuda::PenaltyEntry share one layout");

namespace {

void check_logits(const char* op, const Tensor& logits) {
  require(logits.defined() && logits.dtype() == DType::F32 && logits.is_contiguous() && logits.ndim() == 2, op,
          "logits must be a contiguous [n_rows, n_vocab] F32 tensor, got ",
          logits.defined() ? logits.shape_str() : std::string("undefined"));
}

}  // namespace

void apply_penalties(const Tensor& logits, std::span<const PenaltyEntry> entries) {
  check_logits("apply_penalties", logits);
  const int64_t n_rows = logits.dim(0), V = logits.dim(1);
  for (const auto& e : entries)
    require(e.row >= 0 && e.row < n_rows && e.token >= 0 && e.token < V, "apply_penalties", "entry (row ", e.row,
            ", token ", e.token, ") outside ", logits.shape_str());
  if (entries.empty()) return;
  if (on_cuda(logits)) {
    auto dev = upload_bytes(entries.data(), entries.size_bytes());
    cuda::apply_penalties(logits.data<float>(), V, static_cast<const cuda::PenaltyEntry*>(dev->data()),
                          int64_t(entries.size()), cuda::stream());
    return;
  }
  require(logits.device() == Device::CPU, "apply_penalties", "no implementation for this device in this build");
  cpu::apply_penalties(logits.data<float>(), V, entries);
}

namespace {

void check_sample_rows(const Tensor& logits, std::span<const SampleRow> rows) {
  check_logits("sample", logits);
  require(int64_t(rows.size()) == logits.dim(0), "sample", rows.size(), " parameter rows for ", logits.dim(0),
          " rows of logits");
  for (const auto& r : rows)
    require(r.temperature >= 0 && std::isfinite(r.temperature) && r.top_k >= 0 && r.top_p > 0 && r.top_p <= 1 &&
                r.min_p >= 0 && r.min_p <= 1 && r.uniform >= 0 && r.uniform < 1,
            "sample", "parameters out of range: temperature ", r.temperature, ", top_k ", r.top_k, ", top_p ",
            r.top_p, ", min_p ", r.min_p, ", uniform ", r.uniform);
}

}  // namespace

SampledIds SampledIds::on_host(std::span<const int32_t> ids) {
  SampledIds s;
  s.host_.assign(ids.begin(), ids.end());
  s.device_ = Tensor::empty(DType::I32, {int64_t(ids.size())});
  std::copy(ids.begin(), ids.end(), s.device_.data<int32_t>());
  return s;
}

std::span<const int32_t> SampledIds::host() {
  if (landing_) {
    const auto* p = static_cast<const int32_t*>(landing_->wait());
    host_.assign(p, p + device_.numel());
    landing_.reset();
  }
  return host_;
}

SampledIds sample_async(const Tensor& logits, std::span<const SampleRow> rows, const Tensor& into) {
  check_sample_rows(logits, rows);
  const int64_t n_rows = logits.dim(0), V = logits.dim(1);
  if (!on_cuda(logits)) {
    require(logits.device() == Device::CPU, "sample", "no implementation for this device in this build");
    std::vector<int32_t> ids(size_t(n_rows), 0);
    if (n_rows > 0) cpu::sample(logits.data<float>(), V, rows, ids.data());
    SampledIds s = SampledIds::on_host(ids);
    if (into.defined()) {
      require(into.device() == Device::CPU && into.dtype() == DType::I32 && into.numel() == n_rows, "sample",
              "ids buffer ", into.shape_str(), " for ", n_rows, " rows on the host");
      copy_tensor(s.device_, into);
      s.device_ = into;
    }
    return s;
  }
  SampledIds s;
  const int64_t shape[] = {n_rows};
  if (into.defined()) {
    require(on_cuda(into) && into.dtype() == DType::I32 && into.is_contiguous() && into.numel() == n_rows, "sample",
            "ids buffer ", into.shape_str(), " for ", n_rows, " rows on the logits' device");
    s.device_ = into;
  } else {
    s.device_ = Tensor::view_of(cuda::allocate(size_t(std::max<int64_t>(n_rows, 1)) * 4), 0, DType::I32, shape, 1);
  }
  if (n_rows == 0) return s;
  int32_t* ids = s.device_.data<int32_t>();
  s.landing_ = std::make_shared<cuda::HostLanding>(size_t(n_rows) * 4);
  auto* host = static_cast<int32_t*>(s.landing_->data());
  // Greedy rows only: the argmax, split over the GPU's SMs, and no
  // parameters to upload (sample_kernel reads a row in one block).
  const bool greedy = std::all_of(rows.begin(), rows.end(), [](const SampleRow& r) { return r.temperature == 0; });
  if (greedy) {
    cuda::argmax(logits.data<float>(), n_rows, V, ids, host, cuda::stream());
  } else {
    auto dev_rows = upload_bytes(rows.data(), rows.size_bytes());
    cuda::sample(logits.data<float>(), n_rows, V, static_cast<const cuda::SampleRow*>(dev_rows->data()), ids, host,
                 cuda::stream());
  }
  s.landing_->mark();
  return s;
}

void sample_weights(std::span<const float> logits, const SampleRow& row, std::span<float> weights) {
  require(!logits.empty() && weights.size() == logits.size(), "sample_weights", "weights of ", weights.size(),
          " for a row of ", logits.size(), " logits");
  cpu::sample_weights(logits.data(), int64_t(logits.size()), row, weights.data());
}

int32_t sample_pick(std::span<const float> weights, float uniform) {
  const int32_t id = cpu::sample_walk(weights.data(), int64_t(weights.size()), uniform);
  require(id >= 0, "sample_pick", "no token has a positive weight");
  return id;
}

void sample(const Tensor& logits, std::span<const SampleRow> rows, std::span<int32_t> ids) {
  require(int64_t(ids.size()) == (logits.defined() && logits.ndim() == 2 ? logits.dim(0) : -1), "sample",
          ids.size(), " ids for logits ", logits.defined() ? logits.shape_str() : std::string("undefined"));
  SampledIds s = sample_async(logits, rows);
  const auto host = s.host();
  std::copy(host.begin(), host.end(), ids.begin());
}
}  // namespace augur::ops
