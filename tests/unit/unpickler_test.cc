// The pickle VM: the opcodes torch.save uses, the state dict of the PyTorch-written fixture,
// and malformed pickles, which must all be errors (never crashes or out-of-bounds reads).
#include "engine/io/unpickler.h"

#include <zip.h>

#include <initializer_list>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "engine/io/torch_zip.h"
#include "gtest/gtest.h"
#include "tests/testutil.h"

namespace morserve {
namespace {

using namespace std::string_literals;  // "...\0..."s keeps embedded NULs

using testing::ErrorHas;

// data.pkl of the PyTorch-written fixture.
std::string FixturePickle() {
  const std::string path = testing::FixtureDir() + "/torch_tiny/pytorch_model.bin";
  int error = 0;
  zip_t* z = zip_open(path.c_str(), ZIP_RDONLY, &error);
  if (z == nullptr) return "";
  std::string out;
  zip_file_t* f = zip_fopen(z, "pytorch_model/data.pkl", 0);
  if (f != nullptr) {
    char buf[4096];
    zip_int64_t n;
    while ((n = zip_fread(f, buf, sizeof buf)) > 0) out.append(buf, static_cast<size_t>(n));
    zip_fclose(f);
  }
  zip_discard(z);
  return out;
}

TEST(UnpicklerTest, DictOfScalars) {
  // {'a': 1, 'b': -2, 'c': 70000, 'd': None, 'e': True, 'f': 1.5, 'g': [1, 2]}
  const std::string p =
      "\x80\x02}q\x00(X\x01\x00\x00\x00"
      "aK\x01X\x01\x00\x00\x00"
      "b\x8a\x01\xfe"
      "X\x01\x00\x00\x00"
      "cJ\x70\x11\x01\x00X\x01\x00\x00\x00"
      "dNX\x01\x00\x00\x00"
      "e\x88"
      "X\x01\x00\x00\x00"
      "fG\x3f\xf8\x00\x00\x00\x00\x00\x00X\x01\x00\x00\x00g]q\x01(K\x01M\x02\x00"
      "eu."s;
  absl::StatusOr<Unpickled> u = Unpickle(p);
  ASSERT_TRUE(u.ok()) << u.status();
  const PickleValue& root = u->at(u->root);
  ASSERT_EQ(root.kind, PickleKind::kDict);
  ASSERT_EQ(root.items.size(), 14u);
  EXPECT_EQ(u->at(root.items[0]).str, "a");
  EXPECT_EQ(u->at(root.items[1]).int_value, 1);
  EXPECT_EQ(u->at(root.items[3]).int_value, -2);
  EXPECT_EQ(u->at(root.items[5]).int_value, 70000);
  EXPECT_EQ(u->at(root.items[7]).kind, PickleKind::kNone);
  EXPECT_EQ(u->at(root.items[9]).kind, PickleKind::kBool);
  EXPECT_EQ(u->at(root.items[9]).int_value, 1);
  EXPECT_EQ(u->at(root.items[11]).float_value, 1.5);
  const PickleValue& list = u->at(root.items[13]);
  ASSERT_EQ(list.kind, PickleKind::kList);
  ASSERT_EQ(list.items.size(), 2u);
  EXPECT_EQ(u->at(list.items[1]).int_value, 2);
}

TEST(UnpicklerTest, MemoSharesValues) {
  // x = ('s',); (x, x) through BINPUT / BINGET and LONG_BINPUT / LONG_BINGET.
  const std::string p =
      "\x80\x02X\x01\x00\x00\x00s\x85q\x07r\x00\x01\x00\x00"
      "0h\x07j\x00\x01\x00\x00\x86."s;
  absl::StatusOr<Unpickled> u = Unpickle(p);
  ASSERT_TRUE(u.ok()) << u.status();
  const PickleValue& root = u->at(u->root);
  ASSERT_EQ(root.kind, PickleKind::kTuple);
  ASSERT_EQ(root.items.size(), 2u);
  EXPECT_EQ(root.items[0], root.items[1]);
}

TEST(UnpicklerTest, Protocol4Framing) {
  // FRAME, SHORT_BINUNICODE, MEMOIZE, STACK_GLOBAL building an OrderedDict.
  const std::string p =
      "\x80\x04\x95\x10\x00\x00\x00\x00\x00\x00\x00"
      "\x8c\x0b"
      "collections\x94\x8c\x0bOrderedDict\x94\x93\x94)R\x94."s;
  absl::StatusOr<Unpickled> u = Unpickle(p);
  ASSERT_TRUE(u.ok()) << u.status();
  EXPECT_EQ(u->at(u->root).kind, PickleKind::kDict);
}

TEST(UnpicklerTest, FixtureStateDictRecords) {
  const std::string pickle = FixturePickle();
  ASSERT_FALSE(pickle.empty());
  absl::StatusOr<std::vector<TorchTensorRecord>> records = ReadTorchStateDict(pickle, "fixture");
  ASSERT_TRUE(records.ok()) << records.status();
  ASSERT_EQ(records->size(), 12u);
  const TorchTensorRecord& embed = (*records)[0];
  EXPECT_EQ(embed.name, "model.embed_tokens.weight");
  EXPECT_EQ(embed.storage_type, "torch.BFloat16Storage");
  EXPECT_EQ(embed.storage_numel, 32);
  EXPECT_EQ(embed.shape, (std::vector<int64_t>{8, 4}));
  EXPECT_EQ(embed.stride, (std::vector<int64_t>{4, 1}));
  const TorchTensorRecord& k = (*records)[2];
  const TorchTensorRecord& v = (*records)[3];
  EXPECT_EQ(k.name, "model.layers.0.self_attn.k_proj.weight");
  EXPECT_EQ(v.name, "model.layers.0.self_attn.v_proj.weight");
  EXPECT_EQ(k.storage_key, v.storage_key);
  EXPECT_EQ(k.storage_type, "torch.HalfStorage");
  EXPECT_EQ(k.storage_offset, 0);
  EXPECT_EQ(v.storage_offset, 16);
  EXPECT_EQ(v.storage_numel, 32);
  EXPECT_EQ((*records)[5].storage_type, "torch.FloatStorage");
  EXPECT_EQ((*records)[11].name, "lm_head.weight");  // an nn.Parameter
  EXPECT_EQ((*records)[11].storage_type, "torch.HalfStorage");
}

TEST(UnpicklerTest, Malformed) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {""s, "no STOP"},
      {"\x80\x02"s, "no STOP"},
      {"\x80\x09."s, "protocol 9"},
      {"\x80\x02}q"s, "truncated"},
      {"\x80\x02Z."s, "unsupported opcode"},
      {"."s, "stack underflow"},
      {"\x80\x02R."s, "stack underflow"},
      {"\x80\x02h\x05."s, "memo key 5 not set"},
      {"\x80\x02X\xff\xff\xff\x7f"s, "past the end"},
      {"\x80\x02\x8d\xff\xff\xff\xff\xff\xff\xff\xff"s, "past the end"},
      {"\x80\x02t."s, "no MARK"},
      {"\x80\x02\x8a\x09\x01\x02\x03\x04\x05\x06\x07\x08\x09."s, "wider than 64 bits"},
      {"\x80\x02]K\x01K\x02s."s, "SETITEM on a non-dict"},
      {"\x80\x02}K\x01"
       "a."s,
       "APPEND on a non-list"},
      {"\x80\x02}(K\x01u."s, "odd number"},
      {"\x80\x02K\x01}b."s, "BUILD on a non-dict"},
      {"\x80\x02"
       "cos\nsystem\nX\x02\x00\x00\x00ls\x85R."s,
       "unsupported callable os.system"},
      {"\x80\x02"
       "cbuiltins\neval"s,
       "bad GLOBAL"},
      {"\x80\x02K\x01)R."s, "REDUCE needs a global and a tuple"},
      {"\x80\x02K\x01Q."s, "persistent id is not a 5-tuple"},
      {"\x80\x02(K\x01K\x01K\x01K\x01K\x01tQ."s, "('storage', type, key, location, numel)"},
      {"\x80\x02"
       "ctorch._utils\n_rebuild_tensor_v2\nK\x01\x85R."s,
       "at least 4 arguments"},
      {"\x80\x02"
       "ctorch._utils\n_rebuild_parameter\nK\x01\x85R."s,
       "without a tensor"},
      {"\x80\x02K\x01(0."s, "stack underflow"},  // POP may not reach below a MARK
      {"\x80\x02K\x01\x93."s, "stack underflow"},
  };
  for (const auto& [pickle, message] : cases) {
    EXPECT_TRUE(ErrorHas(Unpickle(pickle).status(), {"malformed pickle", message}))
        << "pickle: " << absl::CEscape(pickle);
  }
}

