// CUDA tests of the decoder's fused ops (add_rms_norm, swiglu_packed,
// qkv_rope_store, decode_attention_rope, rms_norm_linear) and of GPU sampling
// (sample, apply_penalties) against the CPU reference op, on odd sizes (the
// f16 paths: cuda_f16_test.cpp). Outputs are poisoned (NaN / 0xffff) before
// each run.
//
// Sampling properties: the same inputs give the same ids on every run; the
// GPU agrees with cpu::sample (same cuts, same walk; float sums in another
// order may move a draw that lands within rounding of a boundary, so a
// handful of disagreements in thousands is allowed); top-k / top-p / min-p
// never keep a token outside their set; stratified draws follow softmax.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <set>
#include <vector>

#include "backend/cpu/ops_cpu.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/memory.h"
#include "backend/device.h"
#include "backend/ops.h"
#include "core/dtype.h"
#include "cuda_test_util.h"

namespace augur::cuda {
namespace {

using CudaSampling = CudaFused;

// ---- fused ops ----------------------------------------------------------------------

TEST_F(CudaFused, AddRmsNorm) {
  std::mt19937 rng(31);
  for (int64_t D : {1, 31, 33, 4096, 4097})
    for (int64_t M : {1, 3}) {
      std::vector<float> x = uniform_floats(size_t(M * D), rng, -3.f, 3.f);
      std::vector<float> o = uniform_floats(size_t(M * D), rng, -3.f, 3.f), w = uniform_floats(size_t(D), rng, -1, 1);
      std::vector<float> rx(x), rh(x.size());
      cpu::add_rms_norm(rx.data(), o.data(), w.data(), 1e-6f, M, D, rh.data());
      Buf<float> dx(x), dO(o), dw(w), dh(x.size());
      dh.poison();
      add_rms_norm(dx.get(), dO.get(), dw.get(), 1e-6f, M, D, dh.get(), stream());
      const std::vector<float> gx = dx.download(), gh = dh.download();
      ASSERT_EQ(0, std::memcmp(gx.data(), rx.data(), rx.size() * 4)) << "x += o, D=" << D;
      for (size_t i = 0; i < rh.size(); ++i)
        ASSERT_NEAR(gh[i], rh[i], 2e-6 * std::fabs(rh[i]) + 1e-6) << "D=" << D << " M=" << M << " i=" << i;
    }
}

TEST_F(CudaFused, SwigluPacked) {
  std::mt19937 rng(32);
  for (int64_t D : {1, 31, 33, 4096, 4097})
    for (int64_t M : {1, 5}) {
      std::vector<float> gu = uniform_floats(size_t(M * 2 * D), rng, -8.f, 8.f), ref(size_t(M * D));
      cpu::swiglu_packed(gu.data(), M, D, ref.data());
      Buf<float> dg(gu), dout(ref.size());
      dout.poison();
      swiglu_packed(dg.get(), M, D, dout.get(), stream());
      const std::vector<float> got = dout.download();
      for (size_t i = 0; i < ref.size(); ++i)
        ASSERT_NEAR(got[i], ref[i], 2e-6 * std::fabs(ref[i]) + 1e-7) << "D=" << D << " M=" << M << " i=" << i;
    }
}

// qkv_rope_store against slicing + cpu::rms_norm + cpu::rope + bf16 stores.
TEST_F(CudaFused, QkvRopeStore) {
  std::mt19937 rng(33);
  struct Case {
    int64_t n_head, n_head_kv, head_dim, half;
    bool norm;
  };
  // gated: Qwen3.5 / Qwen3-Next q_proj layout, each head's query then its
  // output gate (q_stride 2 D); the gates are copied out.
  const Case cases[] = {Case{4, 2, 16, 8, true}, Case{3, 1, 64, 16, false}, Case{32, 8, 128, 64, true},
                        Case{5, 5, 32, 16, true}, Case{2, 1, 256, 128, false}};
  for (int run = 0; run < 10; ++run) {
    const bool gated = run >= 5;
    const Case& c = cases[run % 5];
    const int64_t D = c.head_dim, T = 7, n_slots = 23, kv_dim = c.n_head_kv * D;
    const int64_t q_stride = gated ? 2 * D : D, q_width = c.n_head * q_stride;
    const int64_t width = q_width + 2 * c.n_head_kv * D;
    std::vector<float> qkv = uniform_floats(size_t(T * width), rng, -4.f, 4.f);
    std::vector<float> qn = uniform_floats(size_t(D), rng, 0.5f, 1.5f), kn = uniform_floats(size_t(D), rng, 0.5f, 1.5f);
    std::vector<int32_t> pos = {0, 1, 5, 77, 1000, 8191, 40000};
    std::vector<int32_t> slots = {3, 22, 0, -1, 9, 10, 4};  // -1: padding, nothing stored
    std::vector<float> inv_freq(static_cast<size_t>(c.half));
    for (int64_t i = 0; i < c.half; ++i) inv_freq[size_t(i)] = float(1.0 / std::pow(1e6, double(i) / double(c.half)));
    // Reference.
    std::vector<float> q(size_t(T * c.n_head * D)), gate(q.size()), k(size_t(T * kv_dim)), v(size_t(T * kv_dim));
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t h = 0; h < c.n_head; ++h) {
        std::copy_n(qkv.begin() + t * width + h * q_stride, D, q.begin() + (t * c.n_head + h) * D);
        if (gated) std::copy_n(qkv.begin() + t * width + h * q_stride + D, D, gate.begin() + (t * c.n_head + h) * D);
      }
      std::copy_n(qkv.begin() + t * width + q_width, kv_dim, k.begin() + t * kv_dim);
      std::copy_n(qkv.begin() + t * width + q_width + kv_dim, kv_dim, v.begin() + t * kv_dim);
    }
    if (c.norm) {
      cpu::rms_norm(q.data(), qn.data(), 1e-6f, T * c.n_head, D, q.data());
      cpu::rms_norm(k.data(), kn.data(), 1e-6f, T * c.n_head_kv, D, k.data());
    }
    cpu::rope(q.data(), T, c.n_head, D, pos, inv_freq);
    cpu::rope(k.data(), T, c.n_head_kv, D, pos, inv_freq);

