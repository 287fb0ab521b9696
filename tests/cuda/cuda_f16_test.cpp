// CUDA tests of the f16 paths (weights, K/V caches, tensor-core operands:
// matmul, conversions, embedding, store_kv, attention, qkv_rope_store, and
// block_tail on f16 and bf16 weights) against the CPU on the same values
// widened, on odd sizes. Outputs are poisoned (NaN / 0xffff) before each run.
//
// f16 tolerances: skinny matmul and decode attention stay f32-class; on the
// tensor-core paths x (or Q and P) is rounded to f16, unit roundoff 2^-11.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/matmul.h"
#include "backend/cpu/ops_cpu.h"
#include "backend/cuda/detail.h"
#include "backend/cuda/kernels.h"
#include "backend/ops.h"
#include "core/dtype.h"
#include "core/thread_pool.h"
#include "cuda_test_util.h"

namespace augur::cuda {
namespace {

// ---- f16 ----------------------------------------------------------------------------

uint16_t f16_sat(float f) { return f32_to_f16(std::fabs(f) > 65504.f ? std::copysign(65504.f, f) : f); }

std::vector<uint16_t> rand_f16(size_t n, std::mt19937& rng, float lo, float hi) {
  std::vector<uint16_t> v(n);
  std::uniform_real_distribution<float> u(lo, hi);
  for (auto& x : v) x = f32_to_f16(u(rng));
  return v;
}

std::vector<float> widen_f16(const std::vector<uint16_t>& h) {
  std::vector<float> f(h.size());
  for (size_t i = 0; i < h.size(); ++i) f[i] = f16_to_f32(h[i]);
  return f;
}

using CudaF16 = CudaFused;

TEST_F(CudaF16, MatmulSkinnyAndTensorCore) {
  std::mt19937 rng(50);
  for (int64_t M : {1, 2, 3, 8, 40})
    for (auto kn : std::vector<std::pair<int64_t, int64_t>>{{64, 1}, {136, 33}, {31, 17}, {4096, 257}}) {
      const int64_t K = kn.first, N = kn.second;
      const std::vector<float> x = uniform_floats(size_t(M * K), rng, -1.f, 1.f);
      const std::vector<uint16_t> w = rand_f16(size_t(N * K), rng, -1.f, 1.f);
      const std::vector<float> wf = widen_f16(w);
      std::vector<float> ref(size_t(M * N));
      cpu::matmul(x.data(), M, K, K, wf.data(), DType::F32, N, ref.data(), N, ThreadPool::global());
      Buf<float> dx(x), dy(ref.size());
      Buf<uint16_t> dw(w);
      dy.poison();
      matmul_half(dx.get(), M, K, K, dw.get(), Half::F16, N, dy.get(), N, stream());
      const std::vector<float> got = dy.download();
      const double tol = M <= detail::kSkinnyMaxM ? 1e-5 : 2e-3;
      for (int64_t m = 0; m < M; ++m)
        for (int64_t n = 0; n < N; ++n) {
          double scale = 0;
          for (int64_t k = 0; k < K; ++k) scale += std::fabs(double(x[size_t(m * K + k)]) * wf[size_t(n * K + k)]);
          ASSERT_NEAR(got[size_t(m * N + n)], ref[size_t(m * N + n)], tol * scale + 1e-6)
              << "M=" << M << " K=" << K << " N=" << N << " y[" << m << "," << n << "]";
        }
    }
}

TEST_F(CudaF16, ConvertMaxAbsEmbeddingStore) {
  std::mt19937 rng(51);
  // bf16 -> f16: exact within range, saturating beyond; max_abs sees the largest.
  std::vector<uint16_t> b = {f32_to_bf16(1.5f), f32_to_bf16(-3.0e5f), f32_to_bf16(1e-3f), f32_to_bf16(70000.f),
                             f32_to_bf16(-2.0f), f32_to_bf16(0.f)};
  Buf<uint16_t> db(b), dh(b.size());
  dh.poison();
  convert_half(db.get(), Half::BF16, dh.get(), Half::F16, int64_t(b.size()), stream());
  const std::vector<uint16_t> h = dh.download();
  for (size_t i = 0; i < b.size(); ++i) EXPECT_EQ(h[i], f16_sat(bf16_to_f32(b[i]))) << i;
  EXPECT_EQ(max_abs_half(db.get(), Half::BF16, int64_t(b.size()), stream()), bf16_to_f32(f32_to_bf16(3.0e5f)));
  EXPECT_EQ(max_abs_half(dh.get(), Half::F16, int64_t(b.size()), stream()), 65504.f);
  // embedding from an f16 table is exact.
  const int64_t d_model = 33, n_vocab = 11;
  const std::vector<uint16_t> table = rand_f16(size_t(n_vocab * d_model), rng, -2.f, 2.f);
  const std::vector<int32_t> ids = {0, 10, 3, 3};
  Buf<uint16_t> dt(table);
  Buf<int32_t> di(ids);
  Buf<float> dout(ids.size() * size_t(d_model));
  dout.poison();
  embedding(dt.get(), d_model, di.get(), int64_t(ids.size()), dout.get(), stream(), Half::F16);
  const std::vector<float> e = dout.download();
  for (size_t t = 0; t < ids.size(); ++t)
    for (int64_t i = 0; i < d_model; ++i)
      ASSERT_EQ(e[t * size_t(d_model) + size_t(i)], f16_to_f32(table[size_t(ids[t]) * size_t(d_model) + size_t(i)]));
  // store_kv into f16 caches: round to nearest even, saturating.
  for (int64_t kv_dim : {16, 33}) {
    const int64_t n_tokens = 3, n_slots = 5;
    std::vector<float> k = uniform_floats(size_t(n_tokens * kv_dim), rng, -100.f, 100.f);
    std::vector<float> v = uniform_floats(size_t(n_tokens * kv_dim), rng, -1e-3f, 1e-3f);
    k[1] = 1e6f, v[2] = -7e4f;
    const std::vector<int32_t> slots = {4, -1, 0};
    Buf<float> dk(k), dv(v);
    Buf<int32_t> ds(slots);
    Buf<uint16_t> kc(size_t(n_slots * kv_dim)), vc(size_t(n_slots * kv_dim));
    kc.poison(), vc.poison();
    AttnMeta meta;
    meta.slot_mapping = ds.get();
    meta.n_tokens = int32_t(n_tokens);
    store_kv(dk.get(), dv.get(), kv_dim, meta, kc.get(), vc.get(), stream(), Half::F16);
    const std::vector<uint16_t> gk = kc.download(), gv = vc.download();
    for (size_t t = 0; t < slots.size(); ++t) {
      if (slots[t] < 0) continue;
      for (int64_t i = 0; i < kv_dim; ++i) {
        const size_t at = size_t(slots[t]) * size_t(kv_dim) + size_t(i), src = t * size_t(kv_dim) + size_t(i);
        ASSERT_EQ(gk[at], f16_sat(k[src])) << "k " << t << " " << i;
        ASSERT_EQ(gv[at], f16_sat(v[src])) << "v " << t << " " << i;
      }
    }
  }
}

// Decode and prefill attention over f16 caches against the CPU on the same
// values widened; one row per case, its blocks in reverse order.
void check_attention_f16(int64_t n_head, int64_t n_head_kv, int64_t D, int64_t block_size, int32_t n_tokens,
                         int32_t pos0, uint32_t seed) {
  std::mt19937 rng(seed);
  const int64_t kv_dim = n_head_kv * D, len = pos0 + n_tokens;
  const int64_t n_blocks = (len + block_size - 1) / block_size;
  std::vector<int32_t> table(static_cast<size_t>(n_blocks));
  for (int64_t b = 0; b < n_blocks; ++b) table[size_t(b)] = int32_t(n_blocks - 1 - b);
  const size_t cache_elems = size_t(n_blocks * block_size * kv_dim);
  const std::vector<uint16_t> kc = rand_f16(cache_elems, rng, -1.f, 1.f), vc = rand_f16(cache_elems, rng, -1.f, 1.f);
  const std::vector<float> kf = widen_f16(kc), vf = widen_f16(vc);
  const std::vector<float> q = uniform_floats(size_t(n_tokens * n_head * D), rng, -2.f, 2.f);
  std::vector<int32_t> positions, token_row(static_cast<size_t>(n_tokens), 0);
  for (int32_t i = 0; i < n_tokens; ++i) positions.push_back(pos0 + i);
  const std::vector<ops::AttnRow> rows = {{0, n_tokens, pos0, table}};
  const float scale = 1.0f / std::sqrt(float(D));
  std::vector<float> ref(q.size());
  cpu::paged_attention(q.data(), kf.data(), vf.data(), block_size, n_head, n_head_kv, D, rows, scale, 0, ref.data());
  Buf<float> dq(q), dout(q.size());
  Buf<uint16_t> dk(kc), dv(vc);
  Buf<int32_t> dpos(positions), drow(token_row), dbt(table);
  AttnMeta meta;
  meta.positions = dpos.get();
  meta.token_row = drow.get();
  meta.block_tables = dbt.get();
  meta.max_blocks = int32_t(n_blocks);
  meta.n_tokens = n_tokens;
  meta.max_context = int32_t(len);
  meta.max_row_tokens = n_tokens;
  Buf<float> ws(attention_workspace_bytes(n_tokens, n_head, D, meta.max_context) / 4 + 1);
  dout.poison();
  paged_attention(dq.get(), dk.get(), dv.get(), block_size, n_head, n_head_kv, D, meta, scale, 0, dout.get(), ws.get(),
                  stream(), Half::F16);
  const std::vector<float> got = dout.download();
  // Flash-decoding on f32 Q and P (the scalar kernel) is f32-exact; the
  // tensor-core decode and prefill round Q and P to f16.
  const bool decode = n_tokens <= 8 && detail::precision().decode_attention;
  double num = 0, den = 0, worst = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    ASSERT_TRUE(std::isfinite(got[i])) << i;
    worst = std::max(worst, std::fabs(double(got[i]) - ref[i]));
    num += (double(got[i]) - ref[i]) * (double(got[i]) - ref[i]);
    den += double(ref[i]) * ref[i];
  }
  const std::string what = "heads " + std::to_string(n_head) + "/" + std::to_string(n_head_kv) + " D " +
                           std::to_string(D) + " tokens " + std::to_string(n_tokens) + "@" + std::to_string(pos0);
  EXPECT_LE(worst, decode ? 2e-5 : 4e-3) << what;
  EXPECT_LE(std::sqrt(num / den), decode ? 1e-5 : 2e-3) << what;
}

TEST_F(CudaF16, AttentionDecodeAndPrefill) {
  check_attention_f16(4, 2, 16, 4, 1, 0, 1);
  check_attention_f16(8, 2, 128, 16, 1, 300, 2);
  check_attention_f16(32, 8, 128, 16, 3, 1000, 3);
  check_attention_f16(4, 4, 64, 16, 1, 4096, 4);
  check_attention_f16(4, 2, 16, 4, 37, 0, 5);
  check_attention_f16(32, 8, 128, 16, 200, 0, 6);
  check_attention_f16(8, 1, 256, 16, 65, 100, 7);
  check_attention_f16(6, 2, 32, 16, 129, 33, 8);
  // The decode cases again on the scalar flash-decoding kernel (f32 Q and P).
  detail::Precision& prec = detail::precision();
  const detail::Precision saved = prec;
  prec.decode_attention = true;
  check_attention_f16(4, 2, 16, 4, 1, 0, 1);
  check_attention_f16(8, 2, 128, 16, 1, 300, 2);
  check_attention_f16(32, 8, 128, 16, 3, 1000, 3);
  check_attention_f16(4, 4, 64, 16, 1, 4096, 4);
  prec = saved;
}

TEST_F(CudaF16, QkvRopeStoreWritesF16) {
  std::mt19937 rng(52);
  const int64_t n_head = 4, n_head_kv = 2, D = 64, half = 32, T = 3, n_slots = 4, kv_dim = n_head_kv * D;
  const int64_t width = (n_head + 2 * n_head_kv) * D;
  const std::vector<float> qkv = uniform_floats(size_t(T * width), rng, -4.f, 4.f);
  const std::vector<int32_t> pos = {0, 9, 300}, slots = {2, 0, 3};
  std::vector<float> inv_freq(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) inv_freq[size_t(i)] = float(1.0 / std::pow(1e4, double(i) / double(half)));
  std::vector<float> k(size_t(T * kv_dim)), v(size_t(T * kv_dim));
  for (int64_t t = 0; t < T; ++t) {
    std::copy_n(qkv.begin() + t * width + n_head * D, kv_dim, k.begin() + t * kv_dim);
    std::copy_n(qkv.begin() + t * width + n_head * D + kv_dim, kv_dim, v.begin() + t * kv_dim);
  }
  cpu::rope(k.data(), T, n_head_kv, D, pos, inv_freq);
  Buf<float> dqkv(qkv), dfreq(inv_freq), dq(size_t(T * n_head * D));
  Buf<int32_t> dpos(pos), dslots(slots);
  Buf<uint16_t> kc(size_t(n_slots * kv_dim)), vc(size_t(n_slots * kv_dim));
  AttnMeta meta;
  meta.positions = dpos.get();
  meta.slot_mapping = dslots.get();
  meta.n_tokens = int32_t(T);
  qkv_rope_store(dqkv.get(), n_head, n_head_kv, D, nullptr, nullptr, 1e-6f, dfreq.get(), half, meta, dq.get(), kc.get(),
                 vc.get(), stream(), Half::F16);
  const std::vector<uint16_t> gk = kc.download(), gv = vc.download();
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < kv_dim; ++i) {
      const size_t at = size_t(slots[size_t(t)] * kv_dim + i), src = size_t(t * kv_dim + i);
      // k: cosf/sinf may differ from std::cos/sin in the last bit, so one f16 step either way.
      ASSERT_NEAR(f16_to_f32(gk[at]), k[src], std::fabs(k[src]) * 0x1p-10f + 1e-6f) << "k " << t << " " << i;
      ASSERT_EQ(gv[at], f16_sat(v[src])) << "v " << t << " " << i;
    }
}

