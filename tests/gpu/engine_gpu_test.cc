// The whole engine on the GPU (--device cuda) against the reference implementation, for the
// Foundation test model families of tests/unit/engine_test.cc at a GPU-sized shape (hidden
// 256, 4 heads of 64, 2 kv heads; adaptive Huginn also at head_dim 96, Huginn-0125's) with bf16
// weights, so the device holds exactly the reference's weights and the differences are the
// bf16 rounding of activations (GEMM inputs, q/K/V, attention output) and fp32 sum orders.
// The same source builds engine_gpu_emu_test: the same checks on the CPU-emulated CUDA
// runner (kernels/emu; fewer requests: tests/gpu/engine_gpu_workloads.h), which runs in CI.
//
// Comparison rule, per request (depth-wise and sequence-wise batching, 16 requests with
// staggered arrivals and chunked prefill):
//   - walk the generated tokens in order; a step is "clear" when the reference's top-1
//     margin (top1 - top2) / max(|top1|, 1) exceeds kGpuMargin (1e-2);
//   - up to the first unclear step (after which greedy paths may legitimately part), the
//     GPU's token equals the reference's, its loop count equals the reference's, and its
//     logits are within kGpuLogitTolerance (2e-2) of the reference's relative to the row's
//     scale max(max |logit|, 1) (testing::CompareWithReference and MaxScaledDiff in
//     tests/engine_harness: bf16 rounding errs in proportion to the row, so a per-logit rule
//     failed near-zero logits of rows whose largest is 16);
//   - a request whose prompt holds an early-exit decision within kGpuMargin of the threshold
//     is not compared (rounding may exit there at another loop, which changes the cache);
//   - a loop count that differs ends that request's comparison (a router score that sat at
//     its threshold, flipped by rounding); at most kMaxLoopFlips (5%) of compared steps may
//     end so, and at least kMinCompared (50%) of all generated steps must be compared, so
//     the test cannot pass by comparing nothing.
// Also: batch invariance for MoR, Relaxed, adaptive Ouro and adaptive Huginn (a request alone vs
// inside three mixed batches: identical tokens and bitwise identical logits), prefix caching for
// the same four (a request that starts from cached KV, shared full blocks and partial ones copied
// on the device, equals the same request on an engine without the cache, bit for bit), sampling
// on the device equal to the host sampler's, a 32-layer decode step's launch, copy and
// synchronisation counts with and without CUDA graphs, graphs on and off bitwise equal, every KV
// block back in the pool at the end, and the clear error for a shape the kernels do not take.
// With --cuda-gemm fixed (the fixed-order GEMM, kernels/fixed_gemm.cuh, for every projection):
// the reference comparison, batch invariance and no allocation after start-up; on the emulator,
// a shape cuBLASLt cannot pin runs on that kernel under --cuda-gemm auto and is an error naming
// it under --cuda-gemm cublaslt. With --cuda-attention-fold warp (per-warp keys in attention):
// the reference comparison, batch invariance and no allocation after start-up.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/reference/reference_model.h"
#include "engine/runtime/cuda_runner_registry.h"
#include "tests/engine_harness.h"
#include "tests/engine_sampling.h"
#include "tests/gpu/engine_gpu_workloads.h"
#include "tests/gpu/gpu_testutil.h"

#ifdef MORSERVE_EMULATED_RUNNER
#include "kernels/emu/cublaslt_emu.h"
#endif