    Buf<float> dqkv(qkv), dqn(qn), dkn(kn), dfreq(inv_freq), dq(q.size()), dgate(q.size());
    Buf<int32_t> dpos(pos), dslots(slots);
    Buf<uint16_t> kc(size_t(n_slots * kv_dim)), vc(size_t(n_slots * kv_dim));
    dq.poison(), kc.poison(), vc.poison();
    AttnMeta meta;
    meta.positions = dpos.get();
    meta.slot_mapping = dslots.get();
    meta.n_tokens = int32_t(T);
    qkv_rope_store(dqkv.get(), c.n_head, c.n_head_kv, D, c.norm ? dqn.get() : nullptr, c.norm ? dkn.get() : nullptr,
                   1e-6f, dfreq.get(), c.half, meta, dq.get(), kc.get(), vc.get(), stream(), Half::BF16,
                   gated ? dgate.get() : nullptr);
    const std::vector<float> gq = dq.download();
    if (gated) {
      ASSERT_EQ(dgate.download(), gate) << "gates are copied exactly";
    }
    const std::vector<uint16_t> gk = kc.download(), gv = vc.download();
    for (size_t i = 0; i < q.size(); ++i)
      ASSERT_NEAR(gq[i], q[i], 2e-6 * std::fabs(q[i]) + 2e-6) << "q " << i << " head_dim " << D;
    for (int64_t s = 0; s < n_slots; ++s) {
      const auto it = std::find(slots.begin(), slots.end(), int32_t(s));
      for (int64_t i = 0; i < kv_dim; ++i) {
        const size_t at = size_t(s * kv_dim + i);
        if (it == slots.end()) {
          ASSERT_EQ(gk[at], 0xffff) << "slot " << s << " written";
          ASSERT_EQ(gv[at], 0xffff) << "slot " << s << " written";
          continue;
        }
        const size_t t = size_t(it - slots.begin());
        // k: the norm's sum runs in another order, so one bf16 step either way.
        const float want_k = k[t * size_t(kv_dim) + size_t(i)];
        ASSERT_NEAR(bf16_to_f32(gk[at]), want_k, std::fabs(want_k) * 0x1p-7f + 1e-6f) << "k slot " << s << " i " << i;
        ASSERT_EQ(gv[at], f32_to_bf16(v[t * size_t(kv_dim) + size_t(i)])) << "v slot " << s << " i " << i;
      }
    }
  }
}

