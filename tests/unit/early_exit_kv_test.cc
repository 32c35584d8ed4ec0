// Early exit with exit_kv propagate: the K/V-only rows that carry an exited token through the
// later loops. Their cache entries equal the reference's (docs/models.md#early-exit: RMSNorm_in
// of the skipped layer on the exit state, K/V projection with that loop's weights and LoRA,
// RoPE), and the runner computes them on its K/V-only path: its counter of K/V-only layer rows
// equals the exits times the later (loop, layer) pairs, and its full rows are only the rows
// that run whole layers.
#include <gtest/gtest.h>

#include <map>

#include "engine/reference/reference_model.h"
#include "tests/engine_harness.h"

namespace morserve {
namespace {

using testing::Greedy;

constexpr double kKvTolerance = 1e-4;  // relative to max(|value|, 1), fp32 compute

// Untied attention copies and LoRA on k and v: the K/V-only projection must use the loop's own
// weights and deltas, as the fused projection of the full rows does.
TinyModelSpec PropagateSpec(const std::string& exit_kv = "propagate") {
  TinyModelSpec s;
  s.family = "early-exit";
  s.dtype = DType::kF32;
  s.exit_kv = exit_kv;
  s.exit_threshold = 0.2f;  // tiny models are unsure: exits after 1, 2 and 3 loops
  s.untied_attention = true;
  s.lora_rank = 4;
  s.lora_targets = {"q_proj", "k_proj", "v_proj"};
  return s;
}

EngineConfig Config(BatchingMode mode) {
  EngineConfig cfg;
  cfg.mode = mode;
  cfg.max_batch_rows = 16;
  cfg.max_step_tokens = 12;
  cfg.block_size = 4;
  cfg.num_kv_blocks = 4096;
  return cfg;
}

const char* Name(BatchingMode mode) {
  return mode == BatchingMode::kDepthWise ? "depth" : "sequence";
}

// Layers outside the looped segment: each token runs them once.
int UniqueLayers(const LayerPlan& plan) {
  int n = 0;
  for (int s = 0; s < static_cast<int>(plan.segments.size()); ++s) {
    if (s != plan.looped_segment) n += plan.segments[s].loops * plan.segments[s].num_layers;
  }
  return n;
}

// Compares every KV entry the engine holds for `seq` with the reference's entry of the same
// (slot, position); returns how many of them are K/V-only entries (written at a loop the
// token did not run).
int ExpectSlotsMatchReference(const Engine& engine, const Sequence& seq, const std::string& label) {
  const ModelWeights& w = engine.weights();
  const LayerPlan& plan = w.plan;
  const int seg = plan.looped_segment;
  ReferenceModel ref(std::shared_ptr<const ModelWeights>(&w, [](const ModelWeights*) {}));
  std::vector<int> loops;  // loops each entered token runs (the reference's decisions)
  for (int t = 0; t < seq.num_entered; ++t) loops.push_back(ref.Step(seq.tokens[t]).trace.loops);
  const int kvd = w.config.kv_dim();
  int kv_only_entries = 0;
  for (int loop = 0; loop < plan.segments[seg].loops; ++loop) {
    for (int k = 0; k < plan.segments[seg].num_layers; ++k) {
      const int slot = plan.CacheSlot(seg, loop, k);
      std::map<int, const ReferenceModel::KvEntry*> want;
      for (const auto& e : ref.SlotContents(slot)) want[e.position] = &e;
      const KvBlockTable& table = seq.kv->slot(slot);
      int done_entries = 0;
      for (int i = 0; i < table.num_tokens(); ++i) {
        const int pos = table.positions()[i];
        const std::string where = label + " loop " + std::to_string(loop) + " layer " +
                                  std::to_string(k) + " position " + std::to_string(pos);
        auto it = want.find(pos);
        if (it == want.end()) {
          ADD_FAILURE() << where << ": the reference has no such entry";
          continue;
        }
        std::vector<float> key(kvd), value(kvd);
        engine.runner().ReadKv(table.PhysicalSlot(i), key.data(), value.data());
        EXPECT_LE(testing::MaxRelDiff(key, it->second->k), kKvTolerance) << where << " K";
        EXPECT_LE(testing::MaxRelDiff(value, it->second->v), kKvTolerance) << where << " V";
        kv_only_entries += loops[pos] <= loop;
        done_entries += pos < seq.num_done;
      }
      // Completed tokens have written every entry of the loops they ran, and their K/V-only
      // rows every entry of the loops those rows already ran.
      int want_done = 0;
      for (const auto& [pos, e] : want) want_done += pos < seq.num_done;
      for (const Row& row : engine.scheduler().loop_rows()) {
        want_done -=
            row.seq == &seq && row.kv_only && row.position < seq.num_done && row.loop <= loop;
      }
      EXPECT_EQ(done_entries, want_done) << label << " loop " << loop << " layer " << k;
    }
  }
  return kv_only_entries;
}

// Mid-run (sequences still running, K/V-only rows in flight), every KV entry of every running
// request equals the reference's, and the runner computed exactly one K/V-only layer row per
// K/V-only entry present.
TEST(EarlyExitKvTest, KvOnlyEntriesMatchReferenceAndRunnerCountsThem) {
  testing::TempDir dir;
  auto weights = testing::MakeModel(PropagateSpec(), &dir);
  ASSERT_NE(weights, nullptr);
  const auto prompts = testing::MakePrompts(4, 6, 20, weights->config.vocab_size, 21);
  for (BatchingMode mode : {BatchingMode::kDepthWise, BatchingMode::kSequenceWise}) {
    auto engine = Engine::Create(weights, Config(mode));
    ASSERT_TRUE(engine.ok()) << engine.status();
    for (const auto& p : prompts) ASSERT_TRUE((*engine)->Submit(Greedy(p, 40)).ok());
    for (int i = 0; i < 14; ++i) (*engine)->Step();
    const auto& running = (*engine)->scheduler().running();
    ASSERT_EQ(running.size(), prompts.size()) << "a request finished or was preempted early";
    int kv_only_entries = 0;
    for (const auto& seq : running) {
      kv_only_entries += ExpectSlotsMatchReference(**engine, *seq, Name(mode));
    }
    EXPECT_GT(kv_only_entries, 0) << Name(mode) << ": no token exited early";
    const EngineStats stats = (*engine)->stats();
    EXPECT_EQ(stats.preemptions, 0);
    EXPECT_EQ(stats.layer_rows.kv_only_rows, kv_only_entries) << Name(mode);
  }
}

// Run to completion: K/V-only layer rows = sum over early exits of (Nr - loops run) x K, and
// full layer rows = sum over tokens of (loops run x K + unique layers). Sequence-wise every
// K/V-only row finishes its loops inside the step, so the count is exact; depth-wise a
// request that finishes drops the K/V-only rows still in flight (of tokens that exited in its
// last Nr - 1 passes, one token per pass in decode), so it is at most that. With exit_kv skip
// there are none.
TEST(EarlyExitKvTest, RunnerRowsMatchExitsTimesLaterLayers) {
  for (const char* exit_kv : {"propagate", "skip"}) {
    testing::TempDir dir;
    auto weights = testing::MakeModel(PropagateSpec(exit_kv), &dir);
    ASSERT_NE(weights, nullptr);
    const LayerPlan& plan = weights->plan;
    const int nr = weights->config.recursion.num_recursions;
    const int K = plan.segments[plan.looped_segment].num_layers;
    const auto prompts = testing::MakePrompts(8, 1, 18, weights->config.vocab_size, 33);
    std::vector<GenerateRequest> requests;
    std::vector<int> arrivals;
    int64_t want_kv_only = 0, want_full = 0, exits = 0;
    ReferenceModel ref(weights);
    for (size_t i = 0; i < prompts.size(); ++i) {
      requests.push_back(Greedy(prompts[i], 4 + static_cast<int>(i) % 4));
      arrivals.push_back(static_cast<int>(i) * 2);
      std::vector<StepOutput> outs;
      ref.GenerateGreedy(prompts[i], requests.back().params.max_tokens, &outs);
      // outs: one per token that goes through the model (all but the last generated one).
      for (size_t t = 0; t < outs.size(); ++t) {
        const int loops = outs[t].trace.loops;
        want_full += static_cast<int64_t>(loops) * K + UniqueLayers(plan);
        if (loops < nr) {
          ++exits;
          want_kv_only += static_cast<int64_t>(nr - loops) * K;
        }
      }
    }
    ASSERT_GT(exits, 0);
    if (std::string(exit_kv) == "skip") want_kv_only = 0;
    for (BatchingMode mode : {BatchingMode::kSequenceWise, BatchingMode::kDepthWise}) {
      const std::string label = std::string(exit_kv) + " " + Name(mode);
      auto engine = Engine::Create(weights, Config(mode));
      ASSERT_TRUE(engine.ok()) << engine.status();
      auto got = testing::RunStaggered(engine->get(), requests, arrivals);
      for (size_t i = 0; i < got.size(); ++i) {
        EXPECT_EQ(got[i].tokens,
                  ref.GenerateGreedy(requests[i].prompt, requests[i].params.max_tokens))
            << label << " request " << i;
      }
      const EngineStats stats = (*engine)->stats();
      ASSERT_EQ(stats.preemptions, 0) << label;
      EXPECT_EQ(stats.layer_rows.full_rows, want_full) << label;
      if (mode == BatchingMode::kSequenceWise || want_kv_only == 0) {
        EXPECT_EQ(stats.layer_rows.kv_only_rows, want_kv_only) << label;
      } else {
        EXPECT_LE(stats.layer_rows.kv_only_rows, want_kv_only) << label;
        const int64_t droppable = static_cast<int64_t>(requests.size()) * (nr - 1) * (nr - 1) * K;
        EXPECT_GE(stats.layer_rows.kv_only_rows, want_kv_only - droppable)
            << label << ": more K/V-only rows lost than the last tokens of each request own";
      }
    }
  }
}

// Depth-wise, an exit frees its row of max_batch_rows at once: whenever fewer full rows than
// the limit are in the loop and the request has a token ready, the next step enters one,
// however many K/V-only rows ride the loop.
TEST(EarlyExitKvTest, KvOnlyRowsTakeNoRowOfTheBatchLimit) {
  testing::TempDir dir;
  auto weights = testing::MakeModel(PropagateSpec(), &dir);
  ASSERT_NE(weights, nullptr);
  EngineConfig cfg = Config(BatchingMode::kDepthWise);
  cfg.max_batch_rows = 2;
  cfg.max_step_tokens = 2;
  auto engine = Engine::Create(weights, cfg);
  ASSERT_TRUE(engine.ok()) << engine.status();
  const auto prompt = testing::MakePrompts(1, 12, 12, weights->config.vocab_size, 5)[0];
  auto channel = (*engine)->Submit(Greedy(prompt, 24));
  ASSERT_TRUE(channel.ok());
  const DepthScheduler& scheduler = (*engine)->scheduler();
  int crowded = 0;  // steps where full + K/V-only rows filled the limit and a token entered
  (*engine)->Step();  // admits the request
  for (int step = 1; step < 400 && !scheduler.running().empty(); ++step) {
    const Sequence& seq = *scheduler.running().front();
    int full = 0, kv_only = 0;
    for (const Row& r : scheduler.loop_rows()) ++(r.kv_only ? kv_only : full);
    const bool ready = static_cast<int>(seq.tokens.size()) > seq.num_entered;
    const int entered = seq.num_entered;
    (*engine)->Step();
    if (scheduler.running().empty()) break;
    if (!ready || full >= cfg.max_batch_rows) continue;
    EXPECT_GT(scheduler.running().front()->num_entered, entered)
        << "step " << step << ": " << full << " full and " << kv_only << " K/V-only rows";
    crowded += full + kv_only >= cfg.max_batch_rows;
  }
  EXPECT_GT(crowded, 0) << "K/V-only rows never filled the limit: nothing was tested";
  (*engine)->RunUntilIdle();
  EXPECT_EQ(testing::Collect(channel->get()).tokens,
            ReferenceModel(weights).GenerateGreedy(prompt, 24));
  const EngineStats stats = (*engine)->stats();
  EXPECT_LE(stats.pass_rows, stats.pass_row_capacity);
}

}  // namespace
}  // namespace morserve
