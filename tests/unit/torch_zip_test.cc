// PyTorch zip checkpoints: the fixture written by real PyTorch (scripts/make_torch_fixture.py)
// must load with exactly the values PyTorch saw, and hand-built archives with bad storages,
// shapes, strides or entries must fail with errors naming the tensor and the file.
#include "engine/io/torch_zip.h"

#include <zip.h>

#include <cstring>
#include <initializer_list>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "engine/io/tensor_store.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testutil.h"

namespace morserve {
namespace {

using testing::TempDir;

using testing::ErrorHas;

std::string FixturePath() { return testing::FixtureDir() + "/torch_tiny/pytorch_model.bin"; }

// ---- building archives ----

struct FakeTensor {
  std::string name;
  std::string storage_class;  // "FloatStorage"
  std::string key;
  int64_t storage_numel = 0;
  int64_t offset = 0;
  std::vector<int64_t> shape;
  std::vector<int64_t> stride;
};

std::string PickleInt(int64_t v) {  // LONG1 with 8 bytes covers every int64
  std::string out = "\x8a\x08";
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>(static_cast<uint64_t>(v) >> (8 * i)));
  return out;
}

std::string PickleStr(const std::string& s) {
  std::string out = "X";
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>(s.size() >> (8 * i)));
  return out + s;
}

std::string PickleInts(const std::vector<int64_t>& v) {
  std::string out = "(";
  for (int64_t x : v) out += PickleInt(x);
  return out + "t";
}

// The opcodes torch.save emits for an OrderedDict of tensors (protocol 2, no memo).
std::string PickleStateDict(const std::vector<FakeTensor>& tensors) {
  std::string p =
      "\x80\x02"
      "ccollections\nOrderedDict\n)R(";
  for (const FakeTensor& t : tensors) {
    p += PickleStr(t.name);
    p += "ctorch._utils\n_rebuild_tensor_v2\n((";
    p += PickleStr("storage") + "ctorch\n" + t.storage_class + "\n" + PickleStr(t.key) +
         PickleStr("cpu") + PickleInt(t.storage_numel) + "tQ";
    p += PickleInt(t.offset) + PickleInts(t.shape) + PickleInts(t.stride);
    p += "\x89"
         "ccollections\nOrderedDict\n)RtR";
  }
  return p + "u.";
}

void WriteZip(const std::string& path,
              const std::vector<std::pair<std::string, std::string>>& entries) {
  int error = 0;
  zip_t* z = zip_open(path.c_str(), ZIP_CREATE | ZIP_TRUNCATE, &error);
  ASSERT_NE(z, nullptr);
  for (const auto& [name, data] : entries) {
    zip_source_t* src = zip_source_buffer(z, data.data(), data.size(), 0);
    ASSERT_NE(src, nullptr);
    const zip_int64_t index = zip_file_add(z, name.c_str(), src, ZIP_FL_OVERWRITE);
    ASSERT_GE(index, 0);
    zip_set_file_compression(z, static_cast<zip_uint64_t>(index), ZIP_CM_STORE, 0);
  }
  ASSERT_EQ(zip_close(z), 0);
}

std::string F32Bytes(const std::vector<float>& v) {
  std::string out(v.size() * 4, '\0');
  std::memcpy(out.data(), v.data(), out.size());
  return out;
}

// A checkpoint directory holding one pytorch_model.bin made of `entries`.
absl::Status LoadZip(const TempDir& dir,
                     const std::vector<std::pair<std::string, std::string>>& entries,
                     std::shared_ptr<TensorStore>* store_out = nullptr) {
  WriteZip(dir.File("pytorch_model.bin"), entries);
  absl::StatusOr<std::shared_ptr<TensorStore>> store = OpenCheckpointDir(dir.path());
  if (store.ok() && store_out != nullptr) *store_out = *store;
  return store.status();
}

FakeTensor F32Tensor(std::string name, std::vector<int64_t> shape, std::vector<int64_t> stride,
                     int64_t offset = 0, int64_t numel = 6) {
  return FakeTensor{std::move(name),  "FloatStorage",   "0", numel, offset,
                    std::move(shape), std::move(stride)};
}

// ---- the PyTorch-written fixture ----

