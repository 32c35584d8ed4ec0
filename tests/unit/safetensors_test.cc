// safetensors reader: round trips through WriteSafetensors, sharded checkpoints, and every
// malformed header the reader must reject (each error must name the tensor and the file).
#include "engine/io/safetensors.h"

#include <cstring>
#include <filesystem>
#include <initializer_list>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "engine/io/safetensors_writer.h"
#include "engine/io/tensor_store.h"
#include "gtest/gtest.h"
#include "tests/testutil.h"

namespace morserve {
namespace {

using testing::TempDir;
using testing::WriteFile;

using testing::ErrorHas;

// A raw safetensors image: header length (or an override), header text, data bytes.
std::vector<uint8_t> Image(const std::string& header, size_t data_bytes,
                           std::optional<uint64_t> header_len = std::nullopt) {
  const uint64_t n = header_len.value_or(header.size());
  std::vector<uint8_t> out(8 + header.size() + data_bytes, 0x5a);
  for (int i = 0; i < 8; ++i) out[i] = static_cast<uint8_t>(n >> (8 * i));
  std::memcpy(out.data() + 8, header.data(), header.size());
  return out;
}

absl::Status Parse(const std::vector<uint8_t>& image, const std::string& file = "bad.safetensors") {
  // An exact-size heap copy so that AddressSanitizer catches any read past the end.
  auto copy = std::make_unique<uint8_t[]>(image.size());
  if (!image.empty()) std::memcpy(copy.get(), image.data(), image.size());
  return ParseSafetensors(copy.get(), image.size(), file).status();
}

std::vector<OwnedTensor> SampleTensors() {
  return {
      OwnedTensor::FromF32("model.embed_tokens.weight", DType::kBF16, {3, 2},
                           {1.0f, -2.5f, 0.15625f, 3.0f, -0.0078125f, 100.0f}),
      OwnedTensor::FromF32("model.norm.weight", DType::kF32, {2}, {0.1f, -7.25f}),
      OwnedTensor::FromF32("lm_head.weight", DType::kF16, {2, 3},
                           {0.5f, -1.0f, 2.0f, 65504.0f, 0.000061035156f, -3.0f}),
      OwnedTensor::FromF32("positions", DType::kI64, {3}, {0.0f, 1.0f, -5.0f}),
      OwnedTensor::FromF32("empty", DType::kF32, {0, 4}, {}),
  };
}

void ExpectStoreHolds(const TensorStore& store, const std::vector<OwnedTensor>& tensors,
                      const std::string& file) {
  ASSERT_EQ(store.tensors().size(), tensors.size());
  for (const OwnedTensor& t : tensors) {
    const TensorView* v = store.Find(t.name);
    ASSERT_NE(v, nullptr) << t.name;
    EXPECT_EQ(v->file, file);
    EXPECT_EQ(v->dtype, t.dtype) << t.name;
    EXPECT_EQ(v->shape, t.shape) << t.name;
    ASSERT_EQ(v->nbytes(), t.bytes.size()) << t.name;
    EXPECT_FALSE(v->empty()) << t.name;
    if (!t.bytes.empty()) {  // memcmp with an empty vector's null data() is undefined
      EXPECT_EQ(std::memcmp(v->data, t.bytes.data(), t.bytes.size()), 0) << t.name;
    }
  }
}

TEST(SafetensorsTest, RoundTripThroughWriter) {
  TempDir dir;
  const std::vector<OwnedTensor> tensors = SampleTensors();
  ASSERT_TRUE(WriteSafetensors(dir.File("model.safetensors"), tensors, {{"format", "pt"}}).ok());
  absl::StatusOr<std::shared_ptr<TensorStore>> store = OpenCheckpointDir(dir.path());
  ASSERT_TRUE(store.ok()) << store.status();
  ExpectStoreHolds(**store, tensors, dir.File("model.safetensors"));
  EXPECT_EQ((*store)->Find("__metadata__"), nullptr);
  // Values, not only bytes.
  EXPECT_EQ((*store)->Find("model.embed_tokens.weight")->ToF32Vector(),
            (std::vector<float>{1.0f, -2.5f, 0.15625f, 3.0f, -0.0078125f, 100.0f}));
  EXPECT_EQ((*store)->Find("model.norm.weight")->ToF32Vector(), (std::vector<float>{0.1f, -7.25f}));
  EXPECT_EQ((*store)->Find("lm_head.weight")->ToF32Vector()[3], 65504.0f);
  EXPECT_EQ((*store)->Find("positions")->ToF32Vector(), (std::vector<float>{0, 1, -5}));
}

TEST(SafetensorsTest, ParsesViewsInHeaderOrder) {
  const std::string header =
      R"({"__metadata__":{"a":"b"},"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
      R"("s":{"dtype":"BF16","shape":[],"data_offsets":[8,10]}})";
  const std::vector<uint8_t> image = Image(header, 10);
  absl::StatusOr<std::vector<TensorView>> views =
      ParseSafetensors(image.data(), image.size(), "x.safetensors");
  ASSERT_TRUE(views.ok()) << views.status();
  ASSERT_EQ(views->size(), 2u);
  const uint8_t* data_region = image.data() + 8 + header.size();
  EXPECT_EQ((*views)[0].name, "w");
  EXPECT_EQ((*views)[0].data, data_region);
  EXPECT_EQ((*views)[0].shape, (std::vector<int64_t>{2}));
  EXPECT_EQ((*views)[1].name, "s");
  EXPECT_EQ((*views)[1].data, data_region + 8);
  EXPECT_EQ((*views)[1].shape, (std::vector<int64_t>{}));
  EXPECT_EQ((*views)[1].dtype, DType::kBF16);
  EXPECT_EQ((*views)[1].file, "x.safetensors");
}

TEST(SafetensorsTest, TruncatedBeforeHeaderLength) {
  EXPECT_TRUE(ErrorHas(Parse({1, 2, 3, 4, 5}, "t.safetensors"), {"t.safetensors", "truncated"}));
  EXPECT_TRUE(ErrorHas(Parse({}, "t.safetensors"), {"t.safetensors", "truncated"}));
}

TEST(SafetensorsTest, HeaderLengthBeyondFile) {
  const std::string header = R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})";
  EXPECT_TRUE(ErrorHas(Parse(Image(header, 4, header.size() + 5)),
                       {"bad.safetensors", "header length", "beyond the file"}));
  EXPECT_TRUE(
      ErrorHas(Parse(Image(header, 4, ~uint64_t{0})), {"bad.safetensors", "18446744073709551615"}));
}

