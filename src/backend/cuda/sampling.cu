// Sampling on the GPU, so only token ids cross to the host.
//
// sample_kernel: one block of 1024 threads per row; the row (n_vocab floats)
// stays in L2 across its passes. Rank order is (logit desc, id asc); every
// filter keeps a prefix of it, so the kept set is "ranked at or above a cut"
// (a key and an id), found without sorting:
//   top-k: a radix select (4 passes of 8-bit digits over the order-preserving
//     key of each logit) of the k-th ranked token, counting tokens;
//   top-p: the same select weighted by each token's softmax weight
//     w = exp(l / T - max / T) in 2^-40 fixed point (integer atomics, so the
//     cut never depends on the order of additions), for the first token where
//     the mass ranked at or above it reaches top_p times the top-k mass;
//   min-p: w >= min_p (w of the top token is 1).
// Ties at a cut resolve by id, as the CPU sampler's sort does. The draw walks
// the kept tokens in id order (each warp a contiguous range, 32 ids a step)
// with float weights: same distribution as the CPU sampler, and the same
// token for the same inputs and uniform on every run.
#include <algorithm>

#include "backend/cuda/common.cuh"

namespace augur::cuda {
namespace {

// a beats b: larger value, or the same value at a smaller index (torch.argmax,
// runtime/sampler.cpp argmax). NaN never beats anything.
__device__ __forceinline__ bool better(float va, int ia, float vb, int ib) {
  return va > vb || (va == vb && ia < ib);
}

// The better of (bv, bi) and the other lanes' candidates, in every lane.
__device__ __forceinline__ void warp_best(float& bv, int& bi) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
    const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
    if (better(ov, oi, bv, bi)) bv = ov, bi = oi;
  }
}

// The block's best candidate, in thread 0. `none` is the index that loses to
// any real one.
__device__ __forceinline__ void block_best(float& bv, int& bi, int none) {
  __shared__ float sv[32];
  __shared__ int si[32];
  warp_best(bv, bi);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) sv[warp] = bv, si[warp] = bi;
  __syncthreads();
  if (warp == 0) {
    const int n_warps = int(blockDim.x >> 5);
    bv = lane < n_warps ? sv[lane] : -INFINITY;
    bi = lane < n_warps ? si[lane] : none;
    warp_best(bv, bi);
  }
}