TEST(TorchZipTest, FixtureMatchesWhatPyTorchSaved) {
  const nlohmann::json expected = nlohmann::json::parse(
      testing::ReadFile(testing::FixtureDir() + "/torch_tiny/expected.json"))["tensors"];
  absl::StatusOr<std::shared_ptr<TensorStore>> store =
      OpenCheckpointDir(testing::FixtureDir() + "/torch_tiny");
  ASSERT_TRUE(store.ok()) << store.status();
  ASSERT_EQ((*store)->tensors().size(), expected.size());
  for (const auto& [name, want] : expected.items()) {
    const TensorView* v = (*store)->Find(name);
    ASSERT_NE(v, nullptr) << name;
    EXPECT_EQ(v->file, FixturePath());
    EXPECT_EQ(DTypeName(v->dtype), want["dtype"].get<std::string>()) << name;
    EXPECT_EQ(v->shape, want["shape"].get<std::vector<int64_t>>()) << name;
    const std::vector<float> got = v->ToF32Vector();
    const std::vector<double> values = want["values"].get<std::vector<double>>();
    ASSERT_EQ(got.size(), values.size()) << name;
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_EQ(got[i], static_cast<float>(values[i])) << name << "[" << i << "]";
    }
  }
}

TEST(TorchZipTest, FixtureViewsShareOneStorage) {
  absl::StatusOr<std::shared_ptr<TensorStore>> store =
      OpenCheckpointDir(testing::FixtureDir() + "/torch_tiny");
  ASSERT_TRUE(store.ok()) << store.status();
  const TensorView* k = (*store)->Find("model.layers.0.self_attn.k_proj.weight");
  const TensorView* v = (*store)->Find("model.layers.0.self_attn.v_proj.weight");
  ASSERT_TRUE(k != nullptr && v != nullptr);
  EXPECT_EQ(k->dtype, DType::kF16);
  // v_proj starts 16 f16 elements into the storage k_proj starts at: read once, not copied.
  EXPECT_EQ(static_cast<const uint8_t*>(v->data), static_cast<const uint8_t*>(k->data) + 32);
}

TEST(TorchZipTest, EveryTruncationOfTheFixtureIsAnError) {
  const std::string bytes = testing::ReadFile(FixturePath());
  ASSERT_GT(bytes.size(), 1000u);
  TempDir dir;
  for (size_t n = 0; n < bytes.size(); n += 7) {
    testing::WriteFile(dir.File("pytorch_model.bin"), bytes.substr(0, n));
    EXPECT_TRUE(ErrorHas(OpenCheckpointDir(dir.path()).status(), {dir.File("pytorch_model.bin")}))
        << n;
  }
}

TEST(TorchZipTest, CorruptStorageBytesFailTheCrc) {
  std::string bytes = testing::ReadFile(FixturePath());
  // data/9 holds model.norm.weight: 4 bf16 values stored right after its local header.
  const size_t header = bytes.find("pytorch_model/data/9");
  ASSERT_NE(header, std::string::npos);
  // torch aligns data with an extra field: "FB", a 2-byte length, then padding.
  const size_t extra = header + std::string("pytorch_model/data/9").size();
  ASSERT_EQ(bytes.substr(extra, 2), "FB");
  const size_t data = extra + 4 + static_cast<uint8_t>(bytes[extra + 2]) +
                      (static_cast<size_t>(static_cast<uint8_t>(bytes[extra + 3])) << 8);
  ASSERT_LT(data, bytes.size());
  bytes[data] ^= 0x55;
  TempDir dir;
  testing::WriteFile(dir.File("pytorch_model.bin"), bytes);
  EXPECT_TRUE(ErrorHas(OpenCheckpointDir(dir.path()).status(),
                       {"'model.norm.weight'", dir.File("pytorch_model.bin"), "corrupt"}));
}

// ---- hand-built archives ----

TEST(TorchZipTest, TopDirectoryNameAndOffsets) {
  TempDir dir;
  std::shared_ptr<TensorStore> store;
  const absl::Status s =
      LoadZip(dir,
              {{"archive/data.pkl",
                PickleStateDict({F32Tensor("a", {2}, {1}, 0), F32Tensor("b", {2, 2}, {2, 1}, 2)})},
               {"archive/data/0", F32Bytes({1, 2, 3, 4, 5, 6})},
               {"archive/byteorder", "little"}},
              &store);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(store->Find("a")->ToF32Vector(), (std::vector<float>{1, 2}));
  EXPECT_EQ(store->Find("b")->ToF32Vector(), (std::vector<float>{3, 4, 5, 6}));
  EXPECT_EQ(store->Find("b")->shape, (std::vector<int64_t>{2, 2}));
}

