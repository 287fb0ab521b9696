#include "io/quantization.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "core/error.h"
#include "io/json_config.h"

namespace augur {
namespace {

Tensor u32_row(std::initializer_list<uint32_t> words) {
  Tensor t = Tensor::empty(DType::U32, {1, int64_t(words.size())});
  std::copy(words.begin(), words.end(), t.data<uint32_t>());
  return t;
}

Tensor bf16_of(std::initializer_list<int64_t> shape, std::initializer_list<float> values) {
  Tensor t = Tensor::empty(DType::BF16, shape);
  int64_t i = 0;
  for (float v : values) t.data<uint16_t>()[i++] = f32_to_bf16(v);
  return t;
}

std::vector<float> floats(const Tensor& t) {
  std::vector<float> out(size_t(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) out[size_t(i)] = bf16_to_f32(t.data<uint16_t>()[i]);
  return out;
}

// Words packed by hand as mlx lays them out: value j of a row at bits
// [j * bits, (j + 1) * bits) of its little-endian bit stream (mlx's kernels
// read a 3-bit pack's v3 at bit 1 of its second byte, v6 at bit 2 of its
// third).
TEST(AffineQuant, UnpacksMlxBitOrder) {
  struct Case {
    int bits;
    std::vector<uint32_t> words;
    std::vector<uint32_t> values;
  };
  std::vector<Case> cases;
  // 4 bits: eight values a word, the first in the lowest nibble.
  cases.push_back({4, {0x87654321u, 0x0fedcba9u}, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 0}});
  // 8 bits: four a word.
  std::vector<uint32_t> v8(32), w8(8);
  for (uint32_t j = 0; j < 32; ++j) v8[j] = (j * 37u + 5u) & 0xffu;
  for (uint32_t j = 0; j < 32; ++j) w8[j / 4] |= v8[j] << (8 * (j % 4));
  cases.push_back({8, w8, v8});
  // 2 bits: sixteen a word.
  cases.push_back({2, {0xe4e4e4e4u}, {0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3}});
  // 32 values of `bits` bits, bit by bit into the stream.
  auto stream_of = [](int bits, uint32_t mul, uint32_t add) {
    Case c{bits, std::vector<uint32_t>(size_t(bits), 0u), std::vector<uint32_t>(32)};
    for (uint32_t j = 0; j < 32; ++j) {
      c.values[j] = (j * mul + add) & ((1u << bits) - 1u);
      for (uint32_t b = 0; b < uint32_t(bits); ++b)
        if (c.values[j] >> b & 1u) c.words[(uint32_t(bits) * j + b) / 32] |= 1u << ((uint32_t(bits) * j + b) % 32);
    }
    return c;
  };
  // 3 bits: 32 values in 3 words; value 10 spans words 0 and 1 (bits 30..32).
  cases.push_back(stream_of(3, 5u, 3u));
  EXPECT_EQ(cases.back().values[10], 5u);  // bits 30, 31 of word 0 and bit 0 of word 1: 1, 0, 1
  EXPECT_EQ(cases.back().words[0] >> 30, 1u);
  EXPECT_EQ(cases.back().words[1] & 1u, 1u);
  // 5 and 6 bits: eight values in five bytes, four in three.
  cases.push_back(stream_of(5, 13u, 1u));
  cases.push_back(stream_of(6, 11u, 7u));
  for (const Case& c : cases) {
    const int64_t in = int64_t(c.values.size()) < 32 ? 32 : int64_t(c.values.size());
    std::vector<uint32_t> words = c.words, values = c.values;
    words.resize(size_t(in * c.bits / 32), 0u);
    values.resize(size_t(in), 0u);
    Tensor packed = Tensor::empty(DType::U32, {1, int64_t(words.size())});
    std::copy(words.begin(), words.end(), packed.data<uint32_t>());
    // scale 2, bias -3: w = 2 q - 3.
    const Tensor scales = bf16_of({1, 1}, {2.f}), biases = bf16_of({1, 1}, {-3.f});
    const Tensor w = dequantize_affine(packed, scales, biases, {c.bits, 32}, in, "test");
    ASSERT_EQ(w.dtype(), DType::BF16);
    ASSERT_EQ(w.dim(1), in);
    const auto got = floats(w);
    for (int64_t j = 0; j < in; ++j)
      EXPECT_EQ(got[size_t(j)], bf16_to_f32(f32_to_bf16(2.f * float(values[size_t(j)]) - 3.f)))
          << c.bits << " bits, value " << j;
  }
}

TEST(AffineQuant, GroupsTakeTheirOwnScaleAndBias) {
  // 4 bits, groups of 32: row 0 groups (1, 0) and (0.5, 10); row 1 (-1, 2) and (0.25, 0).
  Tensor packed = Tensor::empty(DType::U32, {2, 8});
  for (int64_t i = 0; i < 16; ++i) packed.data<uint32_t>()[i] = 0x76543210u;  // q = j % 8
  const Tensor scales = bf16_of({2, 2}, {1.f, 0.5f, -1.f, 0.25f}), biases = bf16_of({2, 2}, {0.f, 10.f, 2.f, 0.f});
  const auto w = floats(dequantize_affine(packed, scales, biases, {4, 32}, 64, "test"));
  for (int64_t r = 0; r < 2; ++r)
    for (int64_t j = 0; j < 64; ++j) {
      const float s = bf16_to_f32(scales.data<uint16_t>()[r * 2 + j / 32]);
      const float b = bf16_to_f32(biases.data<uint16_t>()[r * 2 + j / 32]);
      EXPECT_EQ(w[size_t(r * 64 + j)], bf16_to_f32(f32_to_bf16(s * float(j % 8) + b)));
    }
}

TEST(AffineQuant, QuantizeThenDequantizeIsWithinHalfAStep) {
  std::mt19937 rng(7);
  std::normal_distribution<float> dist(0.f, 0.05f);
  std::uniform_real_distribution<float> narrow(1.0f, 1.01f);
  for (int bits : {2, 3, 4, 5, 6, 8})
    for (int gs : {32, 64, 128}) {
      const int64_t rows = 4, in = 256;
      Tensor w = Tensor::empty(DType::F32, {rows, in});
      for (int64_t i = 0; i < w.numel(); ++i) w.data<float>()[i] = dist(rng);
      w.data<float>()[5] = 0.75f;  // an outlier widens one group's range
      // A row far from zero in a narrow range: the bias's bf16 rounding
      // (an ulp of 1.0 is many steps) must not push weights out of range.
      for (int64_t j = 0; j < in; ++j) w.data<float>()[3 * in + j] = narrow(rng);
      const AffineTriple t = quantize_affine(w, {bits, gs}, "test");
      ASSERT_EQ(t.weight.dim(1), in * bits / 32);
      ASSERT_EQ(t.scales.dim(1), in / gs);
      const Tensor back = dequantize_affine(t.weight, t.scales, t.biases, {bits, gs}, in, "test");
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t j = 0; j < in; ++j) {
          const int64_t g = r * (in / gs) + j / gs;
          const float step = bf16_to_f32(t.scales.data<uint16_t>()[g]);
          const float v = w.data<float>()[r * in + j];
          const float err = std::fabs(bf16_to_f32(back.data<uint16_t>()[r * in + j]) - v);
          // Half a step (and a hair for f32 arithmetic), plus the result's bf16 rounding.
          ASSERT_LE(err, 0.5f * step * 1.001f + std::fabs(v) * 0x1p-8f)
              << bits << " bits, groups of " << gs << ", row " << r << " column " << j << ": " << v;
        }
    }
}

TEST(AffineQuant, QuantizeRefusesWhatItCannotQuantize) {
  auto message = [](const Tensor& w, AffineQuant q) {
    try {
      quantize_affine(w, q, "layers.0.mlp.up_proj.weight");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  Tensor w = Tensor::empty(DType::F32, {2, 64});
  w.data<float>()[70] = std::nanf("");
  EXPECT_NE(message(w, {4, 32}).find("finite"), std::string::npos);
  EXPECT_NE(message(w, {4, 32}).find("up_proj"), std::string::npos);
  EXPECT_NE(message(Tensor::empty(DType::I32, {2, 64}), {4, 32}).find("not a float type"), std::string::npos);
  EXPECT_NE(message(Tensor::empty(DType::F32, {2, 48}), {4, 32}).find("groups of 32"), std::string::npos);
}

TEST(AffineQuant, RefusesShapesThatDisagree) {
  const Tensor scales = bf16_of({1, 1}, {1.f}), biases = bf16_of({1, 1}, {0.f});
  try {
    dequantize_affine(u32_row({0u, 0u, 0u}), scales, biases, {4, 32}, 32, "layer.q_proj.weight");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("layer.q_proj.weight"), std::string::npos) << e.what();
  }
  EXPECT_THROW(dequantize_affine(u32_row({0u, 0u, 0u, 0u}), scales, biases, {7, 32}, 32, "x"), Error);
  EXPECT_THROW(dequantize_affine(u32_row({0u, 0u, 0u, 0u}), scales, biases, {4, 48}, 32, "x"), Error);
}

TEST(AffineQuant, ConfigDefaultsAndModuleEntries) {
  const JsonConfig cfg = JsonConfig::parse(
      R"({"quantization": {"group_size": 64, "bits": 4, "mode": "affine",
           "model.layers.0.mlp.gate": {"group_size": 64, "bits": 8}, "lm_head": false}})",
      "config.json");
  const QuantConfig q = QuantConfig::from(cfg);
  ASSERT_TRUE(q.any());
  EXPECT_EQ(q.for_module("model.layers.3.self_attn.q_proj")->bits, 4);
  EXPECT_EQ(q.for_module("model.layers.0.mlp.gate")->bits, 8);
  EXPECT_FALSE(q.for_module("lm_head").has_value());
  EXPECT_FALSE(QuantConfig::from(JsonConfig::parse(R"({"model_type": "qwen3"})", "config.json")).any());
}

TEST(AffineQuant, ConfigRefusesOtherQuantizers) {
  auto message = [](const char* text) {
    try {
      QuantConfig::from(JsonConfig::parse(text, "config.json"));
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message(R"({"quantization_config": {"quant_method": "gptq", "bits": 4}})").find("gptq"),
            std::string::npos);
  EXPECT_NE(message(R"({"quantization": {"group_size": 32, "bits": 4, "mode": "mxfp4"}})").find("mxfp4"),
            std::string::npos);
  EXPECT_NE(message(R"({"quantization": {"group_size": 64, "bits": 7}})").find("7 bits"), std::string::npos);
  EXPECT_NE(message(R"({"quantization": {"group_size": 64}})").find("bits"), std::string::npos);
}

}  // namespace
}  // namespace augur