// decode_attention_rope (the decode attention doing qkv_rope_store's work)
// against qkv_rope_store + paged_attention: outputs and caches bit-equal, on
// one-token rows at positions that start, end and cross splits and cache
// blocks, a row whose slot is -1 (not stored), sliding windows, both caches.
TEST_F(CudaFused, DecodeAttentionRopeEqualsUnfused) {
  std::mt19937 rng(34);
  struct Case {
    int64_t n_head, n_head_kv, head_dim, half;
    bool norm, f16;
    int32_t window;
  };
  const Case cases[] = {Case{32, 8, 128, 64, true, false, 0}, Case{4, 2, 64, 16, false, true, 0},
                        Case{8, 8, 128, 32, true, true, 100}, Case{8, 1, 256, 128, false, false, 0},
                        Case{6, 3, 16, 8, true, false, 0}};
  const std::vector<int32_t> pos = {0, 17, 63, 64, 300, 1000, 2047};
  const int64_t T = int64_t(pos.size()), bs = 16, max_blocks = 2048 / bs, n_blocks = T * max_blocks + 3;
  // Block tables: a shuffled pool of blocks, rows disjoint.
  std::vector<int32_t> pool(static_cast<size_t>(n_blocks));
  std::iota(pool.begin(), pool.end(), 0);
  std::shuffle(pool.begin(), pool.end(), rng);
  std::vector<int32_t> tables(static_cast<size_t>(T * max_blocks)), rows(static_cast<size_t>(T)),
      slots(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) {
    rows[size_t(t)] = int32_t(t);
    for (int64_t b = 0; b < max_blocks; ++b) tables[size_t(t * max_blocks + b)] = pool[size_t(t * max_blocks + b)];
    const int32_t p = pos[size_t(t)];
    slots[size_t(t)] = tables[size_t(t * max_blocks + p / bs)] * int32_t(bs) + p % int32_t(bs);
  }
  slots[3] = -1;  // padding: nothing stored, attention reads what the cache holds
  Buf<int32_t> dpos(pos), dslots(slots), drows(rows), dtables(tables);
  AttnMeta meta;
  meta.positions = dpos.get(), meta.slot_mapping = dslots.get(), meta.token_row = drows.get();
  meta.block_tables = dtables.get(), meta.max_blocks = int32_t(max_blocks), meta.n_tokens = int32_t(T);
  meta.max_context = 2048, meta.max_row_tokens = 1;
  for (const Case& c : cases) {
    SCOPED_TRACE(testing::Message() << "heads " << c.n_head << "/" << c.n_head_kv << " D " << c.head_dim << " f16 "
                                    << c.f16 << " window " << c.window);
    const int64_t D = c.head_dim, kv_dim = c.n_head_kv * D, width = (c.n_head + 2 * c.n_head_kv) * D;
    const Half kv = c.f16 ? Half::F16 : Half::BF16;
    ASSERT_TRUE(decode_attention_rope_fits(c.n_head, c.n_head_kv, D, meta, false));
    std::vector<float> qkv = uniform_floats(size_t(T * width), rng, -2.f, 2.f);
    std::vector<float> qn = uniform_floats(size_t(D), rng, 0.5f, 1.5f), kn = uniform_floats(size_t(D), rng, 0.5f, 1.5f);
    std::vector<float> inv_freq(static_cast<size_t>(c.half));
    for (int64_t i = 0; i < c.half; ++i) inv_freq[size_t(i)] = float(1.0 / std::pow(1e6, double(i) / double(c.half)));
    std::vector<uint16_t> cache0(size_t(n_blocks * bs * kv_dim));
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    for (auto& h : cache0) h = c.f16 ? f32_to_f16(u(rng)) : f32_to_bf16(u(rng));
    Buf<float> dqkv(qkv), dqn(qn), dkn(kn), dfreq(inv_freq), dq(size_t(T * c.n_head * D));
    Buf<float> out_a(size_t(T * c.n_head * D)), out_b(size_t(T * c.n_head * D));
    Buf<uint16_t> ka(cache0), va(cache0), kb(cache0), vb(cache0);
    Buf<float> ws(attention_workspace_bytes(T, c.n_head, D, meta.max_context) / sizeof(float) + 1);
    const float scale = 1.0f / std::sqrt(float(D));
    const float* qg = c.norm ? dqn.get() : nullptr;
    const float* kg = c.norm ? dkn.get() : nullptr;
    out_a.poison();
    qkv_rope_store(dqkv.get(), c.n_head, c.n_head_kv, D, qg, kg, 1e-6f, dfreq.get(), c.half, meta, dq.get(), ka.get(),
                   va.get(), stream(), kv);
    paged_attention(dq.get(), ka.get(), va.get(), bs, c.n_head, c.n_head_kv, D, meta, scale, c.window, out_a.get(),
                    ws.get(), stream(), kv);
    const std::vector<float> a = out_a.download();
    // The fused kernel from the old cache, twice (its split counters must
    // have been left at zero).
    for (int run = 0; run < 2; ++run) {
      SCOPED_TRACE(testing::Message() << "run " << run);
      kb.upload(cache0), vb.upload(cache0), out_b.poison();
      decode_attention_rope(dqkv.get(), qg, kg, 1e-6f, dfreq.get(), c.half, kb.get(), vb.get(), bs, c.n_head,
                            c.n_head_kv, D, meta, scale, c.window, out_b.get(), ws.get(), stream(), kv);
      const std::vector<float> b = out_b.download();
      size_t finite = 0;
      for (size_t i = 0; i < a.size(); ++i) {
        ASSERT_EQ(std::memcmp(&a[i], &b[i], sizeof(float)), 0) << "out " << i << ": " << a[i] << " vs " << b[i];
        finite += std::isfinite(a[i]);
      }
      EXPECT_EQ(finite, a.size());
      EXPECT_EQ(ka.download(), kb.download()) << "k cache";
      EXPECT_EQ(va.download(), vb.download()) << "v cache";
    }
    EXPECT_NE(ka.download(), cache0) << "the new keys were stored";
  }
  meta.max_row_tokens = 2;  // a row with two new tokens: the second's keys include the first's
  EXPECT_FALSE(decode_attention_rope_fits(32, 8, 128, meta, false));
  meta.max_row_tokens = 1;
  EXPECT_FALSE(decode_attention_rope_fits(32, 8, 128, meta, true));   // output gates stay with qkv_rope_store
  EXPECT_FALSE(decode_attention_rope_fits(32, 8, 96, meta, false));   // no kernel for head_dim 96
  EXPECT_FALSE(decode_attention_rope_fits(64, 2, 128, meta, false));  // 32 query heads a KV head: the scalar kernel
}

