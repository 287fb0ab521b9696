#include "io/safetensors.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <numeric>

#include "io_test_util.h"
#include "io/safetensors_writer.h"

namespace augur {
namespace {

using test::TempDir;
using test::write_raw_safetensors;

// A contiguous host tensor whose bytes are 0, 1, 2, ... (mod 251).
Tensor patterned(DType dtype, std::initializer_list<int64_t> shape) {
  Tensor t = Tensor::empty(dtype, shape);
  auto* p = t.data<unsigned char>();
  for (size_t i = 0; i < t.nbytes(); ++i) p[i] = static_cast<unsigned char>(i % 251);
  return t;
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

TEST(Safetensors, RoundTripsEveryDtype) {
  TempDir dir;
  const DType all[] = {DType::F32, DType::BF16, DType::F16, DType::I32,
                       DType::U32, DType::I64,  DType::U8,  DType::BOOL};
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (DType d : all) tensors.emplace_back("t_" + std::string(dtype_name(d)), patterned(d, {3, 5}));
  const std::string path = dir.file("all.safetensors");
  write_safetensors(path, tensors, {{"format", "pt"}, {"note", "round trip"}});

  auto st = SafetensorsFile::open(path);
  EXPECT_EQ(st->path(), path);
  ASSERT_EQ(st->tensors().size(), tensors.size());
  EXPECT_EQ(st->metadata().at("format"), "pt");
  EXPECT_EQ(st->metadata().at("note"), "round trip");
  for (const auto& [name, want] : tensors) {
    SCOPED_TRACE(name);
    const TensorInfo* info = st->find(name);
    ASSERT_NE(info, nullptr);
    EXPECT_EQ(info->name, name);
    EXPECT_EQ(info->dtype, want.dtype());
    EXPECT_EQ(info->shape, (std::vector<int64_t>{3, 5}));
    EXPECT_EQ(info->nbytes, want.nbytes());
    EXPECT_EQ(info->file, path);
    Tensor got = st->tensor(*info);
    EXPECT_EQ(got.dtype(), want.dtype());
    EXPECT_EQ(got.ndim(), 2);
    EXPECT_EQ(got.dim(0), 3);
    EXPECT_EQ(got.dim(1), 5);
    EXPECT_TRUE(got.is_contiguous());
    EXPECT_TRUE(same_bytes(got, want));
  }
  EXPECT_EQ(st->find("absent"), nullptr);
}

TEST(Safetensors, TensorsAreInDataOrderWithAbsoluteOffsets) {
  TempDir dir;
  const std::string path = dir.file("order.safetensors");
  // Written in this order; the header (a JSON object) lists them by name.
  write_safetensors(path, {{"z", patterned(DType::F32, {4})}, {"a", patterned(DType::U8, {3})}});
  auto st = SafetensorsFile::open(path);
  ASSERT_EQ(st->tensors().size(), 2u);
  EXPECT_EQ(st->tensors()[0].name, "z");
  EXPECT_EQ(st->tensors()[1].name, "a");
  // data_offset is absolute: the last tensor ends at the end of the file.
  const TensorInfo& last = st->tensors()[1];
  EXPECT_EQ(last.data_offset + last.nbytes, std::filesystem::file_size(path));
  EXPECT_EQ(st->tensors()[0].data_offset + 16, last.data_offset);
}

TEST(Safetensors, ScalarsEmptyAndFourDimTensors) {
  TempDir dir;
  const std::string path = dir.file("shapes.safetensors");
  Tensor scalar = Tensor::empty(DType::F32, std::initializer_list<int64_t>{});
  *scalar.data<float>() = 2.5f;
  write_safetensors(path, {{"scalar", scalar},
                           {"empty", Tensor::empty(DType::BF16, {0, 7})},
                           {"four", patterned(DType::F16, {2, 1, 3, 2})}});
  auto st = SafetensorsFile::open(path);
  Tensor s = st->tensor(*st->find("scalar"));
  EXPECT_EQ(s.ndim(), 0);
  EXPECT_EQ(s.numel(), 1);
  EXPECT_EQ(*s.data<float>(), 2.5f);
  Tensor e = st->tensor(*st->find("empty"));
  EXPECT_EQ(e.ndim(), 2);
  EXPECT_EQ(e.numel(), 0);
  EXPECT_EQ(st->find("empty")->nbytes, 0u);
  Tensor f = st->tensor(*st->find("four"));
  EXPECT_EQ(f.shape_str(), "[2, 1, 3, 2]");
  EXPECT_TRUE(same_bytes(f, patterned(DType::F16, {2, 1, 3, 2})));
}

TEST(Safetensors, ViewIsZeroCopyAndOutlivesTheFile) {
  TempDir dir;
  const std::string path = dir.file("alive.safetensors");
  write_safetensors(path, {{"w", patterned(DType::I32, {8})}});
  Tensor t;
  {
    auto st = SafetensorsFile::open(path);
    t = st->tensor(st->tensors()[0]);
    Tensor again = st->tensor(st->tensors()[0]);
    EXPECT_EQ(t.raw(), again.raw());  // both point into the one mapping
    EXPECT_NE(dynamic_cast<BorrowedBuffer*>(t.buffer().get()), nullptr);
  }
  // The SafetensorsFile is gone; the mapping lives on through the view.
  EXPECT_TRUE(same_bytes(t, patterned(DType::I32, {8})));
}

TEST(Safetensors, EmptyHeaderAndPaddingAreFine) {
  TempDir dir;
  const std::string empty = dir.file("empty.safetensors");
  write_raw_safetensors(empty, "{}", "");
  EXPECT_TRUE(SafetensorsFile::open(empty)->tensors().empty());

  const std::string padded = dir.file("padded.safetensors");
  write_raw_safetensors(padded, R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}}     )",
                        "xy");
  auto st = SafetensorsFile::open(padded);
  ASSERT_EQ(st->tensors().size(), 1u);
  EXPECT_EQ(std::string(st->tensor(st->tensors()[0]).data<char>(), 2), "xy");
}

