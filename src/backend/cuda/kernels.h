// CUDA kernels behind backend/ops.h, as plain host-callable functions over raw
// device pointers (no CUDA headers here, so ops.cpp compiles without nvcc).
//
// Conventions: activations f32, weights and the KV cache bf16 (raw uint16_t
// bits), accumulation f32. Every launch goes on `stream` and depends on sizes
// only (never on data such as context lengths), so a decode step can be
// captured once in a CUDA graph and replayed with new metadata. Errors from
// CUDA are checked and thrown as augur::Error naming the kernel.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

struct CUstream_st;

namespace augur::cuda {

using Stream = CUstream_st*;
using bf16_bits = uint16_t;

// The process's CUDA state: device, the stream every op runs on, cuBLASLt
// handle and workspace. Created on first use; throws if no GPU is present.
struct Context;
Context& context();
Stream stream();
bool available();           // a GPU is present and usable (never throws)
void synchronize();         // waits for the stream; throws on a pending error

// y[m, n] = sum_k x[m, k] * w[n, k].  x: [M, K] f32 (row stride ldx);
// w: [N, K] bf16 contiguous; y: [M, N] f32 (row stride ldy).
// M <= 2: a bandwidth-bound skinny kernel (f32 products); larger M: tensor
// cores (cuBLASLt on a bf16 copy of x, f32 output).
void matmul_bf16(const float* x, int64_t M, int64_t K, int64_t ldx, const bf16_bits* w, int64_t N,
                 float* y, int64_t ldy, Stream s);

// The tensor-core path in two halves, so that projections sharing an input
// (q/k/v, gate/up) convert it to bf16 once. xb: [M, K] bf16 contiguous.
void to_bf16(const float* x, int64_t M, int64_t K, int64_t ldx, bf16_bits* xb, Stream s);
void matmul_bf16_xb(const bf16_bits* xb, int64_t M, int64_t K, const bf16_bits* w, int64_t N, float* y,
                    int64_t ldy, Stream s);

// out[t, :] = table[ids[t], :].  table: [n_vocab, d_model] bf16; ids: [n_tokens]
void embedding(const bf16_bits* table, int64_t d_model, const int32_t* ids, int64_t n_tokens,
               float* out, Stream s);

// Per row y = x * rsqrt(mean(x^2) + eps) * w.  x, y: [M, D] (may alias); w: [D] f32
void rms_norm(const float* x, const float* w, float eps, int64_t M, int64_t D, float* y, Stream s);

void add_inplace(float* a, const float* b, int64_t n, Stream s);               // a += b
void swiglu(const float* gate, const float* up, float* out, int64_t n, Stream s);  // silu(g) * u

// Rotate-half RoPE in place on the first 2*half dims of each head.
// x: [n_tokens, n_head, head_dim] f32; positions: [n_tokens]; inv_freq: [half] f32
void rope(float* x, int64_t n_tokens, int64_t n_head, int64_t head_dim, const int32_t* positions,
          const float* inv_freq, int64_t half, Stream s);

// Where each token of a batch sits, on the device (uploaded once per forward).
struct AttnMeta {
  const int32_t* positions = nullptr;     // [n_tokens] position of each token in its row
  const int32_t* slot_mapping = nullptr;  // [n_tokens] cache slot = block * block_size + offset
  const int32_t* token_row = nullptr;     // [n_tokens] row of each token
  const int32_t* block_tables = nullptr;  // [n_rows, max_blocks] block ids of each row
  int32_t max_blocks = 0;                 // row stride of block_tables
  int32_t n_tokens = 0;
  int32_t max_context = 0;                // upper bound on position + 1 (sizes the grid)
  int32_t max_row_tokens = 0;             // most tokens of any one row; 1 = a pure decode batch
                                          // (0 = unknown: the path follows n_tokens alone)
};

// k, v: [n_tokens, kv_dim] f32 -> caches [n_blocks, block_size, kv_dim] bf16 at slot_mapping.
void store_kv(const float* k, const float* v, int64_t kv_dim, const AttnMeta& meta,
              bf16_bits* k_cache, bf16_bits* v_cache, Stream s);

// Causal GQA attention over the paged cache: token t at position p attends to
// positions [max(0, p - window + 1), p] of its row (window 0 = unlimited).
// q, out: [n_tokens, n_head, head_dim] f32; caches [n_blocks, block_size, n_head_kv, head_dim] bf16.
// Path: n_tokens <= 8 or max_row_tokens == 1 -> flash-decoding (the context
// split across blocks, partial results in `workspace`, which must hold
// attention_workspace_bytes() bytes); otherwise a tiled tensor-core kernel
// (FlashAttention-2 style, Q and P rounded to bf16). head_dim: 16, 32, 64,
// 128 or 256; n_head / n_head_kv <= 128.
size_t attention_workspace_bytes(int64_t n_tokens, int64_t n_head, int64_t head_dim, int64_t max_context);
void paged_attention(const float* q, const bf16_bits* k_cache, const bf16_bits* v_cache,
                     int64_t block_size, int64_t n_head, int64_t n_head_kv, int64_t head_dim,
                     const AttnMeta& meta, float scale, int32_t window, float* out, void* workspace,
                     Stream s);

// out[r] = argmax over logits[r, :] (first index on ties). logits: [n_rows, n_vocab]
void argmax(const float* logits, int64_t n_rows, int64_t n_vocab, int32_t* out, Stream s);

}  // namespace augur::cuda

namespace augur::cuda {

// CUDA graphs of the backend stream: everything launched between
// begin_capture() and end_capture() is recorded, not run, and replays with
// launch() (same pointers, same sizes). Decode steps are captured once per
// batch shape, so a step costs one launch instead of hundreds.
class Graph;
struct GraphDeleter {
  void operator()(Graph* g) const;
};
using GraphPtr = std::unique_ptr<Graph, GraphDeleter>;
void begin_capture();
GraphPtr end_capture();
// Ends a capture that went wrong (an exception mid-way), discarding it.
void abort_capture() noexcept;
void launch(Graph& g);

}  // namespace augur::cuda
