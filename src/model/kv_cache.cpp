#include "core/error.h"
#include "model/model.h"

#include <cstring>

namespace augur {

KvCache::KvCache(const KvSpec& spec, int64_t n_blocks, int64_t block_size)
    : spec_(spec), n_blocks_(n_blocks), block_size_(block_size) {
  if (n_blocks <= 0 || block_size <= 0) fail("[kv_cache] need a positive block count and size");
  for (int64_t i = 0; i < spec.n_layer; ++i) {
    ops::KvLayer l;
    l.k = Tensor::empty(DType::F32, {n_blocks, block_size, spec.n_head_kv, spec.head_dim});
    l.v = Tensor::empty(DType::F32, {n_blocks, block_size, spec.n_head_kv, spec.head_dim});
    layers_.push_back(std::move(l));
  }
}

void KvCache::copy_block(int32_t src, int32_t dst) {
  AUGUR_ASSERT(src >= 0 && src < n_blocks_ && dst >= 0 && dst < n_blocks_, "block id out of range");
  const size_t block_elems = size_t(block_size_ * spec_.n_head_kv * spec_.head_dim);
  for (auto& l : layers_)
    for (const Tensor* t : {&l.k, &l.v}) {
      float* base = t->data<float>();
      std::memcpy(base + size_t(dst) * block_elems, base + size_t(src) * block_elems, block_elems * 4);
    }
}

}  // namespace augur