// The decode attention copies cached keys before its PDL wait, and the new
// ones only after it: right after the kernel that stores the step's new keys
// it gives, bit for bit, what it gives once those stores have long finished.
// Rows of one to three new tokens (a row's later tokens see its earlier
// ones, stored by the same step), one row at a long context (more splits
// than the one-trip merge takes), windows, both cache types, and the old
// cache at the new positions random, so a new key read too early shows.
TEST_F(CudaFused, DecodeAttentionEarlyKeysAreNotStale) {
  std::mt19937 rng(35);
  struct Row {
    int32_t pos0, n;
  };
  const std::vector<std::vector<Row>> batches = {
      {{97, 3}, {2045, 1}, {0, 1}, {63, 2}},                                               // 7 tokens
      {{5, 1}, {64, 1}, {127, 1}, {128, 1}, {300, 1}, {1000, 1}, {1500, 1}, {2000, 1}, {2047, 1}},  // 9 rows
      {{6000, 1}},   // one row past 4,096 keys: ~34 splits, more than the one-trip merge takes
      {{1500, 1}, {1501, 1}, {1502, 1}, {1503, 1}, {1504, 1}, {1505, 1}, {1506, 1}, {1507, 1}, {1508, 1},
       {1509, 1}, {1510, 1}, {1511, 2}}};  // 12 rows: 4 splits of 384 keys, 6 stages each
  const int64_t bs = 16;
  struct Case {
    int64_t n_head, n_head_kv, head_dim;
    bool f16;
    int32_t window;
  };
  const Case cases[] = {Case{32, 8, 128, false, 0}, Case{8, 8, 128, true, 100}, Case{4, 2, 64, true, 0},
                        Case{6, 3, 16, false, 0}};
  for (const auto& batch : batches) {
    int32_t last = 0;
    for (const Row& r : batch) last = std::max(last, r.pos0 + r.n);
    const int64_t max_context = last <= 2048 ? 2048 : 8192, max_blocks = max_context / bs;
    std::vector<int32_t> pos, rows, slots;
    const int64_t R = int64_t(batch.size()), n_blocks = R * max_blocks;
    std::vector<int32_t> pool(static_cast<size_t>(n_blocks)), tables(static_cast<size_t>(R * max_blocks));
    std::iota(pool.begin(), pool.end(), 0);
    std::shuffle(pool.begin(), pool.end(), rng);
    int32_t max_row = 0;
    for (int64_t r = 0; r < R; ++r) {
      for (int64_t b = 0; b < max_blocks; ++b) tables[size_t(r * max_blocks + b)] = pool[size_t(r * max_blocks + b)];
      for (int32_t i = 0; i < batch[size_t(r)].n; ++i) {
        const int32_t p = batch[size_t(r)].pos0 + i;
        pos.push_back(p), rows.push_back(int32_t(r));
        slots.push_back(tables[size_t(r * max_blocks + p / bs)] * int32_t(bs) + p % int32_t(bs));
      }
      max_row = std::max(max_row, batch[size_t(r)].n);
    }
    const int64_t T = int64_t(pos.size());
    Buf<int32_t> dpos(pos), dslots(slots), drows(rows), dtables(tables);
    AttnMeta meta;
    meta.positions = dpos.get(), meta.slot_mapping = dslots.get(), meta.token_row = drows.get();
    meta.block_tables = dtables.get(), meta.max_blocks = int32_t(max_blocks), meta.n_tokens = int32_t(T);
    meta.max_context = int32_t(max_context), meta.max_row_tokens = max_row;
    for (const Case& c : cases) {
      SCOPED_TRACE(testing::Message() << T << " tokens, heads " << c.n_head << "/" << c.n_head_kv << " D "
                                      << c.head_dim << " f16 " << c.f16 << " window " << c.window);
      const int64_t D = c.head_dim, kv_dim = c.n_head_kv * D, width = (c.n_head + 2 * c.n_head_kv) * D;
      const Half kv = c.f16 ? Half::F16 : Half::BF16;
      std::vector<float> qkv = uniform_floats(size_t(T * width), rng, -2.f, 2.f);
      std::vector<float> inv_freq(32);
      for (size_t i = 0; i < inv_freq.size(); ++i) inv_freq[i] = float(std::pow(1e-4, double(i) / 32.0));
      std::vector<uint16_t> cache0(size_t(n_blocks * bs * kv_dim));
      std::uniform_real_distribution<float> u(-1.f, 1.f);
      for (auto& h : cache0) h = c.f16 ? f32_to_f16(u(rng)) : f32_to_bf16(u(rng));
      Buf<float> dqkv(qkv), dfreq(inv_freq), dq(size_t(T * c.n_head * D));
      Buf<float> ws(attention_workspace_bytes(T, c.n_head, D, meta.max_context) / sizeof(float) + 1);
      const float scale = 1.0f / std::sqrt(float(D));
      Buf<uint16_t> kc(cache0), vc(cache0);
      Buf<float> out(size_t(T * c.n_head * D));
      out.poison();
      qkv_rope_store(dqkv.get(), c.n_head, c.n_head_kv, D, nullptr, nullptr, 1e-6f, dfreq.get(),
                     std::min<int64_t>(32, D / 2), meta, dq.get(), kc.get(), vc.get(), stream(), kv);
      paged_attention(dq.get(), kc.get(), vc.get(), bs, c.n_head, c.n_head_kv, D, meta, scale, c.window, out.get(),
                      ws.get(), stream(), kv);
      const std::vector<float> early = out.download();  // waits: the stores are done below
      out.poison();
      paged_attention(dq.get(), kc.get(), vc.get(), bs, c.n_head, c.n_head_kv, D, meta, scale, c.window, out.get(),
                      ws.get(), stream(), kv);
      const std::vector<float> settled = out.download();
      for (size_t i = 0; i < settled.size(); ++i) {
        ASSERT_TRUE(std::isfinite(settled[i])) << "out " << i;
        ASSERT_EQ(std::memcmp(&settled[i], &early[i], sizeof(float)), 0)
            << "out " << i << ": " << settled[i] << " vs " << early[i];
      }
    }
  }
}

