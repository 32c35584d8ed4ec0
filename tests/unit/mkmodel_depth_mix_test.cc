// `mkmodel --depth-mix`: the depths assigned to token ids match the mix over the vocabulary,
// and the real engine, running the routers (or exit head) of a model built with the mix,
// sends every token through exactly its assigned number of loops, for mor-ec (linear, mlp
// and aux routers, additive gating), mor-tc (linear and mlp routers) and early-exit, at
// mkmodel's width and at hidden 960; the reference model agrees token by token, with every
// routing decision far from its boundary. Bad mixes are errors that name --depth-mix.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "engine/reference/reference_model.h"
#include "engine/runtime/engine.h"
#include "engine/tools/depth_mix.h"
#include "engine/tools/mkmodel.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/engine_harness.h"
#include "tests/testutil.h"

namespace morserve {
namespace {

using ::testing::HasSubstr;
using testing::RunResult;

std::vector<int64_t> Histogram(const std::vector<int>& depths, int nr) {
  std::vector<int64_t> counts(nr + 1, 0);
  for (int d : depths) ++counts[d];
  return counts;
}

TEST(DepthMix, TokenDepthsMatchTheMixOverTheVocabulary) {
  for (const std::vector<float>& mix : std::vector<std::vector<float>>{
           {0.5f, 0.3f, 0.2f}, {0.0f, 0.0f, 1.0f}, {1.0f / 3, 1.0f / 3, 1.0f / 3}, {0.1f, 0.9f}}) {
    const int nr = static_cast<int>(mix.size());
    for (int vocab : {64, 256, 1000}) {
      const std::vector<int> depths = TokenDepths(mix, vocab, 7);
      const std::vector<int64_t> counts = Histogram(depths, nr);
      EXPECT_EQ(counts[0], 0);
      for (int d = 1; d <= nr; ++d) {
        EXPECT_NEAR(counts[d], mix[d - 1] * vocab, 1.0) << "vocab " << vocab << " depth " << d;
      }
      EXPECT_EQ(depths, TokenDepths(mix, vocab, 7)) << "deterministic";
    }
  }
  // The seed reorders which ids take which depth, not how many.
  const std::vector<int> a = TokenDepths({0.5f, 0.5f}, 256, 1), b = TokenDepths({0.5f, 0.5f}, 256, 2);
  EXPECT_NE(a, b);
  EXPECT_EQ(Histogram(a, 2), Histogram(b, 2));
}

TEST(DepthMix, CapacityIsTheFractionThatRunsEachLoop) {
  EXPECT_THAT(DepthMixCapacity({0.5f, 0.3f, 0.2f}),
              ::testing::Pointwise(::testing::FloatNear(1e-6), std::vector<float>{1.0f, 0.5f, 0.2f}));
  EXPECT_EQ(DepthMixCapacity({0.0f, 0.0f, 1.0f}), (std::vector<float>{1.0f, 1.0f, 1.0f}));
  EXPECT_EQ(DepthMixCapacity({1.0f, 0.0f, 0.0f}), (std::vector<float>{1.0f, 1e-6f, 1e-6f}));
  TinyModelSpec spec = testing::F32Spec("mor-ec");
  spec.depth_mix = {0.25f, 0.25f, 0.5f};
  auto config = TinyModelConfig(spec);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_THAT(config->recursion.router.capacity,
              ::testing::Pointwise(::testing::FloatNear(1e-6), std::vector<float>{1.0f, 0.75f, 0.5f}));
}

TEST(DepthMix, BadMixesAreErrorsNamingTheFlag) {
  struct Case {
    const char* family;
    std::vector<float> mix;
    const char* says;
  };
  const Case cases[] = {
      {"mor-ec", {0.5f, 0.5f}, "3 recursions"},
      {"mor-tc", {0.5f, 0.6f, -0.1f}, "not >= 0"},
      {"early-exit", {0.5f, 0.3f, 0.3f}, "sum to"},
      {"vanilla", {1.0f}, "needs a family with routers"},
      {"recursive-cycle", {0.5f, 0.3f, 0.2f}, "needs a family with routers"},
  };
  for (const Case& c : cases) {
    TinyModelSpec spec = testing::F32Spec(c.family);
    spec.depth_mix = c.mix;
    auto tensors = TinyModelTensors(spec);
    ASSERT_FALSE(tensors.ok()) << c.family;
    EXPECT_THAT(std::string(tensors.status().message()), HasSubstr("--depth-mix")) << c.family;
    EXPECT_THAT(std::string(tensors.status().message()), HasSubstr(c.says)) << c.family;
  }
  TinyModelSpec spec = testing::F32Spec("mor-ec");
  spec.depth_mix = {0.5f, 0.3f, 0.2f};
  spec.router_bias = 1.0f;
  EXPECT_THAT(std::string(TinyModelTensors(spec).status().message()), HasSubstr("--depth-mix"));
  spec.router_bias = 0.0f;
  spec.capacity = {1.0f, 0.5f, 0.2f};
  EXPECT_THAT(std::string(TinyModelTensors(spec).status().message()), HasSubstr("--depth-mix"));
  spec = testing::F32Spec("early-exit");
  spec.depth_mix = {0.5f, 0.3f, 0.2f};
  spec.tie_embeddings = true;
  EXPECT_THAT(std::string(TinyModelTensors(spec).status().message()), HasSubstr("--depth-mix"));

  std::string out;
  for (const char* bad : {"0.5,x,0.5", ""}) {
    auto parsed = TinyModelSpecFromArgs({"--family", "mor-ec", "--out", "d", "--depth-mix", bad}, &out);
    ASSERT_FALSE(parsed.ok()) << bad;
    EXPECT_THAT(std::string(parsed.status().message()), HasSubstr("--depth-mix")) << bad;
  }
  auto parsed = TinyModelSpecFromArgs({"--family", "mor-ec", "--out", "d", "--depth-mix=0.5,0.3,0.2"}, &out);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->depth_mix, (std::vector<float>{0.5f, 0.3f, 0.2f}));
}

struct MixCase {
  std::string name;
  TinyModelSpec spec;
};

void PrintTo(const MixCase& c, std::ostream* os) { *os << c.name; }

TinyModelSpec WithMix(const std::string& family, std::vector<float> mix) {
  TinyModelSpec s = testing::F32Spec(family);
  s.depth_mix = std::move(mix);
  return s;
}

std::vector<MixCase> MixCases() {
  const std::vector<float> main = {0.5f, 0.3f, 0.2f};
  std::vector<MixCase> cases;
  for (const char* family : {"mor-ec", "mor-tc", "early-exit"}) {
    cases.push_back({std::string(family) + "_50_30_20", WithMix(family, main)});
    cases.push_back({std::string(family) + "_0_0_1", WithMix(family, {0.0f, 0.0f, 1.0f})});
    cases.push_back({std::string(family) + "_thirds", WithMix(family, {1.0f / 3, 1.0f / 3, 1.0f / 3})});
    cases.push_back({std::string(family) + "_1_0_0", WithMix(family, {1.0f, 0.0f, 0.0f})});
  }
  MixCase c{"mor-ec_mlp_aux", WithMix("mor-ec", main)};
  c.spec.router = "mlp";
  c.spec.aux_router = true;
  cases.push_back(c);
  c = {"mor-ec_additive_tanh_bf16", WithMix("mor-ec", main)};
  c.spec.gating = "additive";
  c.spec.activation = "tanh";
  c.spec.dtype = DType::kBF16;
  cases.push_back(c);
  c = {"mor-ec_4_loops", WithMix("mor-ec", {0.1f, 0.2f, 0.3f, 0.4f})};
  c.spec.recursions = 4;
  cases.push_back(c);
  c = {"mor-tc_mlp_sigmoid", WithMix("mor-tc", main)};
  c.spec.router = "mlp";
  c.spec.activation = "sigmoid";
  cases.push_back(c);
  c = {"early-exit_bf16_skip_lora", WithMix("early-exit", main)};
  c.spec.dtype = DType::kBF16;
  c.spec.exit_kv = "skip";
  c.spec.lora_rank = 2;
  c.spec.lora_targets = {"q_proj", "v_proj", "o_proj", "gate_proj", "down_proj"};
  cases.push_back(c);
  c = {"early-exit_4_loops_threshold_0_6", WithMix("early-exit", {0.4f, 0.3f, 0.2f, 0.1f})};
  c.spec.recursions = 4;
  c.spec.exit_threshold = 0.6f;
  cases.push_back(c);
  return cases;
}

// Every token id once, in a scrambled order.
std::vector<int> WholeVocabulary(int vocab) {
  std::vector<int> prompt(vocab);
  for (int i = 0; i < vocab; ++i) prompt[i] = static_cast<int>((static_cast<int64_t>(i) * 37 + 11) % vocab);
  return prompt;
}

// A request whose prompt is WholeVocabulary, plus its result.
RunResult RunWholeVocabulary(Engine* engine, int vocab) {
  auto ch = engine->Submit(testing::Greedy(WholeVocabulary(vocab), 1));
  EXPECT_TRUE(ch.ok()) << ch.status();
  if (!ch.ok()) return {};
  engine->RunUntilIdle();
  return testing::Collect(ch->get());
}

class DepthMixEngineTest : public ::testing::TestWithParam<MixCase> {};

// Prompt positions: one prompt holding every token id once exits after d loops for exactly
// the ids of depth d (so the realized fractions are the mix to within 1 / vocab).
TEST_P(DepthMixEngineTest, PromptPositionsRealizeTheMix) {
  const TinyModelSpec& spec = GetParam().spec;
  testing::TempDir dir;
  auto weights = testing::MakeModel(spec, &dir);
  ASSERT_NE(weights, nullptr);
  const int nr = weights->config.recursion.num_recursions, vocab = weights->config.vocab_size;
  EngineConfig cfg;
  cfg.max_batch_rows = 64;
  auto engine = Engine::Create(weights, cfg);
  ASSERT_TRUE(engine.ok()) << engine.status();
  const RunResult r = RunWholeVocabulary(engine->get(), vocab);
  ASSERT_EQ(r.tokens.size(), 1u);
  const std::vector<int> depths = TokenDepths(spec.depth_mix, vocab, spec.seed);
  const std::vector<int64_t> expected = Histogram(depths, nr);
  const EngineStats stats = (*engine)->stats();
  EXPECT_EQ(stats.exits_per_loop, expected);
  for (int d = 1; d <= nr; ++d) {
    EXPECT_NEAR(static_cast<double>(stats.exits_per_loop[d]) / vocab, spec.depth_mix[d - 1], 1.0 / vocab)
        << "depth " << d;
  }
  EXPECT_EQ(r.loops[0], depths[(static_cast<int64_t>(vocab - 1) * 37 + 11) % vocab]) << "last prompt token";
}

// Generated tokens: each sampled token's forward runs exactly the depth of its input token,
// and over 300 sampled tokens the per-loop fractions are near the mix (3 sigma of a
// fraction over 300 draws is at most 0.087; the sampled ids are not exactly uniform, so
// the bound is 0.15).
TEST_P(DepthMixEngineTest, GeneratedTokensRunTheirIdsDepth) {
  const TinyModelSpec& spec = GetParam().spec;
  testing::TempDir dir;
  auto weights = testing::MakeModel(spec, &dir);
  ASSERT_NE(weights, nullptr);
  const int nr = weights->config.recursion.num_recursions, vocab = weights->config.vocab_size;
  auto engine = Engine::Create(weights, EngineConfig());
  ASSERT_TRUE(engine.ok()) << engine.status();
  GenerateRequest req;
  req.prompt = {5, 9};
  req.params.temperature = 1.5f;
  req.params.seed = 3;
  req.params.max_tokens = 300;
  req.params.ignore_eos = true;
  auto ch = (*engine)->Submit(req);
  ASSERT_TRUE(ch.ok()) << ch.status();
  (*engine)->RunUntilIdle();
  const RunResult r = testing::Collect(ch->get());
  ASSERT_EQ(r.tokens.size(), 300u);
  const std::vector<int> depths = TokenDepths(spec.depth_mix, vocab, spec.seed);
  std::vector<double> fraction(nr + 1, 0.0);
  for (size_t i = 0; i < r.tokens.size(); ++i) {
    const int input = i == 0 ? req.prompt.back() : r.tokens[i - 1];
    ASSERT_EQ(r.loops[i], depths[input]) << "token " << i << " (input id " << input << ")";
    fraction[r.loops[i]] += 1.0 / r.tokens.size();
  }
  for (int d = 1; d <= nr; ++d) EXPECT_NEAR(fraction[d], spec.depth_mix[d - 1], 0.15) << "depth " << d;
}

// The reference implementation of docs/models.md agrees token by token, and the decisions
// are clear, not near a boundary: expert-choice scores at least 1 away from the threshold 0,
// token-choice top score at least 3 above the next (the construction gives 4), exit
// confidences at least 0.99 where the token exits and at most 0.5 where it goes on.
TEST_P(DepthMixEngineTest, ReferenceDecidesEveryTokenClearly) {
  const TinyModelSpec& spec = GetParam().spec;
  testing::TempDir dir;
  auto weights = testing::MakeModel(spec, &dir);
  ASSERT_NE(weights, nullptr);
  const int vocab = weights->config.vocab_size;
  const float threshold = weights->config.recursion.early_exit.threshold;
  const std::vector<int> depths = TokenDepths(spec.depth_mix, vocab, spec.seed);
  const std::vector<int> prompt = WholeVocabulary(vocab);
  ReferenceModel ref(weights);
  const std::vector<StepOutput> out = ref.Forward(prompt);
  for (size_t i = 0; i < prompt.size(); ++i) {
    const TokenTrace& t = out[i].trace;
    ASSERT_EQ(t.loops, depths[prompt[i]]) << "position " << i << " id " << prompt[i];
    if (spec.family == "mor-ec") {
      for (double score : t.router_scores) EXPECT_GE(std::abs(score), 1.0) << "id " << prompt[i];
    } else if (spec.family == "mor-tc") {
      std::vector<double> sorted = t.router_scores;
      std::sort(sorted.rbegin(), sorted.rend());
      EXPECT_GE(sorted[0] - sorted[1], 3.0) << "id " << prompt[i];
    } else {
      for (size_t r = 0; r < t.exit_confidence.size(); ++r) {
        const bool exits = static_cast<int>(r) + 1 == t.loops;
        if (exits) EXPECT_GE(t.exit_confidence[r], std::max(0.99, double(threshold))) << "id " << prompt[i];
        if (!exits) EXPECT_LE(t.exit_confidence[r], std::min(0.5, double(threshold))) << "id " << prompt[i];
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Families, DepthMixEngineTest, ::testing::ValuesIn(MixCases()),
                         [](const ::testing::TestParamInfo<MixCase>& info) {
                           std::string n = info.param.name;
                           for (char& ch : n) ch = std::isalnum(static_cast<unsigned char>(ch)) ? ch : '_';
                           return n;
                         });

// The benchmark width: hidden 960 (15 heads of 64, 5 KV heads), bf16, every family.
TEST(DepthMixWide, Hidden960RealizesTheMix) {
  for (const char* family : {"mor-ec", "mor-tc", "early-exit"}) {
    SCOPED_TRACE(family);
    TinyModelSpec spec;
    spec.family = family;
    spec.hidden = 960;
    spec.heads = 15;
    spec.kv_heads = 5;
    spec.intermediate = 960;
    spec.vocab = 256;
    spec.depth_mix = {0.5f, 0.3f, 0.2f};
    testing::TempDir dir;
    auto weights = testing::MakeModel(spec, &dir);
    ASSERT_NE(weights, nullptr);
    auto engine = Engine::Create(weights, EngineConfig());
    ASSERT_TRUE(engine.ok()) << engine.status();
    RunWholeVocabulary(engine->get(), spec.vocab);
    EXPECT_EQ((*engine)->stats().exits_per_loop, Histogram(TokenDepths(spec.depth_mix, 256, 1), 3));
  }
}

}  // namespace
}  // namespace morserve
