// The whole engine on the GPU (--device cuda) against the reference implementation, for the
// Foundation test model families of tests/unit/engine_test.cc at a GPU-sized shape (hidden
// 256, 4 heads of 64, 2 kv heads: the attention kernel takes head_dim 64/128) with bf16
// weights, so the device holds exactly the reference's weights and the differences are the
// bf16 rounding of activations (GEMM inputs, q/K/V, attention output) and fp32 sum orders.
//
// Comparison rule, per request (depth-wise and sequence-wise batching, 16 requests with
// staggered arrivals and chunked prefill):
//   - walk the generated tokens in order; a step is "clear" when the reference's top-1
//     margin (top1 - top2) / max(|top1|, 1) exceeds kMargin (1e-2);
//   - up to the first unclear step (after which greedy paths may legitimately part), the
//     GPU's token equals the reference's, its loop count equals the reference's, and its
//     logits are within kLogitTolerance (5e-2) of the reference's relative to
//     max(|logit|, 1);
//   - a loop count that differs ends that request's comparison (a router score that sat at
//     its threshold, flipped by rounding); at most kMaxLoopFlips (5%) of compared steps may
//     end so, and at least kMinCompared (50%) of all generated steps must be compared, so
//     the test cannot pass by comparing nothing.
// Also: batch invariance (a request alone vs inside three mixed batches: identical tokens
// and bitwise identical logits), every KV block back in the pool at the end, and the clear
// error for a shape the kernels do not take.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "engine/reference/reference_model.h"
#include "tests/engine_harness.h"
#include "tests/gpu/gpu_testutil.h"