// argmax over grid (P, n_rows): block (p, r) takes logits [p * per, (p + 1) *
// per) of row r; with P > 1 each block leaves its best in partials[r * P + p]
// (value bits, index) and the row's last block to arrive (counters[r], reset
// after) takes the best of them: one block a row would leave the GPU idle at
// batch 1. better() is a total order, so the result does not depend on the
// order of arrival.
// logits: [n_rows, n_vocab]; out: [n_rows]
constexpr int kArgmaxThreads = 256;
__global__ void __launch_bounds__(kArgmaxThreads)
    argmax_kernel(const float* __restrict__ logits, int64_t n_vocab, int64_t per, int2* __restrict__ partials,
                  int* __restrict__ counters, int32_t* __restrict__ out, int32_t* __restrict__ host_out) {
  pdl_entry();
  __shared__ bool last;
  const int P = int(gridDim.x), part = int(blockIdx.x), r = int(blockIdx.y);
  const float* row = logits + int64_t(r) * n_vocab;
  const int none = int(n_vocab);
  float bv = -INFINITY;
  int bi = none;
  const int64_t end = min(n_vocab, (part + 1) * per);
  for (int64_t i = part * per + threadIdx.x; i < end; i += blockDim.x) {
    const float v = row[i];
    if (better(v, int(i), bv, bi)) bv = v, bi = int(i);
  }
  block_best(bv, bi, none);
  if (P > 1) {
    if (threadIdx.x == 0) {
      partials[int64_t(r) * P + part] = make_int2(__float_as_int(bv), bi);
      __threadfence();
      last = atomicAdd(&counters[r], 1) == P - 1;
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    bv = -INFINITY, bi = none;
    for (int j = int(threadIdx.x); j < P; j += int(blockDim.x)) {
      const int2 c = __ldcg(&partials[int64_t(r) * P + j]);
      if (better(__int_as_float(c.x), c.y, bv, bi)) bv = __int_as_float(c.x), bi = c.y;
    }
    block_best(bv, bi, none);
  }
  // All -inf or NaN: index 0, as the CPU loop (which starts at 0) returns.
  if (threadIdx.x == 0) {
    out[r] = bi < none ? bi : 0;
    if (host_out != nullptr) host_out[r] = out[r];
    if (P > 1) counters[r] = 0;
  }
}

constexpr int kSampleThreads = 1024;
constexpr int kSampleWarps = kSampleThreads / 32;
constexpr float kFixedOne = 1099511627776.0f;  // 2^40: weights in fixed point

// Order-preserving key of a logit: larger float, larger key; NaN lowest.
__device__ __forceinline__ uint32_t order_key(float f) {
  const uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0;
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
__device__ __forceinline__ float key_value(uint32_t k) {
  return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

// Tokens ranked at or above the cut: key > key_cut, or key == key_cut and id <= id_cut.
struct Cut {
  uint32_t key;
  int id;
};
__device__ __forceinline__ bool within(uint32_t key, int id, Cut c) {
  return key > c.key || (key == c.key && id <= c.id);
}

struct SampleSmem {
  unsigned long long hist[256];
  unsigned long long red64[kSampleWarps];
  float redf[kSampleWarps];
  int redi[kSampleWarps];
  uint32_t redk[kSampleWarps];
  int warp_count[kSampleWarps];
  float warp_total[kSampleWarps];
  int warp_last[kSampleWarps];
  int digit;
  unsigned long long cum;
  int found;
  float r;
};

struct RowCtx {
  const float* row;
  int V;
  float inv_t;
  float mx;  // max logit * inv_t
  int chunk;  // ids per warp in ordered walks (a multiple of 32)
};

__device__ __forceinline__ float weight_of(float l, const RowCtx& x) { return expf(l * x.inv_t - x.mx); }
__device__ __forceinline__ unsigned long long fixed_of(float w) {
  return static_cast<unsigned long long>(w * kFixedOne);
}

__device__ unsigned long long block_sum_u64(unsigned long long v, SampleSmem& sm) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  if (lane == 0) sm.red64[warp] = v;
  __syncthreads();
  unsigned long long total = 0;
  for (int w = 0; w < kSampleWarps; ++w) total += sm.red64[w];
  __syncthreads();
  return total;
}

// The (n)-th (1-based) id, in id order, of the tokens with key == key and
// within `c`; every thread gets it. n >= 1 and at most the number of such tokens.
__device__ int nth_equal(const RowCtx& x, uint32_t key, Cut c, int n, SampleSmem& sm) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int begin = warp * x.chunk, end = min(x.V, begin + x.chunk);
  auto hit = [&](int j) { return j < end && order_key(x.row[j]) == key && within(key, j, c); };
  int count = 0;
  for (int j0 = begin; j0 < end; j0 += 32) count += __popc(__ballot_sync(0xffffffffu, hit(j0 + lane)));
  if (lane == 0) sm.warp_count[warp] = count;
  __syncthreads();
  if (threadIdx.x == 0) {
    int left = n, w = 0;
    while (w < kSampleWarps - 1 && left > sm.warp_count[w]) left -= sm.warp_count[w++];
    sm.digit = w;
    sm.found = left;
  }
  __syncthreads();
  if (warp == sm.digit) {
    int left = sm.found, id = -1;
    for (int j0 = begin; j0 < end && id < 0; j0 += 32) {
      const unsigned m = __ballot_sync(0xffffffffu, hit(j0 + lane));
      const int c2 = __popc(m);
      if (left <= c2) {
        // The lane holding the left-th set bit of m.
        const bool mine = ((m >> lane) & 1u) && __popc(m & ((1u << lane) - 1u)) == left - 1;
        id = j0 + __ffs(int(__ballot_sync(0xffffffffu, mine))) - 1;
      } else {
        left -= c2;
      }
    }
    __syncwarp();  // every lane has read sm.found before lane 0 overwrites it
    if (lane == 0) sm.found = id < 0 ? x.V - 1 : id;
  }
  __syncthreads();
  const int id = sm.found;
  __syncthreads();
  return id;
}

// Radix select in rank order among the tokens within `c`: the token at which
// the running total of contributions (1 each, or fixed-point weights when
// Weighted) first reaches `target`. Returns the cut that ends at that token.
template <bool Weighted>
__device__ Cut select_cut(const RowCtx& x, Cut c, double target, SampleSmem& sm) {
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  uint32_t prefix = 0, mask = 0;
  unsigned long long cum = 0, last_bucket = 0;
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int i = tid; i < 256; i += kSampleThreads) sm.hist[i] = 0;
    __syncthreads();
    for (int j = tid; j < x.V; j += kSampleThreads) {
      const float l = x.row[j];
      const uint32_t k = order_key(l);
      if ((k & mask) != prefix || !within(k, j, c)) continue;
      const unsigned long long add = Weighted ? fixed_of(weight_of(l, x)) : 1ull;
      if (add != 0) atomicAdd(&sm.hist[(k >> shift) & 255u], add);
    }
    __syncthreads();
    if (warp == 0) {
      // Lane l owns buckets 255 - 8l ... 248 - 8l (descending rank).
      unsigned long long own[8], s = 0;
#pragma unroll
      for (int e = 0; e < 8; ++e) own[e] = sm.hist[255 - 8 * lane - e], s += own[e];
      unsigned long long incl = s;
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const unsigned long long v = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += v;
      }
      const unsigned long long total = __shfl_sync(0xffffffffu, incl, 31);
      const double t = fmin(target, double(cum + total));  // rounding: never past the last bucket
      const unsigned hits = __ballot_sync(0xffffffffu, s > 0 && double(cum + incl) >= t);
      const int first = hits ? __ffs(int(hits)) - 1 : 31;
      if (lane == first) {
        unsigned long long run = cum + incl - s;
        int digit = 255 - 8 * lane - 7;
        for (int e = 0; e < 8; ++e) {
          if (own[e] > 0 && double(run + own[e]) >= t) {
            digit = 255 - 8 * lane - e;
            break;
          }
          run += own[e];
        }
        sm.digit = digit;
        sm.cum = run;
      }
    }
    __syncthreads();
    const int digit = sm.digit;
    cum = sm.cum;
    last_bucket = sm.hist[digit];
    prefix |= uint32_t(digit) << shift;
    mask |= 0xffu << shift;
    __syncthreads();
  }
  // `prefix` is the key of the token sought; tokens of that key within c all
  // contribute the same amount: take the first n of them in id order.
  const unsigned long long each = Weighted ? fixed_of(weight_of(key_value(prefix), x)) : 1ull;
  const long long n_equal = each > 0 ? (long long)(last_bucket / each) : 1;
  long long n = each > 0 ? (long long)ceil((target - double(cum)) / double(each)) : 1;
  n = max(1ll, min(n, n_equal));
  const int id_bound = prefix == c.key ? c.id : x.V - 1;
  if (n >= n_equal) return {prefix, id_bound};
  return {prefix, nth_equal(x, prefix, c, int(n), sm)};
}