TEST(Safetensors, RealFixture) {
  const std::string path = std::string(AUGUR_TEST_DATA) + "/qwen3/model.safetensors";
  auto st = SafetensorsFile::open(path);
  EXPECT_EQ(st->tensors().size(), 24u);
  for (const auto& t : st->tensors()) EXPECT_EQ(t.dtype, DType::BF16) << t.name;
  const TensorInfo* embed = st->find("model.embed_tokens.weight");
  ASSERT_NE(embed, nullptr);
  EXPECT_EQ(embed->shape, (std::vector<int64_t>{512, 64}));
  EXPECT_EQ(embed->nbytes, 512u * 64u * 2u);
  Tensor t = st->tensor(*embed);
  EXPECT_EQ(t.shape_str(), "[512, 64]");
  // Trained-looking weights: finite and not all zero.
  const auto* p = t.data<uint16_t>();
  double sum_abs = 0;
  for (int64_t i = 0; i < t.numel(); ++i) {
    float v = bf16_to_f32(p[i]);
    ASSERT_TRUE(std::isfinite(v));
    sum_abs += std::fabs(v);
  }
  EXPECT_GT(sum_abs, 0.0);
  EXPECT_EQ(st->metadata().at("format"), "pt");
}

// ---- malformed files: each is an augur::Error naming the file and the defect ----

class SafetensorsMalformed : public ::testing::Test {
 protected:
  // Writes `header` + `data` as bad.safetensors and returns open()'s message.
  std::string open_error(std::string_view header, std::string_view data = std::string(16, '\0')) {
    write_raw_safetensors(path_, header, data);
    return test::error_of([&] { SafetensorsFile::open(path_); });
  }
  void expect(std::string_view header, std::initializer_list<std::string_view> parts,
              std::string_view data = std::string(16, '\0')) {
    std::string msg = open_error(header, data);
    EXPECT_EQ(msg.rfind("[safetensors] " + path_ + ": ", 0), 0u) << msg;
    for (auto part : parts) EXPECT_NE(msg.find(part), std::string::npos) << msg << "\nmissing: " << part;
  }

  TempDir dir_;
  std::string path_ = dir_.file("bad.safetensors");
};

TEST_F(SafetensorsMalformed, ShorterThanEightBytes) {
  test::write_text(path_, "abc");
  EXPECT_ERROR_HAS(SafetensorsFile::open(path_), "[safetensors] " + path_ + ": ", "3 bytes",
                   "shorter than");
  test::write_text(path_, "");
  EXPECT_ERROR_HAS(SafetensorsFile::open(path_), path_, "0 bytes");
}

TEST_F(SafetensorsMalformed, HeaderLengthBeyondFile) {
  write_raw_safetensors(path_, "{}", "", 9000000000000000000ull);
  EXPECT_ERROR_HAS(SafetensorsFile::open(path_), "[safetensors] " + path_ + ": ",
                   "header length 9000000000000000000 exceeds file size 10");
  write_raw_safetensors(path_, "{}", "", 3);  // one byte too many
  EXPECT_ERROR_HAS(SafetensorsFile::open(path_), "header length 3 exceeds file size 10");
}