// ---- sampling -----------------------------------------------------------------------

std::vector<int32_t> gpu_sample(const std::vector<float>& logits, int64_t V, const std::vector<ops::SampleRow>& rows) {
  static_assert(sizeof(ops::SampleRow) == sizeof(SampleRow));
  Buf<float> dl(logits);
  Buf<ops::SampleRow> dr(rows);
  Buf<int32_t> dout(rows.size());
  dout.poison();
  HostLanding landing(rows.size() * 4);  // the ids written to the host as well
  sample(dl.get(), int64_t(rows.size()), V, reinterpret_cast<const SampleRow*>(dr.get()), dout.get(),
         static_cast<int32_t*>(landing.data()), stream());
  landing.mark();
  std::vector<int32_t> got = dout.download();
  const auto* on_host = static_cast<const int32_t*>(landing.wait());
  EXPECT_EQ(std::vector<int32_t>(on_host, on_host + rows.size()), got);
  return got;
}

std::vector<int32_t> cpu_sample(const std::vector<float>& logits, int64_t V, const std::vector<ops::SampleRow>& rows) {
  std::vector<int32_t> out(rows.size());
  cpu::sample(logits.data(), V, rows, out.data());
  return out;
}

// Rows of one logits vector repeated, each with its own uniform.
std::vector<float> repeat_rows(const std::vector<float>& row, size_t n) {
  std::vector<float> out;
  for (size_t i = 0; i < n; ++i) out.insert(out.end(), row.begin(), row.end());
  return out;
}

TEST_F(CudaSampling, GreedyIsArgmax) {
  std::mt19937 rng(40);
  for (int64_t V : {1, 31, 4097, 151936}) {
    const size_t n = 4;
    std::vector<float> logits = uniform_floats(n * size_t(V), rng, -20.f, 20.f);
    if (V > 3) logits[size_t(V) + 2] = logits[size_t(V) + 1] = 99.f;  // a tie: the lower id
    std::vector<ops::SampleRow> rows(n);
    const auto got = gpu_sample(logits, V, rows), want = cpu_sample(logits, V, rows);
    EXPECT_EQ(got, want) << "V " << V;
    if (V > 3) {
      EXPECT_EQ(got[1], 1);
    }
  }
}

// ops::sample on CUDA logits: every row greedy takes the split argmax (no
// parameters uploaded), a sampled row the sample kernel; both give the CPU's
// tokens.
TEST_F(CudaSampling, OpsSampleRoutesGreedyRowsToTheArgmax) {
  std::mt19937 rng(43);
  const int64_t n = 3, V = 151936;
  Tensor host = Tensor::empty(DType::F32, {n, V});
  const std::vector<float> values = uniform_floats(size_t(n * V), rng, -8.f, 8.f);
  std::copy(values.begin(), values.end(), host.data<float>());
  host.data<float>()[V - 1] = 20.f;              // row 0: the last logit
  host.data<float>()[V + 7] = host.data<float>()[V + 9] = 20.f;  // row 1: a tie, the lower id
  const Tensor dev = to_device(host, Device::CUDA);
  std::vector<ops::SampleRow> rows(static_cast<size_t>(n));
  for (int pass = 0; pass < 2; ++pass) {
    if (pass == 1) rows[2].temperature = 0.8f, rows[2].top_k = 40, rows[2].uniform = 0.37f;  // one sampled row
    std::vector<int32_t> got(static_cast<size_t>(n)), want(static_cast<size_t>(n));
    ops::sample(dev, rows, got);
    ops::sample(host, rows, want);
    EXPECT_EQ(got, want) << "pass " << pass;
    EXPECT_EQ(got[0], V - 1);
    EXPECT_EQ(got[1], 7);
  }
}

