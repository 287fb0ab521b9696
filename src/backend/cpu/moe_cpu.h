// CPU kernels of mixture-of-experts routing and row gather/scatter, behind
// backend/ops.h (raw pointers; shapes checked by the caller).
#pragma once

#include <cstdint>
#include <span>

namespace augur::cpu {

// logits: [n_tokens, n_expert]; weights: [n_tokens, top_k]; ids: [n_tokens, top_k]
void moe_route(const float* logits, int64_t n_tokens, int64_t n_expert, int64_t top_k, bool normalize,
               float* weights, int32_t* ids);

// x: [M, N]; out: [len(idx), N]
void gather_rows(const float* x, int64_t N, std::span<const int32_t> idx, float* out);

// x: [len(idx), N]; out: [M, N]
void scatter_add_rows(const float* x, int64_t N, std::span<const int32_t> idx,
                      std::span<const float> scale, float* out);

}  // namespace augur::cpu