TEST_F(SafetensorsMalformed, BadJson) {
  expect(R"({"a": {"dtype": )", {"bad JSON header", "parse error"});
  expect("", {"bad JSON header"});
}

TEST_F(SafetensorsMalformed, HeaderNotAnObject) {
  expect("[1, 2]", {"header must be a JSON object, got array"});
}

TEST_F(SafetensorsMalformed, EntryNotAnObject) {
  expect(R"({"w": 5})", {"tensor 'w'", "must be an object, got integer"});
}

TEST_F(SafetensorsMalformed, MissingFields) {
  expect(R"({"w": {"shape": [4], "data_offsets": [0, 4]}})", {"tensor 'w'", "missing 'dtype'"});
  expect(R"({"w": {"dtype": "U8", "data_offsets": [0, 4]}})", {"tensor 'w'", "missing 'shape'"});
  expect(R"({"w": {"dtype": "U8", "shape": [4]}})", {"tensor 'w'", "missing 'data_offsets'"});
}

TEST_F(SafetensorsMalformed, WrongFieldTypes) {
  expect(R"({"w": {"dtype": 7, "shape": [4], "data_offsets": [0, 4]}})",
         {"tensor 'w'", "'dtype' must be a string, got integer"});
  expect(R"({"w": {"dtype": "U8", "shape": "4", "data_offsets": [0, 4]}})",
         {"tensor 'w'", "'shape' must be an array, got string"});
  expect(R"({"w": {"dtype": "U8", "shape": [4], "data_offsets": "0-4"}})",
         {"tensor 'w'", "'data_offsets' must be an array [begin, end]"});
  expect(R"({"w": {"dtype": "U8", "shape": [4], "data_offsets": [0, 2, 4]}})",
         {"tensor 'w'", "'data_offsets' must be an array [begin, end]"});
  expect(R"({"w": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4.0]}})",
         {"tensor 'w'", "'data_offsets' must be non-negative integers"});
  expect(R"({"w": {"dtype": "U8", "shape": [4], "data_offsets": [-1, 3]}})",
         {"tensor 'w'", "'data_offsets' must be non-negative integers"});
}

TEST_F(SafetensorsMalformed, UnknownDtype) {
  expect(R"({"w": {"dtype": "F8_E4M3", "shape": [4], "data_offsets": [0, 4]}})",
         {"tensor 'w'", "unknown dtype 'F8_E4M3'"});
}

TEST_F(SafetensorsMalformed, BadShapeDims) {
  expect(R"({"w": {"dtype": "U8", "shape": [2, -2], "data_offsets": [0, 4]}})",
         {"tensor 'w'", "shape dim 1 must be a non-negative integer, got -2"});
  expect(R"({"w": {"dtype": "U8", "shape": [2.5], "data_offsets": [0, 4]}})",
         {"tensor 'w'", "shape dim 0 must be a non-negative integer, got 2.5"});
  expect(R"({"w": {"dtype": "U8", "shape": ["4"], "data_offsets": [0, 4]}})",
         {"tensor 'w'", "shape dim 0 must be a non-negative integer"});
  expect(R"({"w": {"dtype": "U8", "shape": [18446744073709551615], "data_offsets": [0, 4]}})",
         {"tensor 'w'", "shape dim 0 must be a non-negative integer"});
}

TEST_F(SafetensorsMalformed, TooManyDims) {
  expect(R"({"w5": {"dtype": "U8", "shape": [1, 1, 1, 2, 2], "data_offsets": [0, 4]}})",
         {"tensor 'w5'", "has 5 dims, more than the supported 4"});
}

TEST_F(SafetensorsMalformed, OffsetsOutsideDataOrReversed) {
  expect(R"({"w": {"dtype": "U8", "shape": [4], "data_offsets": [14, 18]}})",
         {"tensor 'w'", "data_offsets [14, 18] lie outside the data section of 16 bytes"});
  expect(R"({"w": {"dtype": "U8", "shape": [0], "data_offsets": [4, 2]}})",
         {"tensor 'w'", "data_offsets [4, 2] have begin > end"});
  expect(R"({"w": {"dtype": "U8", "shape": [4], "data_offsets": [0, 18446744073709551615]}})",
         {"tensor 'w'", "'data_offsets' must be non-negative integers"});
}