TEST(TorchZipTest, SizeOneDimsAndEmptyTensorsAreContiguousWhateverTheirStride) {
  TempDir dir;
  std::shared_ptr<TensorStore> store;
  const absl::Status s =
      LoadZip(dir,
              {{"a/data.pkl", PickleStateDict({F32Tensor("row", {1, 3}, {99, 1}, 3),
                                               F32Tensor("none", {0, 3}, {7, 7}, 6)})},
               {"a/data/0", F32Bytes({1, 2, 3, 4, 5, 6})}},
              &store);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(store->Find("row")->ToF32Vector(), (std::vector<float>{4, 5, 6}));
  EXPECT_EQ(store->Find("none")->numel(), 0);
}

TEST(TorchZipTest, NotAZipFile) {
  TempDir dir;
  testing::WriteFile(dir.File("pytorch_model.bin"), std::string("\x80\x02}q\x00.", 6));
  EXPECT_TRUE(
      ErrorHas(OpenCheckpointDir(dir.path()).status(), {dir.File("pytorch_model.bin"), "zip"}));
}

TEST(TorchZipTest, NoDataPkl) {
  TempDir dir;
  EXPECT_TRUE(ErrorHas(LoadZip(dir, {{"archive/data/0", "xxxx"}}),
                       {dir.File("pytorch_model.bin"), "data.pkl"}));
}

TEST(TorchZipTest, MalformedPickle) {
  TempDir dir;
  EXPECT_TRUE(ErrorHas(LoadZip(dir, {{"archive/data.pkl", "\x80\x02}q"}}),
                       {dir.File("pytorch_model.bin"), "data.pkl", "malformed pickle"}));
}

TEST(TorchZipTest, MissingStorageEntry) {
  TempDir dir;
  EXPECT_TRUE(ErrorHas(
      LoadZip(dir, {{"archive/data.pkl", PickleStateDict({F32Tensor("w.weight", {6}, {1})})}}),
      {"'w.weight'", dir.File("pytorch_model.bin"), "missing entry archive/data/0"}));
}

TEST(TorchZipTest, StorageShorterThanDeclared) {
  TempDir dir;
  EXPECT_TRUE(ErrorHas(
      LoadZip(dir, {{"archive/data.pkl", PickleStateDict({F32Tensor("w.weight", {6}, {1})})},
                    {"archive/data/0", F32Bytes({1, 2, 3})}}),
      {"'w.weight'", dir.File("pytorch_model.bin"), "has 12 bytes, expected 24"}));
}

TEST(TorchZipTest, StorageLongerThanDeclared) {
  TempDir dir;
  EXPECT_TRUE(ErrorHas(
      LoadZip(dir, {{"archive/data.pkl", PickleStateDict({F32Tensor("w.weight", {2}, {1}, 0, 2)})},
                    {"archive/data/0", F32Bytes({1, 2, 3})}}),
      {"'w.weight'", dir.File("pytorch_model.bin"), "has 12 bytes, more than the 8 expected"}));
}

TEST(TorchZipTest, UnsupportedStorageType) {
  TempDir dir;
  FakeTensor t = F32Tensor("model.position_ids", {6}, {1});
  t.storage_class = "LongStorage";
  EXPECT_TRUE(ErrorHas(LoadZip(dir, {{"archive/data.pkl", PickleStateDict({t})},
                                     {"archive/data/0", std::string(48, '\0')}}),
                       {"'model.position_ids'", dir.File("pytorch_model.bin"),
                        "unsupported storage type torch.LongStorage"}));
}

TEST(TorchZipTest, NonContiguousTensor) {
  TempDir dir;
  EXPECT_TRUE(ErrorHas(
      LoadZip(dir, {{"archive/data.pkl", PickleStateDict({F32Tensor("w.T", {3, 2}, {1, 3})})},
                    {"archive/data/0", F32Bytes({1, 2, 3, 4, 5, 6})}}),
      {"'w.T'", dir.File("pytorch_model.bin"), "non-contiguous", "stride [1, 3]"}));
}

