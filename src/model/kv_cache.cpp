#include "backend/device.h"
#include "core/error.h"
#include "model/model.h"

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
  if (device != Device::CPU) fail("[kv_cache] recurrent state on ", device_name(device), " is not supported yet");
  if (n_slots <= 0) fail("[kv_cache] a model with recurrent layers needs at least one state slot");
  for (int64_t i = 0; i < recurrent.n_layer; ++i) {
    ops::RecurrentLayer l;
    l.conv = Tensor::empty(DType::F32, {n_slots, recurrent.conv_tail, recurrent.conv_dim});
    l.state = Tensor::empty(DType::F32, {n_slots, recurrent.n_head, recurrent.head_dim_k, recurrent.head_dim_v});
    recurrent_.push_back(std::move(l));
  }
}

void KvCache::copy_block(int32_t src, int32_t dst) {
  AUGUR_ASSERT(src >= 0 && src < n_blocks_ && dst >= 0 && dst < n_blocks_, "block id out of range");
  for (auto& l : layers_)
    for (const Tensor* t : {&l.k, &l.v}) copy_tensor(t->slice_rows(src, src + 1), t->slice_rows(dst, dst + 1));
}

namespace {

// Floats of one slot in each of a recurrent layer's two tensors.
size_t conv_floats(const RecurrentSpec& s) { return size_t(s.conv_tail * s.conv_dim); }
size_t state_floats(const RecurrentSpec& s) { return size_t(s.n_head * s.head_dim_k * s.head_dim_v); }

}  // namespace

void KvCache::zero_slot(int32_t slot) {
  AUGUR_ASSERT(slot >= 0 && slot < n_slots_, "state slot out of range");
  const size_t nc = conv_floats(rspec_), ns = state_floats(rspec_);
  for (auto& l : recurrent_) {
    std::memset(l.conv.data<float>() + size_t(slot) * nc, 0, nc * 4);
    std::memset(l.state.data<float>() + size_t(slot) * ns, 0, ns * 4);
  }
}

// Layout of a saved slot: for each recurrent layer, its conv tail then its state.
Tensor KvCache::save_slot(int32_t slot) const {
  AUGUR_ASSERT(slot >= 0 && slot < n_slots_, "state slot out of range");
  const size_t nc = conv_floats(rspec_), ns = state_floats(rspec_);
  Tensor out = Tensor::empty(DType::F32, {int64_t(recurrent_.size() * (nc + ns))});
  float* dst = out.data<float>();
  for (const auto& l : recurrent_) {
    std::memcpy(dst, l.conv.data<float>() + size_t(slot) * nc, nc * 4);
    std::memcpy(dst + nc, l.state.data<float>() + size_t(slot) * ns, ns * 4);
    dst += nc + ns;
  }
  return out;
}

void KvCache::load_slot(int32_t slot, const Tensor& saved) {
  AUGUR_ASSERT(slot >= 0 && slot < n_slots_, "state slot out of range");
  const size_t nc = conv_floats(rspec_), ns = state_floats(rspec_);
  AUGUR_ASSERT(saved.defined() && saved.dtype() == DType::F32 &&
                   size_t(saved.numel()) == recurrent_.size() * (nc + ns),
               "saved recurrent state of another shape");
  const float* src = saved.data<float>();
  for (auto& l : recurrent_) {
    std::memcpy(l.conv.data<float>() + size_t(slot) * nc, src, nc * 4);
    std::memcpy(l.state.data<float>() + size_t(slot) * ns, src + nc, ns * 4);
    src += nc + ns;
  }
}

}  // namespace augur
