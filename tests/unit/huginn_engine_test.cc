// Huginn-0125 in the engine (docs/models.md#huginn-0125): adaptive depth under depth-wise and
// sequence-wise batching exits at several recurrences by the KL rule, its core entries equal
// the reference's and its copies on exit equal the exit recurrence's entries bit for bit (made by
// copying: the runner computes no row for them), its coda entries hold the last exit check's
// values; a request's mode, exit_threshold, num_steps and init_scale (with its seed) override
// looped.json and change only that request; bad parameters are errors that name them; a token
// that leaves at an exit check is sampled from the logits that check kept. The CUDA
// runner's Huginn is checked by tests/gpu/engine_gpu_test (also on the emulator).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>

#include "engine/reference/reference_model.h"
#include "tests/engine_harness.h"

namespace morserve {
namespace {

using testing::Greedy;
using ::testing::HasSubstr;

constexpr int kSteps = 4;
constexpr double kLogitTolerance = 1e-4;
// The tiny random model's state moves a lot per recurrence: KL between successive exit checks
// runs 0.2-8 nats; this threshold lets decode tokens leave after 1, 2 and 3 recurrences and
// run all 4 too.
constexpr float kThreshold = 3.7f;

TinyModelSpec HuginnSpec(const std::string& loop_mode) {
  TinyModelSpec s = testing::F32Spec("huginn");
  s.prelude_layers = 1;
  s.coda_layers = 1;
  s.recursions = kSteps;
  s.layers = 1 + 2 * kSteps + 1;
  s.exit_threshold = kThreshold;
  s.loop_mode = loop_mode;
  return s;
}

EngineConfig Config(BatchingMode mode) {
  EngineConfig cfg;
  cfg.mode = mode;
  cfg.max_batch_rows = 12;
  cfg.max_step_tokens = 10;
  cfg.block_size = 4;
  cfg.num_kv_blocks = 4096;
  return cfg;
}

const char* Name(BatchingMode mode) {
  return mode == BatchingMode::kDepthWise ? "depth" : "sequence";
}

ReferenceOptions Options(const GenerateRequest& r) {
  ReferenceOptions o;
  o.loop_mode = r.loop_mode;
  o.exit_threshold = r.exit_threshold;
  o.num_steps = r.num_steps;
  o.init_scale = r.init_scale;
  o.seed = r.params.seed.value_or(0);
  return o;
}

void ExpectMatchesReference(const std::shared_ptr<const ModelWeights>& w,
                            const std::vector<GenerateRequest>& requests,
                            const std::vector<testing::RunResult>& got, const std::string& label) {
  for (size_t i = 0; i < requests.size(); ++i) {
    const GenerateRequest& r = requests[i];
    ReferenceModel ref(w, Options(r));
    std::vector<StepOutput> outs;
    ASSERT_EQ(got[i].tokens, ref.GenerateGreedy(r.prompt, r.params.max_tokens, &outs))
        << label << " request " << i;
    for (size_t t = 0; t < got[i].tokens.size(); ++t) {
      const StepOutput& o = outs[r.prompt.size() - 1 + t];
      EXPECT_EQ(got[i].loops[t], o.trace.loops) << label << " request " << i << " token " << t;
      if (!r.return_logits) continue;  // sampled on the runner: only its token comes back
      EXPECT_LE(testing::MaxRelDiff(got[i].logits[t], o.logits), kLogitTolerance)
          << label << " request " << i << " token " << t;
    }
  }
}

// Mid-run, every core entry of a running request against the reference's, copies on exit
// bitwise (testing::ExpectLoopSlotsMatchReference), and the coda entry of every done position
// against the reference's (its last exit check's or tail's write; 1e-4). Returns the number of
// copies checked.
int ExpectSlotsMatchReference(const Engine& engine, const Sequence& seq, const std::string& label) {
  const ModelWeights& w = engine.weights();
  ReferenceModel ref(std::shared_ptr<const ModelWeights>(&w, [](const ModelWeights*) {}));
  const int copies = testing::ExpectLoopSlotsMatchReference(engine, seq, ref, label);
  const int coda = w.plan.CacheSlot(w.plan.looped_segment + 1, 0, 0);
  const auto& want = ref.SlotContents(coda);
  const KvBlockTable& table = seq.kv->slot(coda);
  std::vector<float> key(w.config.kv_dim()), value(w.config.kv_dim());
  for (int p = 0; p < seq.num_done; ++p) {
    const int index = table.IndexOf(p);
    if (index < 0 || p >= static_cast<int>(want.size())) {
      ADD_FAILURE() << label << ": no coda entry at " << p;
      continue;
    }
    engine.runner().ReadKv(table.PhysicalSlot(index), key.data(), value.data());
    EXPECT_LE(testing::MaxRelDiff(key, want[p].k), 1e-4) << label << " coda position " << p;
    EXPECT_LE(testing::MaxRelDiff(value, want[p].v), 1e-4) << label << " coda position " << p;
  }
  return copies;
}

TEST(HuginnEngineTest, AdaptiveExitsAtSeveralDepthsAndCopiesEntriesOnExit) {
  testing::TempDir dir;
  auto weights = testing::MakeModel(HuginnSpec("adaptive"), &dir);
  ASSERT_NE(weights, nullptr);
  const auto prompts = testing::MakePrompts(4, 3, 12, weights->config.vocab_size, 21);
  for (BatchingMode mode : {BatchingMode::kDepthWise, BatchingMode::kSequenceWise}) {
    auto engine = Engine::Create(weights, Config(mode));
    ASSERT_TRUE(engine.ok()) << engine.status();
    for (const auto& p : prompts) ASSERT_TRUE((*engine)->Submit(Greedy(p, 40)).ok());
    for (int i = 0; i < 30; ++i) (*engine)->Step();
    const auto& running = (*engine)->scheduler().running();
    ASSERT_EQ(running.size(), prompts.size()) << "a request finished or was preempted early";
    int copies = 0, early = 0;
    std::map<int, int> depths;
    for (const auto& seq : running) {
      copies += ExpectSlotsMatchReference(**engine, *seq, Name(mode));
      for (int p = seq->num_prompt; p < seq->num_done; ++p) {
        ++depths[seq->token_loops[p]];
        early += seq->token_loops[p] < kSteps ? 1 : 0;
      }
      for (int p = 0; p < seq->num_prompt; ++p)
        EXPECT_EQ(seq->token_loops[p], kSteps) << "prompt at full depth";
    }
    EXPECT_GT(copies, 0) << Name(mode);
    EXPECT_GE(depths.size(), 3u) << Name(mode) << ": decode tokens should exit at several depths";
    const RunnerCounters rows = (*engine)->stats().layer_rows;
    EXPECT_EQ(rows.kv_only_rows, 0) << Name(mode);
    // Every decode token that left at an exit check was sampled from the logits that check
    // kept (no second LM head); the others from their state.
    EXPECT_GT(early, 0) << Name(mode);
    EXPECT_EQ(rows.kept_logit_rows, early) << Name(mode);
  }
}

// looped.json says adaptive (or full); requests ask for the other mode, their own threshold,
// fewer recurrences, a nonzero initial state drawn from their seed. Each gets the reference's
// tokens, loop counts and logits (for those that return logits; the others are sampled on the
// runner) for its own parameters, whatever its neighbours asked for.
TEST(HuginnEngineTest, RequestParametersOverrideTheModelDefault) {
  testing::TempDir dir;
  for (const char* model_mode : {"adaptive", "full"}) {
    auto weights = testing::MakeModel(HuginnSpec(model_mode), &dir);
    ASSERT_NE(weights, nullptr);
    const auto prompts = testing::MakePrompts(8, 2, 14, weights->config.vocab_size, 5);
    std::vector<GenerateRequest> requests;
    std::vector<int> arrivals;
    for (size_t i = 0; i < prompts.size(); ++i) {
      GenerateRequest r = Greedy(prompts[i], 8);
      // Half sampled on the runner (a token leaving at an exit check: from the logits it kept).
      r.return_logits = i % 2 == 1;
      if (i % 4 == 1) r.loop_mode = LoopMode::kFull;
      if (i % 4 == 2) r.loop_mode = LoopMode::kAdaptive;
      if (i == 3) r.exit_threshold = 10 * kThreshold;
      if (i == 5) r.num_steps = 2;
      if (i == 6) {
        r.init_scale = 1.0f;
        r.params.seed = 77;
        r.loop_mode = LoopMode::kAdaptive;
      }
      if (i == 7) r.num_steps = 1;
      requests.push_back(r);
      arrivals.push_back(static_cast<int>(i));
    }
    for (BatchingMode mode : {BatchingMode::kDepthWise, BatchingMode::kSequenceWise}) {
      auto engine = Engine::Create(weights, Config(mode));
      ASSERT_TRUE(engine.ok()) << engine.status();
      const auto got = testing::RunStaggered(engine->get(), requests, arrivals);
      const std::string label = std::string(model_mode) + " " + Name(mode);
      ExpectMatchesReference(weights, requests, got, label);
      for (int t : got[1].loops) EXPECT_EQ(t, kSteps) << label << ": full depth asked";
      for (int t : got[5].loops) EXPECT_LE(t, 2) << label << ": num_steps 2";
      for (int t : got[7].loops) EXPECT_EQ(t, 1) << label << ": num_steps 1";
      EXPECT_EQ((*engine)->kv_pool().num_free(), Config(mode).num_kv_blocks) << label;
    }
  }
}

// The initial state matters: init_scale 1 with two seeds gives two different continuations
// (each the reference's), init_scale 0 ignores the seed.
TEST(HuginnEngineTest, InitialStateFollowsScaleAndSeed) {
  testing::TempDir dir;
  auto weights = testing::MakeModel(HuginnSpec("full"), &dir);
  ASSERT_NE(weights, nullptr);
  const auto prompt = testing::MakePrompts(1, 6, 6, weights->config.vocab_size, 3)[0];
  std::vector<GenerateRequest> requests;
  for (auto [scale, seed] :
       {std::pair{0.0f, 1}, std::pair{0.0f, 2}, std::pair{1.0f, 1}, std::pair{1.0f, 2}}) {
    GenerateRequest r = Greedy(prompt, 6);
    r.init_scale = scale;
    r.params.seed = seed;
    requests.push_back(r);
  }
  auto engine = Engine::Create(weights, Config(BatchingMode::kDepthWise));
  ASSERT_TRUE(engine.ok()) << engine.status();
  const auto got = testing::RunStaggered(engine->get(), requests, {0, 0, 1, 1});
  ExpectMatchesReference(weights, requests, got, "init");
  EXPECT_EQ(got[0].logits, got[1].logits) << "zeros: the seed plays no part";
  EXPECT_NE(got[2].logits, got[3].logits) << "a drawn state depends on the seed";
  EXPECT_NE(got[0].logits, got[2].logits);
}

TEST(HuginnEngineTest, BadParametersAreErrorsThatNameThem) {
  testing::TempDir dir;
  auto weights = testing::MakeModel(HuginnSpec("adaptive"), &dir);
  ASSERT_NE(weights, nullptr);
  auto engine = Engine::Create(weights, Config(BatchingMode::kDepthWise));
  ASSERT_TRUE(engine.ok()) << engine.status();
  GenerateRequest r = Greedy({1, 2, 3}, 4);
  for (int steps : {0, kSteps + 1}) {
    r.num_steps = steps;
    auto s = (*engine)->Submit(r);
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(s.status().message(), HasSubstr("num_steps"));
  }
  r.num_steps.reset();
  r.init_scale = -1.0f;
  EXPECT_THAT((*engine)->Submit(r).status().message(), HasSubstr("init_scale"));

  testing::TempDir other;
  auto vanilla = testing::MakeModel(testing::F32Spec("vanilla"), &other);
  auto plain = Engine::Create(vanilla, Config(BatchingMode::kDepthWise));
  ASSERT_TRUE(plain.ok());
  GenerateRequest v = Greedy({1, 2, 3}, 4);
  v.num_steps = 2;
  auto s = (*plain)->Submit(v);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.status().message(), HasSubstr("num_steps: only Huginn-0125"));
}

}  // namespace
}  // namespace morserve
