#include "backend/cpu/linear_attn_cpu.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/thread_pool.h"

namespace augur::cpu {

namespace {

// Enough work per chunk that a parallel region pays for its dispatch.
constexpr int64_t kElemGrain = 1 << 14;

inline float silu(float x) { return x / (1.0f + std::exp(-x)); }
inline float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }
// torch.nn.functional.softplus with beta 1, threshold 20.
inline float softplus(float x) { return x > 20.0f ? x : std::log1p(std::exp(x)); }

}  // namespace

void slice_cols(const float* x, int64_t M, int64_t N, int64_t begin, int64_t n, float* y) {
  ThreadPool::global().parallel_for(M, std::max<int64_t>(1, kElemGrain / std::max<int64_t>(1, n)),
                                    [&](int64_t b, int64_t e) {
                                      for (int64_t m = b; m < e; ++m)
                                        std::memcpy(y + m * n, x + m * N + begin, size_t(n) * 4);
                                    });
}

void keep_recurrent_inputs(const float* proj, int64_t P, int64_t n_conv, int64_t n_z,
                           std::span<const ops::RecurrentRow> rows, const int32_t* positions, int64_t n_pos,
                           int64_t width, float* inputs) {
  const int64_t n_gates = width - n_conv;  // b, then a
  for (const auto& row : rows) {
    if (row.n_tokens < 2 || row.n_tokens > n_pos) continue;
    for (int64_t i = 0; i < row.n_tokens; ++i) {
      const int64_t t = int64_t(row.token_begin) + i;
      const float* src = proj + t * P;
      float* dst = inputs + (int64_t(row.slot) * n_pos + positions[t] % n_pos) * width;
      std::memcpy(dst, src, size_t(n_conv) * 4);
      std::memcpy(dst + n_conv, src + n_conv + n_z, size_t(n_gates) * 4);
    }
  }
}

// Reference: causal_conv1d_update (cached decode) and causal_conv1d_fn over the
// kept tail followed by the new inputs; the sum over taps runs j = 0 .. K-1.
void causal_conv1d(const float* x, int64_t ldx, const float* w, int64_t C, int64_t K,
                   std::span<const ops::RecurrentRow> rows, float* conv_state, bool silu_out,
                   float* out) {
  const int64_t tail = K - 1;
  ThreadPool::global().parallel_for(C, 64, [&](int64_t cb, int64_t ce) {
    for (const auto& row : rows) {
      if (row.n_tokens <= 0) continue;
      float* st = conv_state + int64_t(row.slot) * tail * C;  // [K-1, C]
      const float* xr = x + int64_t(row.token_begin) * ldx;     // [n, C] at stride ldx
      float* orow = out + int64_t(row.token_begin) * C;
      const int64_t n = row.n_tokens;
      // input m of the row: m < 0 reads the kept tail, m >= 0 the new tokens
      auto in = [&](int64_t m, int64_t c) { return m >= 0 ? xr[m * ldx + c] : st[(tail + m) * C + c]; };
      for (int64_t i = 0; i < n; ++i) {
        for (int64_t c = cb; c < ce; ++c) {
          const float* wc = w + c * K;
          float acc = 0.0f;
          for (int64_t j = 0; j < K; ++j) acc += wc[j] * in(i - tail + j, c);
          orow[i * C + c] = silu_out ? silu(acc) : acc;
        }
      }
      // New tail = the last K-1 inputs. Ascending p reads index p + n > p of
      // the old tail, so updating in place is safe.
      for (int64_t p = 0; p < tail; ++p)
        for (int64_t c = cb; c < ce; ++c) st[p * C + c] = in(n - tail + p, c);
    }
  });
}

void l2norm(const float* x, float eps, int64_t M, int64_t D, float* y) {
  ThreadPool::global().parallel_for(M, std::max<int64_t>(1, kElemGrain / D), [&](int64_t b, int64_t e) {
    for (int64_t m = b; m < e; ++m) {
      const float* xr = x + m * D;
      float* yr = y + m * D;
      double ss = 0;
      for (int64_t i = 0; i < D; ++i) ss += double(xr[i]) * xr[i];
      const float inv = 1.0f / std::sqrt(float(ss) + eps);
      for (int64_t i = 0; i < D; ++i) yr[i] = xr[i] * inv;
    }
  });
}

