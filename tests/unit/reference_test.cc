// Properties of the reference implementation (docs/models.md) that do not trust it blindly:
// each test builds two checkpoints that the spec says must compute the same (or provably
// different) values and compares the reference's logits and traces, or computes the
// expected logits by hand. Checkpoints are derived from mkmodel's tensors by renaming,
// editing and re-writing them, so the comparisons also cover the loader's layer mapping.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <ostream>
#include <string>
#include <vector>

#include "engine/io/safetensors_writer.h"
#include "engine/model/weights.h"
#include "engine/reference/reference_model.h"
#include "engine/tools/mkmodel.h"
#include "nlohmann/json.hpp"
#include "tests/engine_harness.h"
#include "tests/testutil.h"

namespace morserve {
namespace {

using json = nlohmann::json;
using testing::MaxRelDiff;
using testing::TempDir;

const std::vector<int> kTokens = {5, 17, 200, 3, 99, 42, 42, 7, 128, 255, 64, 1};

// A checkpoint being assembled in memory: config.json plus tensors in file order.
struct Checkpoint {
  json config;
  std::vector<OwnedTensor> tensors;

  const OwnedTensor* Find(const std::string& name) const {
    for (const OwnedTensor& t : tensors) {
      if (t.name == name) return &t;
    }
    return nullptr;
  }
  std::vector<float> F32(const std::string& name) const {
    const OwnedTensor* t = Find(name);
    if (t == nullptr || t->dtype != DType::kF32) {
      ADD_FAILURE() << "no F32 tensor " << name;
      return {};
    }
    std::vector<float> v(t->bytes.size() / 4);
    std::memcpy(v.data(), t->bytes.data(), t->bytes.size());
    return v;
  }
  std::vector<int64_t> Shape(const std::string& name) const {
    const OwnedTensor* t = Find(name);
    return t == nullptr ? std::vector<int64_t>{} : t->shape;
  }
  void Put(const std::string& name, std::vector<int64_t> shape, const std::vector<float>& v) {
    Erase(name);
    tensors.push_back(OwnedTensor::FromF32(name, DType::kF32, std::move(shape), v));
  }
  void Erase(const std::string& name) {
    std::erase_if(tensors, [&](const OwnedTensor& t) { return t.name == name; });
  }
  // Every tensor under `from` (a key prefix), renamed to start with `to`.
  std::vector<OwnedTensor> Renamed(const std::string& from, const std::string& to) const {
    std::vector<OwnedTensor> out;
    for (const OwnedTensor& t : tensors) {
      if (t.name.rfind(from, 0) != 0) continue;
      OwnedTensor c = t;
      c.name = to + t.name.substr(from.size());
      out.push_back(std::move(c));
    }
    return out;
  }
};

// mkmodel's config.json and tensors for `spec`.
Checkpoint FromSpec(const TinyModelSpec& spec) {
  Checkpoint c;
  TempDir dir;
  if (absl::Status s = WriteTinyModel(spec, dir.path()); !s.ok()) {
    ADD_FAILURE() << "mkmodel " << spec.family << ": " << s;
    return c;
  }
  c.config = json::parse(testing::ReadFile(dir.File("config.json")));
  auto tensors = TinyModelTensors(spec);
  if (!tensors.ok()) {
    ADD_FAILURE() << tensors.status();
    return c;
  }
  c.tensors = std::move(*tensors);
  return c;
}

// Writes the checkpoint to dir/name and loads it.
std::shared_ptr<const ModelWeights> Load(const Checkpoint& c, const TempDir& dir,
                                         const std::string& name) {
  const std::string path = dir.File(name);
  std::filesystem::create_directories(path);
  testing::WriteFile(path + "/config.json", c.config.dump(2));
  if (absl::Status s = WriteSafetensors(path + "/model.safetensors", c.tensors); !s.ok()) {
    ADD_FAILURE() << name << ": " << s;
    return nullptr;
  }
  auto w = LoadModel(path);
  if (!w.ok()) {
    ADD_FAILURE() << "load " << name << ": " << w.status();
    return nullptr;
  }
  return *w;
}

// The non-layer tensors (embedding, final norm, lm_head) of a checkpoint.
std::vector<OwnedTensor> Globals(const Checkpoint& c) {
  std::vector<OwnedTensor> out;
  for (const OwnedTensor& t : c.tensors) {
    if (t.name.rfind("model.layers.", 0) != 0) out.push_back(t);
  }
  return out;
}

std::vector<StepOutput> RunRef(const std::shared_ptr<const ModelWeights>& w,
                               const std::vector<int>& tokens = kTokens,
                               ReferenceOptions opt = {}) {
  ReferenceModel m(w, opt);
  return m.Forward(tokens);
}

double MaxDiffOverSequence(const std::vector<StepOutput>& a, const std::vector<StepOutput>& b) {
  EXPECT_EQ(a.size(), b.size());
  double m = 0;
  for (size_t t = 0; t < a.size() && t < b.size(); ++t) {
    m = std::max(m, MaxRelDiff(a[t].logits, b[t].logits));
  }
  return m;
}

std::string Layer(int j) { return "model.layers." + std::to_string(j) + "."; }

TinyModelSpec Spec(const std::string& family, DType dtype = DType::kF32) {
  TinyModelSpec s;
  s.family = family;
  s.dtype = dtype;
  s.recursions = 3;
  return s;
}

// ---- 1. A shared plan equals the vanilla model of its unrolled copies ------------------

struct UnrollCase {
  std::string sharing;
  int layers;
  // Unrolled layer j of the vanilla model -> the stored (loop 0) copy it must equal, written
  // out from the table of docs/models.md#layer-plan-and-sharing (Nr = 3, K = 2 for the cycles).
  int (*source)(int j);
};

void PrintTo(const UnrollCase& c, std::ostream* os) { *os << c.sharing; }

class UnrollTest : public ::testing::TestWithParam<UnrollCase> {};

TEST_P(UnrollTest, SharedPlanEqualsVanillaOfUnrolledCopies) {
  const UnrollCase& uc = GetParam();
  TinyModelSpec spec = Spec("recursive-cycle", DType::kBF16);
  spec.sharing = uc.sharing;
  spec.first_copy_only = true;  // only loop 0's copies exist: the plan must map the rest
  Checkpoint shared = FromSpec(spec);
  ASSERT_EQ(shared.config["num_hidden_layers"], uc.layers);

  Checkpoint vanilla;
  vanilla.config = shared.config;
  vanilla.config.erase("recursion");
  vanilla.tensors = Globals(shared);
  for (int j = 0; j < uc.layers; ++j) {
    std::vector<OwnedTensor> copy = shared.Renamed(Layer(uc.source(j)), Layer(j));
    ASSERT_EQ(copy.size(), 9u) << "layer " << j;
    for (OwnedTensor& t : copy) vanilla.tensors.push_back(std::move(t));
  }

  TempDir dir;
  auto ws = Load(shared, dir, "shared");
  auto wv = Load(vanilla, dir, "vanilla");
  ASSERT_NE(ws, nullptr);
  ASSERT_NE(wv, nullptr);
  ASSERT_EQ(wv->plan.segments.size(), 1u);
  ASSERT_EQ(wv->plan.segments[0].num_layers, uc.layers);
  const auto a = RunRef(ws), b = RunRef(wv);
  EXPECT_LE(MaxDiffOverSequence(a, b), 1e-6);

  // Sanity: the unrolled order matters (a vanilla model with another order differs).
  Checkpoint reversed = vanilla;
  reversed.tensors = Globals(shared);
  for (int j = 0; j < uc.layers; ++j) {
    for (OwnedTensor& t : shared.Renamed(Layer(uc.source(uc.layers - 1 - j)), Layer(j))) {
      reversed.tensors.push_back(std::move(t));
    }
  }
  auto wr = Load(reversed, dir, "reversed");
  ASSERT_NE(wr, nullptr);
  EXPECT_GT(MaxDiffOverSequence(RunRef(wr), b), 1e-3);
}

INSTANTIATE_TEST_SUITE_P(
    Sharing, UnrollTest,
    ::testing::Values(
        // cycle: one segment of K = 2 layers looped 3 times; unrolled j uses slot j mod K.
        UnrollCase{"cycle", 6, [](int j) { return j % 2; }},
        // sequence: 2 segments of one layer, each looped 3 times; j uses slot j div Nr,
        // whose loop-0 copy is stored as unrolled layer (j div Nr) * Nr.
        UnrollCase{"sequence", 6, [](int j) { return (j / 3) * 3; }},
        // middle_cycle: layer 0 unique, cycle over 1..6 (K = 2), layer 7 unique.
        UnrollCase{"middle_cycle", 8, [](int j) { return j == 0 || j == 7 ? j : 1 + (j - 1) % 2; }},
        // middle_sequence: layer 0 unique, two sequence segments (1..3, 4..6), layer 7 unique.
        UnrollCase{"middle_sequence", 8,
                   [](int j) { return j == 0 || j == 7 ? j : 1 + ((j - 1) / 3) * 3; }}),
    [](const ::testing::TestParamInfo<UnrollCase>& info) { return info.param.sharing; });

// The first and last unique layers of a middle_cycle MoR checkpoint (official layout: unique
// layers take model.layers.0 and model.layers.(1 + Nr)) as a 2-layer vanilla model.
Checkpoint UniqueLayersOnly(const Checkpoint& mor, int last_index) {
  Checkpoint v;
  v.config = mor.config;
  v.config.erase("recursion");
  v.config["num_hidden_layers"] = 2;
  v.tensors = Globals(mor);
  for (OwnedTensor& t : mor.Renamed(Layer(0), Layer(0))) {
    if (t.name.find(".block") == std::string::npos && t.name.find("router") == std::string::npos) {
      v.tensors.push_back(std::move(t));
    }
  }
  for (OwnedTensor& t : mor.Renamed(Layer(last_index), Layer(1))) v.tensors.push_back(std::move(t));
  return v;
}

// ---- 2. expert_choice that selects nobody equals the model without the looped segment --

TEST(ReferenceProperties, ExpertChoiceInfiniteThresholdRunsZeroLoops) {
  TinyModelSpec spec = Spec("mor-ec");
  spec.capacity = {0.5f, 0.25f, 0.125f};  // every loop decided by the router
  Checkpoint ec = FromSpec(spec);
  ec.config["recursion"]["router"]["threshold"] = 1e30;
  Checkpoint v = UniqueLayersOnly(ec, 4);
  ASSERT_EQ(v.tensors.size(), 3u + 2 * 9u);

  TempDir dir;
  auto we = Load(ec, dir, "ec");
  auto wv = Load(v, dir, "vanilla2");
  ASSERT_NE(we, nullptr);
  ASSERT_NE(wv, nullptr);
  ASSERT_FLOAT_EQ(we->config.recursion.router.threshold, 1e30f);
  ReferenceModel m(we);
  const auto a = m.Forward(kTokens);
  for (size_t t = 0; t < a.size(); ++t) {
    EXPECT_EQ(a[t].trace.loops, 0) << "token " << t;
    EXPECT_EQ(a[t].trace.router_scores.size(), 1u) << "only loop 1 has candidates";
  }
  const Segment& looped = we->plan.segments[we->plan.looped_segment];
  for (int c = looped.first_cache_slot;
       c < looped.first_cache_slot + looped.num_layers * looped.loops; ++c) {
    EXPECT_EQ(m.SlotEntries(c), 0) << "cache slot " << c;
  }
  EXPECT_LE(MaxDiffOverSequence(a, RunRef(wv)), 1e-6);

  // Control: with the default threshold some tokens do loop, and the logits then differ.
  Checkpoint routed = FromSpec(spec);
  auto wr = Load(routed, dir, "ec-default");
  ASSERT_NE(wr, nullptr);
  const auto r = RunRef(wr);
  int looping = 0;
  for (const StepOutput& o : r) looping += o.trace.loops > 0;
  EXPECT_GT(looping, 0);
  EXPECT_GT(MaxDiffOverSequence(r, a), 1e-4);
}

// ---- 3. Early exit -----------------------------------------------------------------------

TEST(ReferenceProperties, EarlyExitThresholdAboveOneEqualsNoExit) {
  TinyModelSpec spec = Spec("early-exit");
  spec.exit_threshold = 1.5f;
  Checkpoint ee = FromSpec(spec);
  Checkpoint plain = ee;
  plain.config["recursion"]["routing"] = "none";
  plain.config["recursion"].erase("early_exit");
  TempDir dir;
  auto we = Load(ee, dir, "early-exit");
  auto wp = Load(plain, dir, "plain");
  ASSERT_NE(we, nullptr);
  ASSERT_NE(wp, nullptr);
  const int nr = we->config.recursion.num_recursions;
  ASSERT_EQ(nr, 3);
  const auto a = RunRef(we), b = RunRef(wp);
  for (size_t t = 0; t < a.size(); ++t) {
    EXPECT_EQ(a[t].trace.loops, nr) << "token " << t;
    EXPECT_EQ(b[t].trace.loops, nr) << "token " << t;
    ASSERT_EQ(a[t].trace.exit_confidence.size(), static_cast<size_t>(nr - 1));
    for (double c : a[t].trace.exit_confidence) EXPECT_TRUE(c > 0 && c <= 1) << c;
    EXPECT_EQ(a[t].logits, b[t].logits) << "token " << t;
  }
}

TEST(ReferenceProperties, EarlyExitTinyThresholdExitsAfterLoopOne) {
  TempDir dir;
  std::vector<std::vector<StepOutput>> outs;
  std::vector<std::vector<int>> entries;
  for (const char* kv : {"propagate", "skip"}) {
    TinyModelSpec spec = Spec("early-exit");
    spec.exit_threshold = 1e-9f;
    spec.exit_kv = kv;
    auto w = Load(FromSpec(spec), dir, kv);
    ASSERT_NE(w, nullptr);
    ReferenceModel m(w);
    outs.push_back(m.Forward(kTokens));
    for (const StepOutput& o : outs.back()) {
      EXPECT_EQ(o.trace.loops, 1) << kv;
      EXPECT_EQ(o.trace.exit_confidence.size(), 1u) << kv;
    }
    // middle_cycle, Nr = 3, K = 2: slot 0 = first layer, 1 + r*K + k, 7 = last layer.
    ASSERT_EQ(w->plan.num_cache_slots, 8);
    entries.emplace_back();
    for (int c = 0; c < 8; ++c) entries.back().push_back(m.SlotEntries(c));
  }
  const int n = static_cast<int>(kTokens.size());
  // Loop 1 and the unique layers hold every token in both modes; loops 2 and 3 hold every
  // token's exit-state K/V under propagate and nothing under skip.
  EXPECT_THAT(entries[0], ::testing::Each(n));
  EXPECT_THAT(entries[1], ::testing::ElementsAre(n, n, n, 0, 0, 0, 0, n));
  // Every token exits after loop 1, so nobody ever reads the loop 2/3 slots: the K/V written
  // there differ, but the logits cannot.
  EXPECT_EQ(MaxDiffOverSequence(outs[0], outs[1]), 0.0);
}

// propagate vs skip where it matters: token 0 exits after loop 1 and token 1 does not, so
// token 1's loop 2 sees token 0's propagated K/V under propagate and nothing under skip.
TEST(ReferenceProperties, EarlyExitPropagateVsSkipDifferFromPositionOne) {
  TinyModelSpec probe_spec = Spec("early-exit");
  probe_spec.exit_threshold = 1.5f;
  TempDir dir;
  auto probe = Load(FromSpec(probe_spec), dir, "probe");
  ASSERT_NE(probe, nullptr);
  // The confidence after loop 1 does not depend on earlier tokens' exits (loop 1 always
  // runs and its slots are written by every token), so the probe's values are the ones
  // the real runs will see at loop 1. Find a prefix where token 0 is more confident.
  std::vector<int> tokens;
  double threshold = 0;
  for (int first = 0; first < 64 && tokens.empty(); ++first) {
    std::vector<int> cand = kTokens;
    cand[0] = first;
    const auto o = RunRef(probe, cand);
    const double c0 = o[0].trace.exit_confidence[0], c1 = o[1].trace.exit_confidence[0];
    if (c0 > c1 * 1.01) {
      tokens = cand;
      threshold = (c0 + c1) / 2;
    }
  }
  ASSERT_FALSE(tokens.empty()) << "no prefix with token 0 more confident than token 1";

  std::vector<std::vector<StepOutput>> outs;
  for (const char* kv : {"propagate", "skip"}) {
    TinyModelSpec spec = probe_spec;
    spec.exit_kv = kv;
    auto w = Load(FromSpec(spec), dir, kv);
    ASSERT_NE(w, nullptr);
    ReferenceOptions opt;
    opt.exit_threshold = static_cast<float>(threshold);
    outs.push_back(RunRef(w, tokens, opt));
    EXPECT_EQ(outs.back()[0].trace.loops, 1) << kv;
    EXPECT_GT(outs.back()[1].trace.loops, 1) << kv;
  }
  EXPECT_EQ(outs[0][0].logits, outs[1][0].logits);
  for (size_t t = 1; t < tokens.size(); ++t) {
    // From position 1 on the last unique layer sees token 1's differing state.
    EXPECT_GT(MaxRelDiff(outs[0][t].logits, outs[1][t].logits), 1e-6) << "position " << t;
  }
}

// ---- 4. LoRA -----------------------------------------------------------------------------

TEST(ReferenceProperties, LoraWithZeroDeltaEqualsStrictSharing) {
  TinyModelSpec strict_spec = Spec("recursive-cycle");
  Checkpoint strict = FromSpec(strict_spec);
  TinyModelSpec lora_spec = Spec("relaxed-lora");
  Checkpoint lora = FromSpec(lora_spec);
  int zeroed = 0;
  for (OwnedTensor& t : lora.tensors) {
    if (t.name.find("lora_B") != std::string::npos) {
      std::fill(t.bytes.begin(), t.bytes.end(), 0);
      ++zeroed;
    }
  }
  EXPECT_EQ(zeroed, 6 * 2);  // 6 unrolled layers x (q_proj, v_proj)
  TinyModelSpec rank0_spec = Spec("relaxed-lora");
  rank0_spec.lora_rank = 0;
  TempDir dir;
  auto ws = Load(strict, dir, "strict");
  auto wl = Load(lora, dir, "lora-b0");
  auto w0 = Load(FromSpec(rank0_spec), dir, "lora-rank0");
  ASSERT_NE(ws, nullptr);
  ASSERT_NE(wl, nullptr);
  ASSERT_NE(w0, nullptr);
  ASSERT_FALSE(wl->layers[0].P(Proj::kQ).lora.empty());
  const auto a = RunRef(ws);
  EXPECT_EQ(MaxDiffOverSequence(RunRef(wl), a), 0.0);
  EXPECT_EQ(MaxDiffOverSequence(RunRef(w0), a), 0.0);
}

TEST(ReferenceProperties, LoraEqualsDeltaAddedIntoUntiedWeights) {
  TinyModelSpec spec = Spec("relaxed-lora");
  Checkpoint lora = FromSpec(spec);
  const int rank = lora.config["recursion"]["lora"]["rank"];
  const double scale = lora.config["recursion"]["lora"]["alpha"].get<double>() / rank;
  ASSERT_EQ(rank, 4);
  ASSERT_DOUBLE_EQ(scale, 2.0);

  Checkpoint untied;
  untied.config = lora.config;
  untied.config["recursion"].erase("lora");
  for (const OwnedTensor& t : lora.tensors) {
    if (t.name.find("lora_") == std::string::npos &&
        t.name.find("base_layer") == std::string::npos) {
      untied.tensors.push_back(t);
    }
  }
  for (int j = 0; j < 6; ++j) {
    for (const char* proj : {"q_proj", "v_proj"}) {
      const std::string key = Layer(j) + "self_attn." + proj;
      const std::vector<float> w = lora.F32(key + ".base_layer.weight");
      const std::vector<float> a = lora.F32(key + ".lora_A.default.weight");
      const std::vector<float> b = lora.F32(key + ".lora_B.default.weight");
      const std::vector<int64_t> shape = lora.Shape(key + ".base_layer.weight");
      const int out = static_cast<int>(shape[0]), in = static_cast<int>(shape[1]);
      ASSERT_EQ(a.size(), static_cast<size_t>(rank * in));
      ASSERT_EQ(b.size(), static_cast<size_t>(out * rank));
      std::vector<float> merged(w.size());
      for (int o = 0; o < out; ++o) {
        for (int i = 0; i < in; ++i) {
          double ba = 0;
          for (int r = 0; r < rank; ++r) ba += static_cast<double>(b[o * rank + r]) * a[r * in + i];
          merged[o * in + i] = static_cast<float>(w[o * in + i] + scale * ba);
        }
      }
      untied.Put(key + ".weight", shape, merged);
    }
  }
  TempDir dir;
  auto wl = Load(lora, dir, "lora");
  auto wu = Load(untied, dir, "untied");
  auto ws = Load(FromSpec(Spec("recursive-cycle")), dir, "strict");
  ASSERT_NE(wl, nullptr);
  ASSERT_NE(wu, nullptr);
  ASSERT_NE(ws, nullptr);
  // The loader keeps the merged copies per loop (they differ), and the LoRA is not a no-op.
  EXPECT_TRUE(wu->layers[0].P(Proj::kQ).untied());
  EXPECT_TRUE(wu->layers[1].P(Proj::kV).untied());
  EXPECT_FALSE(wu->layers[0].P(Proj::kK).untied());
  const auto a = RunRef(wl);
  EXPECT_LE(MaxDiffOverSequence(a, RunRef(wu)), 1e-5);
  EXPECT_GT(MaxDiffOverSequence(a, RunRef(ws)), 1e-3);

  // Each loop has its own delta: dropping those of loops 2 and 3 (unrolled layers 2..5)
  // changes the logits, in both representations alike.
  Checkpoint lora_loop1 = lora, untied_loop1 = untied;
  for (int j = 2; j < 6; ++j) {
    for (const char* proj : {"q_proj", "v_proj"}) {
      const std::string key = Layer(j) + "self_attn." + proj;
      for (OwnedTensor& t : lora_loop1.tensors) {
        if (t.name == key + ".lora_B.default.weight") std::fill(t.bytes.begin(), t.bytes.end(), 0);
      }
      untied_loop1.Put(key + ".weight", lora.Shape(key + ".base_layer.weight"),
                       lora.F32(key + ".base_layer.weight"));
    }
  }
  auto wl1 = Load(lora_loop1, dir, "lora-loop1");
  auto wu1 = Load(untied_loop1, dir, "untied-loop1");
  ASSERT_NE(wl1, nullptr);
  ASSERT_NE(wu1, nullptr);
  const auto a1 = RunRef(wl1);
  EXPECT_LE(MaxDiffOverSequence(a1, RunRef(wu1)), 1e-5);
  EXPECT_GT(MaxDiffOverSequence(a1, a), 1e-4);
  EXPECT_GT(MaxDiffOverSequence(a1, RunRef(ws)), 1e-4);
}

// ---- 5. Recurrent layers -----------------------------------------------------------------

TEST(ReferenceProperties, RecurrentEqualsStandardAtPositionZeroOnly) {
  Checkpoint rec = FromSpec(Spec("recurrent"));
  ASSERT_EQ(rec.config["recursion"]["layer_kind"], "recurrent");
  Checkpoint std_ = rec;
  std_.config["recursion"]["layer_kind"] = "standard";
  TempDir dir;
  auto wr = Load(rec, dir, "recurrent");
  auto ws = Load(std_, dir, "standard");
  ASSERT_NE(wr, nullptr);
  ASSERT_NE(ws, nullptr);
  const std::vector<int> tokens = {kTokens[0], kTokens[1]};
  const auto a = RunRef(wr, tokens), b = RunRef(ws, tokens);
  EXPECT_LE(MaxRelDiff(a[0].logits, b[0].logits), 1e-6);
  EXPECT_GT(MaxRelDiff(a[1].logits, b[1].logits), 1e-4);
  // A one-token prompt: identical too.
  EXPECT_LE(MaxRelDiff(RunRef(wr, {kTokens[3]})[0].logits, RunRef(ws, {kTokens[3]})[0].logits),
            1e-6);
}

// ---- 6. Logits computed by hand ----------------------------------------------------------

// One layer, hidden 2, one head of dim 2, one KV head, intermediate 1, vocab 3.
struct HandModel {
  double E[3][2] = {{1.0, 0.5}, {-0.5, 1.0}, {0.25, -1.0}};
  double in_norm[2] = {1.0, 0.8};
  double post_norm[2] = {0.9, 1.1};
  double Wq[2][2] = {{0.5, -0.3}, {0.2, 0.7}};
  double Wk[2][2] = {{0.4, 0.1}, {-0.6, 0.3}};
  double Wv[2][2] = {{0.3, 0.8}, {-0.2, 0.5}};
  double Wo[2][2] = {{0.7, -0.1}, {0.2, 0.4}};
  double Wgate[2] = {0.6, -0.4};  // [1, 2]
  double Wup[2] = {0.3, 0.9};     // [1, 2]
  double Wdown[2] = {0.5, -0.7};  // [2, 1]
  double final_norm[2] = {1.2, 0.7};
  double lm_head[3][2] = {{0.3, -0.2}, {0.1, 0.5}, {-0.4, 0.6}};
  double eps = 1e-6;

