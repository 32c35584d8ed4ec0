// The engine on recurrent-layer models (docs/models.md#recurrent-transformer-layers) on the GPU
// (--device cuda): the tiled prefill (kernels/recurrent_attention,
// engine/runtime/recurrent_schedule) and the naive one-position-per-wave path, on the five
// recurrent families of tests/unit/recurrent_engine_test.cc at the GPU test shape
// (testing::GpuModelSpec), prompt lengths 1..300 (powers of two and not, on and off the 32-key fold
// tiles), whole prompts in one step and prompts chunked by a 37-token step budget. The same source
// builds engine_gpu_recurrent_emu_test: the same checks on the CPU-emulated CUDA runner
// (kernels/emu; prompt lengths 1..65: tests/gpu/engine_gpu_workloads.h), which runs in CI.
//   - both schedules against the reference by the bf16 rule of engine_gpu_test
//     (testing::CompareWithReference: tokens, loops and logits within 2e-2 of the row's scale
//     up to the first unclear step; at least half of the steps compared, at most 5% loop
//     flips);
//   - tiled against naive: the same tokens and loops up to the first step where the naive
//     run's own top-1 margin is at most 1e-2, logits within 2e-2 of the row's scale
//     (testing::MaxScaledDiff, the bf16 rule). The attention of both is bit for bit the same by
//     construction (split chunks of 256 keys, kRecurrentRange; kernel_recurrent_attention_test
//     checks it); what remains is the GEMMs' row count (the tiled path projects q and the
//     temporary pairs of a whole chunk at once, the naive one a wave at a time), so where
//     cuBLASLt is row-invariant (GemmTest.RowsAreBatchInvariantAcrossM) every logit row is
//     bitwise equal: the count is printed;
//   - batch invariance: a prompt alone and inside mixed batches of recurrent requests (other
//     chunking of its prompt) gives the same tokens and bitwise-equal logits (as
//     engine_gpu_test's invariance test, this rests on cuBLASLt's row invariance:
//     GemmTest.RowsAreBatchInvariantAcrossM);
//   - a 520-token prompt (three 256-key ranges: range-split decode, the ranges' combine):
//     tiled, whole or in 200-token steps, and naive give bitwise-equal logits;
//   - every KV block back in the pool;
//   - a tiled decode token's state stays on the device (one download: the sampled token).
// Skips with "no CUDA device: kernel test skipped" where no sm_90 device is present.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <string>
#include <vector>

#include "tests/engine_harness.h"
#include "tests/gpu/engine_gpu_workloads.h"
#include "tests/gpu/gpu_testutil.h"

