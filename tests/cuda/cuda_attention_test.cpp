// CUDA attention tests: paged_attention of backend/cuda/kernels.h (decode and
// prefill, GQA, sliding windows, CUDA-graph replay, flash-decoding's split
// merge) against cpu::paged_attention on the same bf16 cache values widened to
// f32, on random inputs of odd sizes. Outputs are poisoned (NaN) before each
// run, so an element left unwritten fails.
//
// Tolerances, by what the kernel rounds:
//   f32-class: decode on the scalar flash-decoding kernel (f32 Q and P, the
//     f32-attention experiment): max |err| <= 2e-5, rel-L2 <= 1e-5;
//   bf16 operands: prefill, and decode on tensor cores (Q and P rounded to
//     bf16): max |err| <= 2e-2, rel-L2 <= 1e-2.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "backend/cpu/ops_cpu.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/detail.h"
#include "core/dtype.h"
#include "core/error.h"
#include "cuda_test_util.h"

namespace augur::cuda {
namespace {

// ---- attention ----------------------------------------------------------------------

struct AttnRowSpec {
  int32_t n_tokens;  // new tokens of this row in the batch
  int32_t pos0;      // position of the first of them (the cache holds 0..pos0+n_tokens-1)
};

struct AttnCase {
  int64_t n_head, n_head_kv, head_dim, block_size;
  std::vector<AttnRowSpec> rows;
  int32_t window = 0;
  int32_t max_context = 0;  // 0: the largest position + 1
  bool decode_hint = false; // set max_row_tokens (1 when every row has one token)
};

std::string describe(const AttnCase& c) {
  std::string s = "heads " + std::to_string(c.n_head) + "/" + std::to_string(c.n_head_kv) + " dim " +
                  std::to_string(c.head_dim) + " block " + std::to_string(c.block_size) + " window " +
                  std::to_string(c.window) + " rows";
  for (const auto& r : c.rows) s += " (" + std::to_string(r.n_tokens) + "@" + std::to_string(r.pos0) + ")";
  return s;
}

// Builds a paged cache with each row's blocks scattered, runs the GPU kernel and
// the CPU reference (on the same bf16 values widened to f32), returns the error.
ErrStats run_attention(const AttnCase& c, uint32_t seed, Stream s = nullptr, bool graph_replay = false) {
  std::mt19937 rng(seed);
  const int64_t D = c.head_dim, kv_dim = c.n_head_kv * D;
  const int64_t n_rows = int64_t(c.rows.size());
  int64_t max_blocks = 1, total_blocks = 0, n_tokens = 0;
  int32_t max_pos = 0, max_row_tokens = 0;
  for (const auto& r : c.rows) {
    const int64_t len = r.pos0 + r.n_tokens;
    max_blocks = std::max(max_blocks, (len + c.block_size - 1) / c.block_size);
    total_blocks += (len + c.block_size - 1) / c.block_size;
    n_tokens += r.n_tokens;
    max_pos = std::max(max_pos, r.pos0 + r.n_tokens - 1);
    max_row_tokens = std::max(max_row_tokens, r.n_tokens);
  }
  const int64_t n_blocks = total_blocks + 3;  // a few never used
  std::vector<int32_t> perm(static_cast<size_t>(n_blocks));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  std::vector<int32_t> block_tables(size_t(n_rows * max_blocks), 0);
  std::vector<std::vector<int32_t>> tables(static_cast<size_t>(n_rows));
  size_t next = 0;
  std::vector<ops::AttnRow> rows;
  std::vector<int32_t> positions, token_row;
  int32_t tb = 0;
  for (int64_t r = 0; r < n_rows; ++r) {
    const auto& spec = c.rows[size_t(r)];
    const int64_t nb = (spec.pos0 + spec.n_tokens + c.block_size - 1) / c.block_size;
    for (int64_t b = 0; b < nb; ++b) {
      block_tables[size_t(r * max_blocks + b)] = perm[next];
      tables[size_t(r)].push_back(perm[next++]);
    }
    rows.push_back({tb, spec.n_tokens, spec.pos0, tables[size_t(r)]});
    for (int32_t i = 0; i < spec.n_tokens; ++i) positions.push_back(spec.pos0 + i), token_row.push_back(int32_t(r));
    tb += spec.n_tokens;
  }
  const size_t cache_elems = size_t(n_blocks * c.block_size * kv_dim);
  std::vector<uint16_t> kc = rand_bf16(cache_elems, rng), vc = rand_bf16(cache_elems, rng);
  std::vector<float> kf(cache_elems), vf(cache_elems);
  for (size_t i = 0; i < cache_elems; ++i) kf[i] = bf16_to_f32(kc[i]), vf[i] = bf16_to_f32(vc[i]);
  std::vector<float> q = randn(size_t(n_tokens * c.n_head * D), rng, -2.f, 2.f);
  const float scale = 1.0f / std::sqrt(float(D));
  std::vector<float> ref(q.size());
  cpu::paged_attention(q.data(), kf.data(), vf.data(), c.block_size, c.n_head, c.n_head_kv, D, rows, scale, c.window,
                       ref.data());

  Dev<float> dq(q), dout(q.size());
  Dev<uint16_t> dk(kc), dv(vc);
  Dev<int32_t> dpos(positions), drow(token_row), dbt(block_tables);
  AttnMeta meta;
  meta.positions = dpos.get();
  meta.token_row = drow.get();
  meta.block_tables = dbt.get();
  meta.max_blocks = int32_t(max_blocks);
  meta.n_tokens = int32_t(n_tokens);
  meta.max_context = c.max_context > 0 ? c.max_context : max_pos + 1;
  meta.max_row_tokens = c.decode_hint ? max_row_tokens : 0;
  const size_t ws_bytes = attention_workspace_bytes(n_tokens, c.n_head, D, meta.max_context);
  Dev<float> ws(ws_bytes / 4 + 1);
  if (s == nullptr) s = stream();
  dout.poison();
  if (!graph_replay) {
    paged_attention(dq.get(), dk.get(), dv.get(), c.block_size, c.n_head, c.n_head_kv, D, meta, scale, c.window,
                    dout.get(), ws.get(), s);
  } else {
    // Capture with the positions shifted back, then replay with the real ones:
    // the graph must follow positions it reads on the device.
    std::vector<int32_t> early(positions);
    for (auto& p : early) p = std::max(0, p / 3);
    dpos.upload(early);
    paged_attention(dq.get(), dk.get(), dv.get(), c.block_size, c.n_head, c.n_head_kv, D, meta, scale, c.window,
                    dout.get(), ws.get(), s);  // warm-up (first use sets kernel attributes)
    synchronize();
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    if (cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal) != cudaSuccess) return {1e9, 1e9, false};
    paged_attention(dq.get(), dk.get(), dv.get(), c.block_size, c.n_head, c.n_head_kv, D, meta, scale, c.window,
                    dout.get(), ws.get(), s);
    if (cudaStreamEndCapture(s, &graph) != cudaSuccess) return {1e9, 1e9, false};
    if (cudaGraphInstantiate(&exec, graph, 0) != cudaSuccess) return {1e9, 1e9, false};
    dpos.upload(positions);
    dout.poison();
    if (cudaGraphLaunch(exec, s) != cudaSuccess) return {1e9, 1e9, false};
    synchronize();
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
  }
  return compare(dout.download(), ref);
}

using CudaAttention = CudaTest;

// Decode attention runs on tensor cores (groups of at most 16 heads; Q and P
// rounded to the caches' type, as prefill: prefill's tolerance) unless the
// f32-attention experiment (Precision::decode_attention) selects the scalar
// flash-decoding kernel (f32 Q and P: 2e-5). Decode tests run in both modes.
struct DecodeMode {
  explicit DecodeMode(bool scalar) : saved(detail::precision()) { detail::precision().decode_attention = scalar; }
  ~DecodeMode() { detail::precision() = saved; }
  detail::Precision saved;
};
bool scalar_decode() { return detail::precision().decode_attention; }
double decode_tol() { return scalar_decode() ? 2e-5 : 2e-2; }

void expect_decode_ok(const AttnCase& c, uint32_t seed) {
  for (bool scalar : {false, true}) {
    DecodeMode mode(scalar);
    const ErrStats e = run_attention(c, seed);
    EXPECT_TRUE(e.all_finite) << describe(c) << (scalar ? " (scalar)" : " (tensor cores)");
    EXPECT_LE(e.max_abs, decode_tol()) << describe(c) << (scalar ? " (scalar)" : " (tensor cores)");
    EXPECT_LE(e.rel_l2, scalar ? 1e-5 : 1e-2) << describe(c) << (scalar ? " (scalar)" : " (tensor cores)");
  }
}

void expect_prefill_ok(const AttnCase& c, uint32_t seed) {
  const ErrStats e = run_attention(c, seed);
  EXPECT_TRUE(e.all_finite) << describe(c);
  EXPECT_LE(e.max_abs, 2e-2) << describe(c);
  EXPECT_LE(e.rel_l2, 1e-2) << describe(c);
}

TEST_F(CudaAttention, DecodeSmall) {
  expect_decode_ok({4, 2, 16, 4, {{1, 0}}}, 1);
  expect_decode_ok({4, 2, 32, 16, {{1, 9}, {1, 130}, {1, 3}}}, 2);
  expect_decode_ok({8, 2, 128, 16, {{1, 300}}, 0, 1024}, 3);
}

TEST_F(CudaAttention, DecodeContextsAndGroups) {
  uint32_t seed = 10;
  for (int64_t D : {16, 32, 64, 128, 256})
    for (auto heads : std::vector<std::pair<int64_t, int64_t>>{{4, 4}, {8, 4}, {32, 8}, {12, 2}, {16, 1}})
      for (int32_t ctx : {1, 33, 129, 1000}) expect_decode_ok({heads.first, heads.second, D, 16, {{1, ctx - 1}}}, seed++);
  // Long contexts, many splits, odd block sizes.
  for (int64_t bs : {1, 7, 32}) expect_decode_ok({32, 8, 128, bs, {{1, 5000}}}, seed++);
  expect_decode_ok({32, 8, 128, 16, {{1, 8191}}}, seed++);
}

TEST_F(CudaAttention, DecodeBatchesWindowsAndGridSlack) {
  uint32_t seed = 100;
  // Rows of different lengths in one batch (n_tokens <= 8: flash-decoding).
  expect_decode_ok({32, 8, 128, 16, {{1, 0}, {1, 1}, {1, 200}, {1, 4000}, {1, 17}}}, seed++);
  // A decode batch of 20 rows (max_row_tokens = 1 selects flash-decoding).
  std::vector<AttnRowSpec> many;
  for (int i = 0; i < 20; ++i) many.push_back({1, i * 97 % 1500});
  expect_decode_ok({16, 4, 64, 16, many, 0, 0, true}, seed++);
  // Several tokens per row still on the decode path (n_tokens <= 8).
  expect_decode_ok({8, 2, 64, 16, {{3, 10}, {4, 0}}}, seed++);
  // Sliding windows.
  for (int32_t window : {1, 5, 64, 700}) expect_decode_ok({8, 2, 128, 16, {{1, 1000}, {1, 3}}, window}, seed++);
  // max_context far above the real lengths (a graph captured for long contexts).
  expect_decode_ok({32, 8, 128, 16, {{1, 50}, {1, 700}}, 0, 32768}, seed++);
}

TEST_F(CudaAttention, PrefillSmall) {
  expect_prefill_ok({4, 2, 16, 4, {{9, 0}}}, 1);
  expect_prefill_ok({8, 2, 64, 16, {{12, 0}, {5, 7}}}, 2);
}

TEST_F(CudaAttention, PrefillVarlen) {
  uint32_t seed = 200;
  for (int64_t D : {16, 32, 64, 128, 256})
    for (auto heads : std::vector<std::pair<int64_t, int64_t>>{{4, 4}, {8, 2}, {32, 8}, {12, 4}, {16, 1}})
      expect_prefill_ok({heads.first, heads.second, D, 16, {{37, 0}, {100, 50}, {1, 10}, {64, 3}}}, seed++);
  for (int64_t bs : {1, 5, 64}) expect_prefill_ok({32, 8, 128, bs, {{300, 0}, {129, 1000}}}, seed++);
  for (int32_t window : {1, 16, 100}) expect_prefill_ok({8, 2, 128, 16, {{200, 0}, {50, 300}}, window}, seed++);
  // Many single-token rows without the decode hint: every tile holds several segments.
  std::vector<AttnRowSpec> many;
  for (int i = 0; i < 40; ++i) many.push_back({1 + i % 3, i * 13});
  expect_prefill_ok({8, 2, 64, 16, many}, seed++);
}

TEST_F(CudaAttention, DecodeGraphReplay) {
  // Captured for max_context 4096 with short positions, replayed with longer ones.
  for (auto c : std::vector<AttnCase>{{32, 8, 128, 16, {{1, 3000}}, 0, 4096},
                                      {32, 8, 128, 16, {{1, 100}, {1, 4000}, {1, 2}}, 0, 4096},
                                      {8, 2, 64, 16, {{1, 900}}, 128, 4096}})
    for (bool scalar : {false, true}) {
      DecodeMode mode(scalar);
      const ErrStats e = run_attention(c, 300, nullptr, true);
      EXPECT_TRUE(e.all_finite) << describe(c);
      EXPECT_LE(e.max_abs, decode_tol()) << describe(c) << (scalar ? " (scalar)" : " (tensor cores)");
    }
}

// Flash-decoding with a forced split length, twice in a row on the same
// buffers (cache, q, out, workspace and the Context's split counters), the
// second time at other positions: rows whose context spans several splits
// come to fit one and the reverse, so a counter the first launch left
// non-zero would leave outputs unwritten (poisoned) or merged early. Each
// launch is repeated bit-identically (splits merge in split order, whichever
// block ends last), then both are replayed twice through one CUDA graph.
struct DecodeTwiceCase {
  int64_t n_head, n_head_kv, head_dim;
  int split_len;
  std::vector<int32_t> first, second;  // position of each row's one token, per launch
  int32_t window = 0;
};

std::string describe(const DecodeTwiceCase& c) {
  std::string s = "heads " + std::to_string(c.n_head) + "/" + std::to_string(c.n_head_kv) + " dim " +
                  std::to_string(c.head_dim) + " split_len " + std::to_string(c.split_len) + " window " +
                  std::to_string(c.window) + " positions";
  for (size_t r = 0; r < c.first.size(); ++r) {
    s += ' ';
    s += std::to_string(c.first[r]);
    s += "->";
    s += std::to_string(c.second[r]);
  }
  return s;
}

void run_decode_twice(const DecodeTwiceCase& c, uint32_t seed) {
  std::mt19937 rng(seed);
  const int64_t D = c.head_dim, bs = 16, n_rows = int64_t(c.first.size());
  int32_t max_pos = 0;
  for (size_t r = 0; r < c.first.size(); ++r) max_pos = std::max({max_pos, c.first[r], c.second[r]});
  const int64_t max_blocks = (max_pos + bs) / bs, n_blocks = n_rows * max_blocks;
  std::vector<int32_t> tables(static_cast<size_t>(n_blocks));  // [n_rows, max_blocks], blocks scattered
  std::iota(tables.begin(), tables.end(), 0);
  std::shuffle(tables.begin(), tables.end(), rng);
  std::vector<int32_t> token_row(static_cast<size_t>(n_rows));
  std::iota(token_row.begin(), token_row.end(), 0);
  const size_t cache_elems = size_t(n_blocks * bs * c.n_head_kv * D);
  std::vector<uint16_t> kc = rand_bf16(cache_elems, rng), vc = rand_bf16(cache_elems, rng);
  std::vector<float> kf(cache_elems), vf(cache_elems);
  for (size_t i = 0; i < cache_elems; ++i) kf[i] = bf16_to_f32(kc[i]), vf[i] = bf16_to_f32(vc[i]);
  const float scale = 1.0f / std::sqrt(float(D));
  const size_t q_elems = size_t(n_rows * c.n_head * D);

  struct Launch {
    std::vector<int32_t> positions;
    std::vector<float> q, ref;
  };
  std::vector<Launch> launches;
  for (const std::vector<int32_t>* pos : {&c.first, &c.second}) {
    Launch l{*pos, randn(q_elems, rng, -2.f, 2.f), std::vector<float>(q_elems)};
    std::vector<ops::AttnRow> rows;
    for (int64_t r = 0; r < n_rows; ++r)
      rows.push_back({int32_t(r), 1, (*pos)[size_t(r)],
                      std::span<const int32_t>(tables.data() + r * max_blocks, size_t(max_blocks))});
    cpu::paged_attention(l.q.data(), kf.data(), vf.data(), bs, c.n_head, c.n_head_kv, D, rows, scale, c.window,
                         l.ref.data());
    launches.push_back(std::move(l));
  }

  Dev<float> dq(q_elems), dout(q_elems);
  Dev<float> ws(size_t(n_rows * c.n_head) * size_t((max_pos + c.split_len) / c.split_len) * size_t(D + 2));
  Dev<uint16_t> dk(kc), dv(vc);
  Dev<int32_t> dpos(c.first), drow(token_row), dbt(tables);
  AttnMeta meta;
  meta.positions = dpos.get();
  meta.token_row = drow.get();
  meta.block_tables = dbt.get();
  meta.max_blocks = int32_t(max_blocks);
  meta.n_tokens = int32_t(n_rows);
  meta.max_context = max_pos + 1;
  meta.max_row_tokens = 1;
  auto decode = [&] {
    detail::paged_attention_decode(dq.get(), dk.get(), dv.get(), bs, c.n_head, c.n_head_kv, D, meta, scale, c.window,
                                   dout.get(), ws.get(), stream(), c.split_len);
  };
  auto expect_ok = [&](const std::vector<float>& got, const Launch& l, const std::string& what) {
    const ErrStats e = compare(got, l.ref);
    EXPECT_TRUE(e.all_finite) << what << ": " << describe(c);
    EXPECT_LE(e.max_abs, decode_tol()) << what << ": " << describe(c) << (scalar_decode() ? " (scalar)" : " (tensor cores)");
  };

  for (size_t i = 0; i < launches.size(); ++i) {
    const Launch& l = launches[i];
    dpos.upload(l.positions);
    dq.upload(l.q);
    ws.poison();  // a merge may read only partials written by its own launch
    dout.poison();
    decode();
    const std::vector<float> got = dout.download();
    expect_ok(got, l, "launch " + std::to_string(i));
    dout.poison();
    decode();
    const std::vector<float> again = dout.download();
    EXPECT_EQ(std::memcmp(again.data(), got.data(), got.size() * sizeof(float)), 0)
        << "launch " << i << " repeated differs: " << describe(c);
  }

  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(stream(), cudaStreamCaptureModeThreadLocal), cudaSuccess);
  decode();
  ASSERT_EQ(cudaStreamEndCapture(stream(), &graph), cudaSuccess);
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  for (int rep = 0; rep < 2; ++rep)
    for (size_t i = 0; i < launches.size(); ++i) {
      dpos.upload(launches[i].positions);
      dq.upload(launches[i].q);
      dout.poison();
      EXPECT_EQ(cudaGraphLaunch(exec, stream()), cudaSuccess);
      expect_ok(dout.download(), launches[i], "replay " + std::to_string(rep) + " of launch " + std::to_string(i));
    }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
}