// One block per row. logits: [n_rows, n_vocab]; rows, out: [n_rows]
__global__ void __launch_bounds__(kSampleThreads)
    sample_kernel(const float* __restrict__ logits, int V, const SampleRow* __restrict__ rows,
                  int32_t* __restrict__ out, int32_t* __restrict__ host_out) {
  pdl_entry();
  __shared__ SampleSmem sm;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const float* row = logits + int64_t(blockIdx.x) * V;
  const SampleRow p = rows[blockIdx.x];

  // Pass 1: the best token (as argmax_kernel).
  float bv = -INFINITY;
  int bi = V;
  for (int j = tid; j < V; j += kSampleThreads) {
    const float v = row[j];
    if (better(v, j, bv, bi)) bv = v, bi = j;
  }
  warp_best(bv, bi);
  if (lane == 0) sm.redf[warp] = bv, sm.redi[warp] = bi;
  __syncthreads();
  bv = sm.redf[0], bi = sm.redi[0];
  for (int w = 1; w < kSampleWarps; ++w)
    if (better(sm.redf[w], sm.redi[w], bv, bi)) bv = sm.redf[w], bi = sm.redi[w];
  __syncthreads();
  const int best = bi < V ? bi : 0;
  if (!(p.temperature > 0.f) || !isfinite(bv)) {
    if (tid == 0) {
      out[blockIdx.x] = best;
      if (host_out != nullptr) host_out[blockIdx.x] = best;
    }
    return;
  }

  RowCtx x;
  x.row = row;
  x.V = V;
  x.inv_t = 1.0f / p.temperature;
  x.mx = bv * x.inv_t;
  x.chunk = (V + kSampleWarps * 32 - 1) / (kSampleWarps * 32) * 32;
  Cut cut{0u, V - 1};  // everything
  if (p.top_k > 0 && p.top_k < V) cut = select_cut<false>(x, cut, double(p.top_k), sm);
  if (p.top_p < 1.f) {
    unsigned long long z = 0;
    for (int j = tid; j < V; j += kSampleThreads) {
      const float l = row[j];
      if (within(order_key(l), j, cut)) z += fixed_of(weight_of(l, x));
    }
    z = block_sum_u64(z, sm);
    cut = select_cut<true>(x, cut, double(p.top_p) * double(z), sm);
  }
  const float min_w = p.min_p;  // w of the top token is exactly 1

  // The draw: warp w walks ids [w * chunk, (w + 1) * chunk) 32 at a time.
  const int begin = warp * x.chunk, end = min(V, begin + x.chunk);
  auto kept_weight = [&](int j) {
    if (j >= end) return 0.f;
    const float l = row[j];
    if (!within(order_key(l), j, cut)) return 0.f;
    const float w = weight_of(l, x);
    return w >= min_w ? w : 0.f;
  };
  float run = 0.f;
  int last = -1;
  for (int j0 = begin; j0 < end; j0 += 32) {
    const float w = kept_weight(j0 + lane);
    const unsigned m = __ballot_sync(0xffffffffu, w > 0.f);
    if (m) last = j0 + 31 - __clz(int(m));
    run += warp_sum(w);
  }
  if (lane == 0) sm.warp_total[warp] = run, sm.warp_last[warp] = last;
  __syncthreads();
  if (tid == 0) {
    float total = 0.f;
    int fallback = best;
    for (int w = 0; w < kSampleWarps; ++w) {
      total += sm.warp_total[w];
      if (sm.warp_last[w] >= 0) fallback = sm.warp_last[w];
    }
    float r = p.uniform * total;
    int sel = -1;
    for (int w = 0; w < kSampleWarps; ++w) {
      if (r < sm.warp_total[w]) {
        sel = w;
        break;
      }
      r -= sm.warp_total[w];
    }
    sm.digit = sel;
    sm.r = r;
    sm.found = fallback;
  }
  __syncthreads();
  if (warp == sm.digit) {
    float r = sm.r;
    int id = -1;
    for (int j0 = begin; j0 < end && id < 0; j0 += 32) {
      const float w = kept_weight(j0 + lane);
      const float s = warp_sum(w);
      if (r < s) {
        float incl = w;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
          const float v = __shfl_up_sync(0xffffffffu, incl, o);
          if (lane >= o) incl += v;
        }
        const unsigned hit = __ballot_sync(0xffffffffu, w > 0.f && r < incl);
        const unsigned any = __ballot_sync(0xffffffffu, w > 0.f);
        id = j0 + (hit ? __ffs(int(hit)) - 1 : 31 - __clz(int(any)));
      } else {
        r -= s;
      }
    }
    // Rounding left r past this warp's last step: its last kept token.
    if (lane == 0) sm.found = id >= 0 ? id : sm.warp_last[warp];
  }
  __syncthreads();
  if (tid == 0) {
    out[blockIdx.x] = sm.found;
    if (host_out != nullptr) host_out[blockIdx.x] = sm.found;
  }
}

