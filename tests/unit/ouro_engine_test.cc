// Ouro in the engine (docs/models.md#serving-looped-checkpoints): adaptive depth under
// depth-wise and sequence-wise batching exits at several loops, its copy-on-exit entries equal
// the reference's bit for bit and are copies (the runner computes no row for them), a request's
// mode and threshold override looped.json, and the prefix cache shares only prompt blocks of
// adaptive requests.
#include <gtest/gtest.h>

#include <map>

#include "engine/reference/reference_model.h"
#include "tests/engine_harness.h"

namespace morserve {
namespace {

using testing::Greedy;

constexpr int kLoops = 4;
constexpr double kLogitTolerance = 1e-4;

TinyModelSpec OuroSpec(const std::string& loop_mode) {
  TinyModelSpec s = testing::F32Spec("ouro");
  s.recursions = kLoops;
  s.layers = 2 * kLoops;
  s.exit_threshold = 0.55f;  // random gates: exits after 1, 2 and 3 loops
  s.loop_mode = loop_mode;
  return s;
}

EngineConfig Config(BatchingMode mode, bool prefix_cache = false) {
  EngineConfig cfg;
  cfg.mode = mode;
  cfg.max_batch_rows = 12;
  cfg.max_step_tokens = 10;
  cfg.block_size = 4;
  cfg.num_kv_blocks = 4096;
  cfg.prefix_cache = prefix_cache;
  return cfg;
}

const char* Name(BatchingMode mode) {
  return mode == BatchingMode::kDepthWise ? "depth" : "sequence";
}

ReferenceOptions Options(const GenerateRequest& r) {
  ReferenceOptions o;
  o.loop_mode = r.loop_mode;
  o.exit_threshold = r.exit_threshold;
  return o;
}

// Tokens, loops and logits of each request against the reference run with its parameters.
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
      EXPECT_LE(testing::MaxRelDiff(got[i].logits[t], o.logits), kLogitTolerance)
          << label << " request " << i << " token " << t;
    }
  }
}

// Mid-run, every KV entry of a running request against the reference's, copies on exit
// bitwise (testing::ExpectLoopSlotsMatchReference). Returns the number of copies checked.
int ExpectSlotsMatchReference(const Engine& engine, const Sequence& seq, const std::string& label) {
  ReferenceModel ref(
      std::shared_ptr<const ModelWeights>(&engine.weights(), [](const ModelWeights*) {}));
  return testing::ExpectLoopSlotsMatchReference(engine, seq, ref, label);
}

TEST(OuroEngineTest, AdaptiveExitsAtSeveralDepthsAndCopiesEntriesOnExit) {
  testing::TempDir dir;
  auto weights = testing::MakeModel(OuroSpec("adaptive"), &dir);
  ASSERT_NE(weights, nullptr);
  const auto prompts = testing::MakePrompts(4, 3, 12, weights->config.vocab_size, 21);
  for (BatchingMode mode : {BatchingMode::kDepthWise, BatchingMode::kSequenceWise}) {
    auto engine = Engine::Create(weights, Config(mode));
    ASSERT_TRUE(engine.ok()) << engine.status();
    for (const auto& p : prompts) ASSERT_TRUE((*engine)->Submit(Greedy(p, 40)).ok());
    for (int i = 0; i < 30; ++i) (*engine)->Step();
    const auto& running = (*engine)->scheduler().running();
    ASSERT_EQ(running.size(), prompts.size()) << "a request finished or was preempted early";
    int copies = 0;
    std::map<int, int> depths;
    for (const auto& seq : running) {
      copies += ExpectSlotsMatchReference(**engine, *seq, Name(mode));
      for (int p = seq->num_prompt; p < seq->num_done; ++p) ++depths[seq->token_loops[p]];
      for (int p = 0; p < seq->num_prompt; ++p)
        EXPECT_EQ(seq->token_loops[p], kLoops) << "prompt at full depth";
    }
    EXPECT_GT(copies, 0) << Name(mode);
    EXPECT_GE(depths.size(), 3u) << Name(mode) << ": decode tokens should exit at several loops";
    // Copies are made, not computed: the runner ran no K/V-only layer row.
    EXPECT_EQ((*engine)->stats().layer_rows.kv_only_rows, 0) << Name(mode);
  }
}

