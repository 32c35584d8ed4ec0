// The tiny-model writer: every family writes a directory that LoadModel accepts and the
// reference model runs with non-flat logits; output is deterministic per seed; sharded and
// other-dtype variants load; --router-bias moves the router scores as documented.
#include "engine/tools/mkmodel.h"

#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "engine/io/safetensors_writer.h"
#include "engine/io/tensor_store.h"
#include "engine/model/weights.h"
#include "engine/reference/reference_model.h"
#include "engine/runtime/engine.h"
#include "gtest/gtest.h"
#include "tests/engine_harness.h"
#include "tests/testutil.h"

namespace morserve {
namespace {

using testing::NarrowSpec;
using testing::ReadFile;
using testing::TempDir;

std::shared_ptr<const ModelWeights> WriteAndLoad(const TinyModelSpec& spec, const TempDir& dir) {
  absl::Status s = WriteTinyModel(spec, dir.path());
  EXPECT_TRUE(s.ok()) << spec.family << ": " << s;
  auto w = LoadModel(dir.path());
  EXPECT_TRUE(w.ok()) << spec.family << ": " << w.status();
  return w.ok() ? *w : nullptr;
}

const std::vector<int> kTokens = {5, 17, 3, 42, 8, 8, 61, 0};

TEST(Mkmodel, EveryFamilyWritesLoadsAndRuns) {
  ASSERT_EQ(TinyModelFamilies().size(), 14u);
  for (const std::string& family : TinyModelFamilies()) {
    SCOPED_TRACE(family);
    TempDir dir;
    auto w = WriteAndLoad(NarrowSpec(family), dir);
    ASSERT_NE(w, nullptr);
    ReferenceModel ref(w);
    const std::vector<StepOutput> out = ref.Forward(kTokens);
    ASSERT_EQ(out.size(), kTokens.size());
    for (const StepOutput& step : out) {
      ASSERT_EQ(step.logits.size(), 64u);
      double mean = 0, var = 0;
      for (float x : step.logits) {
        ASSERT_TRUE(std::isfinite(x));
        mean += x / 64.0;
      }
      for (float x : step.logits) var += (x - mean) * (x - mean) / 64.0;
      EXPECT_GT(std::sqrt(var), 0.5) << "logits are nearly flat";
    }
  }
}

TEST(Mkmodel, FamiliesConfigureWhatTheirNamesSay) {
  struct Case {
    const char* family;
    Sharing sharing;
    Routing routing;
    LayerKind kind;
    int layers;
  };
  const Case cases[] = {
      {"vanilla", Sharing::kNone, Routing::kNone, LayerKind::kStandard, 4},
      {"recursive-cycle", Sharing::kCycle, Routing::kNone, LayerKind::kStandard, 6},
      {"recursive-sequence", Sharing::kSequence, Routing::kNone, LayerKind::kStandard, 6},
      {"recursive-middle-cycle", Sharing::kMiddleCycle, Routing::kNone, LayerKind::kStandard, 8},
      {"recursive-middle-sequence", Sharing::kMiddleSequence, Routing::kNone, LayerKind::kStandard,
       8},
      {"recursive-untied-attn", Sharing::kCycle, Routing::kNone, LayerKind::kStandard, 6},
      {"relaxed-lora", Sharing::kCycle, Routing::kNone, LayerKind::kStandard, 6},
      {"mor-ec", Sharing::kMiddleCycle, Routing::kExpertChoice, LayerKind::kStandard, 8},
      {"mor-tc", Sharing::kMiddleCycle, Routing::kTokenChoice, LayerKind::kStandard, 8},
      {"early-exit", Sharing::kMiddleCycle, Routing::kEarlyExit, LayerKind::kStandard, 8},
      {"recurrent", Sharing::kNone, Routing::kNone, LayerKind::kRecurrent, 4},
      {"nanbeige", Sharing::kCycle, Routing::kNone, LayerKind::kStandard, 6},
      {"ouro", Sharing::kCycle, Routing::kNone, LayerKind::kStandard, 6},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.family);
    auto config = TinyModelConfig(NarrowSpec(c.family));
    ASSERT_TRUE(config.ok()) << config.status();
    EXPECT_EQ(config->recursion.sharing, c.sharing);
    EXPECT_EQ(config->recursion.routing, c.routing);
    EXPECT_EQ(config->recursion.layer_kind, c.kind);
    EXPECT_EQ(config->num_layers, c.layers);
  }
  auto lora = TinyModelConfig(NarrowSpec("relaxed-lora"));
  EXPECT_EQ(lora->recursion.lora.rank, 4);
  EXPECT_FLOAT_EQ(lora->recursion.lora.scale(), 2.0f);
  EXPECT_EQ(lora->recursion.lora.targets, (std::vector<std::string>{"q_proj", "v_proj"}));
  EXPECT_FALSE(TinyModelConfig(NarrowSpec("vanilla"))->recursion.present);
  auto ee = TinyModelConfig(NarrowSpec("early-exit"));
  EXPECT_FLOAT_EQ(ee->recursion.early_exit.threshold, 0.9f);
}

// nanbeige writes Nanbeige4.2's own config.json (no recursion object: the loader derives the
// plan from model_type and num_loops) and stores the L layers once.
TEST(Mkmodel, NanbeigeWritesTheReleasedLayout) {
  TinyModelSpec spec = NarrowSpec("nanbeige");
  spec.recursions = 2;
  spec.layers = 6;
  spec.head_dim = 16;
  TempDir dir;
  auto w = WriteAndLoad(spec, dir);
  ASSERT_NE(w, nullptr);
  const nlohmann::json c = nlohmann::json::parse(testing::ReadFile(dir.File("config.json")));
  EXPECT_EQ(c["model_type"], "nanbeige");
  EXPECT_EQ(c["architectures"], nlohmann::json({"NanbeigeForCausalLM"}));
  EXPECT_EQ(c["num_hidden_layers"], 3);
  EXPECT_EQ(c["num_loops"], 2);
  EXPECT_EQ(c["skip_loop_final_norm"], false);
  EXPECT_EQ(c["head_dim"], 16);
  EXPECT_FALSE(c.contains("recursion"));
  EXPECT_TRUE(w->config.recursion.norm_between_loops);
  EXPECT_EQ(w->config.num_layers, 6);
  EXPECT_EQ(w->config.q_dim(), 64);  // 4 heads of 16 on hidden 32
  EXPECT_EQ(w->plan.segments[0].loops, 2);
  EXPECT_FALSE(w->layers[0].P(Proj::kQ).untied());  // one stored copy serves both loops

  TinyModelSpec bad = NarrowSpec("nanbeige");
  bad.kv = "shared";
  EXPECT_FALSE(TinyModelConfig(bad).ok());
  TinyModelSpec skip_elsewhere = NarrowSpec("recursive-cycle");
  skip_elsewhere.skip_loop_final_norm = true;
  EXPECT_FALSE(TinyModelConfig(skip_elsewhere).ok());
}

// ouro writes Ouro's own config.json (Qwen2-style keys with the sliding window off, no
// recursion object), the sandwich norms and the exit gate (its bias from --router-bias), and
// --loop-mode writes looped.json.
TEST(Mkmodel, OuroWritesTheReleasedLayout) {
  TinyModelSpec spec = NarrowSpec("ouro");
  spec.recursions = 4;
  spec.layers = 8;
  spec.exit_threshold = 0.7f;
  spec.router_bias = 0.25f;
  spec.loop_mode = "adaptive";
  TempDir dir;
  auto w = WriteAndLoad(spec, dir);
  ASSERT_NE(w, nullptr);
  const nlohmann::json c = nlohmann::json::parse(testing::ReadFile(dir.File("config.json")));
  EXPECT_EQ(c["model_type"], "ouro");
  EXPECT_EQ(c["architectures"], nlohmann::json({"OuroForCausalLM"}));
  EXPECT_EQ(c["num_hidden_layers"], 2);
  EXPECT_EQ(c["total_ut_steps"], 4);
  EXPECT_EQ(c["early_exit_threshold"], 0.7);
  EXPECT_EQ(c["use_sliding_window"], false);
  EXPECT_FALSE(c.contains("recursion"));
  EXPECT_TRUE(w->config.sandwich_norm);
  EXPECT_EQ(w->config.recursion.exit_rule, LoopExitRule::kOuroGate);
  EXPECT_EQ(w->plan.segments[0].loops, 4);
  EXPECT_FALSE(w->layers[1].attn_out_norm.per_loop.empty());
  EXPECT_FALSE(w->layers[1].mlp_out_norm.untied());  // stored once, tied for every loop
  EXPECT_EQ(w->exit_gate_w.shape, (std::vector<int64_t>{1, 32}));
  EXPECT_FLOAT_EQ(w->exit_gate_b.ToF32Vector()[0], 0.25f);
  EXPECT_EQ(nlohmann::json::parse(testing::ReadFile(dir.File("looped.json"))),
            nlohmann::json({{"mode", "adaptive"}}));
  EXPECT_EQ(w->config.recursion.default_loop_mode, LoopMode::kAdaptive);
  EXPECT_FLOAT_EQ(w->config.recursion.loop_exit_threshold, 0.7f);

  spec.loop_mode.clear();  // rewriting the directory drops the stale looped.json
  auto full = WriteAndLoad(spec, dir);
  ASSERT_NE(full, nullptr);
  EXPECT_EQ(full->config.recursion.default_loop_mode, LoopMode::kFull);

  TinyModelSpec bad = NarrowSpec("ouro");
  bad.loop_mode = "sometimes";
  EXPECT_FALSE(WriteTinyModel(bad, dir.path()).ok());
  bad = NarrowSpec("ouro");
  bad.kv = "shared";
  EXPECT_FALSE(TinyModelConfig(bad).ok());
}

// Huginn-0125's layout: transformer.* blocks resolved as views (the fused Wqkv and fc split by
// rows, qk_bias into its q and k halves), the adapter, ln_f, the stored freqs_cis ignored, a
// tied or untied head; the engine serves it.
TEST(Mkmodel, HuginnWritesTheReleasedLayout) {
  TinyModelSpec spec = NarrowSpec("huginn");
  spec.recursions = 3;
  spec.prelude_layers = 1;
  spec.coda_layers = 2;
  spec.layers = 1 + 2 * 3 + 2;
  TempDir dir;
  auto w = WriteAndLoad(spec, dir);
  ASSERT_NE(w, nullptr);
  const nlohmann::json c = nlohmann::json::parse(testing::ReadFile(dir.File("config.json")));
  EXPECT_EQ(c["model_type"], "huginn_raven");
  EXPECT_EQ(c["architectures"], nlohmann::json({"RavenForCausalLM"}));
  EXPECT_EQ(c["n_layers_in_prelude"], 1);
  EXPECT_EQ(c["n_layers_in_recurrent_block"], 2);
  EXPECT_EQ(c["n_layers_in_coda"], 2);
  EXPECT_EQ(c["mean_recurrence"], 3);
  EXPECT_EQ(c["num_key_value_heads"], 4);  // MHA, as released
  const ModelConfig& m = w->config;
  EXPECT_TRUE(m.huginn.enabled);
  EXPECT_EQ(m.recursion.exit_rule, LoopExitRule::kHuginnKl);
  ASSERT_EQ(w->plan.segments.size(), 3u);
  EXPECT_EQ(w->plan.segments[1].loops, 3);
  EXPECT_EQ(w->layers.size(), 5u);  // 1 + 2 + 2 stored blocks

  const int64_t h = 32, inter = 64;
  const TensorStore& store = *w->store;
  const LayerWeights& core = w->layers[1];  // core_block.0
  const TensorView* qkv = store.Find("transformer.core_block.0.attn.Wqkv.weight");
  ASSERT_NE(qkv, nullptr);
  const size_t row_bytes = static_cast<size_t>(h) * DTypeSize(qkv->dtype);
  const TensorView& q = core.P(Proj::kQ).At(2);  // one view for every recurrence
  const TensorView& k = core.P(Proj::kK).At(0);
  const TensorView& v = core.P(Proj::kV).At(0);
  EXPECT_FALSE(core.P(Proj::kQ).untied());
  EXPECT_EQ(q.data, qkv->data);
  EXPECT_EQ(k.data, static_cast<const char*>(qkv->data) + h * row_bytes);
  EXPECT_EQ(v.data, static_cast<const char*>(qkv->data) + 2 * h * row_bytes);
  EXPECT_EQ(v.shape, (std::vector<int64_t>{h, h}));
  EXPECT_EQ(v.name, "transformer.core_block.0.attn.Wqkv.weight[v]");
  const TensorView* fc = store.Find("transformer.coda.1.mlp.fc.weight");
  ASSERT_NE(fc, nullptr);
  const LayerWeights& coda1 = w->layers[4];
  EXPECT_EQ(coda1.P(Proj::kGate).At(0).data, fc->data);
  EXPECT_EQ(coda1.P(Proj::kUp).At(0).data, static_cast<const char*>(fc->data) + inter * row_bytes);
  EXPECT_EQ(coda1.P(Proj::kUp).At(0).shape, (std::vector<int64_t>{inter, h}));
  const std::vector<float> bias =
      store.Find("transformer.prelude.0.attn.qk_bias")->ToF32Vector();  // [2, 1, 4, 8]
  const std::vector<float> qb = w->layers[0].q_bias.At(0).ToF32Vector();
  const std::vector<float> kb = w->layers[0].k_bias.At(0).ToF32Vector();
  ASSERT_EQ(qb.size(), 32u);
  EXPECT_EQ(qb, std::vector<float>(bias.begin(), bias.begin() + 32));
  EXPECT_EQ(kb, std::vector<float>(bias.begin() + 32, bias.end()));
  EXPECT_EQ(w->layers[0].mlp_out_norm.At(0).name, "transformer.prelude.0.norm_4.weight");
  EXPECT_EQ(w->adapter.shape, (std::vector<int64_t>{h, 2 * h}));
  EXPECT_EQ(w->final_norm.name, "transformer.ln_f.weight");
  EXPECT_FALSE(w->lm_head_tied);
  EXPECT_NE(store.Find("freqs_cis"), nullptr);  // stored, and ignored
  // Served (huginn_engine_test and engine_gpu_test check the numbers of both backends).
  EXPECT_TRUE(Engine::Create(w, EngineConfig{}).ok());

  spec.tie_embeddings = true;
  auto tied = WriteAndLoad(spec, dir);
  ASSERT_NE(tied, nullptr);
  EXPECT_TRUE(tied->lm_head_tied);
  EXPECT_EQ(tied->lm_head.data, tied->embed.data);

  // A missing or an extra tensor is an error naming it.
  auto tensors = TinyModelTensors(spec);
  ASSERT_TRUE(tensors.ok());
  std::vector<OwnedTensor> missing;
  for (OwnedTensor& t : *tensors) {
    if (t.name != "transformer.adapter.weight") missing.push_back(t);
  }
  TempDir broken;
  ASSERT_TRUE(WriteTinyModel(spec, broken.path()).ok());
  ASSERT_TRUE(WriteSafetensors(broken.File("model.safetensors"), missing).ok());
  auto no_adapter = LoadModel(broken.path());
  ASSERT_FALSE(no_adapter.ok());
  EXPECT_NE(no_adapter.status().message().find("missing tensor transformer.adapter.weight"),
            std::string::npos)
      << no_adapter.status();
  tensors->push_back(OwnedTensor::FromF32("transformer.core_block.2.norm_1.weight", DType::kF32,
                                          {h}, std::vector<float>(h, 1.0f)));
  ASSERT_TRUE(WriteSafetensors(broken.File("model.safetensors"), *tensors).ok());
  auto extra = LoadModel(broken.path());
  ASSERT_FALSE(extra.ok());
  EXPECT_NE(extra.status().message().find("transformer.core_block.2.norm_1.weight"),
            std::string::npos)
      << extra.status();

  TinyModelSpec bad = NarrowSpec("huginn");
  bad.layers = 8;  // 2 + 2 + 4 does not split into 3 recurrences
  EXPECT_FALSE(TinyModelConfig(bad).ok());
  bad = NarrowSpec("vanilla");
  bad.prelude_layers = 1;
  EXPECT_FALSE(TinyModelConfig(bad).ok());
}

TEST(Mkmodel, InvalidCombinationsAreErrors) {
  TinyModelSpec s = NarrowSpec("nonsense");
  EXPECT_FALSE(TinyModelConfig(s).ok());
  s = NarrowSpec("mor-ec");
  s.kv = "shared";
  s.capacity = {0.5f, 0.5f, 0.5f};  // shared KV needs loop 1 to run every token
  EXPECT_FALSE(TinyModelConfig(s).ok());
  s = NarrowSpec("recursive-cycle");
  s.layers = 7;  // 3 recursions do not divide 7 layers
  auto c = TinyModelConfig(s);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("num_recursions"), std::string::npos) << c.status();
}

