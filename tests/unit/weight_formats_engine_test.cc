// The engine on every CPU weight format (--weights, engine/cpu/linear_weights.h):
// - bf16 checkpoints served in place (auto) give the reference's greedy tokens and loop
//   counts with logits within 1e-4 (the reference computes from the same bf16 values);
// - int8 (Q8, quantized at load) and bf16/f16 conversions of an fp32 checkpoint stay within a
//   stated distance of the reference: logits within kInt8Tolerance / kHalfTolerance
//   (MaxScaledDiff) while tokens and loop counts agree, and at least kMinAgreement of the
//   generated tokens before a first flip;
// - amx-bf16 (bf16 weights and bf16-rounded projection inputs on the AMX tile unit, or with
//   AVX-512 BF16 where the host has no AMX) stays within kHalfTolerance likewise; elsewhere the
//   engine refuses it by name;
// - w8a8 (int8 weights and int8 projection inputs, where the host has AVX-512 VNNI or AVX2) stays
// within
//   kInt8Tolerance likewise; elsewhere the engine refuses it by name;
// - every format is batch invariant: a request alone equals the same request inside mixed
//   batches with staggered arrivals, bit for bit.
#include <gtest/gtest.h>

#include "engine/cpu/linear_kernels.h"
#include "engine/reference/reference_model.h"
#include "tests/engine_harness.h"