TEST(TorchZipTest, ViewOutsideItsStorage) {
  TempDir dir;
  EXPECT_TRUE(ErrorHas(
      LoadZip(dir, {{"archive/data.pkl", PickleStateDict({F32Tensor("w", {2, 2}, {2, 1}, 3)})},
                    {"archive/data/0", F32Bytes({1, 2, 3, 4, 5, 6})}}),
      {"'w'", dir.File("pytorch_model.bin"), "outside storage 0 of 6 elements"}));
  EXPECT_TRUE(
      ErrorHas(LoadZip(dir, {{"archive/data.pkl", PickleStateDict({F32Tensor("w", {2}, {1}, -1)})},
                             {"archive/data/0", F32Bytes({1, 2, 3, 4, 5, 6})}}),
               {"'w'", "outside storage"}));
  EXPECT_TRUE(ErrorHas(LoadZip(dir, {{"archive/data.pkl",
                                      PickleStateDict({F32Tensor("w", {2}, {1}, INT64_MAX - 1)})},
                                     {"archive/data/0", F32Bytes({1, 2, 3, 4, 5, 6})}}),
                       {"'w'", "outside storage"}));
}

TEST(TorchZipTest, BadShapes) {
  TempDir dir;
  const std::string file = dir.File("pytorch_model.bin");
  const std::string data = F32Bytes({1, 2, 3, 4, 5, 6});
  EXPECT_TRUE(ErrorHas(
      LoadZip(dir, {{"archive/data.pkl", PickleStateDict({F32Tensor("neg", {-2, 3}, {3, 1})})},
                    {"archive/data/0", data}}),
      {"'neg'", file, "bad shape [-2, 3]"}));
  EXPECT_TRUE(ErrorHas(LoadZip(dir, {{"archive/data.pkl",
                                      PickleStateDict({F32Tensor("big", {INT64_MAX, 4}, {4, 1})})},
                                     {"archive/data/0", data}}),
                       {"'big'", file, "bad shape"}));
  EXPECT_TRUE(ErrorHas(
      LoadZip(dir, {{"archive/data.pkl", PickleStateDict({F32Tensor("rank", {2, 3}, {1})})},
                    {"archive/data/0", data}}),
      {"'rank'", file, "stride [1] does not match shape [2, 3]"}));
  FakeTensor huge = F32Tensor("huge_storage", {1}, {1}, 0, INT64_MAX / 2);
  EXPECT_TRUE(ErrorHas(
      LoadZip(dir, {{"archive/data.pkl", PickleStateDict({huge})}, {"archive/data/0", data}}),
      {"'huge_storage'", file}));
}

TEST(TorchZipTest, StorageKeyEscapingTheArchive) {
  TempDir dir;
  FakeTensor t = F32Tensor("w", {6}, {1});
  t.key = "../../etc/passwd";
  EXPECT_TRUE(ErrorHas(LoadZip(dir, {{"archive/data.pkl", PickleStateDict({t})}}),
                       {"'w'", dir.File("pytorch_model.bin"), "bad storage key"}));
}

TEST(TorchZipTest, StorageUsedWithTwoDtypes) {
  TempDir dir;
  FakeTensor half = F32Tensor("h", {6}, {1}, 0, 12);
  half.storage_class = "HalfStorage";
  EXPECT_TRUE(ErrorHas(
      LoadZip(dir, {{"archive/data.pkl", PickleStateDict({F32Tensor("f", {6}, {1}), half})},
                    {"archive/data/0", F32Bytes({1, 2, 3, 4, 5, 6})}}),
      {"'h'", dir.File("pytorch_model.bin"), "two dtypes"}));
}

TEST(TorchZipTest, BigEndianRejected) {
  TempDir dir;
  EXPECT_TRUE(
      ErrorHas(LoadZip(dir, {{"archive/data.pkl", PickleStateDict({F32Tensor("w", {6}, {1})})},
                             {"archive/data/0", F32Bytes({1, 2, 3, 4, 5, 6})},
                             {"archive/byteorder", "big"}}),
               {dir.File("pytorch_model.bin"), "big-endian"}));
}

TEST(TorchZipTest, DuplicateKeyInStateDict) {
  TempDir dir;
  EXPECT_TRUE(ErrorHas(
      LoadZip(dir, {{"archive/data.pkl",
                     PickleStateDict({F32Tensor("w", {6}, {1}), F32Tensor("w", {6}, {1})})},
                    {"archive/data/0", F32Bytes({1, 2, 3, 4, 5, 6})}}),
      {"'w'", "twice"}));
}

}  // namespace
}  // namespace morserve