TEST(Mkmodel, SameSeedSameBytesOtherSeedOtherBytes) {
  for (const std::string& family : TinyModelFamilies()) {
    SCOPED_TRACE(family);
    TempDir a, b, c;
    TinyModelSpec spec = NarrowSpec(family);
    ASSERT_TRUE(WriteTinyModel(spec, a.path()).ok());
    ASSERT_TRUE(WriteTinyModel(spec, b.path()).ok());
    spec.seed = 2;
    ASSERT_TRUE(WriteTinyModel(spec, c.path()).ok());
    const std::string bytes = ReadFile(a.File("model.safetensors"));
    ASSERT_GT(bytes.size(), 1000u);
    EXPECT_EQ(bytes, ReadFile(b.File("model.safetensors")));
    EXPECT_EQ(ReadFile(a.File("config.json")), ReadFile(b.File("config.json")));
    EXPECT_NE(bytes, ReadFile(c.File("model.safetensors")));
  }
}

TEST(Mkmodel, ShardedVariantLoadsWithTheSameTensors) {
  TempDir one, three;
  TinyModelSpec spec = NarrowSpec("mor-ec");
  auto single = WriteAndLoad(spec, one);
  spec.shards = 3;
  auto sharded = WriteAndLoad(spec, three);
  ASSERT_NE(single, nullptr);
  ASSERT_NE(sharded, nullptr);
  EXPECT_FALSE(std::filesystem::exists(three.File("model.safetensors")));
  EXPECT_TRUE(std::filesystem::exists(three.File("model-00002-of-00003.safetensors")));
  EXPECT_TRUE(std::filesystem::exists(three.File("model.safetensors.index.json")));
  std::set<std::string> files;
  for (const auto& [name, view] : sharded->store->tensors()) {
    files.insert(std::filesystem::path(view.file).filename().string());
    const TensorView* other = single->store->Find(name);
    ASSERT_NE(other, nullptr) << name;
    EXPECT_TRUE(view.SameContents(*other)) << name;
  }
  EXPECT_EQ(files.size(), 3u);
  EXPECT_EQ(sharded->store->tensors().size(), single->store->tensors().size());
}