namespace morserve {
namespace {

using testing::FamilyCase;
using testing::Greedy;
using ::testing::HasSubstr;
using testing::MakeWorkload;
using testing::RunResult;
using testing::Workload;

using testing::CompareWithReference;
using testing::ReferenceRuns;
using testing::RefRun;
using testing::Tally;

constexpr double kMaxLoopFlips = 0.05;
constexpr double kMinCompared = 0.5;

TinyModelSpec Spec(const std::string& family) { return testing::GpuModelSpec(family); }

// Relaxed with rank 13 on all seven projections: fused LoRA ranks 39 (q|k|v) and 26
// (gate|up), not multiples of 8, on every linear of the looped block.
TinyModelSpec RelaxedEveryProjection() {
  TinyModelSpec s = Spec("relaxed-lora");
  s.lora_rank = 13;
  s.lora_targets = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
  return s;
}

// Ouro in adaptive mode (tests/engine_harness.cc's ouro-adaptive): decode tokens leave at the
// exit gate after 1, 2 or 3 loops and copy their K/V entries into the later loops' slots.
TinyModelSpec OuroAdaptive() {
  TinyModelSpec s = Spec("ouro");
  s.exit_threshold = 0.55f;
  s.loop_mode = "adaptive";
  return s;
}

// The families of engine_test.cc (tests/engine_harness.cc) at the GPU shape, plus the
// rank-13 every-projection Relaxed model (the batched LoRA kernels' odd ranks) and adaptive
// Huginn with Huginn-0125's head_dim 96 (4 heads of 96, 2 kv heads).
std::vector<FamilyCase> GpuFamilies() {
  std::vector<FamilyCase> v = testing::EngineFamilies(Spec);
  v.push_back({"relaxed-lora-r13-every-projection", RelaxedEveryProjection()});
  for (const FamilyCase& c : testing::EngineFamilies(Spec)) {
    if (c.name != "huginn-adaptive") continue;
    FamilyCase hd96 = c;
    hd96.name = "huginn-adaptive-head-dim-96";
    hd96.spec.hidden = 4 * 96;
    v.push_back(hd96);
  }
  return v;
}

// One family of the engine test table at the GPU shape, by name.
FamilyCase GpuFamily(const std::string& name, const std::string& label) {
  for (FamilyCase& c : testing::EngineFamilies(Spec)) {
    if (c.name == name) return {label, c.spec};
  }
  ADD_FAILURE() << "no engine family " << name;
  return {label, Spec("vanilla")};
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

// The runner's counters before and after the steps that generate the 4th token of a greedy
// request with an 8-token prompt (a decode token), sampled on the device.
std::pair<RunnerCounters, RunnerCounters> FourthTokenCounters(Engine* engine, int vocab,
                                                              uint64_t seed) {
  GenerateRequest r = Greedy(testing::MakePrompts(1, 8, 8, vocab, seed)[0], 8);
  r.return_logits = false;
  EXPECT_TRUE(engine->Submit(r).ok());
  while (engine->stats().tokens_generated < 3) EXPECT_TRUE(engine->Step());
  const RunnerCounters before = engine->runner().counters();
  while (engine->stats().tokens_generated < 4) EXPECT_TRUE(engine->Step());
  return {before, engine->runner().counters()};
}

// Runs the workload on an engine made with cfg and compares it with the reference runs (the rule
// at the top); every KV block must be back in the pool. The runner's device counters after
// start-up and at the end go to *start and *end.
std::vector<RunResult> RunAndCompare(const std::shared_ptr<const ModelWeights>& weights,
                                     const Workload& w, const std::vector<RefRun>& refs,
                                     const EngineConfig& cfg, const std::string& label,
                                     RunnerCounters::Device* start, RunnerCounters::Device* end) {
  auto engine = Engine::Create(weights, cfg);
  EXPECT_TRUE(engine.ok()) << engine.status();
  if (!engine.ok()) return {};
  *start = (*engine)->runner().counters().device;
  auto got = testing::RunStaggered(engine->get(), w.requests, w.arrivals);
  Tally tally;
  CompareWithReference(refs, w.requests, got, label, &tally);
  std::printf("%s: %d of %d steps compared, %d loop flips\n", label.c_str(), tally.compared,
              tally.generated, tally.loop_flips);
  EXPECT_GE(tally.compared, kMinCompared * tally.generated)
      << label << ": too few clear steps compared";
  EXPECT_LE(tally.loop_flips, kMaxLoopFlips * std::max(tally.compared, 1))
      << label << ": router decisions differ";
  EXPECT_EQ((*engine)->kv_pool().num_free(), cfg.num_kv_blocks) << label << ": blocks leaked";
  *end = (*engine)->runner().counters().device;
  return got;
}

class EngineGpuTest : public ::testing::TestWithParam<FamilyCase> {
 protected:
  void SetUp() override { MORSERVE_SKIP_WITHOUT_GPU(); }
};

TEST_P(EngineGpuTest, DepthAndSequenceWiseMatchReference) {
  testing::TempDir dir;
  auto weights = testing::MakeModel(GetParam().spec, &dir);
  ASSERT_NE(weights, nullptr);
  const Workload w = MakeWorkload(weights->config.vocab_size, testing::EngineGpuRequests());
  const std::vector<RefRun> refs = ReferenceRuns(weights, w.requests);
  for (BatchingMode mode : {BatchingMode::kDepthWise, BatchingMode::kSequenceWise}) {
    const std::string label =
        GetParam().name + (mode == BatchingMode::kDepthWise ? " depth" : " sequence");
    RunnerCounters::Device start, end;
    const std::vector<RunResult> got =
        RunAndCompare(weights, w, refs, GpuConfig(mode), label, &start, &end);
    // Adaptive looped models: generated tokens leave at several loop counts (else the exit
    // path would go untested).
    std::map<int, int> exits;
    for (const RunResult& r : got)
      for (int l : r.loops) ++exits[l];
    if (GetParam().spec.loop_mode == "adaptive") {
      EXPECT_GE(exits.size(), 2u) << label << ": every token ran the same number of loops";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Families, EngineGpuTest, ::testing::ValuesIn(GpuFamilies()),
                         testing::FamilyCaseName);

// A request's tokens and logits are bit-identical alone and inside mixed-depth batches: MoR
// (rows leave at different depths), Relaxed (every loop's rows take their own LoRA adapter in
// the same launches), adaptive Ouro (exited rows' K/V copies ride the later loops) and
// adaptive Huginn (exit checks run coda and head inside the pass).
class EngineGpuInvarianceTest : public ::testing::TestWithParam<FamilyCase> {
 protected:
  void SetUp() override { MORSERVE_SKIP_WITHOUT_GPU(); }
};

TEST_P(EngineGpuInvarianceTest, AloneAndInMixedBatchesAreBitwiseEqual) {
  testing::TempDir dir;
  auto weights = testing::MakeModel(GetParam().spec, &dir);
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

INSTANTIATE_TEST_SUITE_P(Families, EngineGpuInvarianceTest,
                         ::testing::Values(FamilyCase{"mor_ec", Spec("mor-ec")},
                                           FamilyCase{"relaxed_lora_r13", RelaxedEveryProjection()},
                                           FamilyCase{"ouro_adaptive", OuroAdaptive()},
                                           GpuFamily("huginn-adaptive", "huginn_adaptive")),
                         [](const auto& info) { return info.param.name; });

class EngineGpuPrefixCacheTest : public ::testing::TestWithParam<FamilyCase> {
 protected:
  void SetUp() override { MORSERVE_SKIP_WITHOUT_GPU(); }
};

TEST_P(EngineGpuPrefixCacheTest, HitEqualsMissBitwise) {
  testing::TempDir dir;
  auto weights = testing::MakeModel(GetParam().spec, &dir);
  ASSERT_NE(weights, nullptr);
  const std::vector<int> base = testing::MakePrompts(1, 21, 21, weights->config.vocab_size, 7)[0];
  const GenerateRequest first = Greedy(base, 3);
  std::vector<int> longer(base.begin(), base.begin() + 18);
  longer.push_back(3);
  const GenerateRequest second = Greedy(longer, 6);
  for (BatchingMode mode : {BatchingMode::kDepthWise, BatchingMode::kSequenceWise}) {
    EngineConfig off = GpuConfig(mode);
    off.prefix_cache = false;
    auto miss_engine = Engine::Create(weights, off);
    ASSERT_TRUE(miss_engine.ok()) << miss_engine.status();
    const RunResult miss = testing::RunStaggered(miss_engine->get(), {second}, {0})[0];
    auto engine = Engine::Create(weights, GpuConfig(mode));
    ASSERT_TRUE(engine.ok()) << engine.status();
    testing::RunStaggered(engine->get(), {first}, {0});
    const RunResult hit = testing::RunStaggered(engine->get(), {second}, {0})[0];
    EXPECT_EQ(hit.usage.cached_tokens, 16);
    EXPECT_EQ(hit.tokens, miss.tokens);
    EXPECT_EQ(hit.loops, miss.loops);
    ASSERT_EQ(hit.logits.size(), miss.logits.size());
    for (size_t t = 0; t < miss.logits.size(); ++t) {
      EXPECT_EQ(hit.logits[t], miss.logits[t]) << "token " << t;
    }
    EXPECT_EQ((*engine)->kv_pool().num_free(), off.num_kv_blocks) << "blocks leaked";
  }
}

INSTANTIATE_TEST_SUITE_P(Families, EngineGpuPrefixCacheTest,
                         ::testing::Values(FamilyCase{"mor_ec", Spec("mor-ec")},
                                           FamilyCase{"relaxed_lora_r13", RelaxedEveryProjection()},
                                           FamilyCase{"ouro_adaptive", OuroAdaptive()},
                                           GpuFamily("huginn-adaptive", "huginn_adaptive")),
                         [](const auto& info) { return info.param.name; });

// Requests that need no logits on the host are sampled on the device (ModelRunner::Sample:
// only tokens and logprobs come back): the same tokens and loops as the host sampler on the
// same requests asking for logits, logprobs within 1e-4 (the device's log-partition sums in
// another order), and the runner counts every generated token as its own.
class EngineGpuSamplingTest : public ::testing::TestWithParam<FamilyCase> {
 protected:
  void SetUp() override { MORSERVE_SKIP_WITHOUT_GPU(); }
};

TEST_P(EngineGpuSamplingTest, DeviceSamplingMatchesHostSampling) {
  testing::TempDir dir;
  auto weights = testing::MakeModel(GetParam().spec, &dir);
  ASSERT_NE(weights, nullptr);
  const std::vector<GenerateRequest> requests =
      testing::RunnerSampledRequests(weights->config.vocab_size, 10);
  std::vector<int> arrivals;
  for (size_t i = 0; i < requests.size(); ++i) arrivals.push_back(static_cast<int>(i % 4));
  for (BatchingMode mode : {BatchingMode::kDepthWise, BatchingMode::kSequenceWise}) {
    auto run = [&](const std::vector<GenerateRequest>& reqs, int64_t* sampled) {
      auto engine = Engine::Create(weights, GpuConfig(mode));
      EXPECT_TRUE(engine.ok()) << engine.status();
      auto got = testing::RunStaggered(engine->get(), reqs, arrivals);
      *sampled = (*engine)->runner().counters().sampled_rows;
      return got;
    };
    int64_t on_device = 0, on_host = 0;
    const std::vector<RunResult> device = run(requests, &on_device);
    const std::vector<RunResult> host = run(testing::WithLogits(requests), &on_host);
    int64_t generated = 0;
    for (size_t i = 0; i < requests.size(); ++i) {
      EXPECT_EQ(device[i].tokens, host[i].tokens) << "request " << i;
      EXPECT_EQ(device[i].loops, host[i].loops) << "request " << i;
      ASSERT_EQ(device[i].logprobs.size(), host[i].logprobs.size());
      for (size_t t = 0; t < host[i].logprobs.size(); ++t) {
        EXPECT_NEAR(device[i].logprobs[t], host[i].logprobs[t], 1e-4)
            << "request " << i << " token " << t;
      }
      generated += static_cast<int64_t>(device[i].tokens.size());
    }
    EXPECT_EQ(on_device, generated);
    EXPECT_EQ(on_host, 0);
  }
}

INSTANTIATE_TEST_SUITE_P(Families, EngineGpuSamplingTest,
                         ::testing::Values(FamilyCase{"vanilla", Spec("vanilla")},
                                           FamilyCase{"mor_ec", Spec("mor-ec")}),
                         [](const auto& info) { return info.param.name; });

// What one decode step of a 32-layer model costs the host, counted by the runner
// (RunnerCounters::device). With CUDA graphs (the default) the segment's 32 layers are one
// graph launch, replayed (captured by an earlier step of the same shape); the embedding and
// the device sampling launch a few kernels of their own. Without graphs every layer launches
// its 11 kernels from the host. Either way: two uploads, the sampled token down, one
// synchronisation, no allocation.
class EngineGpuStepTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override { MORSERVE_SKIP_WITHOUT_GPU(); }
};

TEST_P(EngineGpuStepTest, DecodeStepLaunchesCopiesAndSyncs) {
  const bool graphs = GetParam();
  constexpr int kLayers = 32;
  TinyModelSpec spec = Spec("vanilla");
  spec.layers = kLayers;
  testing::TempDir dir;
  auto weights = testing::MakeModel(spec, &dir);
  ASSERT_NE(weights, nullptr);
  EngineConfig cfg = GpuConfig(BatchingMode::kDepthWise);
  cfg.cuda_graphs = graphs;
  auto engine = Engine::Create(weights, cfg);
  ASSERT_TRUE(engine.ok()) << engine.status();
  // One step: one decode row through every layer, then sampled.
  const auto [before, after] = FourthTokenCounters(engine->get(), weights->config.vocab_size, 5);
  ASSERT_EQ(after.full_rows - before.full_rows, kLayers);
  ASSERT_EQ(after.sampled_rows - before.sampled_rows, 1);
  const RunnerCounters::Device& a = after.device;
  const RunnerCounters::Device& b = before.device;
  std::printf(
      "decode step, %d layers, graphs %s: %lld launches + %lld graph launches (%lld captured), "
      "%lld + %lld copies (%lld + %lld bytes), %lld syncs, %lld allocations\n",
      kLayers, graphs ? "on" : "off", static_cast<long long>(a.launches - b.launches),
      static_cast<long long>(a.graph_launches - b.graph_launches),
      static_cast<long long>(a.graph_captures - b.graph_captures),
      static_cast<long long>(a.h2d_copies - b.h2d_copies),
      static_cast<long long>(a.d2h_copies - b.d2h_copies),
      static_cast<long long>(a.h2d_bytes - b.h2d_bytes),
      static_cast<long long>(a.d2h_bytes - b.d2h_bytes), static_cast<long long>(a.syncs - b.syncs),
      static_cast<long long>(a.allocations - b.allocations));
  // Outside the layers: the embedding and its scatter into the row's state, the sampling's
  // gather and its 5 (final norm, lm_head, sampling, argmax, exit confidence). The layers: the
  // segment's gather, 11 per layer and its scatter, or one replay of their graph.
  const int64_t outside = 2 + 1 + 5;
  if (graphs) {
    EXPECT_EQ(a.launches - b.launches, outside);
    EXPECT_EQ(a.graph_launches - b.graph_launches, 1);
    EXPECT_EQ(a.graph_captures - b.graph_captures, 0);  // the earlier decode steps' graph
    EXPECT_GE(a.graph_captures, 1);
  } else {
    EXPECT_EQ(a.launches - b.launches, outside + 11 * kLayers + 2);
    EXPECT_EQ(a.graph_launches, 0);
  }
  // The row's state stays on the device from the embedding to the sampling: two uploads (the
  // token's id and every layer's metadata with the segment, the sampling parameters), each
  // with the slots, the sampled token down, one synchronisation.
  EXPECT_EQ(a.h2d_copies - b.h2d_copies, 2);
  EXPECT_EQ(a.d2h_copies - b.d2h_copies, 1);
  EXPECT_EQ(a.syncs - b.syncs, 1);
  EXPECT_EQ(a.allocations - b.allocations, 0);
  // The sampled token came back, not the logits: a few bytes, whatever the vocabulary.
  EXPECT_LE(a.d2h_bytes - b.d2h_bytes, 64);
}

INSTANTIATE_TEST_SUITE_P(Graphs, EngineGpuStepTest, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "on" : "off"; });

// CUDA graphs change no bit: a staggered workload (prefill chunks, decode batches of every
// size up to the bucket limit, rows joining and leaving) gives the same tokens and bitwise
// the same logits with graphs on and off, for shared weights (vanilla, MoR: loop groups of
// mixed depth), per-loop weights and LoRA (Relaxed r13: the groups' GEMMs are in the key),
// adaptive Ouro (K/V-only rows: those passes launch eagerly) and adaptive Huginn; and the
// graphs ran (replays outnumber captures).
class EngineGpuGraphTest : public ::testing::TestWithParam<FamilyCase> {
 protected:
  void SetUp() override { MORSERVE_SKIP_WITHOUT_GPU(); }
};

TEST_P(EngineGpuGraphTest, GraphsOnAndOffAreBitwiseEqual) {
  testing::TempDir dir;
  auto weights = testing::MakeModel(GetParam().spec, &dir);
  ASSERT_NE(weights, nullptr);
  const Workload w = MakeWorkload(weights->config.vocab_size, 10);
  auto run = [&](bool graphs, RunnerCounters::Device* device) {
    EngineConfig cfg = GpuConfig(BatchingMode::kDepthWise);
    cfg.cuda_graphs = graphs;
    auto engine = Engine::Create(weights, cfg);
    EXPECT_TRUE(engine.ok()) << engine.status();
    auto got = testing::RunStaggered(engine->get(), w.requests, w.arrivals);
    *device = (*engine)->runner().counters().device;
    return got;
  };
  RunnerCounters::Device on, off;
  const std::vector<RunResult> eager = run(false, &off);
  const std::vector<RunResult> graphed = run(true, &on);
  ASSERT_EQ(eager.size(), graphed.size());
  for (size_t i = 0; i < eager.size(); ++i) {
    EXPECT_EQ(graphed[i].tokens, eager[i].tokens) << "request " << i;
    EXPECT_EQ(graphed[i].loops, eager[i].loops) << "request " << i;
    ASSERT_EQ(graphed[i].logits.size(), eager[i].logits.size()) << "request " << i;
    for (size_t t = 0; t < eager[i].logits.size(); ++t) {
      EXPECT_EQ(graphed[i].logits[t], eager[i].logits[t]) << "request " << i << " token " << t;
    }
  }
  std::printf("%s: %lld graph launches, %lld captures; %lld vs %lld direct launches\n",
              GetParam().name.c_str(), static_cast<long long>(on.graph_launches),
              static_cast<long long>(on.graph_captures), static_cast<long long>(on.launches),
              static_cast<long long>(off.launches));
  EXPECT_EQ(off.graph_launches, 0);
  EXPECT_GT(on.graph_captures, 0);
  EXPECT_GT(on.graph_launches, 2 * on.graph_captures);
  EXPECT_LT(on.launches, off.launches / 2);
}

INSTANTIATE_TEST_SUITE_P(Families, EngineGpuGraphTest,
                         ::testing::Values(GpuFamily("vanilla", "vanilla"),
                                           GpuFamily("mor-ec", "mor_ec"),
                                           FamilyCase{"relaxed_lora_r13", RelaxedEveryProjection()},
                                           FamilyCase{"ouro_adaptive", OuroAdaptive()},
                                           GpuFamily("huginn-adaptive", "huginn_adaptive")),
                         [](const auto& info) { return info.param.name; });

// A looped model's decode token (Recursive middle-cycle: unique first layer, shared middle
// block run num_recursions times, unique last layer) in depth-wise mode takes num_recursions
// steps and these runner calls: the embedding, the segment before the loop, one pass per loop,
// the segment after it, the sampling. Each uploads once (the embedding's ids ride with the
// segment before the loop); the state never leaves the device and only the sampled token comes
// back.
TEST(EngineGpuLoopedStepTest, LoopedDecodeTokenRoundTrips) {
  MORSERVE_SKIP_WITHOUT_GPU();
  testing::TempDir dir;
  auto weights = testing::MakeModel(Spec("recursive-middle-cycle"), &dir);
  ASSERT_NE(weights, nullptr);
  const LayerPlan& plan = weights->plan;
  ASSERT_GE(plan.looped_segment, 1);
  ASSERT_EQ(plan.segments.size(), static_cast<size_t>(plan.looped_segment) + 2);
  int64_t calls = 2;  // the embedding and the sampling
  for (int s = 0; s < static_cast<int>(plan.segments.size()); ++s) {
    calls += s == plan.looped_segment ? weights->config.recursion.num_recursions
                                      : plan.segments[s].loops;
  }
  auto engine = Engine::Create(weights, GpuConfig(BatchingMode::kDepthWise));
  ASSERT_TRUE(engine.ok()) << engine.status();
  const auto counters = FourthTokenCounters(engine->get(), weights->config.vocab_size, 7);
  const RunnerCounters::Device& before = counters.first.device;
  const RunnerCounters::Device& after = counters.second.device;
  std::printf(
      "looped decode token, %lld runner calls: %lld launches, %lld + %lld copies, %lld syncs\n",
      static_cast<long long>(calls), static_cast<long long>(after.launches - before.launches),
      static_cast<long long>(after.h2d_copies - before.h2d_copies),
      static_cast<long long>(after.d2h_copies - before.d2h_copies),
      static_cast<long long>(after.syncs - before.syncs));
  EXPECT_EQ(after.syncs - before.syncs, 1);
  EXPECT_EQ(after.d2h_copies - before.d2h_copies, 1);
  EXPECT_EQ(after.h2d_copies - before.h2d_copies, calls - 1);
  EXPECT_EQ(after.allocations - before.allocations, 0);
}

// The looped models' per-loop math stays on the device: a Nanbeige decode token (the norm
// between loops, ModelRunner::NormBetweenLoops) and a Huginn one (the scaled embedding, the
// input injection's join, ln_f before the coda) download only their sampled token and
// synchronise once; an adaptive Ouro token adds its gate logits (4 bytes per row and loop),
// never a state (hidden 256: 1 KiB per row).
TEST(EngineGpuLoopedStepTest, NormBetweenLoopsStaysOnTheDevice) {
  MORSERVE_SKIP_WITHOUT_GPU();
  for (const FamilyCase& c : {GpuFamily("nanbeige", "nanbeige"), GpuFamily("huginn-full", "huginn"),
                              FamilyCase{"ouro_adaptive", OuroAdaptive()}}) {
    SCOPED_TRACE(c.name);
    testing::TempDir dir;
    auto weights = testing::MakeModel(c.spec, &dir);
    ASSERT_NE(weights, nullptr);
    ASSERT_TRUE(weights->config.recursion.norm_between_loops ||
                weights->config.huginn.input_injection);
    auto engine = Engine::Create(weights, GpuConfig(BatchingMode::kDepthWise));
    ASSERT_TRUE(engine.ok()) << engine.status();
    const auto counters = FourthTokenCounters(engine->get(), weights->config.vocab_size, 11);
    const RunnerCounters::Device& before = counters.first.device;
    const RunnerCounters::Device& after = counters.second.device;
    const int64_t loops = weights->config.recursion.num_recursions;
    std::printf("%s decode token: %lld + %lld copies (%lld bytes down), %lld syncs\n",
                c.name.c_str(), static_cast<long long>(after.h2d_copies - before.h2d_copies),
                static_cast<long long>(after.d2h_copies - before.d2h_copies),
                static_cast<long long>(after.d2h_bytes - before.d2h_bytes),
                static_cast<long long>(after.syncs - before.syncs));
    const bool gate = c.name == "ouro_adaptive";
    EXPECT_LE(after.syncs - before.syncs, gate ? loops : 1);
    EXPECT_LE(after.d2h_copies - before.d2h_copies, gate ? loops : 1);
    EXPECT_LE(after.d2h_bytes - before.d2h_bytes, 64 + (gate ? 4 * loops : 0));
    EXPECT_EQ(after.allocations - before.allocations, 0);
  }
}

// Huginn's adaptive exit check stays on the device too (ModelRunner::HuginnExitKl): each check
// of a decode token (every recurrence but its last) downloads its KL statistic (8 bytes) and
// synchronises once for it, never a row of logits (vocab * 4 bytes), and the token is sampled on
// the device whether it exits early or not (one download of the sampled token); a token that
// exits at a check is sampled from the logits that check kept (SampleKept: no second LM head).
// Seeds 13, 5 and 3 give a 4th token that runs all 4 recurrences (3 checks), exits at the 2nd
// check, and exits at the 3rd (before the device check: 3120, 2048 and 3072 bytes down, 4, 2
// and 3 syncs).
TEST(EngineGpuLoopedStepTest, HuginnExitCheckStaysOnTheDevice) {
  MORSERVE_SKIP_WITHOUT_GPU();
  testing::TempDir dir;
  auto weights = testing::MakeModel(GpuFamily("huginn-adaptive", "huginn_adaptive").spec, &dir);
  ASSERT_NE(weights, nullptr);
  const int64_t max_checks = weights->config.recursion.num_recursions - 1;
  struct Case {
    uint64_t seed;
    int64_t checks;
    bool exits;  // at its last check, so sampled from the kept logits
  };
  for (const auto [seed, checks, exits] :
       {Case{13, 3, false}, Case{5, 2, true}, Case{3, 3, true}}) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    ASSERT_LE(checks, max_checks);
    auto engine = Engine::Create(weights, GpuConfig(BatchingMode::kDepthWise));
    ASSERT_TRUE(engine.ok()) << engine.status();
    const auto [before, after] =
        FourthTokenCounters(engine->get(), weights->config.vocab_size, seed);
    const RunnerCounters::Device& b = before.device;
    const RunnerCounters::Device& a = after.device;
    std::printf(
        "huginn adaptive decode token (seed %llu): %lld + %lld copies (%lld bytes down), "
        "%lld syncs\n",
        static_cast<unsigned long long>(seed), static_cast<long long>(a.h2d_copies - b.h2d_copies),
        static_cast<long long>(a.d2h_copies - b.d2h_copies),
        static_cast<long long>(a.d2h_bytes - b.d2h_bytes),
        static_cast<long long>(a.syncs - b.syncs));
    EXPECT_EQ(after.sampled_rows - before.sampled_rows, 1);  // early exit or not
    EXPECT_EQ(after.kept_logit_rows - before.kept_logit_rows, exits ? 1 : 0);
    EXPECT_EQ(a.syncs - b.syncs, 1 + checks);
    EXPECT_EQ(a.d2h_copies - b.d2h_copies, 1 + checks);
    EXPECT_LE(a.d2h_bytes - b.d2h_bytes, 64 + 8 * checks);
    EXPECT_EQ(a.allocations - b.allocations, 0);
  }
}

// Every step buffer is reserved when the engine is made (ReserveStepBuffers): a staggered
// workload of mixed prompt lengths, half of it asking for host logits, allocates nothing on
// the device or in pinned memory, for families with routers, LoRA, K/V-only rows, the norm
// between loops, Ouro's gate and Huginn's injection and exit checks (CUDA graphs captured
// meanwhile: their metadata buffer is reserved too).
class EngineGpuAllocationTest : public ::testing::TestWithParam<FamilyCase> {
 protected:
  void SetUp() override { MORSERVE_SKIP_WITHOUT_GPU(); }
};

TEST_P(EngineGpuAllocationTest, NoAllocationAfterStartUp) {
  testing::TempDir dir;
  auto weights = testing::MakeModel(GetParam().spec, &dir);
  ASSERT_NE(weights, nullptr);
  auto engine = Engine::Create(weights, GpuConfig(BatchingMode::kDepthWise));
  ASSERT_TRUE(engine.ok()) << engine.status();
  const int64_t before = (*engine)->runner().counters().device.allocations;
  Workload w = MakeWorkload(weights->config.vocab_size, 8);
  for (size_t i = 0; i < w.requests.size(); ++i) w.requests[i].return_logits = i % 2 == 0;
  const std::vector<RunResult> got = testing::RunStaggered(engine->get(), w.requests, w.arrivals);
  ASSERT_EQ(got.size(), w.requests.size());
  EXPECT_EQ((*engine)->runner().counters().device.allocations - before, 0);
}

INSTANTIATE_TEST_SUITE_P(Families, EngineGpuAllocationTest,
                         ::testing::Values(GpuFamily("vanilla", "vanilla"),
                                           GpuFamily("mor-ec", "mor_ec"),
                                           GpuFamily("mor-tc", "mor_tc"),
                                           FamilyCase{"relaxed_lora_r13", RelaxedEveryProjection()},
                                           GpuFamily("early-exit-propagate", "early_exit"),
                                           GpuFamily("nanbeige", "nanbeige"),
                                           FamilyCase{"ouro_adaptive", OuroAdaptive()},
                                           GpuFamily("huginn-adaptive", "huginn_adaptive")),
                         [](const auto& info) { return info.param.name; });

// The engine under `cfg` against the reference (RunAndCompare), then a request alone and inside
// a mixed batch (rows at other depths, prefill chunks): the same tokens and bitwise the same
// logits. The device counters around the reference run go to *start and *end.
void MatchesReferenceAndIsBatchInvariant(const std::shared_ptr<const ModelWeights>& weights,
                                         EngineConfig cfg, const std::string& label,
                                         RunnerCounters::Device* start,
                                         RunnerCounters::Device* end) {
  const Workload w = MakeWorkload(weights->config.vocab_size, testing::EngineGpuRequests());
  RunAndCompare(weights, w, ReferenceRuns(weights, w.requests), cfg, label, start, end);
  const int vocab = weights->config.vocab_size;
  const GenerateRequest probe = Greedy(testing::MakePrompts(1, 9, 9, vocab, 99)[0], 12);
  cfg.max_batch_rows = 16;
  cfg.max_step_tokens = 32;
  auto run = [&](const std::vector<GenerateRequest>& reqs, const std::vector<int>& arrivals) {
    auto engine = Engine::Create(weights, cfg);
    EXPECT_TRUE(engine.ok()) << engine.status();
    return testing::RunStaggered(engine->get(), reqs, arrivals);
  };
  const RunResult alone = run({probe}, {0})[0];
  Workload batch = MakeWorkload(vocab, 12);
  batch.requests.push_back(probe);
  batch.arrivals.push_back(2);
  const RunResult mixed = run(batch.requests, batch.arrivals).back();
  EXPECT_EQ(mixed.tokens, alone.tokens) << label;
  ASSERT_EQ(mixed.logits.size(), alone.logits.size()) << label;
  for (size_t t = 0; t < alone.logits.size(); ++t) {
    EXPECT_EQ(mixed.logits[t], alone.logits[t]) << label << " token " << t;
  }
}

// --cuda-gemm fixed: every projection, router-free LM head included, on the fixed-order GEMM.
class EngineGpuFixedGemmTest : public ::testing::TestWithParam<FamilyCase> {
 protected:
  void SetUp() override { MORSERVE_SKIP_WITHOUT_GPU(); }
};

TEST_P(EngineGpuFixedGemmTest, MatchesReferenceAndIsBatchInvariant) {
  testing::TempDir dir;
  auto weights = testing::MakeModel(GetParam().spec, &dir);
  ASSERT_NE(weights, nullptr);
  EngineConfig cfg = GpuConfig(BatchingMode::kDepthWise);
  cfg.cuda_gemm = CudaGemm::kFixed;
  RunnerCounters::Device start, end;
  ASSERT_NO_FATAL_FAILURE(
      MatchesReferenceAndIsBatchInvariant(weights, cfg, GetParam().name + " fixed", &start, &end));
  EXPECT_GT(end.fixed_gemm_calls, 0);
  EXPECT_EQ(end.allocations - start.allocations, 0) << "allocated after start-up";
}

INSTANTIATE_TEST_SUITE_P(Families, EngineGpuFixedGemmTest,
                         ::testing::Values(GpuFamily("vanilla", "vanilla"),
                                           GpuFamily("mor-ec", "mor_ec"),
                                           FamilyCase{"relaxed_lora_r13", RelaxedEveryProjection()},
                                           FamilyCase{"ouro_adaptive", OuroAdaptive()},
                                           GpuFamily("huginn-adaptive", "huginn_adaptive")),
                         [](const auto& info) { return info.param.name; });

// --cuda-attention-fold warp: the non-recurrent layers' attention with per-warp keys
// (kernels/attention_warp_fold.cuh), in every family whose attention it serves, graphs on.
class EngineGpuWarpFoldTest : public ::testing::TestWithParam<FamilyCase> {
 protected:
  void SetUp() override { MORSERVE_SKIP_WITHOUT_GPU(); }
};

TEST_P(EngineGpuWarpFoldTest, MatchesReferenceAndIsBatchInvariant) {
  testing::TempDir dir;
  auto weights = testing::MakeModel(GetParam().spec, &dir);
  ASSERT_NE(weights, nullptr);
  EngineConfig cfg = GpuConfig(BatchingMode::kDepthWise);
  cfg.cuda_attention_fold = CudaAttentionFold::kWarp;
  RunnerCounters::Device start, end;
  ASSERT_NO_FATAL_FAILURE(MatchesReferenceAndIsBatchInvariant(
      weights, cfg, GetParam().name + " warp fold", &start, &end));
  EXPECT_EQ(end.allocations - start.allocations, 0) << "allocated after start-up";
}

INSTANTIATE_TEST_SUITE_P(Families, EngineGpuWarpFoldTest,
                         ::testing::Values(GpuFamily("vanilla", "vanilla"),
                                           GpuFamily("mor-ec", "mor_ec"),
                                           FamilyCase{"ouro_adaptive", OuroAdaptive()},
                                           GpuFamily("huginn-adaptive", "huginn_adaptive")),
                         [](const auto& info) { return info.param.name; });

#ifdef MORSERVE_EMULATED_RUNNER
// The emulated cuBLASLt offers no algorithm common to every batch size for the fused gate/up
// projection (cublaslt_emu.h), as a real cuBLASLt may for some shape: --cuda-gemm auto runs that
// projection on the fixed-order GEMM (and still matches the reference), --cuda-gemm cublaslt
// refuses to start and names it.
TEST(EngineGpuFixedGemmFallbackTest, UnpinnableShapeRunsOnTheFixedGemmOrIsAnError) {
  testing::TempDir dir;
  auto weights = testing::MakeModel(Spec("vanilla"), &dir);
  ASSERT_NE(weights, nullptr);
  const int gate_up = 2 * weights->config.intermediate_size;
  cublaslt_emu::SetNoCommonAlgorithmRows(gate_up, /*others_run=*/false);
  struct Reset {
    ~Reset() { cublaslt_emu::SetNoCommonAlgorithmRows(0, true); }
  } reset;
  EngineConfig cfg = GpuConfig(BatchingMode::kDepthWise);
  cfg.cuda_gemm = CudaGemm::kCublasLt;
  auto refused = Engine::Create(weights, cfg);
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(std::string(refused.status().message()),
              HasSubstr(absl::StrCat(gate_up, " x ", weights->config.hidden_size, " projection")));
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("--cuda-gemm"));
  cfg.cuda_gemm = CudaGemm::kAuto;
  const Workload w = MakeWorkload(weights->config.vocab_size, testing::EngineGpuRequests());
  RunnerCounters::Device start, end;
  RunAndCompare(weights, w, ReferenceRuns(weights, w.requests), cfg, "vanilla, gate/up unpinned",
                &start, &end);
  EXPECT_GT(end.fixed_gemm_calls, 0);
}

// As an H200 with CUDA 13 does for every projection: the heuristic's offers for gate/up share
// no algorithm across batch sizes, but its kernels run at every batch size
// (cublasLtMatmulAlgoCheck). --cuda-gemm cublaslt pins one by the check and runs no fixed-order
// GEMM, and still matches the reference.
TEST(EngineGpuFixedGemmFallbackTest, OffersThatDifferWithBatchSizeStillPin) {
  testing::TempDir dir;
  auto weights = testing::MakeModel(Spec("vanilla"), &dir);
  ASSERT_NE(weights, nullptr);
  cublaslt_emu::SetNoCommonAlgorithmRows(2 * weights->config.intermediate_size,
                                         /*others_run=*/true);
  struct Reset {
    ~Reset() { cublaslt_emu::SetNoCommonAlgorithmRows(0, true); }
  } reset;
  EngineConfig cfg = GpuConfig(BatchingMode::kDepthWise);
  cfg.cuda_gemm = CudaGemm::kCublasLt;
  const Workload w = MakeWorkload(weights->config.vocab_size, testing::EngineGpuRequests());
  RunnerCounters::Device start, end;
  RunAndCompare(weights, w, ReferenceRuns(weights, w.requests), cfg, "vanilla, gate/up by check",
                &start, &end);
  EXPECT_EQ(end.fixed_gemm_calls, start.fixed_gemm_calls);
}
#endif

// `morserve bench --device cuda`'s MBU reference, registered with the runner: a positive
// finite rate, and errors that name the flags.
TEST(DeviceCopyBandwidthTest, MeasuresARateAndNamesBadFlags) {
  MORSERVE_SKIP_WITHOUT_GPU();
  const CudaCopyBandwidthFn copy_bandwidth = RegisteredCudaCopyBandwidth();
  ASSERT_NE(copy_bandwidth, nullptr);
  auto bw = copy_bandwidth(8, 2);
  ASSERT_TRUE(bw.ok()) << bw.status();
  EXPECT_GT(*bw, 0.0);
  EXPECT_TRUE(std::isfinite(*bw));
  EXPECT_THAT(std::string(copy_bandwidth(0, 1).status().message()), HasSubstr("--membw-mb"));
  EXPECT_THAT(std::string(copy_bandwidth(8, 0).status().message()), HasSubstr("--membw-passes"));
}

TEST(EngineGpuErrorTest, UnsupportedHeadDimIsAClearError) {
  MORSERVE_SKIP_WITHOUT_GPU();
  TinyModelSpec s = Spec("vanilla");
  s.hidden = 16 * s.heads;  // head_dim 16
  testing::TempDir dir;
  auto weights = testing::MakeModel(s, &dir);
  ASSERT_NE(weights, nullptr);
  auto engine = Engine::Create(weights, GpuConfig(BatchingMode::kDepthWise));
  ASSERT_FALSE(engine.ok());
  EXPECT_THAT(std::string(engine.status().message()), HasSubstr("head_dim 16"));
}

}  // namespace
}  // namespace morserve