// block_tail (stream GEMVs with fused ends) against the ops it replaces:
// matmul_half at M <= 2 (rows_kernel, here without split-K), add_rms_norm,
// the gate/up matmul, swiglu and the down matmul, then optionally
// add_rms_norm with the next gain and the next projection. The stream GEMVs
// sum in another order than rows_kernel, their norm in another than
// add_rms_norm: results agree to float noise. Each case runs twice. Shapes:
// the fixtures' (64/128), K not a multiple of 256 (augur-tiny's 384), more
// units than SMs, Qwen3-8B's and Qwen3.5-27B's.
TEST_F(CudaF16, BlockTailEqualsUnfusedOps) {
  std::mt19937 rng(60);
  struct Case {
    int64_t M, Ka, D, F, N;
    Half wo, gu, dn, nx;
  };
  const Half f16 = Half::F16, bf16 = Half::BF16;
  for (const Case& c : {Case{1, 64, 64, 128, 128, f16, f16, f16, f16}, Case{2, 384, 384, 1024, 0, bf16, f16, bf16, f16},
                        Case{2, 384, 384, 1024, 1152, f16, bf16, f16, bf16},
                        Case{1, 520, 1032, 2056, 1032, f16, bf16, f16, f16}, Case{2, 1024, 1024, 8192, 0, f16, f16, f16, f16},
                        Case{1, 4096, 4096, 12288, 6144, f16, f16, f16, f16},
                        Case{1, 6144, 5120, 17408, 16480, bf16, bf16, bf16, bf16}}) {
    SCOPED_TRACE(testing::Message() << "M=" << c.M << " Ka=" << c.Ka << " D=" << c.D << " F=" << c.F << " N=" << c.N);
    ASSERT_TRUE(block_tail_fits(c.M, c.Ka, c.D, c.F, c.N));
    auto weights = [&](int64_t n, Half t) {
      std::vector<uint16_t> w(static_cast<size_t>(n));
      std::uniform_real_distribution<float> u(-0.05f, 0.05f);
      for (auto& v : w) v = t == Half::F16 ? f32_to_f16(u(rng)) : f32_to_bf16(u(rng));
      return w;
    };
    const std::vector<float> a = uniform_floats(size_t(c.M * c.Ka), rng, -2.f, 2.f);
    const std::vector<float> x = uniform_floats(size_t(c.M * c.D), rng, -2.f, 2.f);
    const std::vector<float> g = uniform_floats(size_t(c.D), rng, 0.5f, 1.5f);
    const std::vector<float> g2 = uniform_floats(size_t(c.D), rng, 0.5f, 1.5f);
    Buf<uint16_t> wo(weights(c.D * c.Ka, c.wo)), gu(weights(2 * c.F * c.D, c.gu)), dn(weights(c.D * c.F, c.dn));
    Buf<uint16_t> wn(weights(std::max<int64_t>(c.N, 1) * c.D, c.nx));
    Buf<float> da(a), dg(g), dg2(g2), dx(x), o(size_t(c.M * c.D)), h(size_t(c.M * c.D)), gate_up(size_t(c.M * 2 * c.F));
    Buf<float> act(size_t(c.M * c.F)), out(size_t(c.M * c.D)), y(size_t(c.M * std::max<int64_t>(c.N, 1)));
    const float eps = 1e-6f;
    // The unfused ops.
    detail::skinny_matmul(da.get(), c.M, c.Ka, c.Ka, wo.get(), c.D, o.get(), c.D, stream(), 1, c.wo);
    add_rms_norm(dx.get(), o.get(), dg.get(), eps, c.M, c.D, h.get(), stream());
    detail::skinny_matmul(h.get(), c.M, c.D, c.D, gu.get(), 2 * c.F, gate_up.get(), 2 * c.F, stream(), 1, c.gu);
    swiglu_packed(gate_up.get(), c.M, c.F, act.get(), stream());
    detail::skinny_matmul(act.get(), c.M, c.F, c.F, dn.get(), c.D, out.get(), c.D, stream(), 1, c.dn);
    const std::vector<float> want_out = out.download();
    if (c.N > 0) {
      add_rms_norm(dx.get(), out.get(), dg2.get(), eps, c.M, c.D, h.get(), stream());
      detail::skinny_matmul(h.get(), c.M, c.D, c.D, wn.get(), c.N, y.get(), c.N, stream(), 1, c.nx);
    }
    const std::vector<float> want_x = dx.download(), want_y = c.N > 0 ? y.download() : std::vector<float>();
    auto compare = [&](const std::vector<float>& got, const std::vector<float>& want, const char* what, int run) {
      float scale = 0.f;
      for (float v : want) scale = std::max(scale, std::fabs(v));
      size_t exact = 0;
      for (size_t i = 0; i < want.size(); ++i) {
        EXPECT_NEAR(got[i], want[i], 2e-6f * scale + 1e-7f) << what << "[" << i << "], run " << run;
        if (std::fabs(got[i] - want[i]) > 2e-6f * scale + 1e-7f) return;
        exact += got[i] == want[i];
      }
      if (run == 0)
        std::printf("  block_tail M=%lld D=%lld F=%lld N=%lld %s: %zu of %zu bit-equal\n", (long long)c.M,
                    (long long)c.D, (long long)c.F, (long long)c.N, what, exact, want.size());
    };
    for (int run = 0; run < 2; ++run) {
      dx.upload(x);
      act.poison(), out.poison(), y.poison();
      BlockTail t;
      t.a = da.get(), t.M = c.M, t.Ka = c.Ka, t.D = c.D, t.F = c.F;
      t.w_out = wo.get(), t.w_out_t = c.wo, t.x = dx.get(), t.g = dg.get(), t.eps = eps;
      t.gate_up = gu.get(), t.gate_up_t = c.gu, t.down = dn.get(), t.down_t = c.dn;
      t.act = act.get(), t.out = out.get();
      if (c.N > 0) t.n_next = c.N, t.w_next = wn.get(), t.w_next_t = c.nx, t.g_next = dg2.get(), t.y_next = y.get();
      block_tail(t, stream());
      compare(dx.download(), want_x, "x", run);
      compare(out.download(), want_out, "out", run);
      if (c.N > 0) compare(y.download(), want_y, "y_next", run);
      if (HasFailure()) break;
    }
  }
  EXPECT_TRUE(block_tail_fits(8, 256, 256, 256));         // verify steps of up to 8 rows are fused
  EXPECT_FALSE(block_tail_fits(9, 256, 256, 256));        // batches past 8 rows stay unfused
  EXPECT_FALSE(block_tail_fits(1, 100, 256, 256));        // rows not in 16-byte runs
  EXPECT_FALSE(block_tail_fits(1, 256, 256, 1 << 20));    // a SwiGLU wider than the stream GEMV takes
  EXPECT_TRUE(block_tail_fits(1, 256, 256, 256, 6));      // a GEMV takes any row count
  EXPECT_FALSE(block_tail_fits(1, 20000, 256, 256, 0));   // K past the stream kernel's 18432
}

}  // namespace
}  // namespace augur::cuda