TEST(Mkmodel, DtypesAreHonoured) {
  for (DType t : {DType::kF32, DType::kF16, DType::kBF16}) {
    TempDir dir;
    TinyModelSpec spec = NarrowSpec("recursive-cycle");
    spec.dtype = t;
    auto w = WriteAndLoad(spec, dir);
    ASSERT_NE(w, nullptr);
    EXPECT_EQ(w->embed.dtype, t);
    EXPECT_EQ(w->Layer(0, 1).P(Proj::kDown).At(0).dtype, t);
  }
}

TEST(Mkmodel, FirstCopyOnlyIsSmallerAndLoads) {
  TempDir full, once;
  TinyModelSpec spec = NarrowSpec("recursive-middle-cycle");
  auto all = WriteAndLoad(spec, full);
  ASSERT_NE(all, nullptr);
  spec.first_copy_only = true;
  auto w = WriteAndLoad(spec, once);
  ASSERT_NE(w, nullptr);
  // Loops 1 and 2 of the 2-layer block are absent: 4 layers of 9 tensors, 9280 values each.
  EXPECT_EQ(all->store->tensors().size() - w->store->tensors().size(), 36u);
  EXPECT_GE(ReadFile(full.File("model.safetensors")).size() -
                ReadFile(once.File("model.safetensors")).size(),
            4u * 9280u * 2u);
  EXPECT_EQ(w->Layer(1, 0).P(Proj::kQ).per_loop.size(), 1u);
}

