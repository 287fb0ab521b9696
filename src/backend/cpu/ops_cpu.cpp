#include "backend/cpu/ops_cpu.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/thread_pool.h"

namespace augur::cpu {

namespace {

// Enough work per chunk that a parallel region pays for its dispatch.
constexpr int64_t kElemGrain = 1 << 14;

}  // namespace

void embedding(const void* table, DType dtype, int64_t d_model, std::span<const int32_t> ids,
               float* out) {
  for (size_t t = 0; t < ids.size(); ++t) {
    float* dst = out + int64_t(t) * d_model;
    if (dtype == DType::F32) {
      std::memcpy(dst, static_cast<const float*>(table) + int64_t(ids[t]) * d_model,
                  size_t(d_model) * 4);
    } else {
      const uint16_t* src = static_cast<const uint16_t*>(table) + int64_t(ids[t]) * d_model;
      if (dtype == DType::BF16)
        for (int64_t i = 0; i < d_model; ++i) dst[i] = bf16_to_f32(src[i]);
      else
        for (int64_t i = 0; i < d_model; ++i) dst[i] = f16_to_f32(src[i]);
    }
  }
}

// Reference: LlamaRMSNorm.forward (variance in f32, x * rsqrt(var + eps) * w).
void rms_norm(const float* x, const float* w, float eps, int64_t M, int64_t D, float* y) {
  ThreadPool::global().parallel_for(M, std::max<int64_t>(1, kElemGrain / D), [&](int64_t b, int64_t e) {
    for (int64_t m = b; m < e; ++m) {
      const float* xr = x + m * D;
      float* yr = y + m * D;
      double ss = 0;
      for (int64_t i = 0; i < D; ++i) ss += double(xr[i]) * xr[i];
      float inv = 1.0f / std::sqrt(float(ss / double(D)) + eps);
      for (int64_t i = 0; i < D; ++i) yr[i] = w[i] * (xr[i] * inv);
    }
  });
}

void add_inplace(float* a, const float* b, int64_t n) {
  ThreadPool::global().parallel_for(n, kElemGrain, [&](int64_t s, int64_t e) {
    for (int64_t i = s; i < e; ++i) a[i] += b[i];
  });
}

void swiglu(const float* gate, const float* up, float* out, int64_t n) {
  ThreadPool::global().parallel_for(n, kElemGrain, [&](int64_t s, int64_t e) {
    for (int64_t i = s; i < e; ++i) {
      float g = gate[i];
      out[i] = g / (1.0f + std::exp(-g)) * up[i];
    }
  });
}

void add_rms_norm(float* x, const float* o, const float* w, float eps, int64_t M, int64_t D, float* h) {
  add_inplace(x, o, M * D);
  rms_norm(x, w, eps, M, D, h);
}

void swiglu_packed(const float* gate_up, int64_t M, int64_t D, float* out) {
  for (int64_t m = 0; m < M; ++m) swiglu(gate_up + m * 2 * D, gate_up + m * 2 * D + D, out + m * D, D);
}

void apply_penalties(float* logits, int64_t n_vocab, std::span<const ops::PenaltyEntry> entries) {
  for (const auto& e : entries) {
    float& l = logits[int64_t(e.row) * n_vocab + e.token];
    float v = l;
    if (e.repetition != 1.0f) v = v > 0 ? v / e.repetition : v * e.repetition;
    l = v - e.subtract;
  }
}

namespace {

// Rank order of logits: larger first, NaN last (the key of the CUDA kernel).
uint32_t order_key(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0;
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

}  // namespace

// The reference for the CUDA sample_kernel: the same cuts (found here by
// sorting), the same fixed-point top-p mass, the same walk in id order.
void sample_weights(const float* row, int64_t V, const ops::SampleRow& p, float* w) {
  int32_t best = 0;
  float bv = -INFINITY;
  for (int64_t j = 0; j < V; ++j)
    if (row[j] > bv) bv = row[j], best = int32_t(j);
  std::fill_n(w, V, 0.0f);
  if (!(p.temperature > 0.f) || !std::isfinite(bv)) {
    w[best] = 1.0f;
    return;
  }
  const float inv_t = 1.0f / p.temperature, mx = bv * inv_t;
  // A temperature so small that 1 / t or the top logit over t overflows is
  // greedy (every weight would be inf - inf); the CUDA kernel falls back to
  // the best token in that case too.
  if (!std::isfinite(inv_t) || !std::isfinite(mx)) {
    w[best] = 1.0f;
    return;
  }
  auto weight = [&](int32_t j) { return std::exp(row[j] * inv_t - mx); };
  auto fixed = [](float x) { return static_cast<uint64_t>(x * 1099511627776.0f); };
  std::vector<int32_t> order(static_cast<size_t>(V));
  for (int64_t j = 0; j < V; ++j) order[size_t(j)] = int32_t(j);
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    const uint32_t ka = order_key(row[a]), kb = order_key(row[b]);
    return ka > kb || (ka == kb && a < b);
  });
  int64_t n_keep = p.top_k > 0 && p.top_k < V ? p.top_k : V;
  if (p.top_p < 1.0f) {
    uint64_t z = 0;
    for (int64_t i = 0; i < n_keep; ++i) z += fixed(weight(order[size_t(i)]));
    const double target = double(p.top_p) * double(z);
    uint64_t run = 0;
    for (int64_t i = 0; i < n_keep; ++i) {
      run += fixed(weight(order[size_t(i)]));
      if (double(run) >= target) {
        n_keep = i + 1;
        break;
      }
    }
  }
  for (int64_t i = 0; i < n_keep; ++i) {
    const int32_t j = order[size_t(i)];
    const float x = weight(j);
    w[j] = x >= p.min_p ? x : 0.f;
  }
}