namespace morserve {
namespace {

using testing::Greedy;
using testing::RunResult;

const std::vector<int> kPromptLengths = testing::RecurrentPromptLengths();
constexpr double kTiledNaiveTolerance = testing::kGpuLogitTolerance;

struct ModelCase {
  std::string name;
  TinyModelSpec spec;
};

std::vector<ModelCase> Models() {
  std::vector<ModelCase> v;
  TinyModelSpec plain = testing::GpuModelSpec("recurrent");
  v.push_back({"recurrent", plain});
  for (const char* family : {"mor-ec", "mor-tc", "relaxed-lora", "early-exit"}) {
    TinyModelSpec s = testing::GpuModelSpec(family);
    s.layer_kind = "recurrent";
    s.exit_kv = "skip";       // propagate is refused for recurrent layers
    s.exit_threshold = 0.2f;  // exits after 1, 2 and 3 loops
    v.push_back({std::string("recurrent-") + family, s});
  }
  return v;
}

std::vector<GenerateRequest> Requests(int vocab) {
  std::vector<GenerateRequest> out;
  for (size_t i = 0; i < kPromptLengths.size(); ++i) {
    const int len = kPromptLengths[i];
    out.push_back(Greedy(testing::MakePrompts(1, len, len, vocab, 300 + i)[0], 4));
  }
  return out;
}

EngineConfig Config(RecurrentPrefill prefill, int step_tokens) {
  EngineConfig cfg;
  cfg.device = Device::kCuda;
  cfg.recurrent_prefill = prefill;
  cfg.max_batch_rows = 1024;
  cfg.max_step_tokens = step_tokens;
  cfg.block_size = 16;
  cfg.num_kv_blocks = 4096;
  return cfg;
}

std::vector<RunResult> RunEngine(std::shared_ptr<const ModelWeights> w, const EngineConfig& cfg,
                                 const std::vector<GenerateRequest>& reqs,
                                 const std::vector<int>& arrivals) {
  auto engine = Engine::Create(std::move(w), cfg);
  EXPECT_TRUE(engine.ok()) << engine.status();
  if (!engine.ok()) return {};
  auto got = testing::RunStaggered(engine->get(), reqs, arrivals);
  EXPECT_EQ((*engine)->kv_pool().num_free(), cfg.num_kv_blocks) << "blocks leaked";
  return got;
}

// Tiled vs naive, by the rule in the file comment; returns the bitwise-equal logit rows.
int CompareSchedules(const std::vector<GenerateRequest>& reqs, const std::vector<RunResult>& tiled,
                     const std::vector<RunResult>& naive, const std::string& label) {
  int bitwise = 0;
  for (size_t i = 0; i < reqs.size(); ++i) {
    const std::string where = label + " prompt length " + std::to_string(reqs[i].prompt.size());
    EXPECT_EQ(tiled[i].tokens.size(), naive[i].tokens.size()) << where;
    for (size_t t = 0; t < std::min(tiled[i].tokens.size(), naive[i].tokens.size()); ++t) {
      if (tiled[i].logits[t] == naive[i].logits[t]) ++bitwise;
      EXPECT_LE(testing::MaxScaledDiff(tiled[i].logits[t], naive[i].logits[t]),
                kTiledNaiveTolerance)
          << where << " token " << t;
      if (testing::Margin(naive[i].logits[t]) <= testing::kGpuMargin) break;
      EXPECT_EQ(tiled[i].tokens[t], naive[i].tokens[t]) << where << " token " << t;
      EXPECT_EQ(tiled[i].loops[t], naive[i].loops[t]) << where << " token " << t;
      if (tiled[i].tokens[t] != naive[i].tokens[t] || tiled[i].loops[t] != naive[i].loops[t]) break;
    }
  }
  return bitwise;
}

class EngineGpuRecurrentTest : public ::testing::TestWithParam<ModelCase> {
 protected:
  void SetUp() override { MORSERVE_SKIP_WITHOUT_GPU(); }
};

TEST_P(EngineGpuRecurrentTest, TiledAndNaiveMatchReferenceAndEachOther) {
  testing::TempDir dir;
  auto weights = testing::MakeModel(GetParam().spec, &dir);
  ASSERT_NE(weights, nullptr);
  const std::vector<GenerateRequest> reqs = Requests(weights->config.vocab_size);
  std::vector<int> arrivals;
  for (size_t i = 0; i < reqs.size(); ++i) arrivals.push_back(static_cast<int>(i % 4));
  const std::vector<testing::RefRun> refs = testing::ReferenceRuns(weights, reqs);
  for (int step_tokens : {2048, 37}) {
    std::vector<RunResult> runs[2];
    int s = 0;
    for (RecurrentPrefill prefill : {RecurrentPrefill::kTiled, RecurrentPrefill::kNaive}) {
      const std::string label =
          GetParam().name + (s == 0 ? " tiled" : " naive") + " step " + std::to_string(step_tokens);
      runs[s] = RunEngine(weights, Config(prefill, step_tokens), reqs, arrivals);
      ASSERT_EQ(runs[s].size(), reqs.size()) << label;
      testing::Tally tally;
      testing::CompareWithReference(refs, reqs, runs[s], label, &tally);
      std::printf("%s: %d of %d steps compared, %d loop flips\n", label.c_str(), tally.compared,
                  tally.generated, tally.loop_flips);
      EXPECT_GE(tally.compared, 0.5 * tally.generated) << label << ": too few clear steps";
      EXPECT_LE(tally.loop_flips, 0.05 * std::max(tally.compared, 1)) << label;
      ++s;
    }
    const std::string label = GetParam().name + " step " + std::to_string(step_tokens);
    const int bitwise = CompareSchedules(reqs, runs[0], runs[1], label);
    std::printf("%s: tiled vs naive, %d logit rows bitwise equal\n", label.c_str(), bitwise);
  }
}

INSTANTIATE_TEST_SUITE_P(Families, EngineGpuRecurrentTest, ::testing::ValuesIn(Models()),
                         [](const auto& info) {
                           std::string n = info.param.name;
                           for (char& c : n)
                             c = std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
                           return n;
                         });

// A recurrent prompt alone and inside mixed batches (its prefill cut differently): the same
// tokens, bitwise-equal logits.
TEST(EngineGpuRecurrentInvarianceTest, AloneAndInMixedBatchesAreBitwiseEqual) {
  MORSERVE_SKIP_WITHOUT_GPU();
  testing::TempDir dir;
  auto weights = testing::MakeModel(testing::GpuModelSpec("recurrent"), &dir);
  ASSERT_NE(weights, nullptr);
  const int vocab = weights->config.vocab_size;
  const GenerateRequest probe = Greedy(testing::MakePrompts(1, 150, 150, vocab, 99)[0], 8);
  const EngineConfig cfg = Config(RecurrentPrefill::kTiled, 64);
  const std::vector<RunResult> alone_runs = RunEngine(weights, cfg, {probe}, {0});
  ASSERT_EQ(alone_runs.size(), 1u);
  const RunResult& alone = alone_runs[0];
  for (int variant = 0; variant < 3; ++variant) {
    std::vector<GenerateRequest> reqs;
    std::vector<int> arrivals;
    const auto prompts = testing::MakePrompts(4 + 2 * variant, 1, 90, vocab, 7 + variant);
    for (size_t i = 0; i < prompts.size(); ++i) {
      reqs.push_back(Greedy(prompts[i], 3 + static_cast<int>(i % 4)));
      arrivals.push_back(static_cast<int>(i % 3));
    }
    reqs.push_back(probe);
    arrivals.push_back(variant);
    const std::vector<RunResult> runs = RunEngine(weights, cfg, reqs, arrivals);
    ASSERT_EQ(runs.size(), reqs.size());
    const RunResult& mixed = runs.back();
    EXPECT_EQ(mixed.tokens, alone.tokens) << "variant " << variant;
    ASSERT_EQ(mixed.logits.size(), alone.logits.size());
    for (size_t t = 0; t < alone.logits.size(); ++t) {
      EXPECT_EQ(mixed.logits[t], alone.logits[t]) << "variant " << variant << " token " << t;
    }
  }
}

// A 520-token recurrent prompt decoded 6 tokens: its rows' keys span three ranges of 256
// (kernels/recurrent_attention.cuh kRecurrentRange), so a tiled decode row merges its cached
// prefix as one item per range (parallel CTAs) and finishes by combining the ranges in order,
// while the naive path runs paged attention in chunks of the same 256 keys with its combine.
// Prefilled whole and in steps of 200 (chunks ending inside ranges), tiled and naive: the same
// tokens and bitwise-equal logits; against the reference by the bf16 rule up to the first
// unclear step, which must come after the first decode token (at 520 keys a random model's
// top-1 margins are small, so the usual half of the steps is not asked).
TEST(EngineGpuRecurrentLongContextTest, RangeSplitDecodeMatchesNaiveBitwise) {
  MORSERVE_SKIP_WITHOUT_GPU();
  testing::TempDir dir;
  TinyModelSpec spec = testing::GpuModelSpec("recurrent");
  spec.max_pos = 1024;
  auto weights = testing::MakeModel(spec, &dir);
  ASSERT_NE(weights, nullptr);
  const std::vector<GenerateRequest> reqs = {
      Greedy(testing::MakePrompts(1, 520, 520, weights->config.vocab_size, 41)[0], 6)};
  const std::vector<testing::RefRun> refs = testing::ReferenceRuns(weights, reqs);
  const RunResult naive = RunEngine(weights, Config(RecurrentPrefill::kNaive, 2048), reqs, {0})[0];
  for (int step_tokens : {2048, 200}) {
    const std::string label = "tiled step " + std::to_string(step_tokens);
    const std::vector<RunResult> tiled =
        RunEngine(weights, Config(RecurrentPrefill::kTiled, step_tokens), reqs, {0});
    ASSERT_EQ(tiled.size(), 1u) << label;
    testing::Tally tally;
    testing::CompareWithReference(refs, reqs, tiled, label, &tally);
    std::printf("%s: %d of %d steps compared\n", label.c_str(), tally.compared, tally.generated);
    EXPECT_GE(tally.compared, 2) << label << ": no decode step compared";
    EXPECT_EQ(tiled[0].tokens, naive.tokens) << label;
    ASSERT_EQ(tiled[0].logits.size(), naive.logits.size()) << label;
    for (size_t t = 0; t < naive.logits.size(); ++t)
      EXPECT_EQ(tiled[0].logits[t], naive.logits[t]) << label << " token " << t;
  }
}

// A recurrent decode token by the tiled schedule keeps its state on the device: every layer
// uploads its metadata once and gathers and scatters the states there, so the token's step
// downloads only its sampled token and synchronises once (with --recurrent-prefill naive, h
// goes through the host at every layer).
TEST(EngineGpuRecurrentStepTest, DecodeTokenStateStaysOnTheDevice) {
  MORSERVE_SKIP_WITHOUT_GPU();
  testing::TempDir dir;
  auto weights = testing::MakeModel(testing::GpuModelSpec("recurrent"), &dir);
  ASSERT_NE(weights, nullptr);
  auto engine = Engine::Create(weights, Config(RecurrentPrefill::kTiled, 64));
  ASSERT_TRUE(engine.ok()) << engine.status();
  GenerateRequest r = Greedy(testing::MakePrompts(1, 20, 20, weights->config.vocab_size, 3)[0], 8);
  r.return_logits = false;  // sampled on the device
  ASSERT_TRUE((*engine)->Submit(r).ok());
  while ((*engine)->stats().tokens_generated < 3) ASSERT_TRUE((*engine)->Step());
  const RunnerCounters before = (*engine)->runner().counters();
  while ((*engine)->stats().tokens_generated < 4) ASSERT_TRUE((*engine)->Step());
  const RunnerCounters after = (*engine)->runner().counters();
  const RunnerCounters::Device& a = after.device;
  const RunnerCounters::Device& b = before.device;
  std::printf("recurrent decode token: %lld + %lld copies (%lld bytes down), %lld syncs\n",
              static_cast<long long>(a.h2d_copies - b.h2d_copies),
              static_cast<long long>(a.d2h_copies - b.d2h_copies),
              static_cast<long long>(a.d2h_bytes - b.d2h_bytes),
              static_cast<long long>(a.syncs - b.syncs));
  EXPECT_GT(after.full_rows - before.full_rows, 0);
  EXPECT_EQ(a.d2h_copies - b.d2h_copies, 1);
  EXPECT_LE(a.d2h_bytes - b.d2h_bytes, 64);
  EXPECT_EQ(a.syncs - b.syncs, 1);
}

}  // namespace
}  // namespace morserve