// Router scores of every token at its first loop (every token is a candidate there).
std::vector<double> FirstLoopScores(const TinyModelSpec& spec, std::vector<int>* loops) {
  TempDir dir;
  auto w = WriteAndLoad(spec, dir);
  std::vector<double> scores;
  if (w == nullptr) return scores;
  ReferenceModel ref(w);
  for (const StepOutput& step : ref.Forward(kTokens)) {
    scores.push_back(step.trace.router_scores.at(0));
    if (loops != nullptr) loops->push_back(step.trace.loops);
  }
  return scores;
}

TEST(Mkmodel, RouterBiasShiftsExpertChoiceScores) {
  for (const char* arch : {"linear", "mlp"}) {
    SCOPED_TRACE(arch);
    TinyModelSpec spec = NarrowSpec("mor-ec");
    spec.router = arch;
    spec.dtype = DType::kF32;  // exact weights, so the shift is exact too
    const std::vector<double> base = FirstLoopScores(spec, nullptr);
    spec.router_bias = 0.5f;
    const std::vector<double> shifted = FirstLoopScores(spec, nullptr);
    ASSERT_EQ(base.size(), kTokens.size());
    ASSERT_EQ(shifted.size(), kTokens.size());
    for (size_t i = 0; i < base.size(); ++i) EXPECT_NEAR(shifted[i] - base[i], 0.5, 1e-5);
  }
}