int32_t sample_walk(const float* w, int64_t V, float uniform) {
  float total = 0;
  int32_t last = -1;
  for (int64_t j = 0; j < V; ++j) {
    total += w[j];
    if (w[j] > 0) last = int32_t(j);
  }
  float rest = uniform * total;
  for (int64_t j = 0; j < V; ++j) {
    if (w[j] > 0 && rest < w[j]) return int32_t(j);
    rest -= w[j];
  }
  return last;
}

void sample(const float* logits, int64_t n_vocab, std::span<const ops::SampleRow> rows, int32_t* out) {
  std::vector<float> w(static_cast<size_t>(n_vocab));
  for (size_t r = 0; r < rows.size(); ++r) {
    sample_weights(logits + int64_t(r) * n_vocab, n_vocab, rows[r], w.data());
    out[r] = sample_walk(w.data(), n_vocab, rows[r].uniform);
  }
}

// Reference: apply_rotary_pos_emb with rotate_half; angles pos * inv_freq in f32
// as transformers' RotaryEmbedding computes them.
void rope(float* x, int64_t n_tokens, int64_t n_head, int64_t head_dim,
          std::span<const int32_t> positions, std::span<const float> inv_freq) {
  const int64_t half = int64_t(inv_freq.size());
  ThreadPool::global().parallel_for(n_tokens, std::max<int64_t>(1, 64 / n_head), [&](int64_t b, int64_t e) {
    std::vector<float> cs(static_cast<size_t>(2 * half));
    for (int64_t t = b; t < e; ++t) {
      const float pos = float(positions[size_t(t)]);
      for (int64_t i = 0; i < half; ++i) {
        float angle = pos * inv_freq[size_t(i)];
        cs[size_t(i)] = std::cos(angle);
        cs[size_t(half + i)] = std::sin(angle);
      }
      for (int64_t h = 0; h < n_head; ++h) {
        float* v = x + (t * n_head + h) * head_dim;
        for (int64_t i = 0; i < half; ++i) {
          float x1 = v[i], x2 = v[i + half];
          float c = cs[size_t(i)], s = cs[size_t(half + i)];
          v[i] = x1 * c - x2 * s;
          v[i + half] = x2 * c + x1 * s;
        }
      }
    }
  });
}