TEST_F(SafetensorsMalformed, OverlappingRanges) {
  expect(R"({"a": {"dtype": "U8", "shape": [8], "data_offsets": [0, 8]},
             "b": {"dtype": "U8", "shape": [4], "data_offsets": [6, 10]}})",
         {"tensors 'a' and 'b' have overlapping data ranges"});
  // Contained inside a larger one, after a short one that ends earlier.
  expect(R"({"big": {"dtype": "U8", "shape": [12], "data_offsets": [0, 12]},
             "mid": {"dtype": "U8", "shape": [2], "data_offsets": [1, 3]}})",
         {"tensors 'big' and 'mid' have overlapping data ranges"});
  // Adjacent is fine, and so are empty tensors sharing an offset.
  write_raw_safetensors(path_, R"({"a": {"dtype": "U8", "shape": [8], "data_offsets": [0, 8]},
             "b": {"dtype": "U8", "shape": [8], "data_offsets": [8, 16]},
             "e": {"dtype": "F32", "shape": [0, 3], "data_offsets": [8, 8]}})",
                        std::string(16, '\0'));
  EXPECT_EQ(SafetensorsFile::open(path_)->tensors().size(), 3u);
}

TEST_F(SafetensorsMalformed, ByteSizeMismatch) {
  expect(R"({"w": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}})",
         {"tensor 'w'", "shape [3] of F32 needs 12 bytes but data_offsets [0, 8] span 8"});
  // 2^40 * 2^40 * 2^40 elements: the product wraps in 64 bits.
  expect(R"({"w": {"dtype": "BF16", "shape": [1099511627776, 1099511627776, 1099511627776],
             "data_offsets": [0, 0]}})",
         {"tensor 'w'", "needs more than 2^64 bytes"});
  // 2^62 * 4 bytes wraps to exactly 0: must not be taken for an empty tensor.
  expect(R"({"w": {"dtype": "F32", "shape": [4611686018427387904], "data_offsets": [0, 0]}})",
         {"tensor 'w'", "needs more than 2^64 bytes"});
}

TEST_F(SafetensorsMalformed, DuplicateTensorNames) {
  expect(R"({"w": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]},
             "w": {"dtype": "U8", "shape": [4], "data_offsets": [4, 8]}})",
         {"duplicate tensor name 'w'"});
  expect(R"({"w": {"dtype": "U8", "dtype": "U8", "shape": [4], "data_offsets": [0, 4]}})",
         {"duplicate key 'dtype'"});
}

TEST_F(SafetensorsMalformed, MetadataMustBeStringToString) {
  expect(R"({"__metadata__": ["pt"]})", {"__metadata__ must be an object, got array"});
  expect(R"({"__metadata__": {"format": "pt", "step": 3}})",
         {"__metadata__ value for 'step' must be a string, got integer"});
}

TEST(Safetensors, MissingFileNamesThePath) {
  TempDir dir;
  const std::string path = dir.file("nope.safetensors");
  EXPECT_ERROR_HAS(SafetensorsFile::open(path), path, "cannot open");
}

// ---- writer ----

TEST(SafetensorsWriter, RejectsBadInput) {
  TempDir dir;
  const std::string path = dir.file("out.safetensors");
  Tensor t = patterned(DType::F32, {2, 2});
  EXPECT_ERROR_HAS(write_safetensors(path, {{"a", t}, {"a", t}}), path, "duplicate tensor name 'a'");
  EXPECT_ERROR_HAS(write_safetensors(path, {{"u", Tensor()}}), path, "tensor 'u' is undefined");
  EXPECT_ERROR_HAS(write_safetensors(path, {{"__metadata__", t}}), path, "reserved");
  EXPECT_ERROR_HAS(write_safetensors(dir.file("no/such/dir/x.safetensors"), {{"a", t}}),
                   "no/such/dir/x.safetensors", "cannot create");
}

TEST(SafetensorsWriter, HeaderIsPaddedToEightBytes) {
  TempDir dir;
  const std::string path = dir.file("pad.safetensors");
  write_safetensors(path, {{"abc", patterned(DType::U8, {3})}});
  auto st = SafetensorsFile::open(path);
  EXPECT_EQ(st->tensors()[0].data_offset % 8, 0u);
}

TEST(SafetensorsWriter, SlicedRowsAreContiguous) {
  TempDir dir;
  const std::string path = dir.file("rows.safetensors");
  Tensor t = patterned(DType::F32, {4, 3});
  Tensor rows = t.slice_rows(1, 3);
  write_safetensors(path, {{"rows", rows}});
  auto st = SafetensorsFile::open(path);
  Tensor got = st->tensor(st->tensors()[0]);
  EXPECT_EQ(got.shape_str(), "[2, 3]");
  EXPECT_EQ(std::memcmp(got.raw(), rows.raw(), rows.nbytes()), 0);
}

}  // namespace
}  // namespace augur