  Checkpoint ToCheckpoint(bool recurrent) const {
    Checkpoint c;
    c.config = {{"architectures", {"LlamaForCausalLM"}},
                {"hidden_size", 2},
                {"intermediate_size", 1},
                {"num_hidden_layers", 1},
                {"num_attention_heads", 1},
                {"num_key_value_heads", 1},
                {"vocab_size", 3},
                {"rms_norm_eps", eps},
                {"rope_theta", 10000.0},
                {"hidden_act", "silu"},
                {"tie_word_embeddings", false},
                {"torch_dtype", "float32"}};
    if (recurrent) {
      c.config["recursion"] = {{"num_recursions", 1},
                               {"sharing", "none"},
                               {"routing", "none"},
                               {"layer_kind", "recurrent"}};
    }
    auto flat = [](const auto& m) {
      std::vector<float> v;
      for (const auto& row : m) {
        for (double x : row) v.push_back(static_cast<float>(x));
      }
      return v;
    };
    auto vec = [](const double* p, int n) { return std::vector<float>(p, p + n); };
    c.Put("model.embed_tokens.weight", {3, 2}, flat(E));
    c.Put("model.layers.0.input_layernorm.weight", {2}, vec(in_norm, 2));
    c.Put("model.layers.0.post_attention_layernorm.weight", {2}, vec(post_norm, 2));
    c.Put("model.layers.0.self_attn.q_proj.weight", {2, 2}, flat(Wq));
    c.Put("model.layers.0.self_attn.k_proj.weight", {2, 2}, flat(Wk));
    c.Put("model.layers.0.self_attn.v_proj.weight", {2, 2}, flat(Wv));
    c.Put("model.layers.0.self_attn.o_proj.weight", {2, 2}, flat(Wo));
    c.Put("model.layers.0.mlp.gate_proj.weight", {1, 2}, vec(Wgate, 2));
    c.Put("model.layers.0.mlp.up_proj.weight", {1, 2}, vec(Wup, 2));
    c.Put("model.layers.0.mlp.down_proj.weight", {2, 1}, vec(Wdown, 2));
    c.Put("model.norm.weight", {2}, vec(final_norm, 2));
    c.Put("lm_head.weight", {3, 2}, flat(lm_head));
    return c;
  }
};

TEST(ReferenceProperties, HandComputedLogitsOneLayerTwoDims) {
  const HandModel hm;
  // The checkpoint stores fp32: compute from the fp32-rounded values.
  auto f = [](double x) { return static_cast<double>(static_cast<float>(x)); };
  const double eps = f(hm.eps);

  // x = E[token]; a = RMSNorm_in(x): a_i = w_i * x_i / sqrt((x_0^2 + x_1^2) / 2 + eps).
  // q = Wq a, k = Wk a, v = Wv a. RoPE with head_dim 2: one pair (i = 0), inv_freq =
  // 10000^(-0/2) = 1, angle = position: (u0, u1) -> (u0 cos p - u1 sin p, u1 cos p + u0 sin p).
  struct Qkv {
    double q0, q1, k0, k1, v0, v1;
  };
  auto qkv_of = [&](double x0, double x1, int pos) {
    const double inv = 1.0 / std::sqrt((x0 * x0 + x1 * x1) / 2.0 + eps);
    const double a0 = f(hm.in_norm[0]) * x0 * inv, a1 = f(hm.in_norm[1]) * x1 * inv;
    const double q0 = f(hm.Wq[0][0]) * a0 + f(hm.Wq[0][1]) * a1;
    const double q1 = f(hm.Wq[1][0]) * a0 + f(hm.Wq[1][1]) * a1;
    const double k0 = f(hm.Wk[0][0]) * a0 + f(hm.Wk[0][1]) * a1;
    const double k1 = f(hm.Wk[1][0]) * a0 + f(hm.Wk[1][1]) * a1;
    const double v0 = f(hm.Wv[0][0]) * a0 + f(hm.Wv[0][1]) * a1;
    const double v1 = f(hm.Wv[1][0]) * a0 + f(hm.Wv[1][1]) * a1;
    const double c = std::cos(static_cast<double>(pos)), s = std::sin(static_cast<double>(pos));
    return Qkv{q0 * c - q1 * s, q1 * c + q0 * s, k0 * c - k1 * s, k1 * c + k0 * s, v0, v1};
  };
  // Attention over n keys: p_j = softmax_j((q . k_j) / sqrt(2)), o = sum_j p_j v_j; then
  // y = x + Wo o; m = RMSNorm_post(y); out = y + Wdown * silu(Wgate m) * (Wup m).
  struct Out {
    double x0, x1;
  };
  auto layer_rest = [&](double x0, double x1, double q0, double q1, const std::vector<Qkv>& keys) {
    std::vector<double> sc;
    double mx = -1e300;
    for (const Qkv& kv : keys) {
      sc.push_back((q0 * kv.k0 + q1 * kv.k1) / std::sqrt(2.0));
      mx = std::max(mx, sc.back());
    }
    double sum = 0, o0 = 0, o1 = 0;
    for (size_t j = 0; j < keys.size(); ++j) sum += std::exp(sc[j] - mx);
    for (size_t j = 0; j < keys.size(); ++j) {
      const double p = std::exp(sc[j] - mx) / sum;
      o0 += p * keys[j].v0;
      o1 += p * keys[j].v1;
    }
    const double y0 = x0 + f(hm.Wo[0][0]) * o0 + f(hm.Wo[0][1]) * o1;
    const double y1 = x1 + f(hm.Wo[1][0]) * o0 + f(hm.Wo[1][1]) * o1;
    const double inv = 1.0 / std::sqrt((y0 * y0 + y1 * y1) / 2.0 + eps);
    const double m0 = f(hm.post_norm[0]) * y0 * inv, m1 = f(hm.post_norm[1]) * y1 * inv;
    const double g = f(hm.Wgate[0]) * m0 + f(hm.Wgate[1]) * m1;
    const double u = f(hm.Wup[0]) * m0 + f(hm.Wup[1]) * m1;
    const double act = g / (1.0 + std::exp(-g)) * u;
    return Out{y0 + f(hm.Wdown[0]) * act, y1 + f(hm.Wdown[1]) * act};
  };
  // logits_v = lm_head_v . RMSNorm_final(out).
  auto logits_of = [&](const Out& o) {
    const double inv = 1.0 / std::sqrt((o.x0 * o.x0 + o.x1 * o.x1) / 2.0 + eps);
    const double n0 = f(hm.final_norm[0]) * o.x0 * inv, n1 = f(hm.final_norm[1]) * o.x1 * inv;
    std::vector<float> l(3);
    for (int v = 0; v < 3; ++v)
      l[v] = static_cast<float>(f(hm.lm_head[v][0]) * n0 + f(hm.lm_head[v][1]) * n1);
    return l;
  };

  const int t0 = 0, t1 = 2;
  const double x00 = f(hm.E[t0][0]), x01 = f(hm.E[t0][1]);
  const double x10 = f(hm.E[t1][0]), x11 = f(hm.E[t1][1]);

  // Standard layer: position 0 sees its own key; position 1 sees keys 0 and 1.
  const Qkv p0 = qkv_of(x00, x01, 0), p1 = qkv_of(x10, x11, 1);
  const Out out0 = layer_rest(x00, x01, p0.q0, p0.q1, {p0});
  const Out out1 = layer_rest(x10, x11, p1.q0, p1.q1, {p0, p1});
  const std::vector<float> expect0 = logits_of(out0), expect1 = logits_of(out1);

  // Recurrent layer (docs/models.md#recurrent-transformer-layers): position 0 is the same; the
  // persistent pair of position 0 is Wk, Wv of RMSNorm_in(out_0) at RoPE position 0; position
  // 1 attends to that pair and to its own temporary pair.
  const Qkv persistent0 = qkv_of(out0.x0, out0.x1, 0);
  const Out rout1 = layer_rest(x10, x11, p1.q0, p1.q1, {persistent0, p1});
  const std::vector<float> rexpect1 = logits_of(rout1);

  TempDir dir;
  for (bool recurrent : {false, true}) {
    SCOPED_TRACE(recurrent ? "recurrent" : "standard");
    auto w = Load(hm.ToCheckpoint(recurrent), dir, recurrent ? "rec" : "std");
    ASSERT_NE(w, nullptr);
    const auto outs = RunRef(w, {t0, t1});
    ASSERT_EQ(outs.size(), 2u);
    EXPECT_LE(MaxRelDiff(outs[0].logits, expect0), 1e-5)
        << outs[0].logits[0] << " " << outs[0].logits[1] << " " << outs[0].logits[2] << " vs "
        << expect0[0] << " " << expect0[1] << " " << expect0[2];
    const std::vector<float>& e1 = recurrent ? rexpect1 : expect1;
    EXPECT_LE(MaxRelDiff(outs[1].logits, e1), 1e-5)
        << outs[1].logits[0] << " " << outs[1].logits[1] << " " << outs[1].logits[2] << " vs "
        << e1[0] << " " << e1[1] << " " << e1[2];
  }
  // The two position-1 expectations must differ, or the recurrent check proves nothing.
  EXPECT_GT(MaxRelDiff(expect1, rexpect1), 1e-4);
}

// ---- 7. token_choice ---------------------------------------------------------------------

TEST(ReferenceProperties, TokenChoiceRouterBiasForcesDepth) {
  TempDir dir;
  std::vector<std::vector<StepOutput>> outs;
  for (float bias : {100.0f, -100.0f, 0.0f}) {
    TinyModelSpec spec = Spec("mor-tc");
    spec.router_bias = bias;
    auto w = Load(FromSpec(spec), dir, "tc" + std::to_string(static_cast<int>(bias)));
    ASSERT_NE(w, nullptr);
    outs.push_back(RunRef(w));
    for (size_t t = 0; t < kTokens.size(); ++t) {
      const TokenTrace& tr = outs.back()[t].trace;
      ASSERT_EQ(tr.router_scores.size(), 3u);
      // d = 1 + argmax(alpha * softmax(s) + bias_i), bias_i = B * i (mkmodel), alpha 1.
      const std::vector<double>& s = tr.router_scores;
      const double m = std::max({s[0], s[1], s[2]});
      const double z = std::exp(s[0] - m) + std::exp(s[1] - m) + std::exp(s[2] - m);
      int best = 0;
      double best_v = -1e300;
      for (int i = 0; i < 3; ++i) {
        const double v = std::exp(s[i] - m) / z + static_cast<double>(bias) * i;
        if (v > best_v) best_v = v, best = i;
      }
      EXPECT_EQ(tr.loops, best + 1) << "bias " << bias << " token " << t;
      if (bias > 0) EXPECT_EQ(tr.loops, 3);
      if (bias < 0) EXPECT_EQ(tr.loops, 1);
    }
  }
  EXPECT_GT(MaxDiffOverSequence(outs[0], outs[1]), 1e-3);
  int depths[4] = {};
  for (const StepOutput& o : outs[2]) ++depths[o.trace.loops];
  EXPECT_EQ(depths[0], 0);
}

// With router alpha 0 every p is 0, so the segment output x0 + p[d-1] * Block^d(x0) is x0:
// the model equals its unique layers alone, whatever the depth (forced to Nr here).
TEST(ReferenceProperties, TokenChoiceAlphaZeroEqualsUniqueLayersOnly) {
  TinyModelSpec spec = Spec("mor-tc");
  spec.router_bias = 100.0f;
  Checkpoint tc = FromSpec(spec);
  tc.config["recursion"]["router"]["alpha"] = 0.0;
  // Official token-choice layout: model.layers.0 unique, .1 the looped block list, .2 unique.
  Checkpoint v = UniqueLayersOnly(tc, 2);
  ASSERT_EQ(v.tensors.size(), 3u + 2 * 9u);
  TempDir dir;
  auto wt = Load(tc, dir, "tc");
  auto wv = Load(v, dir, "vanilla2");
  ASSERT_NE(wt, nullptr);
  ASSERT_NE(wv, nullptr);
  const auto a = RunRef(wt);
  for (const StepOutput& o : a) EXPECT_EQ(o.trace.loops, 3);
  EXPECT_LE(MaxDiffOverSequence(a, RunRef(wv)), 1e-6);
}

// The output is x0 + p[d-1] * Block^d(x0): with sigmoid activation p_i = alpha * sigmoid(s_i)
// depends on router row i alone, so with depth forced to Nr only row Nr-1 may matter.
TEST(ReferenceProperties, TokenChoiceForcedDeepestDependsOnLastRouterRowOnly) {
  TinyModelSpec spec = Spec("mor-tc");
  spec.router_bias = 100.0f;
  spec.activation = "sigmoid";
  const Checkpoint base = FromSpec(spec);
  const std::string router = "model.layers.1.mor_router.router.weight";
  const std::vector<float> rows = base.F32(router);
  const std::vector<int64_t> shape = base.Shape(router);
  ASSERT_EQ(shape, (std::vector<int64_t>{3, 64}));
  Checkpoint early_rows = base;  // rows 0 and 1 replaced: nothing may change
  Checkpoint last_row = base;    // row 2 scaled: the gate p[2] changes
  std::vector<float> e = rows, l = rows;
  for (int i = 0; i < 64; ++i) {
    e[i] = -3.0f * rows[i];
    e[64 + i] = 0.0f;
    l[128 + i] = 3.0f * rows[128 + i];
  }
  early_rows.Put(router, shape, e);
  last_row.Put(router, shape, l);
  TempDir dir;
  auto wb = Load(base, dir, "base");
  auto we = Load(early_rows, dir, "early");
  auto wl = Load(last_row, dir, "last");
  ASSERT_NE(wb, nullptr);
  ASSERT_NE(we, nullptr);
  ASSERT_NE(wl, nullptr);
  const auto b = RunRef(wb);
  for (const StepOutput& o : b) EXPECT_EQ(o.trace.loops, 3);
  EXPECT_EQ(MaxDiffOverSequence(RunRef(we), b), 0.0);
  EXPECT_GT(MaxDiffOverSequence(RunRef(wl), b), 1e-4);
}

// ---- 8. KV cache slots -------------------------------------------------------------------

TEST(ReferenceProperties, SharedKvWritesOnlyLoopOne) {
  const int n = static_cast<int>(kTokens.size());
  TempDir dir;
  for (const char* family : {"recursive-cycle", "mor-ec"}) {
    SCOPED_TRACE(family);
    TinyModelSpec spec = Spec(family);
    spec.kv = "shared";
    auto w = Load(FromSpec(spec), dir, std::string(family) + "-shared");
    TinyModelSpec rw_spec = Spec(family);
    auto wr = Load(FromSpec(rw_spec), dir, std::string(family) + "-rw");
    ASSERT_NE(w, nullptr);
    ASSERT_NE(wr, nullptr);
    // Shared: the looped segment has K slots (loops > 1 read loop 1's); recursion-wise Nr*K.
    const bool middle = std::string(family) == "mor-ec";
    ASSERT_EQ(w->plan.num_cache_slots, 2 + (middle ? 2 : 0));
    ASSERT_EQ(wr->plan.num_cache_slots, 6 + (middle ? 2 : 0));
    ReferenceModel m(w);
    const auto a = m.Forward(kTokens);
    int deeper = 0;
    for (const StepOutput& o : a) deeper += o.trace.loops > 1;
    EXPECT_GT(deeper, 0) << "some token must run loops > 1 for this to test anything";
    // Every slot holds exactly one entry per token: loop 1 wrote them, later loops nothing.
    for (int c = 0; c < w->plan.num_cache_slots; ++c)
      EXPECT_EQ(m.SlotEntries(c), n) << "slot " << c;
    // And the shared reads change the numbers.
    EXPECT_GT(MaxDiffOverSequence(a, RunRef(wr)), 1e-4);
  }
}

TEST(ReferenceProperties, RecursionWiseSlotsHoldTokensThatReachedThem) {
  TinyModelSpec spec = Spec("mor-ec");
  spec.capacity = {0.5f, 0.5f, 0.5f};  // loop 1 routed too
  TempDir dir;
  auto w = Load(FromSpec(spec), dir, "ec");
  ASSERT_NE(w, nullptr);
  ASSERT_EQ(w->plan.num_cache_slots, 8);  // first layer, 3 loops x 2 layers, last layer
  std::vector<int> tokens;
  for (int i = 0; i < 40; ++i) tokens.push_back((i * 37 + 11) % 256);
  ReferenceModel m(w);
  const auto outs = m.Forward(tokens);
  int reached[4] = {};  // reached[r]: tokens with loops > r
  for (const StepOutput& o : outs) {
    for (int r = 0; r < 3; ++r) reached[r] += o.trace.loops > r;
  }
  const int n = static_cast<int>(tokens.size());
  EXPECT_EQ(m.SlotEntries(0), n);
  EXPECT_EQ(m.SlotEntries(7), n);
  for (int r = 0; r < 3; ++r) {
    for (int k = 0; k < 2; ++k)
      EXPECT_EQ(m.SlotEntries(1 + r * 2 + k), reached[r]) << r << "," << k;
  }
  // The routing must be mixed for the check to mean anything.
  EXPECT_GT(reached[0], reached[2]);
  EXPECT_LT(reached[0], n);
  EXPECT_GT(reached[1], 0);
}

// Nanbeige4.2 (docs/models.md#nanbeige42) at position 0, computed here in double from the
// loaded tensors: with one key, attention returns V (each query head reads its kv head's v),
// so a layer is y = x + Wo v(a), out = y + Wdown(silu(Wgate m) * Wup m); the stack runs N
// times with x = RMSNorm(x, model.norm) between loops, then logits = lm_head RMSNorm(x).
std::vector<double> NanbeigePositionZero(const ModelWeights& w, int token, bool norm_between) {
  const ModelConfig& c = w.config;
  const int hs = c.hidden_size, d = c.head_dim, heads = c.num_heads, kvh = c.num_kv_heads;
  using V = std::vector<double>;
  auto vec = [](const TensorView& t) {
    const std::vector<float> f = t.ToF32Vector();
    return V(f.begin(), f.end());
  };
  auto matvec = [](const V& m, const V& x, int rows) {
    const size_t cols = x.size();
    V y(rows, 0.0);
    for (int r = 0; r < rows; ++r) {
      for (size_t i = 0; i < cols; ++i) y[r] += m[r * cols + i] * x[i];
    }
    return y;
  };
  auto rms = [&](const V& x, const V& wt) {
    double ss = 0;
    for (double v : x) ss += v * v;
    const double inv = 1.0 / std::sqrt(ss / x.size() + c.rms_norm_eps);
    V y(x.size());
    for (size_t i = 0; i < x.size(); ++i) y[i] = wt[i] * x[i] * inv;
    return y;
  };
  const V embed = vec(w.embed);
  V x(embed.begin() + static_cast<size_t>(token) * hs, embed.begin() + static_cast<size_t>(token + 1) * hs);
  const V final_norm = vec(w.final_norm);
  const Segment& seg = w.plan.segments[0];
  for (int loop = 0; loop < seg.loops; ++loop) {
    for (int k = 0; k < seg.num_layers; ++k) {
      const LayerWeights& lw = w.Layer(0, k);
      auto P = [&](Proj p) { return vec(lw.P(p).At(loop)); };
      const V a = rms(x, vec(lw.input_norm.At(loop)));
      const V v = matvec(P(Proj::kV), a, kvh * d);
      V attn(static_cast<size_t>(heads) * d);
      for (int h = 0; h < heads; ++h) {
        for (int j = 0; j < d; ++j) attn[h * d + j] = v[(h / (heads / kvh)) * d + j];
      }
      const V o = matvec(P(Proj::kO), attn, hs);
      V y(hs);
      for (int i = 0; i < hs; ++i) y[i] = x[i] + o[i];
      const V m = rms(y, vec(lw.post_norm.At(loop)));
      const V g = matvec(P(Proj::kGate), m, c.intermediate_size);
      const V u = matvec(P(Proj::kUp), m, c.intermediate_size);
      V act(c.intermediate_size);
      for (int i = 0; i < c.intermediate_size; ++i) act[i] = g[i] / (1.0 + std::exp(-g[i])) * u[i];
      const V down = matvec(P(Proj::kDown), act, hs);
      for (int i = 0; i < hs; ++i) x[i] = y[i] + down[i];
    }
    if (norm_between && loop + 1 < seg.loops) x = rms(x, final_norm);
  }
  return matvec(vec(w.lm_head), rms(x, final_norm), c.vocab_size);
}

double MaxAbsDiff(const std::vector<double>& a, const std::vector<float>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(a[i] - b[i]));
  return m;
}

TEST(ReferenceProperties, NanbeigeNormsBetweenLoopsAndLoopsTheWholeStack) {
  TempDir dir;
  for (bool skip : {false, true}) {
    TinyModelSpec spec = testing::F32Spec("nanbeige");
    spec.recursions = 3;  // num_loops
    spec.layers = 6;      // 2 stored layers
    spec.head_dim = 32;   // q/o not square (hidden / heads = 16)
    spec.skip_loop_final_norm = skip;
    auto w = Load(FromSpec(spec), dir, skip ? "skip" : "norm");
    ASSERT_NE(w, nullptr);
    ASSERT_EQ(w->plan.segments.size(), 1u);
    ASSERT_EQ(w->plan.segments[0].loops, 3);
    ReferenceModel ref(w);
    for (int token : {5, 77, 200}) {
      ref.Reset();
      const StepOutput out = ref.Step(token);
      EXPECT_EQ(out.trace.loops, 3);
      const double scale = 1.0 + std::fabs(*std::max_element(out.logits.begin(), out.logits.end()));
      // The reference (fp32 activations, double sums) against double throughout.
      EXPECT_LT(MaxAbsDiff(NanbeigePositionZero(*w, token, !skip), out.logits), 2e-4 * scale)
          << (skip ? "skip" : "norm") << " token " << token;
      // And the other rule is measurably different: the test can tell them apart.
      EXPECT_GT(MaxAbsDiff(NanbeigePositionZero(*w, token, skip), out.logits), 1e-2 * scale)
          << (skip ? "skip" : "norm") << " token " << token;
    }
  }
}

}  // namespace
}  // namespace morserve