__global__ void penalties_kernel(float* __restrict__ logits, int64_t V, const PenaltyEntry* __restrict__ e, int64_t n) {
  pdl_entry();
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const PenaltyEntry p = e[i];
  float& l = logits[int64_t(p.row) * V + p.token];
  float v = l;
  // As runtime/sampler.cpp: divide positive logits, multiply negative ones; then subtract.
  if (p.repetition != 1.0f) v = v > 0 ? v / p.repetition : v * p.repetition;
  l = v - p.subtract;
}

}  // namespace

void argmax(const float* logits, int64_t n_rows, int64_t n_vocab, int32_t* out, int32_t* host_out, Stream s) {
  if (n_rows <= 0) return;
  if (n_vocab <= 0 || n_vocab >= (int64_t(1) << 31)) fail("[cuda] argmax: bad n_vocab ", n_vocab);
  if (n_rows > 65535) fail("[cuda] argmax: too many rows ", n_rows, " (at most 65535)");
  // Splits of at least 2048 logits, about two blocks an SM over all rows;
  // their partials and counters in the split-K scratch (used in stream order).
  Context& c = context();
  int64_t P = std::clamp<int64_t>(ceil_div(int64_t(2) * c.sm_count, n_rows), 1, ceil_div(n_vocab, 2048));
  if (n_rows > Context::kSplitKCounters || n_rows * P * int64_t(sizeof(int2)) > int64_t(Context::kSplitKPartialBytes))
    P = 1;
  const int64_t per = ceil_div(n_vocab, P);
  P = ceil_div(n_vocab, per);
  launch("argmax_kernel", argmax_kernel, dim3(unsigned(P), unsigned(n_rows)), dim3(kArgmaxThreads), 0, s, logits,
         n_vocab, per, static_cast<int2*>(c.splitk_partials.get()), static_cast<int*>(c.splitk_counters.get()), out,
         host_out);
}

void apply_penalties(float* logits, int64_t n_vocab, const PenaltyEntry* entries, int64_t n_entries, Stream s) {
  if (n_entries <= 0) return;
  if (n_entries > (int64_t(1) << 30)) fail("[cuda] apply_penalties: too many entries ", n_entries);
  launch("penalties_kernel", penalties_kernel, dim3(unsigned(ceil_div(n_entries, 256))), dim3(256), 0, s, logits,
         n_vocab, entries, n_entries);
}

void sample(const float* logits, int64_t n_rows, int64_t n_vocab, const SampleRow* rows, int32_t* out,
            int32_t* host_out, Stream s) {
  if (n_rows <= 0) return;
  if (n_vocab <= 0 || n_vocab >= (int64_t(1) << 30)) fail("[cuda] sample: bad n_vocab ", n_vocab);
  if (n_rows > 0x7fffffff) fail("[cuda] sample: too many rows ", n_rows);
  launch("sample_kernel", sample_kernel, dim3(unsigned(n_rows)), dim3(kSampleThreads), 0, s, logits, int(n_vocab), rows,
         out, host_out);
}

}  // namespace augur::cuda