// looped.json says adaptive; a request may ask for full depth (and the reverse), and for its
// own threshold. Batch neighbours with other parameters change nothing.
TEST(OuroEngineTest, RequestModeAndThresholdOverrideTheModelDefault) {
  testing::TempDir dir;
  for (const char* model_mode : {"adaptive", "full"}) {
    auto weights = testing::MakeModel(OuroSpec(model_mode), &dir);
    ASSERT_NE(weights, nullptr);
    const auto prompts = testing::MakePrompts(6, 2, 14, weights->config.vocab_size, 5);
    std::vector<GenerateRequest> requests;
    std::vector<int> arrivals;
    for (size_t i = 0; i < prompts.size(); ++i) {
      GenerateRequest r = Greedy(prompts[i], 8);
      if (i % 3 == 1) r.loop_mode = LoopMode::kFull;
      if (i % 3 == 2) r.loop_mode = LoopMode::kAdaptive;
      if (i == 5) r.exit_threshold = 0.3f;
      requests.push_back(r);
      arrivals.push_back(static_cast<int>(i));
    }
    for (BatchingMode mode : {BatchingMode::kDepthWise, BatchingMode::kSequenceWise}) {
      auto engine = Engine::Create(weights, Config(mode));
      ASSERT_TRUE(engine.ok()) << engine.status();
      const auto got = testing::RunStaggered(engine->get(), requests, arrivals);
      const std::string label = std::string(model_mode) + " " + Name(mode);
      ExpectMatchesReference(weights, requests, got, label);
      for (int t : got[1].loops)
        EXPECT_EQ(t, kLoops) << label << ": the request asked for full depth";
      EXPECT_EQ((*engine)->kv_pool().num_free(), Config(mode).num_kv_blocks) << label;
    }
  }
}

// A prompt that contains an adaptive request's prompt and generated tokens reuses only the
// prompt's blocks (its generated tokens may have exited: a new request runs them as prompt
// tokens at full depth); after a full-mode request it reuses the generated part too.
TEST(OuroEngineTest, PrefixCacheSharesOnlyPromptBlocksOfAdaptiveRequests) {
  testing::TempDir dir;
  auto weights = testing::MakeModel(OuroSpec("adaptive"), &dir);
  ASSERT_NE(weights, nullptr);
  const std::vector<int> prompt = testing::MakePrompts(1, 16, 16, weights->config.vocab_size, 9)[0];
  for (LoopMode first_mode : {LoopMode::kAdaptive, LoopMode::kFull}) {
    auto engine = Engine::Create(weights, Config(BatchingMode::kDepthWise, /*prefix_cache=*/true));
    ASSERT_TRUE(engine.ok()) << engine.status();
    GenerateRequest first = Greedy(prompt, 13);
    first.loop_mode = first_mode;
    const auto a = testing::RunStaggered(engine->get(), {first}, {0});
    GenerateRequest second = Greedy(prompt, 4);
    second.prompt.insert(second.prompt.end(), a[0].tokens.begin(),
                         a[0].tokens.end() - 1);  // 28 tokens
    const auto b = testing::RunStaggered(engine->get(), {second}, {0});
    const std::string label = first_mode == LoopMode::kAdaptive ? "after adaptive" : "after full";
    if (first_mode == LoopMode::kAdaptive) {
      EXPECT_EQ(b[0].usage.cached_tokens, 16) << label;
    } else {
      EXPECT_EQ(b[0].usage.cached_tokens, 24) << label;  // 27 known tokens, whole blocks of 4
    }
    ExpectMatchesReference(weights, {second}, b, label);
  }
}

}  // namespace
}  // namespace morserve