// ops::rms_norm_linear: one stream GEMV with the norm in it for 1 and 2 rows,
// rms_norm then linear for 3; all within f32 rounding of the two ops.
TEST_F(CudaFused, RmsNormLinearEqualsNormThenLinear) {
  std::mt19937 rng(44);
  const int64_t K = 4096, N = 1000;
  std::vector<float> w32 = uniform_floats(size_t(N * K), rng, -0.05f, 0.05f);
  Tensor wh = Tensor::empty(DType::BF16, {N, K});
  for (size_t i = 0; i < w32.size(); ++i) wh.data<uint16_t>()[i] = f32_to_bf16(w32[i]);
  Tensor gh = Tensor::empty(DType::F32, {K});
  const std::vector<float> g = uniform_floats(size_t(K), rng, 0.5f, 1.5f);
  std::copy(g.begin(), g.end(), gh.data<float>());
  const Tensor w = to_device(wh, Device::CUDA), gd = to_device(gh, Device::CUDA);
  for (int64_t M : {1, 2, 3}) {
    Tensor xh = Tensor::empty(DType::F32, {M, K});
    const std::vector<float> x = uniform_floats(size_t(M * K), rng, -3.f, 3.f);
    std::copy(x.begin(), x.end(), xh.data<float>());
    const Tensor xd = to_device(xh, Device::CUDA);
    const Tensor h = empty_on(Device::CUDA, DType::F32, {M, K}), y = empty_on(Device::CUDA, DType::F32, {M, N});
    const Tensor h2 = empty_on(Device::CUDA, DType::F32, {M, K}), y2 = empty_on(Device::CUDA, DType::F32, {M, N});
    ops::rms_norm_linear(xd, gd, 1e-6f, w, h, y);
    ops::rms_norm(xd, gd, 1e-6f, h2);
    ops::linear(h2, w, y2);
    const Tensor a = to_device(y, Device::CPU), b = to_device(y2, Device::CPU);
    for (int64_t i = 0; i < M * N; ++i)
      ASSERT_NEAR(a.data<float>()[i], b.data<float>()[i], 1e-4f + 1e-4f * std::fabs(b.data<float>()[i]))
          << "M " << M << " at " << i;
  }
}