void store_kv(const float* k, const float* v, int64_t kv_dim, std::span<const ops::AttnRow> rows,
              int64_t block_size, float* k_cache, float* v_cache) {
  for (const auto& row : rows) {
    for (int32_t i = 0; i < row.n_tokens; ++i) {
      int64_t p = row.pos0 + i;
      int64_t slot = int64_t(row.block_table[size_t(p / block_size)]) * block_size + p % block_size;
      int64_t t = row.token_begin + i;
      std::memcpy(k_cache + slot * kv_dim, k + t * kv_dim, size_t(kv_dim) * 4);
      std::memcpy(v_cache + slot * kv_dim, v + t * kv_dim, size_t(kv_dim) * 4);
    }
  }
}

namespace {

// The attention inner loops, cloned per instruction set (this file is built
// for baseline x86-64): 16 partial sums in a fixed order, so every clone
// gives the same bits and the loop vectorizes.
__attribute__((target_clones("avx512f", "avx2", "default")))
float dot(const float* a, const float* b, int64_t n) {
  float acc[16] = {};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    for (int j = 0; j < 16; ++j) acc[j] += a[i + j] * b[i + j];
  float s = 0;
  for (; i < n; ++i) s += a[i] * b[i];
  for (int j = 0; j < 16; ++j) s += acc[j];
  return s;
}

// y += a * x
__attribute__((target_clones("avx512f", "avx2", "default")))
void axpy(float* y, const float* x, float a, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}

}  // namespace

// Reference: eager_attention_forward (softmax in f32 over scaled q·k, then ·v).
void paged_attention(const float* q, const float* k_cache, const float* v_cache,
                     int64_t block_size, int64_t n_head, int64_t n_head_kv, int64_t head_dim,
                     std::span<const ops::AttnRow> rows, float scale, int32_t window, float* out) {
  // Flatten (row, token, head) into jobs; the token's row is found by lookup.
  std::vector<int32_t> token_row;
  for (size_t r = 0; r < rows.size(); ++r)
    for (int32_t i = 0; i < rows[r].n_tokens; ++i) token_row.push_back(int32_t(r));
  const int64_t n_tokens = int64_t(token_row.size());
  const int64_t group = n_head / n_head_kv;
  const int64_t kv_dim = n_head_kv * head_dim;
  ThreadPool::global().parallel_for(n_tokens * n_head, 1, [&](int64_t jb, int64_t je) {
    std::vector<float> scores;
    std::vector<float> acc(static_cast<size_t>(head_dim));
    for (int64_t job = jb; job < je; ++job) {
      const int64_t t = job / n_head, h = job % n_head, kvh = h / group;
      const ops::AttnRow& row = rows[size_t(token_row[size_t(t)])];
      const int64_t p = row.pos0 + (t - row.token_begin);
      const int64_t lo = window > 0 ? std::max<int64_t>(0, p - window + 1) : 0;
      const float* qv = q + (t * n_head + h) * head_dim;
      scores.resize(size_t(p - lo + 1));
      float mx = -INFINITY;
      for (int64_t j = lo; j <= p; ++j) {
        int64_t slot = int64_t(row.block_table[size_t(j / block_size)]) * block_size + j % block_size;
        const float* kv = k_cache + slot * kv_dim + kvh * head_dim;
        float s = dot(qv, kv, head_dim);
        s *= scale;
        scores[size_t(j - lo)] = s;
        mx = std::max(mx, s);
      }
      float sum = 0;
      for (auto& s : scores) {
        s = std::exp(s - mx);
        sum += s;
      }
      const float inv = 1.0f / sum;
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int64_t j = lo; j <= p; ++j) {
        int64_t slot = int64_t(row.block_table[size_t(j / block_size)]) * block_size + j % block_size;
        const float* vv = v_cache + slot * kv_dim + kvh * head_dim;
        const float w = scores[size_t(j - lo)] * inv;
        axpy(acc.data(), vv, w, head_dim);
      }
      std::memcpy(out + (t * n_head + h) * head_dim, acc.data(), size_t(head_dim) * 4);
    }
  });
}

}  // namespace augur::cpu
