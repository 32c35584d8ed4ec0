// The engine against the reference implementation: every family the engine covers, both KV
// modes, depth-wise and sequence-wise batching, staggered arrivals, chunked prefill and
// forced preemption produce the reference's greedy tokens with logits within 1e-4 (relative
// to max(|logit|, 1), fp32 compute). Also batch invariance, KV accounting, cancellation and
// bad input.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "engine/reference/reference_model.h"
#include "tests/engine_harness.h"

namespace morserve {
namespace {

using testing::FamilyCase;
using testing::Greedy;
using ::testing::HasSubstr;
using testing::MakeWorkload;
using testing::RunResult;
using testing::Workload;

constexpr double kLogitTolerance = 1e-4;

TinyModelSpec Spec(const std::string& family) { return testing::F32Spec(family); }

// Checks engine results against the reference, request by request.
void ExpectMatchesReference(const ModelWeights& weights, const Workload& w,
                            const std::vector<RunResult>& got, const std::string& label) {
  auto shared = std::shared_ptr<const ModelWeights>(&weights, [](const ModelWeights*) {});
  ReferenceModel ref(shared);
  for (size_t i = 0; i < w.requests.size(); ++i) {
    const GenerateRequest& r = w.requests[i];
    std::vector<StepOutput> outs;
    const std::vector<int> want = ref.GenerateGreedy(r.prompt, r.params.max_tokens, &outs);
    ASSERT_EQ(got[i].tokens, want) << label << " request " << i;
    EXPECT_EQ(got[i].finish, FinishReason::kLength);
    EXPECT_EQ(got[i].usage.completion_tokens, r.params.max_tokens);
    EXPECT_EQ(got[i].usage.prompt_tokens, static_cast<int>(r.prompt.size()));
    int64_t loops = 0;
    for (size_t t = 0; t + 1 < r.prompt.size() + want.size(); ++t) loops += outs[t].trace.loops;
    for (size_t t = 0; t < want.size(); ++t) {
      const StepOutput& o = outs[r.prompt.size() - 1 + t];
      EXPECT_LE(testing::MaxRelDiff(got[i].logits[t], o.logits), kLogitTolerance)
          << label << " request " << i << " token " << t;
      EXPECT_EQ(got[i].loops[t], o.trace.loops) << label << " request " << i << " token " << t;
    }
    if (got[i].usage.preemptions == 0) EXPECT_EQ(got[i].usage.recursion_loops, loops) << label;
  }
}

class EngineFamilyTest : public ::testing::TestWithParam<FamilyCase> {};

TEST_P(EngineFamilyTest, DepthAndSequenceWiseMatchReference) {
  testing::TempDir dir;
  auto weights = testing::MakeModel(GetParam().spec, &dir);
  ASSERT_NE(weights, nullptr);
  const Workload w = MakeWorkload(weights->config.vocab_size);
  for (BatchingMode mode : {BatchingMode::kDepthWise, BatchingMode::kSequenceWise}) {
    EngineConfig cfg;
    cfg.mode = mode;
    cfg.max_batch_rows = 12;
    cfg.max_step_tokens = 10;  // prompts arrive in chunks
    cfg.block_size = 4;
    cfg.num_kv_blocks = 4096;
    auto engine = Engine::Create(weights, cfg);
    ASSERT_TRUE(engine.ok()) << engine.status();
    auto got = testing::RunStaggered(engine->get(), w.requests, w.arrivals);
    const std::string label =
        GetParam().name + (mode == BatchingMode::kDepthWise ? " depth" : " sequence");
    ExpectMatchesReference(*weights, w, got, label);
    EXPECT_EQ((*engine)->kv_pool().num_free(), cfg.num_kv_blocks) << label << ": blocks leaked";
    const EngineStats stats = (*engine)->stats();
    EXPECT_LE(stats.pass_rows, stats.pass_row_capacity) << label << ": a pass over the row limit";
    int64_t loop_rows = 0;
    for (int64_t v : stats.rows_per_loop) loop_rows += v;
    if (weights->plan.looped_segment >= 0) EXPECT_EQ(loop_rows, stats.pass_rows) << label;
  }
}

TEST_P(EngineFamilyTest, ForcedPreemptionChangesNothing) {
  testing::TempDir dir;
  auto weights = testing::MakeModel(GetParam().spec, &dir);
  ASSERT_NE(weights, nullptr);
  const Workload w = MakeWorkload(weights->config.vocab_size);
  EngineConfig cfg;
  cfg.max_batch_rows = 16;
  cfg.max_step_tokens = 64;
  cfg.block_size = 2;
  // Room for a few requests only: later ones preempt the newest and recompute.
  cfg.num_kv_blocks = weights->plan.num_cache_slots * 28;
  auto engine = Engine::Create(weights, cfg);
  ASSERT_TRUE(engine.ok()) << engine.status();
  auto got =
      testing::RunStaggered(engine->get(), w.requests, std::vector<int>(w.requests.size(), 0));
  EXPECT_GT((*engine)->stats().preemptions, 0) << "the pool was meant to be too small";
  ExpectMatchesReference(*weights, w, got, GetParam().name + " preempted");
  EXPECT_EQ((*engine)->kv_pool().num_free(), cfg.num_kv_blocks);
}

INSTANTIATE_TEST_SUITE_P(Families, EngineFamilyTest,
                         ::testing::ValuesIn(testing::EngineFamilies(Spec)),
                         testing::FamilyCaseName);

EngineConfig SmallConfig() {
  EngineConfig cfg;
  cfg.max_batch_rows = 16;
  cfg.max_step_tokens = 32;
  cfg.block_size = 4;
  cfg.num_kv_blocks = 2048;
  return cfg;
}

// A request's tokens and logits are bit-identical alone and inside mixed-depth batches (MoR
// exits; early exits whose K/V-only rows share the passes with full rows; Ouro's gate exits
// whose copy-on-exit rows do; Huginn's KL exits, whose checks run the coda in the pass).
class BatchInvarianceTest : public ::testing::TestWithParam<FamilyCase> {};

std::vector<FamilyCase> BatchInvarianceFamilies() {
  TinyModelSpec early = Spec("early-exit");
  early.exit_kv = "propagate";
  early.exit_threshold = 0.2f;
  // K/V-only rows through per-loop attention copies and LoRA on q, k and v.
  TinyModelSpec untied_lora = early;
  untied_lora.untied_attention = true;
  untied_lora.lora_rank = 4;
  untied_lora.lora_targets = {"q_proj", "k_proj", "v_proj"};
  // Ouro adaptive: decode tokens exit at the gate and their copy-on-exit rows share passes.
  TinyModelSpec ouro = Spec("ouro");
  ouro.exit_threshold = 0.55f;
  ouro.loop_mode = "adaptive";
  // Huginn adaptive (the family suite's): exits by the KL rule, the exit check's coda runs
  // inside the pass.
  TinyModelSpec huginn;
  for (const FamilyCase& c : testing::EngineFamilies(Spec))
    if (c.name == "huginn-adaptive") huginn = c.spec;
  return {{"mor-ec", Spec("mor-ec")},
          {"early-exit-propagate", early},
          {"early-exit-propagate-untied-lora", untied_lora},
          {"ouro-adaptive", ouro},
          {"huginn-adaptive", huginn}};
}

TEST_P(BatchInvarianceTest, AloneEqualsMixed) {
  testing::TempDir dir;
  auto weights = testing::MakeModel(GetParam().spec, &dir);
  ASSERT_NE(weights, nullptr);
  const int vocab = weights->config.vocab_size;
  GenerateRequest probe = Greedy(testing::MakePrompts(1, 9, 9, vocab, 99)[0], 12);
  GenerateRequest sampled = probe;
  sampled.params.temperature = 0.9f;
  sampled.params.top_p = 0.95f;
  sampled.params.seed = 1234;
  sampled.request_id = "sampled";

  auto run = [&](const std::vector<GenerateRequest>& reqs, const std::vector<int>& arrivals) {
    auto engine = Engine::Create(weights, SmallConfig());
    EXPECT_TRUE(engine.ok());
    return testing::RunStaggered(engine->get(), reqs, arrivals);
  };
  const RunResult alone = run({probe}, {0})[0];
  const int nr = weights->config.recursion.num_recursions;
  EXPECT_TRUE(std::any_of(alone.loops.begin(), alone.loops.end(), [&](int l) { return l < nr; }))
      << "the probe has no early exit: mixed depths untested";
  const RunResult sampled_alone = run({sampled}, {0})[0];
  for (int variant = 0; variant < 3; ++variant) {
    Workload w = MakeWorkload(vocab, 8 + 4 * variant);
    w.requests.push_back(probe);
    w.arrivals.push_back(variant * 2);
    w.requests.push_back(sampled);
    w.arrivals.push_back(variant);
    auto got = run(w.requests, w.arrivals);
    const RunResult& mixed = got[got.size() - 2];
    EXPECT_EQ(mixed.tokens, alone.tokens) << "variant " << variant;
    for (size_t t = 0; t < alone.logits.size(); ++t) {
      EXPECT_EQ(mixed.logits[t], alone.logits[t]) << "variant " << variant << " token " << t;
    }
    EXPECT_EQ(got.back().tokens, sampled_alone.tokens) << "seeded sampling, variant " << variant;
  }
}

// The same long prompt in one prefill chunk and in chunks of 3 (K/V-only rows then share
// passes with other chunks' full rows in other groupings): bit-identical tokens and logits.
TEST_P(BatchInvarianceTest, ChunkedPrefillEqualsWhole) {
  testing::TempDir dir;
  auto weights = testing::MakeModel(GetParam().spec, &dir);
  ASSERT_NE(weights, nullptr);
  const GenerateRequest probe =
      Greedy(testing::MakePrompts(1, 40, 40, weights->config.vocab_size, 5)[0], 6);
  auto run = [&](int step_tokens) {
    EngineConfig cfg = SmallConfig();
    cfg.max_step_tokens = step_tokens;
    auto engine = Engine::Create(weights, cfg);
    EXPECT_TRUE(engine.ok());
    return testing::RunStaggered(engine->get(), {probe}, {0})[0];
  };
  const RunResult whole = run(64), chunked = run(3);
  EXPECT_EQ(chunked.tokens, whole.tokens);
  ASSERT_EQ(chunked.logits.size(), whole.logits.size());
  for (size_t t = 0; t < whole.logits.size(); ++t)
    EXPECT_EQ(chunked.logits[t], whole.logits[t]) << "token " << t;
}

INSTANTIATE_TEST_SUITE_P(Families, BatchInvarianceTest,
                         ::testing::ValuesIn(BatchInvarianceFamilies()), testing::FamilyCaseName);

// Recursion-wise caching: each (loop, layer) slot holds exactly the tokens that reached it.
TEST(EngineTest, RecursionWiseSlotsHoldOnlyTokensThatReachedThem) {
  testing::TempDir dir;
  auto weights = testing::MakeModel(Spec("mor-ec"), &dir);
  ASSERT_NE(weights, nullptr);
  const std::vector<int> prompt = testing::MakePrompts(1, 20, 20, weights->config.vocab_size, 5)[0];
  auto engine = Engine::Create(weights, SmallConfig());
  ASSERT_TRUE(engine.ok());
  GenerateRequest r = Greedy(prompt, 30);
  r.request_id = "probe";
  auto ch = (*engine)->Submit(r);
  ASSERT_TRUE(ch.ok());
  for (int i = 0; i < 12; ++i) (*engine)->Step();
  const Sequence* seq = (*engine)->scheduler().running().at(0).get();
  // Reference run over the tokens whose forward completed.
  ReferenceModel ref(weights);
  const int done = seq->num_done;
  ASSERT_GT(done, static_cast<int>(prompt.size()));
  std::vector<int> loops;
  for (int t = 0; t < done; ++t) loops.push_back(ref.Step(seq->tokens[t]).trace.loops);
  const LayerPlan& plan = weights->plan;
  const int seg = plan.looped_segment;
  for (int loop = 0; loop < plan.segments[seg].loops; ++loop) {
    int reached = 0, in_flight = 0;
    for (int t = 0; t < done; ++t) reached += loops[t] > loop;
    for (const Row& row : (*engine)->scheduler().loop_rows()) in_flight += row.loop > loop;
    for (const auto& [pos, row] : seq->pending_tail) in_flight += row.loop > loop;
    for (int k = 0; k < plan.segments[seg].num_layers; ++k) {
      const int slot = plan.CacheSlot(seg, loop, k);
      EXPECT_EQ(seq->kv->slot(slot).num_tokens(), reached + in_flight)
          << "loop " << loop << " layer " << k;
      EXPECT_EQ(seq->kv->slot(slot).num_tokens(), ref.SlotEntries(slot) + in_flight);
    }
  }
  (*engine)->Cancel("probe");
  (*engine)->RunUntilIdle();
  EXPECT_EQ((*engine)->kv_pool().num_free(), SmallConfig().num_kv_blocks);
}

TEST(EngineTest, CancelFreesBlocksAndLeavesOthersAlone) {
  testing::TempDir dir;
  auto weights = testing::MakeModel(Spec("mor-ec"), &dir);
  ASSERT_NE(weights, nullptr);
  auto engine = Engine::Create(weights, SmallConfig());
  ASSERT_TRUE(engine.ok());
  const auto prompts = testing::MakePrompts(3, 5, 12, weights->config.vocab_size, 3);
  GenerateRequest victim = Greedy(prompts[0], 100);
  victim.request_id = "victim";
  auto v = (*engine)->Submit(victim);
  auto a = (*engine)->Submit(Greedy(prompts[1], 10));
  ASSERT_TRUE(v.ok() && a.ok());
  for (int i = 0; i < 6; ++i) (*engine)->Step();
  (*engine)->Cancel("victim");
  (*engine)->RunUntilIdle();
  const RunResult vr = testing::Collect(v->get());
  EXPECT_EQ(vr.finish, FinishReason::kCancelled);
  // A front end that ends a request on a stop string cancels it with reason kStop.
  GenerateRequest stopped = Greedy(prompts[2], 100);
  stopped.request_id = "stopped";
  auto st = (*engine)->Submit(stopped);
  ASSERT_TRUE(st.ok());
  for (int i = 0; i < 4; ++i) (*engine)->Step();
  (*engine)->Cancel("stopped", FinishReason::kStop);
  (*engine)->RunUntilIdle();
  EXPECT_EQ(testing::Collect(st->get()).finish, FinishReason::kStop);
  EXPECT_LT(vr.tokens.size(), 100u);
  const RunResult ar = testing::Collect(a->get());
  ReferenceModel ref(weights);
  EXPECT_EQ(ar.tokens, ref.GenerateGreedy(prompts[1], 10));
  EXPECT_EQ((*engine)->kv_pool().num_free(), SmallConfig().num_kv_blocks);
}

TEST(EngineTest, RejectsBadInputWithoutDisturbingOthers) {
  testing::TempDir dir;
  TinyModelSpec spec = Spec("mor-ec");
  spec.max_pos = 64;
  auto weights = testing::MakeModel(spec, &dir);
  ASSERT_NE(weights, nullptr);
  auto engine = Engine::Create(weights, SmallConfig());
  ASSERT_TRUE(engine.ok());
  const std::vector<int> ok_prompt = {1, 2, 3, 4};
  auto good = (*engine)->Submit(Greedy(ok_prompt, 8));
  ASSERT_TRUE(good.ok());
  struct Bad {
    GenerateRequest r;
    absl::StatusCode code;
    const char* field;
  };
  std::vector<Bad> bad;
  bad.push_back({Greedy({}, 4), absl::StatusCode::kInvalidArgument, "prompt"});
  bad.push_back(
      {Greedy(std::vector<int>(64, 1), 1), absl::StatusCode::kFailedPrecondition, "prompt"});
  bad.push_back({Greedy(ok_prompt, 0), absl::StatusCode::kInvalidArgument, "max_tokens"});
  bad.push_back({Greedy(ok_prompt, 61), absl::StatusCode::kInvalidArgument, "max_tokens"});
  bad.push_back({Greedy({1, 999}, 4), absl::StatusCode::kInvalidArgument, "prompt"});
  GenerateRequest t = Greedy(ok_prompt, 4);
  t.params.temperature = -1;
  bad.push_back({t, absl::StatusCode::kInvalidArgument, "temperature"});
  t = Greedy(ok_prompt, 4);
  t.params.top_p = 0;
  bad.push_back({t, absl::StatusCode::kInvalidArgument, "top_p"});
  t = Greedy(ok_prompt, 4);
  t.exit_threshold = -0.5f;
  bad.push_back({t, absl::StatusCode::kInvalidArgument, "exit_threshold"});
  for (const Bad& b : bad) {
    auto s = (*engine)->Submit(b.r);
    ASSERT_FALSE(s.ok()) << b.field;
    EXPECT_EQ(s.status().code(), b.code) << b.field << ": " << s.status();
    EXPECT_THAT(std::string(s.status().message()), HasSubstr(b.field));
  }
  (*engine)->RunUntilIdle();
  ReferenceModel ref(weights);
  EXPECT_EQ(testing::Collect(good->get()).tokens, ref.GenerateGreedy(ok_prompt, 8));
}

TEST(EngineTest, QueueLimitRejectsWithResourceExhausted) {
  testing::TempDir dir;
  auto weights = testing::MakeModel(Spec("vanilla"), &dir);
  ASSERT_NE(weights, nullptr);
  EngineConfig cfg = SmallConfig();
  cfg.max_queue = 2;
  cfg.max_running = 1;
  auto engine = Engine::Create(weights, cfg);
  ASSERT_TRUE(engine.ok());
  std::vector<std::shared_ptr<EventChannel>> accepted;
  for (int i = 0; i < 3; ++i) {
    auto ch = (*engine)->Submit(Greedy({1, 2, 3}, 3));
    ASSERT_TRUE(ch.ok());
    accepted.push_back(*ch);
  }
  auto rejected = (*engine)->Submit(Greedy({1, 2, 3}, 3));
  ASSERT_FALSE(rejected.ok());
  EXPECT_EQ(rejected.status().code(), absl::StatusCode::kResourceExhausted);
  (*engine)->RunUntilIdle();
  for (auto& ch : accepted) EXPECT_EQ(testing::Collect(ch.get()).tokens.size(), 3u);
}

// The engine thread serves concurrent submitters.
TEST(EngineTest, EngineThreadServesConcurrentRequests) {
  testing::TempDir dir;
  auto weights = testing::MakeModel(Spec("mor-tc"), &dir);
  ASSERT_NE(weights, nullptr);
  auto engine = Engine::Create(weights, SmallConfig());
  ASSERT_TRUE(engine.ok());
  (*engine)->Start();
  const auto prompts = testing::MakePrompts(8, 1, 16, weights->config.vocab_size, 11);
  std::vector<std::shared_ptr<EventChannel>> chans;
  for (const auto& p : prompts) chans.push_back(*(*engine)->Submit(Greedy(p, 7)));
  ReferenceModel ref(weights);
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_EQ(testing::Collect(chans[i].get()).tokens, ref.GenerateGreedy(prompts[i], 7));
  }
  (*engine)->Stop();
}

}  // namespace
}  // namespace morserve

namespace morserve {
namespace {

// exit_kv propagate with recurrent layers is refused at load, not served with wrong K/V.
TEST(EngineTest, RefusesEarlyExitPropagateOnRecurrentLayers) {
  testing::TempDir dir;
  TinyModelSpec spec = Spec("early-exit");
  spec.exit_kv = "propagate";
  spec.layer_kind = "recurrent";
  auto weights = testing::MakeModel(spec, &dir);
  ASSERT_NE(weights, nullptr);
  auto engine = Engine::Create(weights, SmallConfig());
  ASSERT_FALSE(engine.ok());
  EXPECT_EQ(engine.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(std::string(engine.status().message()), HasSubstr("exit_kv"));
}

}  // namespace
}  // namespace morserve