void delta_rule_gates(const float* a, const float* b, const float* a_log, const float* dt_bias,
                      int64_t n_tokens, int64_t n_head, float* g, float* beta) {
  for (int64_t t = 0; t < n_tokens; ++t)
    for (int64_t h = 0; h < n_head; ++h) {
      const int64_t i = t * n_head + h;
      g[i] = -std::exp(a_log[h]) * softplus(a[i] + dt_bias[h]);
      beta[i] = sigmoid(b[i]);
    }
}

// The ops the chunked form's inputs took in turn (slices of proj, the conv,
// slices of its output, l2norm, delta_rule_gates), row by row, in their
// arithmetic: the same bits.
void delta_rule_inputs(const float* proj, int64_t P, int64_t ba_col, const float* conv_w, int64_t K,
                       const DeltaRuleDims& d, const float* a_log, const float* dt_bias, float qk_eps,
                       std::span<const ops::RecurrentRow> rows, float* conv_state, float* q, float* k, float* v,
                       float* g, float* beta) {
  const int64_t Qd = d.n_head_k * d.head_dim_k, Vd = d.n_head * d.head_dim_v, C = 2 * Qd + Vd, H = d.n_head;
  std::vector<float> conv;
  for (const auto& row : rows) {
    if (row.n_tokens <= 0) continue;
    const int64_t t0 = row.token_begin, n = row.n_tokens;
    conv.resize(size_t(n * C));
    const ops::RecurrentRow local{0, row.n_tokens, row.slot};
    causal_conv1d(proj + t0 * P, P, conv_w, C, K, {&local, 1}, conv_state, true, conv.data());
    for (int64_t i = 0; i < n; ++i) {
      const float* c = conv.data() + i * C;
      std::memcpy(q + (t0 + i) * Qd, c, size_t(Qd) * 4);
      std::memcpy(k + (t0 + i) * Qd, c + Qd, size_t(Qd) * 4);
      std::memcpy(v + (t0 + i) * Vd, c + 2 * Qd, size_t(Vd) * 4);
    }
    l2norm(q + t0 * Qd, qk_eps, n * d.n_head_k, d.head_dim_k, q + t0 * Qd);
    l2norm(k + t0 * Qd, qk_eps, n * d.n_head_k, d.head_dim_k, k + t0 * Qd);
    std::vector<float> a(size_t(n * H)), b(size_t(n * H));
    for (int64_t i = 0; i < n; ++i) {
      std::memcpy(b.data() + i * H, proj + (t0 + i) * P + ba_col, size_t(H) * 4);
      std::memcpy(a.data() + i * H, proj + (t0 + i) * P + ba_col + H, size_t(H) * 4);
    }
    delta_rule_gates(a.data(), b.data(), a_log, dt_bias, n, H, g + t0 * H, beta + t0 * H);
  }
}

namespace {

// One job per (row, value head): the recurrence of one head of one sequence.
// `fn(row, head, work)` gets scratch floats reused across the jobs of a thread.
template <typename Fn>
void for_each_row_head(std::span<const ops::RecurrentRow> rows, int64_t n_head, Fn&& fn) {
  const int64_t n_jobs = int64_t(rows.size()) * n_head;
  ThreadPool::global().parallel_for(n_jobs, 1, [&](int64_t jb, int64_t je) {
    std::vector<float> work;
    for (int64_t job = jb; job < je; ++job) fn(rows[size_t(job / n_head)], job % n_head, work);
  });
}

}  // namespace

// Reference: torch_recurrent_gated_delta_rule (per token: decay, read, delta
// write, read out).
void gated_delta_rule_recurrent(const float* q, const float* k, const float* v, const float* g,
                                const float* beta, float scale, const DeltaRuleDims& d,
                                std::span<const ops::RecurrentRow> rows, float* state, float* out) {
  const int64_t dk = d.head_dim_k, dv = d.head_dim_v, group = d.n_head / d.n_head_k;
  for_each_row_head(rows, d.n_head, [&](const ops::RecurrentRow& row, int64_t h, std::vector<float>& work) {
    const int64_t hk = h / group;
    float* S = state + (int64_t(row.slot) * d.n_head + h) * dk * dv;  // [dk, dv]
    work.resize(size_t(2 * dv));
    float* kv_mem = work.data();
    float* delta = kv_mem + dv;
    for (int64_t i = 0; i < row.n_tokens; ++i) {
      const int64_t t = row.token_begin + i;
      const float* qt = q + (t * d.n_head_k + hk) * dk;
      const float* kt = k + (t * d.n_head_k + hk) * dk;
      const float* vt = v + (t * d.n_head + h) * dv;
      float* ot = out + (t * d.n_head + h) * dv;
      const float decay = std::exp(g[t * d.n_head + h]);
      const float b = beta[t * d.n_head + h];
      std::fill(kv_mem, kv_mem + dv, 0.0f);
      for (int64_t a = 0; a < dk; ++a) {
        float* Sa = S + a * dv;
        const float ka = kt[a];
        for (int64_t j = 0; j < dv; ++j) {
          Sa[j] *= decay;
          kv_mem[j] += Sa[j] * ka;
        }
      }
      for (int64_t j = 0; j < dv; ++j) delta[j] = (vt[j] - kv_mem[j]) * b;
      std::fill(ot, ot + dv, 0.0f);
      for (int64_t a = 0; a < dk; ++a) {
        float* Sa = S + a * dv;
        const float ka = kt[a], qa = qt[a] * scale;
        for (int64_t j = 0; j < dv; ++j) {
          Sa[j] += ka * delta[j];
          ot[j] += Sa[j] * qa;
        }
      }
    }
  });
}