TEST(UnpicklerTest, ErrorsNameOffsetAndOpcode) {
  EXPECT_TRUE(ErrorHas(Unpickle("\x80\x02N\xff.").status(), {"at byte 3", "opcode 0xff"}));
}

TEST(UnpicklerTest, StateDictShapeErrors) {
  EXPECT_TRUE(ErrorHas(ReadTorchStateDict("\x80\x02K\x01.", "f.bin").status(),
                       {"f.bin", "does not hold a dict"}));
  EXPECT_TRUE(
      ErrorHas(ReadTorchStateDict("\x80\x02}X\x07\x00\x00\x00step_idK\x05s."s, "f.bin").status(),
               {"'step_id'", "f.bin", "not a tensor"}));
  EXPECT_TRUE(ErrorHas(ReadTorchStateDict("\x80\x02}K\x01K\x05s.", "f.bin").status(),
                       {"f.bin", "key is not a string"}));
}

TEST(UnpicklerTest, LimitsAreErrorsNotCrashes) {
  // A million nested tuples: built and freed without recursion.
  std::string deep = "\x80\x02N" + std::string(1'000'000, '\x85') + ".";
  absl::StatusOr<Unpickled> u = Unpickle(deep);
  ASSERT_TRUE(u.ok()) << u.status();
  EXPECT_EQ(u->at(u->root).kind, PickleKind::kTuple);
  // Too many values on the stack, too many marks.
  EXPECT_TRUE(ErrorHas(Unpickle("\x80\x02" + std::string(2'000'000, 'N') + ".").status(),
                       {"stack too deep"}));
  EXPECT_TRUE(ErrorHas(Unpickle("\x80\x02" + std::string(100'000, '(') + ".").status(),
                       {"too many MARKs"}));
}

// Every prefix and single-byte corruption of a real torch pickle: an error or a value, never
// a crash (run under -DMORSERVE_SANITIZE=address to check reads too).
TEST(UnpicklerTest, FixtureCorruptionsNeverCrash) {
  const std::string pickle = FixturePickle();
  ASSERT_FALSE(pickle.empty());
  for (size_t n = 0; n < pickle.size(); ++n) {
    EXPECT_FALSE(ReadTorchStateDict(pickle.substr(0, n), "f").ok()) << n;
  }
  int accepted = 0;
  for (size_t i = 0; i < pickle.size(); ++i) {
    for (char value : {'\x00', '\x01', '\xff', 'R', 't', '(', 'u', 'h', 'Q', '.'}) {
      std::string corrupt = pickle;
      corrupt[i] = value;
      absl::StatusOr<std::vector<TorchTensorRecord>> records = ReadTorchStateDict(corrupt, "f");
      if (records.ok()) ++accepted;
    }
  }
  EXPECT_GT(accepted, 0);  // e.g. changed digits inside a name
}

}  // namespace
}  // namespace morserve