TEST(Mkmodel, RouterBiasSetsExitRates) {
  for (const char* family : {"mor-ec", "mor-tc"}) {
    SCOPED_TRACE(family);
    TinyModelSpec spec = NarrowSpec(family);
    std::vector<int> deep, shallow;
    spec.router_bias = 50.0f;
    FirstLoopScores(spec, &deep);
    spec.router_bias = -50.0f;
    FirstLoopScores(spec, &shallow);
    ASSERT_EQ(deep.size(), kTokens.size());
    for (int l : deep) EXPECT_EQ(l, 3);
    for (int l : shallow) EXPECT_EQ(l, 1);
  }
}

TEST(Mkmodel, CommandLineWritesWhatItIsTold) {
  TempDir dir;
  const std::string out = dir.path() + "/m";
  auto r = testing::RunCommand(testing::MorserveBinary() + " mkmodel --family mor-ec --out " + out +
                               " --hidden 32 --vocab 64 --intermediate 64 --router mlp"
                               " --activation tanh --aux-router --kv shared --sharing cycle"
                               " --capacity 1,0.5,0.25 --dtype f16 --seed 7 --shards 2");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto w = LoadModel(out);
  ASSERT_TRUE(w.ok()) << w.status();
  const RecursionConfig& rc = (*w)->config.recursion;
  EXPECT_EQ(rc.sharing, Sharing::kCycle);
  EXPECT_EQ(rc.kv, KvMode::kShared);
  EXPECT_EQ(rc.router.arch, RouterArch::kMlp);
  EXPECT_EQ(rc.router.activation, RouterActivation::kTanh);
  EXPECT_TRUE(rc.router.aux_router);
  EXPECT_EQ(rc.router.capacity, (std::vector<float>{1.0f, 0.5f, 0.25f}));
  EXPECT_EQ((*w)->router.aux.size(), 3u);
  EXPECT_EQ((*w)->embed.dtype, DType::kF16);
  EXPECT_EQ((*w)->config.hidden_size, 32);

  TinyModelSpec same = NarrowSpec("mor-ec");
  same.router = "mlp";
  same.activation = "tanh";
  same.aux_router = true;
  same.kv = "shared";
  same.sharing = "cycle";
  same.capacity = {1.0f, 0.5f, 0.25f};
  same.dtype = DType::kF16;
  same.seed = 7;
  same.shards = 2;
  TempDir api;
  ASSERT_TRUE(WriteTinyModel(same, api.path()).ok());
  EXPECT_EQ(ReadFile(api.File("model-00001-of-00002.safetensors")),
            ReadFile(out + "/model-00001-of-00002.safetensors"));

  auto bad = testing::RunCommand(testing::MorserveBinary() + " mkmodel --family nope --out " + out);
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.output.find("unknown family 'nope'"), std::string::npos) << bad.output;
  auto usage = testing::RunCommand(testing::MorserveBinary() + " mkmodel --out " + out);
  EXPECT_EQ(usage.exit_code, 2);
  EXPECT_NE(usage.output.find("--family is required"), std::string::npos) << usage.output;
}

TEST(Mkmodel, ArgumentParsing) {
  std::string out;
  auto spec = TinyModelSpecFromArgs(
      {"--family=relaxed-lora", "--out", "/tmp/x", "--lora-rank", "8", "--lora-targets",
       "q_proj,k_proj,o_proj", "--router-bias", "-1.5", "--first-copy-only"},
      &out);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(out, "/tmp/x");
  EXPECT_EQ(spec->family, "relaxed-lora");
  EXPECT_EQ(spec->lora_rank, 8);
  EXPECT_EQ(spec->lora_targets, (std::vector<std::string>{"q_proj", "k_proj", "o_proj"}));
  EXPECT_FLOAT_EQ(spec->router_bias, -1.5f);
  EXPECT_TRUE(spec->first_copy_only);
  EXPECT_FALSE(
      TinyModelSpecFromArgs({"--family", "vanilla", "--out", "d", "--hidden", "x"}, &out).ok());
  EXPECT_FALSE(
      TinyModelSpecFromArgs({"--family", "vanilla", "--out", "d", "--bogus", "1"}, &out).ok());
}

}  // namespace
}  // namespace morserve