// Reference: torch_chunk_gated_delta_rule. Within a chunk of L tokens with
// cumulative log-decay gc, the UT transform solves (I + A) U = beta v and
// (I + A) W = beta k exp(gc), A[i][j] = beta_i (k_i·k_j) exp(gc_i - gc_j) for
// j < i; then v_new = U - W S, the output is the read of the old state plus the
// causal intra-chunk attention over v_new, and the state advances once per chunk.
// A last partial chunk is computed as is: the reference's zero padding adds
// nothing to the outputs or the state.
void gated_delta_rule_chunked(const float* q, const float* k, const float* v, const float* g,
                              const float* beta, float scale, int64_t chunk_size,
                              const DeltaRuleDims& d, std::span<const ops::RecurrentRow> rows,
                              float* state, float* out) {
  const int64_t dk = d.head_dim_k, dv = d.head_dim_v, group = d.n_head / d.n_head_k;
  const int64_t C = chunk_size;
  for_each_row_head(rows, d.n_head, [&](const ops::RecurrentRow& row, int64_t h, std::vector<float>& work) {
    const int64_t hk = h / group;
    float* S = state + (int64_t(row.slot) * d.n_head + h) * dk * dv;  // [dk, dv]
    // Per chunk: gc [C], U, vn [C, dv], W, qs, kb [C, dk], acc [dv].
    work.resize(size_t(C + 2 * C * dv + 3 * C * dk + dv));
    float* gc = work.data();
    float* U = gc + C;
    float* vn = U + C * dv;
    float* W = vn + C * dv;
    float* qs = W + C * dk;
    float* kb = qs + C * dk;
    float* acc = kb + C * dk;
    std::vector<const float*> kp(static_cast<size_t>(C));
    for (int64_t c0 = 0; c0 < row.n_tokens; c0 += C) {
      const int64_t L = std::min(C, int64_t(row.n_tokens) - c0);
      const int64_t t0 = row.token_begin + c0;
      float cum = 0.0f;
      for (int64_t i = 0; i < L; ++i) {
        const int64_t t = t0 + i;
        cum += g[t * d.n_head + h];
        gc[i] = cum;
        const float b = beta[t * d.n_head + h];
        const float* qt = q + (t * d.n_head_k + hk) * dk;
        const float* kt = k + (t * d.n_head_k + hk) * dk;
        const float* vt = v + (t * d.n_head + h) * dv;
        kp[size_t(i)] = kt;
        for (int64_t a = 0; a < dk; ++a) {
          qs[i * dk + a] = qt[a] * scale;
          kb[i * dk + a] = kt[a] * b;
        }
        for (int64_t j = 0; j < dv; ++j) U[i * dv + j] = vt[j] * b;
      }
      // Forward substitution for U and W, A[i][j] made as it is used.
      for (int64_t i = 0; i < L; ++i) {
        const float ei = std::exp(gc[i]);
        float* Wi = W + i * dk;
        for (int64_t a = 0; a < dk; ++a) Wi[a] = kb[i * dk + a] * ei;
        float* Ui = U + i * dv;
        for (int64_t j = 0; j < i; ++j) {
          const float* kj = kp[size_t(j)];
          float dot = 0.0f;
          for (int64_t a = 0; a < dk; ++a) dot += kb[i * dk + a] * kj[a];
          const float aij = dot * std::exp(gc[i] - gc[j]);
          const float* Uj = U + j * dv;
          for (int64_t x = 0; x < dv; ++x) Ui[x] -= aij * Uj[x];
          const float* Wj = W + j * dk;
          for (int64_t a = 0; a < dk; ++a) Wi[a] -= aij * Wj[a];
        }
      }
      // v_new = U - W S
      for (int64_t i = 0; i < L; ++i) {
        float* vni = vn + i * dv;
        std::memcpy(vni, U + i * dv, size_t(dv) * 4);
        const float* Wi = W + i * dk;
        for (int64_t a = 0; a < dk; ++a) {
          const float w = Wi[a];
          const float* Sa = S + a * dv;
          for (int64_t x = 0; x < dv; ++x) vni[x] -= w * Sa[x];
        }
      }
      // out_i = exp(gc_i) (q_i S) + sum_{j <= i} (q_i·k_j) exp(gc_i - gc_j) v_new_j
      for (int64_t i = 0; i < L; ++i) {
        const float* qi = qs + i * dk;
        std::fill(acc, acc + dv, 0.0f);
        for (int64_t a = 0; a < dk; ++a) {
          const float qa = qi[a];
          const float* Sa = S + a * dv;
          for (int64_t x = 0; x < dv; ++x) acc[x] += qa * Sa[x];
        }
        const float ei = std::exp(gc[i]);
        float* ot = out + ((t0 + i) * d.n_head + h) * dv;
        for (int64_t x = 0; x < dv; ++x) ot[x] = acc[x] * ei;
        for (int64_t j = 0; j <= i; ++j) {
          const float* kj = kp[size_t(j)];
          float dot = 0.0f;
          for (int64_t a = 0; a < dk; ++a) dot += qi[a] * kj[a];
          const float w = dot * std::exp(gc[i] - gc[j]);
          const float* vnj = vn + j * dv;
          for (int64_t x = 0; x < dv; ++x) ot[x] += w * vnj[x];
        }
      }
      // S <- exp(gc_last) S + sum_i (k_i exp(gc_last - gc_i)) ⊗ v_new_i
      const float last = gc[L - 1], el = std::exp(last);
      for (int64_t a = 0; a < dk; ++a) {
        float* Sa = S + a * dv;
        for (int64_t x = 0; x < dv; ++x) Sa[x] *= el;
      }
      for (int64_t i = 0; i < L; ++i) {
        const float* ki = kp[size_t(i)];
        const float di = std::exp(last - gc[i]);
        const float* vni = vn + i * dv;
        for (int64_t a = 0; a < dk; ++a) {
          const float ka = ki[a] * di;
          float* Sa = S + a * dv;
          for (int64_t x = 0; x < dv; ++x) Sa[x] += ka * vni[x];
        }
      }
    }
  });
}