namespace morserve {
namespace {

using testing::FamilyCase;
using testing::RunResult;
using testing::Workload;

constexpr double kSameValuesTolerance = 1e-4;  // fp32 sums of the same weights in another order
// Relative to the row's max(|logit|, 1) (MaxScaledDiff). The tiny test models (hidden 64)
// sum few terms per output, so a weight's rounding weighs more than in a real model, and an
// early exit decided at another loop in the prompt changes the cache later tokens read without
// showing in their loop counts: these are regression bounds (measured worst: int8 7.1e-2,
// bf16 7.4e-2 on early-exit); docs/benchmarks.md gives the accuracy measured at a real width.
constexpr double kInt8Tolerance = 1e-1;
constexpr double kHalfTolerance = 1e-1;
constexpr double kMinAgreement = 0.75;

EngineConfig Config(CpuWeights weights) {
  EngineConfig cfg;
  cfg.weights = weights;
  cfg.max_batch_rows = 12;
  cfg.max_step_tokens = 10;
  cfg.block_size = 4;
  cfg.num_kv_blocks = 2048;
  return cfg;
}

std::vector<FamilyCase> Families(DType dtype) {
  std::vector<FamilyCase> out;
  for (const char* f : {"vanilla", "mor-ec", "mor-tc", "relaxed-lora", "early-exit", "recurrent"}) {
    TinyModelSpec s = testing::F32Spec(f);
    s.dtype = dtype;
    out.push_back({f, s});
  }
  return out;
}

// Tokens, loops and logits against the reference up to each request's first token or loop
// flip (the logits of a step whose loop count differs are not compared: another depth);
// returns the fraction of generated tokens that agree before the flip.
double CompareUntilFlip(const ModelWeights& weights, const Workload& w,
                        const std::vector<RunResult>& got, double tolerance,
                        const std::string& label) {
  auto shared = std::shared_ptr<const ModelWeights>(&weights, [](const ModelWeights*) {});
  ReferenceModel ref(shared);
  int generated = 0, agreed = 0;
  for (size_t i = 0; i < w.requests.size(); ++i) {
    const GenerateRequest& r = w.requests[i];
    std::vector<StepOutput> outs;
    const std::vector<int> want = ref.GenerateGreedy(r.prompt, r.params.max_tokens, &outs);
    generated += static_cast<int>(want.size());
    for (size_t t = 0; t < want.size(); ++t) {
      const StepOutput& o = outs[r.prompt.size() - 1 + t];
      if (got[i].loops[t] != o.trace.loops) break;  // a routing flip: another depth, other logits
      EXPECT_LE(testing::MaxScaledDiff(got[i].logits[t], o.logits), tolerance)
          << label << " request " << i << " token " << t;
      if (got[i].tokens[t] != want[t]) break;
      ++agreed;
    }
  }
  return static_cast<double>(agreed) / generated;
}

class WeightFormatsTest : public ::testing::TestWithParam<FamilyCase> {};

// bf16 checkpoint, --weights auto: the rows are read in place and the values are the
// reference's, so the existing fp32 rule holds.
TEST_P(WeightFormatsTest, Bf16CheckpointInPlaceMatchesReference) {
  testing::TempDir dir;
  TinyModelSpec spec = GetParam().spec;
  spec.dtype = DType::kBF16;
  auto weights = testing::MakeModel(spec, &dir);
  ASSERT_NE(weights, nullptr);
  const Workload w = testing::MakeWorkload(weights->config.vocab_size);
  auto engine = Engine::Create(weights, Config(CpuWeights::kAuto));
  ASSERT_TRUE(engine.ok()) << engine.status();
  auto got = testing::RunStaggered(engine->get(), w.requests, w.arrivals);
  EXPECT_EQ(CompareUntilFlip(*weights, w, got, kSameValuesTolerance, GetParam().name + " bf16"),
            1.0)
      << "a token or loop count differs from the reference";
}

// fp32 checkpoint in int8, bf16 and f16: close to the reference, and batch invariant.
TEST_P(WeightFormatsTest, ConvertedFormatsStayCloseAndBatchInvariant) {
  testing::TempDir dir;
  auto weights = testing::MakeModel(GetParam().spec, &dir);
  ASSERT_NE(weights, nullptr);
  const Workload w = testing::MakeWorkload(weights->config.vocab_size);
  std::vector<std::tuple<CpuWeights, double, const char*>> formats = {
      {CpuWeights::kInt8, kInt8Tolerance, "int8"},
      {CpuWeights::kBF16, kHalfTolerance, "bf16"},
      {CpuWeights::kF16, kHalfTolerance, "f16"}};
  if (AmxBf16BestLinearKernels() != nullptr)
    formats.emplace_back(CpuWeights::kAmxBf16, kHalfTolerance, "amx-bf16");
  if (W8A8BestLinearKernels() != nullptr)
    formats.emplace_back(CpuWeights::kW8A8, kInt8Tolerance, "w8a8");
  for (auto [format, tolerance, name] : formats) {
    const std::string label = GetParam().name + " " + name;
    auto engine = Engine::Create(weights, Config(format));
    ASSERT_TRUE(engine.ok()) << engine.status();
    auto got = testing::RunStaggered(engine->get(), w.requests, w.arrivals);
    const double agreement = CompareUntilFlip(*weights, w, got, tolerance, label);
    std::printf("%s: %.0f%% of generated tokens agree with the reference before a first flip\n",
                label.c_str(), 100 * agreement);
    EXPECT_GE(agreement, kMinAgreement) << label;
    // Each request alone, on a fresh engine: bitwise what it got in the staggered batch.
    for (size_t i = 0; i < w.requests.size(); i += 5) {
      auto alone_engine = Engine::Create(weights, Config(format));
      ASSERT_TRUE(alone_engine.ok());
      const RunResult alone = testing::RunStaggered(alone_engine->get(), {w.requests[i]}, {0})[0];
      EXPECT_EQ(alone.tokens, got[i].tokens) << label << " request " << i;
      EXPECT_EQ(alone.logits, got[i].logits)
          << label << " request " << i << ": bits differ in a batch";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Families, WeightFormatsTest, ::testing::ValuesIn(Families(DType::kF32)),
                         testing::FamilyCaseName);

TEST(WeightFormatsTest, AmxBf16NeedsAmxOrAvx512Bf16) {
  if (AmxBf16BestLinearKernels() != nullptr) GTEST_SKIP() << "the format runs above on this host";
  testing::TempDir dir;
  auto weights = testing::MakeModel(testing::F32Spec("vanilla"), &dir);
  auto engine = Engine::Create(weights, Config(CpuWeights::kAmxBf16));
  ASSERT_FALSE(engine.ok());
  EXPECT_NE(std::string(engine.status().message()).find("--weights amx-bf16"), std::string::npos);
}

TEST(WeightFormatsTest, W8A8NeedsVnni) {
  if (W8A8BestLinearKernels() != nullptr) GTEST_SKIP() << "the format runs above on this host";
  testing::TempDir dir;
  auto weights = testing::MakeModel(testing::F32Spec("vanilla"), &dir);
  auto engine = Engine::Create(weights, Config(CpuWeights::kW8A8));
  ASSERT_FALSE(engine.ok());
  EXPECT_NE(std::string(engine.status().message()).find("--weights w8a8"), std::string::npos);
}

TEST(WeightFormatsTest, CudaRefusesCpuOnlyFormats) {
  testing::TempDir dir;
  auto weights = testing::MakeModel(testing::F32Spec("vanilla"), &dir);
  EngineConfig cfg = Config(CpuWeights::kInt8);
  cfg.device = Device::kCuda;
  auto engine = Engine::Create(weights, cfg);
  ASSERT_FALSE(engine.ok());
  EXPECT_NE(std::string(engine.status().message()).find("--weights"), std::string::npos);
}

}  // namespace
}  // namespace morserve