// Prefill rows (M > 8, cuBLASLt's path): the norms and the SwiGLU write the
// matmuls' 16-bit inputs themselves (cuda::norm_matmul_tc,
// add_norm_matmul_tc, swiglu_matmul). That must be the same bits as the ops
// one by one, which write f32 and round it in to_half: rms_norm_linear
// against rms_norm + linear, and block_tail (with a next projection) against
// linear, add_rms_norm, linear, swiglu_packed, linear, add_rms_norm, linear.
// Shapes: rows in float4 runs and not (D = 100, F = 68: the scalar ends),
// bf16 and f16 weights.
TEST_F(CudaFused, PrefillNormAndSwigluWriteTheMatmulInputBitEqual) {
  std::mt19937 rng(45);
  struct Case {
    int64_t M, D, F, N;
    DType wt;
  };
  for (const Case& c : {Case{40, 1032, 2056, 1032, DType::BF16}, Case{300, 100, 68, 36, DType::F16},
                        Case{9, 4096, 4096, 512, DType::BF16}}) {
    SCOPED_TRACE(testing::Message() << "M=" << c.M << " D=" << c.D << " F=" << c.F << " N=" << c.N);
    auto weights = [&](int64_t rows, int64_t cols) {
      Tensor w = Tensor::empty(c.wt, {rows, cols});
      std::uniform_real_distribution<float> u(-0.05f, 0.05f);
      for (int64_t i = 0; i < rows * cols; ++i)
        w.data<uint16_t>()[i] = c.wt == DType::F16 ? f32_to_f16(u(rng)) : f32_to_bf16(u(rng));
      return to_device(w, Device::CUDA);
    };
    auto floats = [&](std::vector<int64_t> shape, float lo, float hi) {
      Tensor t = Tensor::empty(DType::F32, shape.data(), int(shape.size()));
      const std::vector<float> v = uniform_floats(size_t(t.numel()), rng, lo, hi);
      std::copy(v.begin(), v.end(), t.data<float>());
      return to_device(t, Device::CUDA);
    };
    auto f32 = [&](std::vector<int64_t> shape) {
      return empty_on(Device::CUDA, DType::F32, shape.data(), int(shape.size()));
    };
    auto same_bits = [](const Tensor& got, const Tensor& want, const char* what) {
      const Tensor a = to_device(got, Device::CPU), b = to_device(want, Device::CPU);
      ASSERT_EQ(a.numel(), b.numel());
      int64_t differ = 0;
      for (int64_t i = 0; i < a.numel(); ++i) differ += std::memcmp(&a.data<float>()[i], &b.data<float>()[i], 4) != 0;
      EXPECT_EQ(differ, 0) << what << ": " << differ << " of " << a.numel() << " values differ";
    };
    const Tensor w_out = weights(c.D, c.D), gate_up = weights(2 * c.F, c.D), down = weights(c.D, c.F);
    const Tensor w_next = weights(c.N, c.D);
    const Tensor a = floats({c.M, c.D}, -2.f, 2.f), x0 = floats({c.M, c.D}, -2.f, 2.f);
    const Tensor g = floats({c.D}, 0.5f, 1.5f), g_next = floats({c.D}, 0.5f, 1.5f);
    const float eps = 1e-6f;

    const Tensor y1 = f32({c.M, c.N}), y1_want = f32({c.M, c.N}), h = f32({c.M, c.D});
    ops::rms_norm_linear(x0, g, eps, w_next, h, y1);
    ops::rms_norm(x0, g, eps, h);
    ops::linear(h, w_next, y1_want);
    same_bits(y1, y1_want, "rms_norm_linear");

    const Tensor x = f32({c.M, c.D}), x_want = f32({c.M, c.D});
    copy_tensor(x0, x);
    copy_tensor(x0, x_want);
    const Tensor gu = f32({c.M, 2 * c.F}), act = f32({c.M, c.F}), out = f32({c.M, c.D}), y = f32({c.M, c.N});
    ops::block_tail(a, w_out, x, g, eps, gate_up, down, h, gu, act, out, w_next, g_next, y);
    const Tensor o_want = f32({c.M, c.D}), out_want = f32({c.M, c.D}), y_want = f32({c.M, c.N});
    ops::linear(a, w_out, o_want);
    ops::add_rms_norm(x_want, o_want, g, eps, h);
    ops::linear(h, gate_up, gu);
    ops::swiglu_packed(gu, act);
    ops::linear(act, down, out_want);
    ops::add_rms_norm(x_want, out_want, g_next, eps, h);
    ops::linear(h, w_next, y_want);
    same_bits(out, out_want, "block_tail out");
    same_bits(x, x_want, "block_tail x");
    same_bits(y, y_want, "block_tail y_next");
  }
}

TEST_F(CudaSampling, AgreesWithCpuReferenceAndRepeats) {
  std::mt19937 rng(41);
  std::uniform_real_distribution<float> u01(0.f, 1.f);
  for (int64_t V : {33, 4097, 151936}) {
    const size_t n = V > 10000 ? 96 : 512;
    std::vector<float> logits = uniform_floats(n * size_t(V), rng, -6.f, 6.f);
    // A few rows with ties and -inf entries.
    for (size_t r = 0; r < n; r += 7)
      for (int64_t j = 0; j < V; j += 3) logits[r * size_t(V) + size_t(j)] = (j % 2) ? 1.25f : -INFINITY;
    std::vector<ops::SampleRow> rows(n);
    for (size_t r = 0; r < n; ++r) {
      rows[r].temperature = r % 5 == 0 ? 0.f : 0.3f + 1.5f * u01(rng);
      rows[r].top_k = r % 3 == 0 ? 0 : int32_t(1 + rng() % 60);
      rows[r].top_p = r % 4 == 0 ? 1.f : 0.05f + 0.9f * u01(rng);
      rows[r].min_p = r % 6 == 0 ? 0.05f * u01(rng) : 0.f;
      rows[r].uniform = std::min(u01(rng), 0.99999f);
    }
    const auto got = gpu_sample(logits, V, rows);
    const auto again = gpu_sample(logits, V, rows);
    EXPECT_EQ(got, again) << "not deterministic, V " << V;
    const auto want = cpu_sample(logits, V, rows);
    int differ = 0;
    for (size_t r = 0; r < n; ++r) {
      ASSERT_GE(got[r], 0);
      ASSERT_LT(got[r], V);
      differ += got[r] != want[r];
    }
    EXPECT_LE(differ, 2) << "V " << V << ": " << differ << " of " << n << " rows differ from cpu::sample";
  }
}