// Reference: Qwen3NextRMSNormGated.forward (norm before gate, weight γ as stored).
void gated_rms_norm(const float* x, const float* z, int64_t z_width, int64_t ldz, const float* w, float eps,
                    int64_t M, int64_t D, float* y) {
  const int64_t per = z_width / D;  // x rows a z row gates
  ThreadPool::global().parallel_for(M, std::max<int64_t>(1, kElemGrain / D), [&](int64_t b, int64_t e) {
    for (int64_t m = b; m < e; ++m) {
      const float* xr = x + m * D;
      const float* zr = z + (m / per) * ldz + (m % per) * D;
      float* yr = y + m * D;
      double ss = 0;
      for (int64_t i = 0; i < D; ++i) ss += double(xr[i]) * xr[i];
      const float inv = 1.0f / std::sqrt(float(ss / double(D)) + eps);
      for (int64_t i = 0; i < D; ++i) yr[i] = w[i] * (xr[i] * inv) * silu(zr[i]);
    }
  });
}

void sigmoid_mul(const float* x, const float* gate, bool per_row, int64_t M, int64_t N, float* y) {
  ThreadPool::global().parallel_for(M, std::max<int64_t>(1, kElemGrain / N), [&](int64_t b, int64_t e) {
    for (int64_t m = b; m < e; ++m) {
      const float* xr = x + m * N;
      float* yr = y + m * N;
      if (per_row) {
        const float s = sigmoid(gate[m]);
        for (int64_t i = 0; i < N; ++i) yr[i] = xr[i] * s;
      } else {
        const float* gr = gate + m * N;
        for (int64_t i = 0; i < N; ++i) yr[i] = xr[i] * sigmoid(gr[i]);
      }
    }
  });
}

}  // namespace augur::cpu
