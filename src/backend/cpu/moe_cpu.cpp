#include "backend/cpu/moe_cpu.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>

namespace augur::cpu {

// Reference: Qwen3NextTopKRouter.forward (softmax in f32, torch.topk, then the
// optional renormalisation of the kept probabilities).
void moe_route(const float* logits, int64_t n_tokens, int64_t n_expert, int64_t top_k, bool normalize,
               float* weights, int32_t* ids) {
  std::vector<float> p(static_cast<size_t>(n_expert));
  std::vector<int32_t> order(static_cast<size_t>(n_expert));
  for (int64_t t = 0; t < n_tokens; ++t) {
    const float* l = logits + t * n_expert;
    const float mx = *std::max_element(l, l + n_expert);
    float sum = 0.0f;
    for (int64_t e = 0; e < n_expert; ++e) {
      p[size_t(e)] = std::exp(l[e] - mx);
      sum += p[size_t(e)];
    }
    for (auto& x : p) x /= sum;
    std::iota(order.begin(), order.end(), 0);
    // Larger probability first; equal ones by expert id.
    std::partial_sort(order.begin(), order.begin() + top_k, order.end(), [&](int32_t a, int32_t b) {
      return p[size_t(a)] > p[size_t(b)] || (p[size_t(a)] == p[size_t(b)] && a < b);
    });
    float kept = 0.0f;
    for (int64_t i = 0; i < top_k; ++i) kept += p[size_t(order[size_t(i)])];
    for (int64_t i = 0; i < top_k; ++i) {
      const int32_t e = order[size_t(i)];
      ids[t * top_k + i] = e;
      weights[t * top_k + i] = normalize ? p[size_t(e)] / kept : p[size_t(e)];
    }
  }
}

void gather_rows(const float* x, int64_t N, std::span<const int32_t> idx, float* out) {
  for (size_t i = 0; i < idx.size(); ++i)
    std::memcpy(out + int64_t(i) * N, x + int64_t(idx[i]) * N, size_t(N) * 4);
}

void scatter_add_rows(const float* x, int64_t N, std::span<const int32_t> idx,
                      std::span<const float> scale, float* out) {
  for (size_t i = 0; i < idx.size(); ++i) {
    const float* xr = x + int64_t(i) * N;
    float* o = out + int64_t(idx[i]) * N;
    const float s = scale[i];
    for (int64_t n = 0; n < N; ++n) o[n] += xr[n] * s;
  }
}

}  // namespace augur::cpu