// Only tokens inside the filters' sets are ever drawn.
TEST_F(CudaSampling, FiltersKeepTheirSets) {
  std::mt19937 rng(42);
  const int64_t V = 50000;
  std::vector<float> row = uniform_floats(size_t(V), rng, -5.f, 5.f);
  std::vector<int32_t> order(static_cast<size_t>(V));
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return row[size_t(a)] > row[size_t(b)]; });
  const size_t n = 256;
  const std::vector<float> logits = repeat_rows(row, n);
  // top-k = 7
  std::vector<ops::SampleRow> rows(n);
  for (size_t i = 0; i < n; ++i) rows[i] = {1.0f, 7, 1.0f, 0.0f, (float(i) + 0.5f) / float(n)};
  std::set<int32_t> top7(order.begin(), order.begin() + 7), seen;
  for (int32_t id : gpu_sample(logits, V, rows)) {
    EXPECT_TRUE(top7.count(id)) << "top_k 7 drew " << id;
    seen.insert(id);
  }
  EXPECT_EQ(seen.size(), 7u) << "stratified draws should reach every kept token";
  // top-p = 0.5 at temperature 0.2: the smallest prefix with half the mass.
  const float t = 0.2f;
  double z = 0;
  for (int64_t j = 0; j < V; ++j) z += std::exp((row[size_t(j)] - row[size_t(order[0])]) / t);
  size_t n_keep = 0;
  for (double mass = 0; n_keep < size_t(V) && mass < 0.5;) mass += std::exp((row[size_t(order[n_keep++])] - row[size_t(order[0])]) / t) / z;
  std::set<int32_t> top_p(order.begin(), order.begin() + long(n_keep));
  for (size_t i = 0; i < n; ++i) rows[i] = {t, 0, 0.5f, 0.0f, (float(i) + 0.5f) / float(n)};
  for (int32_t id : gpu_sample(logits, V, rows)) EXPECT_TRUE(top_p.count(id)) << "top_p 0.5 drew " << id;
  // min-p = 0.3: probability at least 0.3 of the top one.
  for (size_t i = 0; i < n; ++i) rows[i] = {0.5f, 0, 1.0f, 0.3f, (float(i) + 0.5f) / float(n)};
  for (int32_t id : gpu_sample(logits, V, rows))
    EXPECT_GE(std::exp((row[size_t(id)] - row[size_t(order[0])]) / 0.5f), 0.3f * 0.999f) << "min_p drew " << id;
}

// top_k cutting through a run of equal logits keeps the lowest ids.
TEST_F(CudaSampling, TopKTiesGoToLowerIds) {
  const int64_t V = 3001;
  std::vector<float> row(static_cast<size_t>(V), -1.0f);
  for (int64_t j = 100; j < V; j += 100) row[size_t(j)] = 2.0f;  // 30 equal best
  const size_t n = 400;
  std::vector<ops::SampleRow> rows(n);
  for (size_t i = 0; i < n; ++i) rows[i] = {1.0f, 10, 1.0f, 0.0f, (float(i) + 0.5f) / float(n)};
  std::set<int32_t> seen;
  for (int32_t id : gpu_sample(repeat_rows(row, n), V, rows)) seen.insert(id);
  std::set<int32_t> want;
  for (int j = 1; j <= 10; ++j) want.insert(100 * j);
  EXPECT_EQ(seen, want);
}

// Stratified uniforms: the histogram of draws follows softmax(logits / T).
TEST_F(CudaSampling, DrawsFollowSoftmax) {
  std::mt19937 rng(43);
  const int64_t V = 37;
  const std::vector<float> row = uniform_floats(size_t(V), rng, -3.f, 3.f);
  const float t = 0.7f;
  const size_t n = 8192;
  std::vector<ops::SampleRow> rows(n);
  for (size_t i = 0; i < n; ++i) rows[i] = {t, 0, 1.0f, 0.0f, (float(i) + 0.5f) / float(n)};
  std::vector<double> hist(static_cast<size_t>(V), 0);
  for (int32_t id : gpu_sample(repeat_rows(row, n), V, rows)) hist[size_t(id)] += 1.0 / double(n);
  double z = 0, mx = *std::max_element(row.begin(), row.end());
  for (float l : row) z += std::exp((l - mx) / t);
  for (int64_t j = 0; j < V; ++j)
    EXPECT_NEAR(hist[size_t(j)], std::exp((row[size_t(j)] - mx) / t) / z, 2.0 / double(n)) << "token " << j;
}

TEST_F(CudaSampling, PenaltiesMatchCpu) {
  std::mt19937 rng(44);
  const int64_t V = 1001, n_rows = 3;
  std::vector<float> logits = uniform_floats(size_t(V * n_rows), rng, -4.f, 4.f), ref(logits);
  std::vector<ops::PenaltyEntry> entries;
  for (int32_t r = 0; r < n_rows; ++r)
    for (int32_t t = int32_t(r); t < V; t += 37) entries.push_back({r, t, 1.3f, t % 2 ? 0.5f + 0.25f * float(t % 5) : 0.f});
  cpu::apply_penalties(ref.data(), V, entries);
  Buf<float> dl(logits);
  Buf<ops::PenaltyEntry> de(entries);
  apply_penalties(dl.get(), V, reinterpret_cast<const PenaltyEntry*>(de.get()), int64_t(entries.size()), stream());
  const std::vector<float> got = dl.download();
  ASSERT_EQ(0, std::memcmp(got.data(), ref.data(), ref.size() * 4));
}

}  // namespace
}  // namespace augur::cuda
