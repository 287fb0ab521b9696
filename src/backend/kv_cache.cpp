#include "backend/device.h"
#include "core/error.h"
#include "backend/kv_cache.h"

#include <algorithm>
#include <atomic>
#include <cstring>

namespace augur {

namespace {
uint64_t next_cache_id() {
  static std::atomic<uint64_t> next{1};
  return next++;
}
}  // namespace

KvCache::KvCache(const KvSpec& spec, int64_t n_blocks, int64_t block_size, Device device)
    : KvCache(spec, n_blocks, block_size, RecurrentSpec{}, 0, device) {}

KvCache::KvCache(const KvSpec& spec, int64_t n_blocks, int64_t block_size, const RecurrentSpec& recurrent,
                 int64_t n_slots, Device device)
    : id_(next_cache_id()), spec_(spec), n_blocks_(n_blocks), block_size_(block_size), rspec_(recurrent),
      n_slots_(n_slots) {
  if (n_blocks <= 0 || block_size <= 0) fail("[kv_cache] need a positive block count and size");
  const DType dtype = KvSpec::kv_dtype(device);
  for (int64_t i = 0; i < spec.n_layer; ++i) {
    ops::KvLayer l;
    l.k = empty_on(device, dtype, {n_blocks, block_size, spec.n_head_kv, spec.head_dim});
    l.v = empty_on(device, dtype, {n_blocks, block_size, spec.n_head_kv, spec.head_dim});
    layers_.push_back(std::move(l));
  }
  if (recurrent.n_layer == 0) {
    n_slots_ = 0;
    return;
  }
  if (n_slots <= 0) fail("[kv_cache] a model with recurrent layers needs at least one state slot");
  // f32 on the cache's device, zero-filled.
  for (int64_t i = 0; i < recurrent.n_layer; ++i) {
    ops::RecurrentLayer l;
    l.conv = empty_on(device, DType::F32, {n_slots, recurrent.conv_tail, recurrent.conv_dim});
    l.state = empty_on(device, DType::F32, {n_slots, recurrent.n_head, recurrent.head_dim_k, recurrent.head_dim_v});
    l.inputs = empty_on(device, DType::F32, {n_slots, kInputHistory, recurrent.inputs_per_token()});
    recurrent_.push_back(std::move(l));
  }
  if (device != Device::CPU)
    zeros_ = empty_on(device, DType::F32, {std::max(recurrent.conv_tail * recurrent.conv_dim,
                                                    recurrent.n_head * recurrent.head_dim_k * recurrent.head_dim_v)});
}

void KvCache::copy_block(int32_t src, int32_t dst) {
  AUGUR_ASSERT(src >= 0 && src < n_blocks_ && dst >= 0 && dst < n_blocks_, "block id out of range");
  for (auto& l : layers_)
    for (const Tensor* t : {&l.k, &l.v}) copy_tensor(t->slice_rows(src, src + 1), t->slice_rows(dst, dst + 1));
}

int64_t RecurrentSpec::history_bytes_per_slot() const {
  return n_layer * KvCache::kInputHistory * inputs_per_token() * 4;
}

namespace {

// Floats of one slot in each of a recurrent layer's two tensors.
size_t conv_floats(const RecurrentSpec& s) { return size_t(s.conv_tail * s.conv_dim); }
size_t state_floats(const RecurrentSpec& s) { return size_t(s.n_head * s.head_dim_k * s.head_dim_v); }

}  // namespace

namespace {

// `n` floats of `t` from element `at` on, as a flat view.
Tensor flat(const Tensor& t, size_t at, size_t n) {
  const int64_t shape[] = {int64_t(n)};
  const size_t offset = size_t(static_cast<const char*>(t.raw()) - static_cast<const char*>(t.buffer()->data()));
  return Tensor::view_of(t.buffer(), offset + at * 4, DType::F32, shape, 1);
}

}  // namespace

void KvCache::zero_slot(int32_t slot) {
  AUGUR_ASSERT(slot >= 0 && slot < n_slots_, "state slot out of range");
  const size_t nc = conv_floats(rspec_), ns = state_floats(rspec_);
  for (auto& l : recurrent_) {
    if (l.conv.device() == Device::CPU) {
      std::memset(l.conv.data<float>() + size_t(slot) * nc, 0, nc * 4);
      std::memset(l.state.data<float>() + size_t(slot) * ns, 0, ns * 4);
    } else {
      if (nc > 0) copy_tensor(flat(zeros_, 0, nc), flat(l.conv, size_t(slot) * nc, nc));
      copy_tensor(flat(zeros_, 0, ns), flat(l.state, size_t(slot) * ns, ns));
    }
  }
}

// Layout of a saved slot: for each recurrent layer, its conv tail then its
// state; on the cache's device, copied bit for bit.
Tensor KvCache::save_slot(int32_t slot) const {
  AUGUR_ASSERT(slot >= 0 && slot < n_slots_, "state slot out of range");
  const size_t nc = conv_floats(rspec_), ns = state_floats(rspec_);
  const Device device = recurrent_.empty() ? Device::CPU : recurrent_.front().state.device();
  Tensor out = empty_on(device, DType::F32, {int64_t(recurrent_.size() * (nc + ns))});
  size_t at = 0;
  for (const auto& l : recurrent_) {
    if (nc > 0) copy_tensor(flat(l.conv, size_t(slot) * nc, nc), flat(out, at, nc));
    copy_tensor(flat(l.state, size_t(slot) * ns, ns), flat(out, at + nc, ns));
    at += nc + ns;
  }
  return out;
}

void KvCache::load_slot(int32_t slot, const Tensor& saved) {
  AUGUR_ASSERT(slot >= 0 && slot < n_slots_, "state slot out of range");
  const size_t nc = conv_floats(rspec_), ns = state_floats(rspec_);
  AUGUR_ASSERT(saved.defined() && saved.dtype() == DType::F32 && saved.is_contiguous() &&
                   size_t(saved.numel()) == recurrent_.size() * (nc + ns),
               "saved recurrent state of another shape");
  size_t at = 0;
  for (auto& l : recurrent_) {
    if (nc > 0) copy_tensor(flat(saved, at, nc), flat(l.conv, size_t(slot) * nc, nc));
    copy_tensor(flat(saved, at + nc, ns), flat(l.state, size_t(slot) * ns, ns));
    at += nc + ns;
  }
}

}  // namespace augur
