// `morserve convert` from a vanilla model: which original layers initialise the shared ones
// (stepwise, average, lower), what the strict output stores, truncated-SVD LoRA (full rank
// reproduces the original logits, rank 0 is the strict model, error falls with rank), and
// the errors that name the flag or tensor at fault.
#include "engine/convert/recursive_converter.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <random>

#include "absl/strings/str_cat.h"
#include "engine/convert/convert.h"
#include "engine/convert/layer_init.h"
#include "engine/convert/lora_svd.h"
#include "engine/io/safetensors_writer.h"
#include "engine/io/tensor_store.h"
#include "engine/model/layer_plan.h"
#include "engine/model/weights.h"
#include "engine/reference/reference_model.h"
#include "engine/tools/mkmodel.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testutil.h"

namespace morserve {
namespace {

using testing::ReadFile;
using testing::TempDir;
using testing::WriteFile;

const std::vector<int> kTokens = {5, 17, 3, 42, 8, 8, 61, 0, 33, 12};

TinyModelSpec Vanilla(int layers) {
  TinyModelSpec s;
  s.family = "vanilla";
  s.layers = layers;
  s.hidden = 32;
  s.heads = 4;
  s.kv_heads = 2;
  s.intermediate = 64;
  s.vocab = 64;
  s.dtype = DType::kF32;
  s.seed = 7;
  return s;
}

std::string WriteVanilla(const TempDir& dir, int layers) {
  const std::string path = dir.File("vanilla");
  absl::Status s = WriteTinyModel(Vanilla(layers), path);
  EXPECT_TRUE(s.ok()) << s;
  return path;
}

std::shared_ptr<const ModelWeights> Load(const std::string& dir) {
  auto w = LoadModel(dir);
  EXPECT_TRUE(w.ok()) << w.status();
  return w.ok() ? *w : nullptr;
}

std::vector<std::vector<float>> Logits(const std::shared_ptr<const ModelWeights>& w) {
  ReferenceModel ref(w);
  std::vector<std::vector<float>> out;
  for (const StepOutput& s : ref.Forward(kTokens)) out.push_back(s.logits);
  return out;
}

double MaxAbsDiff(const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b) {
  double m = 0;
  for (size_t t = 0; t < a.size(); ++t) {
    for (size_t i = 0; i < a[t].size(); ++i) m = std::max(m, std::abs(double(a[t][i]) - b[t][i]));
  }
  return m;
}

double RmsDiff(const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b) {
  double s = 0;
  size_t n = 0;
  for (size_t t = 0; t < a.size(); ++t) {
    for (size_t i = 0; i < a[t].size(); ++i, ++n) s += std::pow(double(a[t][i]) - b[t][i], 2);
  }
  return std::sqrt(s / n);
}

RecursiveConversionOptions Options(Sharing sharing, int nr, InitStrategy init, int rank = 0) {
  RecursiveConversionOptions o;
  o.sharing = sharing;
  o.recursions = nr;
  o.init = init;
  o.lora_rank = rank;
  return o;
}

std::string Convert(const std::string& from, const TempDir& dir, const std::string& name,
                    const RecursiveConversionOptions& o) {
  const std::string out = dir.File(name);
  absl::Status s = ConvertVanillaDir(from, out, o);
  EXPECT_TRUE(s.ok()) << name << ": " << s;
  return out;
}

LayerPlan Plan(int layers, Sharing sharing, int nr) {
  ModelConfig c;
  c.num_layers = layers;
  c.recursion.present = true;
  c.recursion.sharing = sharing;
  c.recursion.num_recursions = nr;
  auto plan = BuildLayerPlan(c);
  EXPECT_TRUE(plan.ok()) << plan.status();
  return *plan;
}

// Sources of every shared position, in plan order.
std::vector<std::vector<int>> Sources(const LayerPlan& plan, InitStrategy s) {
  std::vector<std::vector<int>> out;
  for (int seg = 0; seg < static_cast<int>(plan.segments.size()); ++seg) {
    if (!plan.segments[seg].looped()) continue;
    for (int k = 0; k < plan.segments[seg].num_layers; ++k) out.push_back(InitSourceLayers(plan, s, seg, k));
  }
  return out;
}

using V = std::vector<std::vector<int>>;

TEST(ConvertInit, StepwiseAverageLowerPickThePaperLayers) {
  // Cycle, 6 layers, 3 loops: block of 2; unrolled j runs slot j mod 2.
  const LayerPlan cycle = Plan(6, Sharing::kCycle, 3);
  EXPECT_EQ(Sources(cycle, InitStrategy::kStepwise), (V{{0}, {3}}));  // every 3rd layer
  EXPECT_EQ(Sources(cycle, InitStrategy::kLower), (V{{0}, {1}}));
  EXPECT_EQ(Sources(cycle, InitStrategy::kAverage), (V{{0, 2, 4}, {1, 3, 5}}));
  // Sequence, 6 layers, 2 loops: slots of one layer; unrolled j runs slot j div 2.
  const LayerPlan seq = Plan(6, Sharing::kSequence, 2);
  EXPECT_EQ(Sources(seq, InitStrategy::kStepwise), (V{{0}, {2}, {4}}));
  EXPECT_EQ(Sources(seq, InitStrategy::kLower), (V{{0}, {1}, {2}}));
  EXPECT_EQ(Sources(seq, InitStrategy::kAverage), (V{{0, 1}, {2, 3}, {4, 5}}));
  // Middle cycle, 8 layers, 3 loops: layers 1..6 looped as a block of 2.
  const LayerPlan mid = Plan(8, Sharing::kMiddleCycle, 3);
  EXPECT_EQ(Sources(mid, InitStrategy::kStepwise), (V{{1}, {4}}));
  EXPECT_EQ(Sources(mid, InitStrategy::kLower), (V{{1}, {2}}));
  EXPECT_EQ(Sources(mid, InitStrategy::kAverage), (V{{1, 3, 5}, {2, 4, 6}}));
  EXPECT_EQ(InitSourceLayers(mid, InitStrategy::kAverage, 0, 0), (std::vector<int>{0}));  // unique
  EXPECT_EQ(InitSourceLayers(mid, InitStrategy::kStepwise, 2, 0), (std::vector<int>{7}));
  // Middle sequence, 8 layers, 2 loops: slots take layers 1,3,5 stepwise.
  const LayerPlan midseq = Plan(8, Sharing::kMiddleSequence, 2);
  EXPECT_EQ(Sources(midseq, InitStrategy::kStepwise), (V{{1}, {3}, {5}}));
  EXPECT_EQ(Sources(midseq, InitStrategy::kAverage), (V{{1, 2}, {3, 4}, {5, 6}}));
  EXPECT_FALSE(ParseInitStrategy("upper").ok());
  EXPECT_NE(ParseInitStrategy("upper").status().message().find("--init"), std::string::npos);
}

TEST(ConvertLoraSvd, FullRankReconstructsAndTruncationIsOptimal) {
  const int out = 6, in = 9;
  std::vector<double> r(out * in);
  for (int i = 0; i < out * in; ++i) r[i] = std::sin(1.7 * i) + 0.3 * std::cos(0.2 * i * i);
  auto product = [&](const LoraFactors& f, int rank, double scale) {
    std::vector<double> p(out * in, 0.0);
    for (int o = 0; o < out; ++o)
      for (int i = 0; i < in; ++i)
        for (int k = 0; k < rank; ++k) p[o * in + i] += scale * f.b[o * rank + k] * f.a[k * in + i];
    return p;
  };
  auto frob = [&](const std::vector<double>& p) {
    double s = 0;
    for (int i = 0; i < out * in; ++i) s += (p[i] - r[i]) * (p[i] - r[i]);
    return std::sqrt(s);
  };
  for (double scale : {1.0, 2.0, 0.25}) {
    auto full = TruncatedSvdLora(r, out, in, out, scale);
    ASSERT_TRUE(full.ok()) << full.status();
    EXPECT_LT(frob(product(*full, out, scale)), 1e-5) << "scale " << scale;
  }
  // Rank above min(out, in): extra triplets are zero.
  auto over = TruncatedSvdLora(r, out, in, 8, 1.0);
  ASSERT_TRUE(over.ok());
  for (int i = 0; i < in; ++i) EXPECT_EQ(over->a[7 * in + i], 0.0f);
  EXPECT_LT(frob(product(*over, 8, 1.0)), 1e-5);
  // Eckart-Young: the rank-k error is the norm of the dropped singular values, so the errors
  // fall strictly and err(k)^2 - err(k+1)^2 = sigma_{k+1}^2 falls too.
  std::vector<double> err;
  for (int k = 1; k <= out; ++k) err.push_back(frob(product(*TruncatedSvdLora(r, out, in, k, 1.0), k, 1.0)));
  for (int k = 0; k + 1 < out; ++k) EXPECT_LT(err[k + 1], err[k]);
  for (int k = 0; k + 2 < out; ++k) {
    EXPECT_GE(err[k] * err[k] - err[k + 1] * err[k + 1] + 1e-9,
              err[k + 1] * err[k + 1] - (k + 2 < out ? err[k + 2] * err[k + 2] : 0));
  }
  EXPECT_FALSE(TruncatedSvdLora(r, out, in, 0, 1.0).ok());
  EXPECT_FALSE(TruncatedSvdLora(r, out, in + 1, 2, 1.0).ok());
}

TEST(ConvertRecursive, StrictStepwiseStoresLoopZeroCopiesOfTheChosenLayers) {
  TempDir dir;
  const std::string from = WriteVanilla(dir, 6);
  WriteFile(from + "/tokenizer.json", "{\"model\": {}}\n");
  WriteFile(from + "/tokenizer_config.json", "{\"eos_token\": \"</s>\"}\n");
  const std::string out =
      Convert(from, dir, "cycle", Options(Sharing::kCycle, 3, InitStrategy::kStepwise));
  // config.json: the source's fields plus the recursion object.
  const nlohmann::json config = nlohmann::json::parse(ReadFile(out + "/config.json"));
  EXPECT_EQ(config["num_hidden_layers"], 6);
  EXPECT_EQ(config["hidden_size"], 32);
  EXPECT_EQ(config["recursion"]["num_recursions"], 3);
  EXPECT_EQ(config["recursion"]["sharing"], "cycle");
  EXPECT_EQ(config["recursion"]["routing"], "none");
  EXPECT_FALSE(config["recursion"].contains("lora"));
  EXPECT_EQ(ReadFile(out + "/tokenizer.json"), ReadFile(from + "/tokenizer.json"));
  EXPECT_EQ(ReadFile(out + "/tokenizer_config.json"), ReadFile(from + "/tokenizer_config.json"));
  auto src = Load(from);
  auto w = Load(out);
  ASSERT_NE(w, nullptr);
  // embed + 2 block layers x 9 tensors (loop 0 only) + norm + lm_head.
  EXPECT_EQ(w->store->tensors().size(), 1u + 2 * 9 + 2);
  EXPECT_NE(w->store->Find("model.layers.1.mlp.up_proj.weight"), nullptr);
  EXPECT_EQ(w->store->Find("model.layers.2.mlp.up_proj.weight"), nullptr);
  ASSERT_EQ(w->plan.segments.size(), 1u);
  EXPECT_EQ(w->plan.segments[0].loops, 3);
  // Block layer k holds original layer 3k, byte for byte.
  for (int k = 0; k < 2; ++k) {
    const LayerWeights& got = w->Layer(0, k);
    const LayerWeights& want = src->layers[3 * k];
    for (int p = 0; p < kNumProj; ++p) {
      EXPECT_FALSE(got.proj[p].untied());
      EXPECT_TRUE(got.proj[p].At(2).SameContents(want.proj[p].At(0))) << "k " << k << " proj " << p;
    }
    EXPECT_TRUE(got.input_norm.At(1).SameContents(want.input_norm.At(0)));
    EXPECT_TRUE(got.post_norm.At(1).SameContents(want.post_norm.At(0)));
  }
  EXPECT_TRUE(w->embed.SameContents(src->embed));
  EXPECT_TRUE(w->lm_head.SameContents(src->lm_head));
}

TEST(ConvertRecursive, AverageIsTheMeanOfTheLayersSharingASlot) {
  TempDir dir;
  const std::string from = WriteVanilla(dir, 6);
  const std::string out =
      Convert(from, dir, "seq", Options(Sharing::kSequence, 3, InitStrategy::kAverage));
  auto src = Load(from);
  auto w = Load(out);
  ASSERT_NE(w, nullptr);
  ASSERT_EQ(w->plan.segments.size(), 2u);  // sequence: two one-layer segments looped 3 times
  EXPECT_EQ(w->store->tensors().size(), 1u + 2 * 9 + 2);
  for (int seg = 0; seg < 2; ++seg) {
    for (int p = 0; p < kNumProj; ++p) {
      const std::vector<float> got = w->Layer(seg, 0).proj[p].At(0).ToF32Vector();
      std::vector<std::vector<float>> orig;
      for (int r = 0; r < 3; ++r) orig.push_back(src->layers[3 * seg + r].proj[p].At(0).ToF32Vector());
      for (size_t i = 0; i < got.size(); ++i) {
        const double mean = (double(orig[0][i]) + orig[1][i] + orig[2][i]) / 3.0;
        ASSERT_NEAR(got[i], mean, 1e-6) << "segment " << seg << " proj " << p << " elt " << i;
      }
    }
    const std::vector<float> norm = w->Layer(seg, 0).input_norm.At(0).ToF32Vector();
    const double mean = (double(src->layers[3 * seg].input_norm.At(0).ToF32Vector()[5]) +
                         src->layers[3 * seg + 1].input_norm.At(0).ToF32Vector()[5] +
                         src->layers[3 * seg + 2].input_norm.At(0).ToF32Vector()[5]) / 3.0;
    EXPECT_NEAR(norm[5], mean, 1e-6);
  }
}

TEST(ConvertRecursive, MiddleStrategiesKeepFirstAndLastLayers) {
  TempDir dir;
  const std::string from = WriteVanilla(dir, 8);
  auto src = Load(from);
  for (auto [name, sharing] : {std::pair{"mc", Sharing::kMiddleCycle}, std::pair{"ms", Sharing::kMiddleSequence}}) {
    SCOPED_TRACE(name);
    const std::string out = Convert(from, dir, name, Options(sharing, 3, InitStrategy::kLower));
    auto w = Load(out);
    ASSERT_NE(w, nullptr);
    const LayerPlan& plan = w->plan;
    const int last = static_cast<int>(plan.segments.size()) - 1;
    for (int p = 0; p < kNumProj; ++p) {
      EXPECT_TRUE(w->Layer(0, 0).proj[p].At(0).SameContents(src->layers[0].proj[p].At(0)));
      EXPECT_TRUE(w->Layer(last, 0).proj[p].At(0).SameContents(src->layers[7].proj[p].At(0)));
    }
    // lower: shared positions take layers 1 and 2.
    EXPECT_TRUE(w->Layer(1, 0).proj[0].At(0).SameContents(src->layers[1].proj[0].At(0)));
    const int second_seg = sharing == Sharing::kMiddleCycle ? 1 : 2;
    const int second_k = sharing == Sharing::kMiddleCycle ? 1 : 0;
    EXPECT_TRUE(w->Layer(second_seg, second_k).proj[0].At(0).SameContents(src->layers[2].proj[0].At(0)));
    // 1 + (first + 2 shared + last) * 9 + 2 tensors.
    EXPECT_EQ(w->store->tensors().size(), 1u + 4 * 9 + 2);
  }
}

TEST(ConvertRelaxed, FullRankLoraReproducesTheOriginalLogits) {
  TempDir dir;
  const std::string from = WriteVanilla(dir, 6);
  const auto original = Logits(Load(from));
  struct Case {
    const char* name;
    Sharing sharing;
    int nr;
    InitStrategy init;
    int layers;
  };
  for (const Case& c : {Case{"cycle-stepwise", Sharing::kCycle, 3, InitStrategy::kStepwise, 6},
                        Case{"seq-average", Sharing::kSequence, 2, InitStrategy::kAverage, 6},
                        Case{"cycle-lower", Sharing::kCycle, 2, InitStrategy::kLower, 6}}) {
    SCOPED_TRACE(c.name);
    RecursiveConversionOptions o = Options(c.sharing, c.nr, c.init, /*rank=*/32);
    o.lora_alpha = 64;  // scale 2: the factors must absorb it
    const std::string out = Convert(from, dir, c.name, o);
    auto w = Load(out);
    ASSERT_NE(w, nullptr);
    EXPECT_EQ(w->config.recursion.lora.rank, 32);
    EXPECT_FLOAT_EQ(w->config.recursion.lora.scale(), 2.0f);
    EXPECT_EQ(w->config.recursion.lora.targets.size(), 7u);
    // Every loop's copy: 6 unrolled layers x (2 norms + 7 base + 14 LoRA) + 3 globals.
    EXPECT_EQ(w->store->tensors().size(), 6u * (2 + 7 + 14) + 3);
    EXPECT_NE(w->store->Find("model.layers.4.mlp.down_proj.lora_B.default.weight"), nullptr);
    EXPECT_EQ(w->Layer(0, 0).proj[0].lora.size(), static_cast<size_t>(c.nr));
    EXPECT_TRUE(w->Layer(0, 0).input_norm.untied());  // original norms per loop
    EXPECT_FALSE(w->Layer(0, 0).proj[0].untied());    // one shared base
    const double err = MaxAbsDiff(Logits(w), original);
    EXPECT_LT(err, 1e-4);
  }
}

// A vanilla model shaped like a pretrained one in the way that matters for Relaxed
// conversion: layers that will share a slot under cycle sharing with K = 2 (j mod 2) differ
// by a perturbation with a decaying spectrum (component r scaled 0.6^r), as correlated
// pretrained layers do. With i.i.d. random layers (mkmodel's vanilla) the residuals have a
// flat spectrum and a few SVD components change the logits chaotically, in either direction.
std::string WriteCorrelatedVanilla(const TempDir& dir) {
  const std::string path = dir.File("correlated");
  const TinyModelSpec spec = Vanilla(6);
  EXPECT_TRUE(WriteTinyModel(spec, path).ok());
  auto tensors = TinyModelTensors(spec);
  EXPECT_TRUE(tensors.ok());
  std::map<std::string, std::vector<float>> values;
  for (const OwnedTensor& t : *tensors) {
    std::vector<float> v(t.bytes.size() / 4);
    std::memcpy(v.data(), t.bytes.data(), t.bytes.size());
    values[t.name] = std::move(v);
  }
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (OwnedTensor& t : *tensors) {
    int j = -1;
    char suffix[64] = {0};
    if (std::sscanf(t.name.c_str(), "model.layers.%d.%63s", &j, suffix) != 2 ||
        t.name.find("_proj.weight") == std::string::npos) {
      continue;
    }
    const std::vector<float>& base = values[absl::StrCat("model.layers.", j % 2, ".", suffix)];
    const int64_t rows = t.shape[0], cols = t.shape[1];
    std::vector<float> w = base;
    for (int r = 0; r < 12; ++r) {
      std::vector<float> a(rows), b(cols);
      for (float& x : a) x = normal(rng);
      for (float& x : b) x = normal(rng);
      const float c = 0.05f * std::pow(0.6f, static_cast<float>(r));
      for (int64_t o = 0; o < rows; ++o)
        for (int64_t i = 0; i < cols; ++i) w[o * cols + i] += c * a[o] * b[i];
    }
    t = OwnedTensor::FromF32(t.name, DType::kF32, t.shape, w);
  }
  EXPECT_TRUE(WriteSafetensors(path + "/model.safetensors", *tensors).ok());
  return path;
}

TEST(ConvertRelaxed, RankZeroIsTheStrictModelAndErrorFallsWithRank) {
  TempDir dir;
  const std::string from = WriteCorrelatedVanilla(dir);
  const auto original = Logits(Load(from));
  const std::string strict = Convert(from, dir, "strict", Options(Sharing::kCycle, 3, InitStrategy::kStepwise));
  const std::string zero = Convert(from, dir, "r0", Options(Sharing::kCycle, 3, InitStrategy::kStepwise, 0));
  EXPECT_EQ(ReadFile(strict + "/model.safetensors"), ReadFile(zero + "/model.safetensors"));
  EXPECT_EQ(ReadFile(strict + "/config.json"), ReadFile(zero + "/config.json"));
  const auto strict_logits = Logits(Load(strict));
  EXPECT_EQ(MaxAbsDiff(Logits(Load(zero)), strict_logits), 0.0);
  // Norms per loop for every rank so only the LoRA rank changes between points.
  std::vector<double> errors;
  for (int rank : {0, 1, 2, 3, 4, 6, 8, 12, 16, 32}) {
    RecursiveConversionOptions o = Options(Sharing::kCycle, 3, InitStrategy::kStepwise, rank);
    o.norms = NormTying::kPerLoop;
    const auto logits = Logits(Load(Convert(from, dir, "rank" + std::to_string(rank), o)));
    errors.push_back(RmsDiff(logits, original));
  }
  EXPECT_GT(RmsDiff(strict_logits, original), 0.05) << "conversion should change the model";
  for (size_t i = 0; i + 1 < errors.size(); ++i) {
    EXPECT_LT(errors[i + 1], errors[i]) << "rank step " << i;
  }
  EXPECT_LT(errors.back(), 1e-5);
}

TEST(ConvertRelaxed, TargetsLimitWhichProjectionsGetLora) {
  TempDir dir;
  const std::string from = WriteVanilla(dir, 6);
  RecursiveConversionOptions o = Options(Sharing::kMiddleCycle, 2, InitStrategy::kStepwise, 4);
  o.lora_targets = {"q_proj", "down_proj"};
  o.norms = NormTying::kShared;
  auto w = Load(Convert(from, dir, "targets", o));
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(w->config.recursion.lora.targets, (std::vector<std::string>{"q_proj", "down_proj"}));
  EXPECT_FLOAT_EQ(w->config.recursion.lora.scale(), 1.0f);  // alpha defaults to the rank
  const LayerWeights& l = w->Layer(1, 0);
  EXPECT_EQ(l.P(Proj::kQ).lora.size(), 2u);
  EXPECT_EQ(l.P(Proj::kDown).lora.size(), 2u);
  EXPECT_TRUE(l.P(Proj::kK).lora.empty());
  EXPECT_FALSE(l.input_norm.untied());
  EXPECT_TRUE(w->Layer(0, 0).P(Proj::kQ).lora.empty());  // unique layers get none
  EXPECT_EQ(w->store->Find("model.layers.0.self_attn.q_proj.base_layer.weight"), nullptr);
  EXPECT_NE(w->store->Find("model.layers.3.self_attn.q_proj.lora_A.default.weight"), nullptr);
  EXPECT_EQ(w->store->Find("model.layers.5.self_attn.q_proj.lora_A.default.weight"), nullptr);
}

void ExpectError(const absl::Status& s, const std::string& needle) {
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find(needle), std::string::npos) << s.message();
}

TEST(ConvertErrors, BadOptionsNameTheFlag) {
  TempDir dir;
  const std::string from = WriteVanilla(dir, 6);
  const std::string out = dir.File("out");
  ExpectError(ConvertVanillaDir(from, out, Options(Sharing::kCycle, 4, InitStrategy::kStepwise)),
              "--recursions: 4 does not divide the 6 layers");
  ExpectError(ConvertVanillaDir(from, out, Options(Sharing::kMiddleCycle, 3, InitStrategy::kStepwise)),
              "--recursions: 3 does not divide the 4 layers");
  ExpectError(ConvertVanillaDir(from, out, Options(Sharing::kCycle, 1, InitStrategy::kStepwise)),
              "--recursions");
  ExpectError(ConvertVanillaDir(from, out, Options(Sharing::kNone, 2, InitStrategy::kStepwise)),
              "--sharing");
  RecursiveConversionOptions bad_target = Options(Sharing::kCycle, 2, InitStrategy::kStepwise, 4);
  bad_target.lora_targets = {"q_proj", "qkv_proj"};
  ExpectError(ConvertVanillaDir(from, out, bad_target), "--lora-targets: unknown projection 'qkv_proj'");
  RecursiveConversionOptions alpha_only = Options(Sharing::kCycle, 2, InitStrategy::kStepwise, 0);
  alpha_only.lora_alpha = 8;
  ExpectError(ConvertVanillaDir(from, out, alpha_only), "--lora-rank");
  EXPECT_FALSE(std::filesystem::exists(out)) << "failed conversions write nothing";
  ExpectError(ConvertVanillaDir(from, from, Options(Sharing::kCycle, 2, InitStrategy::kStepwise)),
              "source directory");
}

TEST(ConvertErrors, RecursiveSourcesAndMissingTensorsAreRefused) {
  TempDir dir;
  TinyModelSpec rec = Vanilla(0);
  rec.family = "recursive-cycle";
  ASSERT_TRUE(WriteTinyModel(rec, dir.File("rec")).ok());
  ExpectError(ConvertVanillaDir(dir.File("rec"), dir.File("out"),
                                Options(Sharing::kCycle, 2, InitStrategy::kStepwise)),
              "already recursive");
  // A vanilla checkpoint missing one tensor.
  auto tensors = TinyModelTensors(Vanilla(4));
  ASSERT_TRUE(tensors.ok());
  std::vector<OwnedTensor> kept;
  for (OwnedTensor& t : *tensors) {
    if (t.name != "model.layers.2.mlp.up_proj.weight") kept.push_back(std::move(t));
  }
  const std::string broken = dir.File("broken");
  ASSERT_TRUE(WriteTinyModel(Vanilla(4), broken).ok());
  ASSERT_TRUE(WriteSafetensors(broken + "/model.safetensors", kept).ok());
  ExpectError(ConvertVanillaDir(broken, dir.File("out"), Options(Sharing::kCycle, 2, InitStrategy::kStepwise)),
              "model.layers.2.mlp.up_proj.weight");
  ExpectError(ConvertVanillaDir(dir.File("nothing"), dir.File("out"),
                                Options(Sharing::kCycle, 2, InitStrategy::kStepwise)),
              "config.json");
}

}  // namespace
}  // namespace morserve