namespace morserve {
namespace {

using testing::FamilyCase;
using testing::Greedy;
using ::testing::HasSubstr;
using testing::MakeWorkload;
using testing::RunResult;
using testing::Workload;

constexpr double kMargin = 1e-2;
constexpr double kLogitTolerance = 5e-2;
constexpr double kMaxLoopFlips = 0.05;
constexpr double kMinCompared = 0.5;

TinyModelSpec Spec(const std::string& family) {
  TinyModelSpec s;
  s.family = family;
  s.dtype = DType::kBF16;
  s.hidden = 256;
  s.heads = 4;
  s.kv_heads = 2;
  s.intermediate = 256;
  return s;
}

EngineConfig GpuConfig(BatchingMode mode) {
  EngineConfig cfg;
  cfg.device = Device::kCuda;
  cfg.mode = mode;
  cfg.max_batch_rows = 12;
  cfg.max_step_tokens = 10;  // prompts arrive in chunks
  cfg.block_size = 4;
  cfg.num_kv_blocks = 4096;
  return cfg;
}

// (top1 - top2) / max(|top1|, 1) of a logit row.
double Margin(const std::vector<float>& l) {
  float a = -INFINITY, b = -INFINITY;
  for (float v : l) {
    if (v > a) {
      b = a;
      a = v;
    } else if (v > b) {
      b = v;
    }
  }
  return (static_cast<double>(a) - b) / std::max(1.0, std::abs(static_cast<double>(a)));
}

struct Tally {
  int generated = 0, compared = 0, loop_flips = 0;
};

struct RefRun {
  std::vector<int> tokens;
  std::vector<StepOutput> outs;
};

// The reference's greedy run of every request (computed once per model).
std::vector<RefRun> ReferenceRuns(std::shared_ptr<const ModelWeights> weights, const Workload& w) {
  ReferenceModel ref(std::move(weights));
  std::vector<RefRun> runs(w.requests.size());
  for (size_t i = 0; i < w.requests.size(); ++i) {
    runs[i].tokens =
        ref.GenerateGreedy(w.requests[i].prompt, w.requests[i].params.max_tokens, &runs[i].outs);
  }
  return runs;
}

void CompareWithReference(const std::vector<RefRun>& refs, const Workload& w,
                          const std::vector<RunResult>& got, const std::string& label,
                          Tally* tally) {
  for (size_t i = 0; i < w.requests.size(); ++i) {
    const GenerateRequest& r = w.requests[i];
    const std::vector<int>& want = refs[i].tokens;
    const std::vector<StepOutput>& outs = refs[i].outs;
    ASSERT_EQ(got[i].tokens.size(), want.size()) << label << " request " << i;
    ASSERT_EQ(got[i].logits.size(), want.size()) << label << " request " << i;
    tally->generated += static_cast<int>(want.size());
    for (size_t t = 0; t < want.size(); ++t) {
      const StepOutput& o = outs[r.prompt.size() - 1 + t];
      if (Margin(o.logits) <= kMargin) break;
      if (got[i].loops[t] != o.trace.loops) {
        ++tally->loop_flips;
        break;
      }
      ++tally->compared;
      ASSERT_EQ(got[i].tokens[t], want[t]) << label << " request " << i << " token " << t;
      EXPECT_LE(testing::MaxRelDiff(got[i].logits[t], o.logits), kLogitTolerance)
          << label << " request " << i << " token " << t;
    }
  }
}

class EngineGpuTest : public ::testing::TestWithParam<FamilyCase> {
 protected:
  void SetUp() override { MORSERVE_SKIP_WITHOUT_GPU(); }
};

TEST_P(EngineGpuTest, DepthAndSequenceWiseMatchReference) {
  testing::TempDir dir;
  auto weights = testing::MakeModel(GetParam().spec, &dir);
  ASSERT_NE(weights, nullptr);
  const Workload w = MakeWorkload(weights->config.vocab_size);
  const std::vector<RefRun> refs = ReferenceRuns(weights, w);
  for (BatchingMode mode : {BatchingMode::kDepthWise, BatchingMode::kSequenceWise}) {
    const EngineConfig cfg = GpuConfig(mode);
    auto engine = Engine::Create(weights, cfg);
    ASSERT_TRUE(engine.ok()) << engine.status();
    auto got = testing::RunStaggered(engine->get(), w.requests, w.arrivals);
    const std::string label =
        GetParam().name + (mode == BatchingMode::kDepthWise ? " depth" : " sequence");
    Tally tally;
    CompareWithReference(refs, w, got, label, &tally);
    std::printf("%s: %d of %d steps compared, %d loop flips\n", label.c_str(), tally.compared,
                tally.generated, tally.loop_flips);
    EXPECT_GE(tally.compared, kMinCompared * tally.generated)
        << label << ": too few clear steps compared";
    EXPECT_LE(tally.loop_flips, kMaxLoopFlips * std::max(tally.compared, 1))
        << label << ": router decisions differ";
    EXPECT_EQ((*engine)->kv_pool().num_free(), cfg.num_kv_blocks) << label << ": blocks leaked";
  }
}

// The families of engine_test.cc (tests/engine_harness.cc) at the GPU shape.
INSTANTIATE_TEST_SUITE_P(Families, EngineGpuTest,
                         ::testing::ValuesIn(testing::EngineFamilies(Spec)),
                         testing::FamilyCaseName);

// A request's tokens and logits are bit-identical alone and inside mixed-depth batches.
TEST(EngineGpuInvarianceTest, AloneAndInMixedBatchesAreBitwiseEqual) {
  MORSERVE_SKIP_WITHOUT_GPU();
  testing::TempDir dir;
  auto weights = testing::MakeModel(Spec("mor-ec"), &dir);
  ASSERT_NE(weights, nullptr);
  const int vocab = weights->config.vocab_size;
  GenerateRequest probe = Greedy(testing::MakePrompts(1, 9, 9, vocab, 99)[0], 12);
  EngineConfig cfg = GpuConfig(BatchingMode::kDepthWise);
  cfg.max_batch_rows = 16;
  cfg.max_step_tokens = 32;
  auto run = [&](const std::vector<GenerateRequest>& reqs, const std::vector<int>& arrivals) {
    auto engine = Engine::Create(weights, cfg);
    EXPECT_TRUE(engine.ok()) << engine.status();
    auto got = testing::RunStaggered(engine->get(), reqs, arrivals);
    EXPECT_EQ((*engine)->kv_pool().num_free(), cfg.num_kv_blocks) << "blocks leaked";
    return got;
  };
  const RunResult alone = run({probe}, {0})[0];
  for (int variant = 0; variant < 3; ++variant) {
    Workload w = MakeWorkload(vocab, 8 + 4 * variant);
    w.requests.push_back(probe);
    w.arrivals.push_back(variant * 2);
    const RunResult mixed = run(w.requests, w.arrivals).back();
    EXPECT_EQ(mixed.tokens, alone.tokens) << "variant " << variant;
    ASSERT_EQ(mixed.logits.size(), alone.logits.size());
    for (size_t t = 0; t < alone.logits.size(); ++t) {
      EXPECT_EQ(mixed.logits[t], alone.logits[t]) << "variant " << variant << " token " << t;
    }
  }
}

TEST(EngineGpuErrorTest, UnsupportedHeadDimIsAClearError) {
  MORSERVE_SKIP_WITHOUT_GPU();
  TinyModelSpec s = Spec("vanilla");
  s.hidden = 64;  // head_dim 16
  testing::TempDir dir;
  auto weights = testing::MakeModel(s, &dir);
  ASSERT_NE(weights, nullptr);
  auto engine = Engine::Create(weights, GpuConfig(BatchingMode::kDepthWise));
  ASSERT_FALSE(engine.ok());
  EXPECT_THAT(std::string(engine.status().message()), HasSubstr("head_dim 16"));
}

}  // namespace
}  // namespace morserve