TEST(SafetensorsTest, HeaderNotJson) {
  EXPECT_TRUE(
      ErrorHas(Parse(Image(R"({"w":{"dtype":)", 0)), {"bad.safetensors", "not valid JSON"}));
  EXPECT_TRUE(ErrorHas(Parse(Image("", 0)), {"bad.safetensors", "not valid JSON"}));
}

TEST(SafetensorsTest, HeaderNotObject) {
  EXPECT_TRUE(ErrorHas(Parse(Image("[1, 2, 3]", 0)), {"bad.safetensors", "not a JSON object"}));
  EXPECT_TRUE(
      ErrorHas(Parse(Image(R"({"w": [1]})", 0)), {"'w'", "bad.safetensors", "not an object"}));
}

TEST(SafetensorsTest, OffsetsOutsideDataRegion) {
  EXPECT_TRUE(
      ErrorHas(Parse(Image(R"({"w.weight":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 8)),
               {"'w.weight'", "bad.safetensors", "outside the data region of 8 bytes"}));
  EXPECT_TRUE(ErrorHas(
      Parse(Image(R"({"w.weight":{"dtype":"F32","shape":[2],"data_offsets":[16,24]}})", 8)),
      {"'w.weight'", "bad.safetensors", "outside the data region"}));
}

TEST(SafetensorsTest, OffsetsEndBeforeBegin) {
  EXPECT_TRUE(
      ErrorHas(Parse(Image(R"({"w.weight":{"dtype":"F32","shape":[0],"data_offsets":[8,4]}})", 8)),
               {"'w.weight'", "bad.safetensors", "end 4 < begin 8"}));
}

TEST(SafetensorsTest, OffsetsMalformed) {
  for (const char* offsets : {"[0]", "[0,4,8]", "[-4,0]", "[0,4.5]", "\"0,4\"", "[0,1e30]"}) {
    const std::string header =
        absl::StrCat(R"({"w.weight":{"dtype":"F32","shape":[1],"data_offsets":)", offsets, "}}");
    EXPECT_TRUE(
        ErrorHas(Parse(Image(header, 4)), {"'w.weight'", "bad.safetensors", "data_offsets"}))
        << offsets;
  }
  EXPECT_TRUE(ErrorHas(Parse(Image(R"({"w.weight":{"dtype":"F32","shape":[1]}})", 4)),
                       {"'w.weight'", "data_offsets"}));
}

TEST(SafetensorsTest, SizeNotMatchingShapeAndDtype) {
  EXPECT_TRUE(ErrorHas(
      Parse(Image(R"({"w.weight":{"dtype":"BF16","shape":[2,3],"data_offsets":[0,8]}})", 8)),
      {"'w.weight'", "bad.safetensors", "size 8 bytes", "BF16 [2, 3] (12 bytes)"}));
}

TEST(SafetensorsTest, UnknownOrMissingDtype) {
  EXPECT_TRUE(ErrorHas(
      Parse(Image(R"({"w.weight":{"dtype":"F8_E4M3","shape":[4],"data_offsets":[0,4]}})", 4)),
      {"'w.weight'", "bad.safetensors", "unknown dtype 'F8_E4M3'"}));
  EXPECT_TRUE(
      ErrorHas(Parse(Image(R"({"w.weight":{"dtype":7,"shape":[4],"data_offsets":[0,4]}})", 4)),
               {"'w.weight'", "bad.safetensors", "dtype"}));
}

TEST(SafetensorsTest, NegativeOrNonIntegerDims) {
  for (const char* shape : {"[-2]", "[2,-1]", "[1.5]", "[\"2\"]", "3", "[1e40]"}) {
    const std::string header =
        absl::StrCat(R"({"w.weight":{"dtype":"F32","shape":)", shape, R"(,"data_offsets":[0,8]}})");
    EXPECT_TRUE(ErrorHas(Parse(Image(header, 8)), {"'w.weight'", "bad.safetensors", "shape"}))
        << shape;
  }
}

TEST(SafetensorsTest, ShapeProductOverflow) {
  EXPECT_TRUE(ErrorHas(Parse(Image(R"({"w.weight":{"dtype":"F32","shape":[4294967296,4294967296],)"
                                   R"("data_offsets":[0,0]}})",
                                   0)),
                       {"'w.weight'", "bad.safetensors", "overflows"}));
  // The element product fits in int64 but the byte count does not.
  EXPECT_TRUE(ErrorHas(Parse(Image(R"({"w.weight":{"dtype":"I64","shape":[9223372036854775807],)"
                                   R"("data_offsets":[0,0]}})",
                                   0)),
                       {"'w.weight'", "overflows"}));
}

TEST(SafetensorsTest, DuplicateNameInOneHeader) {
  EXPECT_TRUE(
      ErrorHas(Parse(Image(R"({"w.weight":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                           R"("w.weight":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                           8)),
               {"'w.weight'", "bad.safetensors", "twice"}));
}

TEST(SafetensorsTest, TruncatedDataRegionNamesTheTensor) {
  TempDir dir;
  ASSERT_TRUE(WriteSafetensors(dir.File("model.safetensors"), SampleTensors()).ok());
  const std::string bytes = testing::ReadFile(dir.File("model.safetensors"));
  WriteFile(dir.File("model.safetensors"), bytes.substr(0, bytes.size() - 3));
  absl::StatusOr<std::shared_ptr<TensorStore>> store = OpenCheckpointDir(dir.path());
  EXPECT_TRUE(ErrorHas(store.status(),
                       {"'positions'", dir.File("model.safetensors"), "outside the data region"}));
}

// Every prefix of a valid file is rejected and never read past its end.
TEST(SafetensorsTest, EveryTruncationIsAnError) {
  TempDir dir;
  ASSERT_TRUE(WriteSafetensors(dir.File("m.safetensors"), SampleTensors()).ok());
  const std::string bytes = testing::ReadFile(dir.File("m.safetensors"));
  std::vector<uint8_t> image(bytes.begin(), bytes.end());
  EXPECT_TRUE(Parse(image).ok());
  for (size_t n = 0; n < image.size(); ++n) {
    const std::vector<uint8_t> prefix(image.begin(), image.begin() + static_cast<ptrdiff_t>(n));
    EXPECT_FALSE(Parse(prefix).ok()) << "prefix of " << n << " bytes";
  }
}

// Header bytes overwritten one at a time: an error or views inside the buffer, nothing else.
TEST(SafetensorsTest, CorruptedHeaderBytesNeverPointOutside) {
  TempDir dir;
  ASSERT_TRUE(WriteSafetensors(dir.File("m.safetensors"), SampleTensors()).ok());
  const std::string bytes = testing::ReadFile(dir.File("m.safetensors"));
  const size_t header_end = 8 + static_cast<uint8_t>(bytes[0]) +
                            (static_cast<size_t>(static_cast<uint8_t>(bytes[1])) << 8);
  int accepted = 0;
  for (size_t i = 0; i < header_end; ++i) {
    for (char value : {'9', '-', '\xff', '"', '}', '\0'}) {
      auto copy = std::make_unique<uint8_t[]>(bytes.size());
      std::memcpy(copy.get(), bytes.data(), bytes.size());
      copy[i] = static_cast<uint8_t>(value);
      absl::StatusOr<std::vector<TensorView>> views =
          ParseSafetensors(copy.get(), bytes.size(), "f");
      if (!views.ok()) continue;
      ++accepted;
      for (const TensorView& v : *views) {
        const uint8_t* p = static_cast<const uint8_t*>(v.data);
        ASSERT_GE(p, copy.get() + header_end) << v.name;
        ASSERT_LE(p + v.nbytes(), copy.get() + bytes.size()) << v.name;
      }
    }
  }
  EXPECT_GT(accepted, 0);  // e.g. digits changed inside the metadata
}

// ---- sharded checkpoints ----

void WriteIndex(const TempDir& dir, const std::string& weight_map_json) {
  WriteFile(dir.File("model.safetensors.index.json"),
            absl::StrCat(R"({"metadata":{"total_size":0},"weight_map":)", weight_map_json, "}"));
}

std::vector<OwnedTensor> Shard1() {
  return {OwnedTensor::FromF32("a", DType::kF32, {2}, {1, 2}),
          OwnedTensor::FromF32("b", DType::kBF16, {1}, {3})};
}
std::vector<OwnedTensor> Shard2() { return {OwnedTensor::FromF32("c", DType::kF16, {1}, {4})}; }

TEST(ShardedSafetensorsTest, LoadsAllShards) {
  TempDir dir;
  ASSERT_TRUE(WriteSafetensors(dir.File("model-00001-of-00002.safetensors"), Shard1()).ok());
  ASSERT_TRUE(WriteSafetensors(dir.File("model-00002-of-00002.safetensors"), Shard2()).ok());
  WriteIndex(dir, R"({"a":"model-00001-of-00002.safetensors","b":"model-00001-of-00002.safetensors",
                      "c":"model-00002-of-00002.safetensors"})");
  absl::StatusOr<std::shared_ptr<TensorStore>> store = OpenCheckpointDir(dir.path());
  ASSERT_TRUE(store.ok()) << store.status();
  ASSERT_EQ((*store)->tensors().size(), 3u);
  EXPECT_EQ((*store)->Find("a")->ToF32Vector(), (std::vector<float>{1, 2}));
  EXPECT_EQ((*store)->Find("b")->ToF32Vector(), (std::vector<float>{3}));
  EXPECT_EQ((*store)->Find("c")->ToF32Vector(), (std::vector<float>{4}));
  EXPECT_EQ((*store)->Find("c")->file, dir.File("model-00002-of-00002.safetensors"));
}

TEST(ShardedSafetensorsTest, MissingShard) {
  TempDir dir;
  ASSERT_TRUE(WriteSafetensors(dir.File("s1.safetensors"), Shard1()).ok());
  WriteIndex(dir, R"({"a":"s1.safetensors","b":"s1.safetensors","c":"s2.safetensors"})");
  EXPECT_TRUE(ErrorHas(
      OpenCheckpointDir(dir.path()).status(),
      {"'c'", dir.File("s2.safetensors"), "missing", dir.File("model.safetensors.index.json")}));
}

TEST(ShardedSafetensorsTest, IndexedTensorMissingFromShard) {
  TempDir dir;
  ASSERT_TRUE(WriteSafetensors(dir.File("s1.safetensors"), Shard1()).ok());
  WriteIndex(dir, R"({"a":"s1.safetensors","b":"s1.safetensors","z":"s1.safetensors"})");
  EXPECT_TRUE(ErrorHas(OpenCheckpointDir(dir.path()).status(),
                       {"'z'", dir.File("s1.safetensors"), "not found in the shard"}));
}

TEST(ShardedSafetensorsTest, ShardTensorMissingFromIndex) {
  TempDir dir;
  ASSERT_TRUE(WriteSafetensors(dir.File("s1.safetensors"), Shard1()).ok());
  WriteIndex(dir, R"({"a":"s1.safetensors"})");
  EXPECT_TRUE(ErrorHas(OpenCheckpointDir(dir.path()).status(),
                       {"'b'", dir.File("s1.safetensors"), "not listed"}));
}

TEST(ShardedSafetensorsTest, DuplicateNameAcrossShards) {
  TempDir dir;
  ASSERT_TRUE(WriteSafetensors(dir.File("s1.safetensors"), Shard1()).ok());
  ASSERT_TRUE(WriteSafetensors(dir.File("s2.safetensors"),
                               {OwnedTensor::FromF32("a", DType::kF32, {2}, {5, 6}),
                                OwnedTensor::FromF32("c", DType::kF16, {1}, {4})})
                  .ok());
  WriteIndex(dir, R"({"a":"s1.safetensors","b":"s1.safetensors","c":"s2.safetensors"})");
  EXPECT_TRUE(ErrorHas(OpenCheckpointDir(dir.path()).status(),
                       {"'a'", "twice", dir.File("s1.safetensors"), dir.File("s2.safetensors")}));
}

TEST(ShardedSafetensorsTest, MalformedIndex) {
  TempDir dir;
  const std::string index = dir.File("model.safetensors.index.json");
  WriteFile(index, "{not json");
  EXPECT_TRUE(ErrorHas(OpenCheckpointDir(dir.path()).status(), {index, "not valid JSON"}));
  WriteFile(index, R"({"metadata":{}})");
  EXPECT_TRUE(ErrorHas(OpenCheckpointDir(dir.path()).status(), {index, "weight_map"}));
  WriteIndex(dir, R"({"a":"../outside.safetensors"})");
  EXPECT_TRUE(ErrorHas(OpenCheckpointDir(dir.path()).status(), {"'a'", index, "file name"}));
  WriteIndex(dir, R"({"a":3})");
  EXPECT_TRUE(ErrorHas(OpenCheckpointDir(dir.path()).status(), {"'a'", index}));
}

TEST(ShardedSafetensorsTest, BadShardNamesTheShard) {
  TempDir dir;
  WriteFile(dir.File("s1.safetensors"), "short");
  WriteIndex(dir, R"({"a":"s1.safetensors"})");
  EXPECT_TRUE(
      ErrorHas(OpenCheckpointDir(dir.path()).status(), {dir.File("s1.safetensors"), "truncated"}));
}

// ---- directory discovery and the store ----

TEST(CheckpointDirTest, NoCheckpointFiles) {
  TempDir dir;
  EXPECT_EQ(OpenCheckpointDir(dir.path()).status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(ErrorHas(OpenCheckpointDir(dir.path()).status(), {dir.path(), "pytorch_model.bin"}));
}

TEST(CheckpointDirTest, SingleFilePreferredOverIndex) {
  TempDir dir;
  ASSERT_TRUE(WriteSafetensors(dir.File("model.safetensors"), Shard2()).ok());
  WriteFile(dir.File("model.safetensors.index.json"), "garbage");
  absl::StatusOr<std::shared_ptr<TensorStore>> store = OpenCheckpointDir(dir.path());
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_NE((*store)->Find("c"), nullptr);
}

TEST(TensorStoreTest, AddRejectsDuplicatesNamingBothFiles) {
  TensorStore store;
  float x = 1;
  ASSERT_TRUE(store.Add(TensorView{"w", "one.safetensors", DType::kF32, {1}, &x}).ok());
  EXPECT_TRUE(ErrorHas(store.Add(TensorView{"w", "two.safetensors", DType::kF32, {1}, &x}),
                       {"'w'", "one.safetensors", "two.safetensors"}));
  ASSERT_NE(store.Find("w"), nullptr);
  EXPECT_EQ(store.Find("w")->file, "one.safetensors");
  EXPECT_EQ(store.Find("x"), nullptr);
}

}  // namespace
}  // namespace morserve