TEST_F(CudaAttention, DecodeTwiceOnSameBuffers) {
  for (bool scalar : {false, true}) {
    DecodeMode mode(scalar);
    uint32_t seed = 400;
    // Qwen3-8B heads (GP 4): 16 splits -> fits one, 11 -> 16, fits one -> 5.
    run_decode_twice({32, 8, 128, 64, {1000, 700, 5}, {40, 1000, 300}}, seed++);
    // GQA 12 (scalar: two head passes of 8 and 4 heads); head_dim 256.
    run_decode_twice({24, 2, 256, 128, {517, 3}, {900, 129}}, seed++);
    // One head per block, head_dim 16: 32 thread groups share each output lane of the merge.
    run_decode_twice({4, 4, 16, 32, {300, 31}, {31, 100}}, seed++);
    // A split length that is not a multiple of the stage; a row at position 0.
    run_decode_twice({8, 2, 64, 48, {0, 500, 199}, {700, 47, 200}}, seed++);
    // Sliding window: the splits counted from the window's first key.
    run_decode_twice({8, 2, 128, 64, {1000, 90}, {300, 1000}, 200}, seed++);
  }
}

TEST_F(CudaAttention, RejectsBadShapes) {
  AttnMeta meta;
  meta.n_tokens = 1;
  meta.max_context = 16;
  meta.max_blocks = 1;
  Dev<float> dq(64), dout(64);
  Dev<uint16_t> dk(64);
  EXPECT_THROW(paged_attention(dq.get(), dk.get(), dk.get(), 16, 3, 2, 16, meta, 1.f, 0, dout.get(), nullptr, stream()),
               Error);
  EXPECT_THROW(paged_attention(dq.get(), dk.get(), dk.get(), 16, 2, 2, 24, meta, 1.f, 0, dout.get(), nullptr, stream()),
               Error);
}

}  // namespace
}  // namespace augur::cuda
