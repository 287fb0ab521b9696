#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "core/mmap.h"
#include "core/tensor.h"
#include "core/thread_pool.h"

namespace augur {
namespace {

TEST(DType, Bf16RoundTripAndRounding) {
  for (float f : {0.0f, -0.0f, 1.0f, -2.5f, 3.140625f, 0x1p-100f, 65280.0f})
    EXPECT_EQ(bf16_to_f32(f32_to_bf16(f)), f) << f;
  // 1 + 2^-8 is halfway between two bf16 values: ties go to even (1.0).
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f + 0x1p-8f)), 1.0f);
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f + 0x1.8p-8f)), 1.0f + 0x1p-7f);
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(NAN))));
}

TEST(DType, F16RoundTripIncludingSubnormals) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const uint16_t v = uint16_t(h);
    if ((v & 0x7c00) == 0x7c00 && (v & 0x3ff)) continue;  // NaN payloads
    EXPECT_EQ(f32_to_f16(f16_to_f32(v)), v) << std::hex << h;
  }
  EXPECT_EQ(f16_to_f32(0x3c00), 1.0f);
  EXPECT_EQ(f16_to_f32(0x0001), 0x1p-24f);
}

TEST(DType, NamesAndSizes) {
  DType t;
  ASSERT_TRUE(parse_dtype("BF16", &t));
  EXPECT_EQ(t, DType::BF16);
  EXPECT_EQ(dtype_size(t), 2u);
  EXPECT_FALSE(parse_dtype("F8_E4M3", &t));
  EXPECT_EQ(dtype_name(DType::I64), "I64");
}

TEST(Tensor, ViewsShareTheBuffer) {
  Tensor t = Tensor::empty(DType::F32, {4, 3});
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_EQ(t.numel(), 12);
  for (int i = 0; i < 12; ++i) t.data<float>()[i] = float(i);
  Tensor r = t.reshape({2, 6});
  EXPECT_EQ(r.data<float>()[7], 7.0f);
  Tensor s = t.slice_rows(1, 3);
  EXPECT_EQ(s.dim(0), 2);
  EXPECT_EQ(s.data<float>()[0], 3.0f);
  EXPECT_EQ(s.shape_str(), "[2, 3]");
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t.raw()) % 64, 0u);
  Tensor c = t.slice_cols(1, 3);  // columns 1, 2 of each row
  EXPECT_EQ(c.shape_str(), "[4, 2]");
  EXPECT_EQ(c.stride(0), 3);
  EXPECT_FALSE(c.is_contiguous());
  EXPECT_EQ(c.data<float>()[0], 1.0f);
  EXPECT_EQ(c.data<float>()[c.stride(0) + 1], 5.0f);
  EXPECT_TRUE(t.slice_cols(0, 3).is_contiguous());
}

TEST(MappedFile, MissingFileIsAnErrorNamingIt) {
  try {
    MappedFile::open("/nonexistent/file.bin");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/file.bin"), std::string::npos);
  }
}

TEST(ThreadPool, ParallelForCoversEveryIndexOnce) {
  for (int threads : {1, 2, 3, 8}) {
    ThreadPool pool(threads);
    for (int64_t n : {0, 1, 7, 1000}) {
      std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
      for (int rep = 0; rep < 50; ++rep)
        pool.parallel_for(n, 1, [&](int64_t b, int64_t e) {
          for (int64_t i = b; i < e; ++i) hits[size_t(i)]++;
        });
      for (auto& h : hits) EXPECT_EQ(h.load(), 50);
    }
  }
}

TEST(ThreadPool, RunGivesEveryThreadItsIndex) {
  ThreadPool pool(4);
  std::vector<std::atomic<int>> seen(4);
  pool.run([&](int tid, int n) {
    EXPECT_EQ(n, 4);
    seen[size_t(tid)]++;
  });
  for (auto& s : seen) EXPECT_EQ(s.load(), 1);
}

}  // namespace
}  // namespace augur
