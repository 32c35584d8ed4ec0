// The engine hooks the server relies on: EventChannel's listener (runs after each push,
// outside the channel's mutex) and EngineObserver (admission, tokens, finishes and per-step
// deltas that add up to the engine's own totals).
#include <gtest/gtest.h>

#include <atomic>
#include <map>

#include "engine/runtime/engine.h"
#include "tests/engine_harness.h"

namespace morserve::testing {
namespace {

TEST(EventChannelListener, RunsAfterEachPushOutsideTheLock) {
  EventChannel ch;
  ch.Push(RequestEvent{});  // before the listener: no call
  int calls = 0;
  ch.SetListener([&] {
    ++calls;
    // The channel's mutex is free here: draining from the listener must not deadlock.
    EXPECT_TRUE(ch.TryPop().has_value());
  });
  ch.Push(RequestEvent{});
  ch.Push(RequestEvent{});
  EXPECT_EQ(calls, 2);
  ch.SetListener(nullptr);
  ch.Push(RequestEvent{});
  EXPECT_EQ(calls, 2);
  EXPECT_TRUE(ch.TryPop().has_value());  // the first push's event, left for the consumer
  EXPECT_TRUE(ch.TryPop().has_value());
  EXPECT_FALSE(ch.TryPop().has_value());
}

class Recorder : public EngineObserver {
 public:
  void OnAdmitted(double q) override {
    EXPECT_GE(q, 0.0);
    ++admitted;
  }
  void OnToken(bool first, double latency, int loops) override {
    EXPECT_GE(latency, 0.0);
    ++tokens;
    first_tokens += first;
    token_loops[loops]++;
  }
  void OnFinished(FinishReason reason, double e2e, const Usage& usage) override {
    EXPECT_GE(e2e, 0.0);
    ++finished[reason];
    completion += usage.completion_tokens;
  }
  void OnStep(const StepReport& r) override {
    ++steps;
    step_tokens += r.tokens_generated;
    pass_rows += r.pass_rows;
    for (size_t l = 0; l < r.rows_per_loop.size(); ++l) rows_per_loop += r.rows_per_loop[l];
    last = r;
  }
  int admitted = 0, tokens = 0, first_tokens = 0, steps = 0, completion = 0;
  int64_t step_tokens = 0, pass_rows = 0, rows_per_loop = 0;
  std::map<int, int> token_loops;
  std::map<FinishReason, int> finished;
  StepReport last;
};

// An engine (EngineConfig defaults) on mkmodel's tiny model of `family`, written to `dir`,
// reporting to `observer`; null (with the failure recorded) when it cannot be made.
std::unique_ptr<Engine> ObservedEngine(const std::string& family, TempDir* dir,
                                       EngineObserver* observer) {
  TinyModelSpec spec;
  spec.family = family;
  auto weights = MakeModel(spec, dir);
  EXPECT_NE(weights, nullptr);
  if (weights == nullptr) return nullptr;
  auto engine = Engine::Create(weights, EngineConfig());
  EXPECT_TRUE(engine.ok()) << engine.status();
  if (!engine.ok()) return nullptr;
  (*engine)->SetObserver(observer);
  return *std::move(engine);
}

TEST(EngineObserver, ReportsAddUpToTheEngineStats) {
  TempDir dir;
  Recorder rec;
  const std::unique_ptr<Engine> engine = ObservedEngine("mor-ec", &dir, &rec);
  ASSERT_NE(engine, nullptr);
  std::vector<GenerateRequest> reqs;
  for (const auto& p : MakePrompts(5, 3, 30, 256, 11)) reqs.push_back(Greedy(p, 7));
  std::vector<RunResult> out = RunStaggered(engine.get(), reqs, {0, 0, 1, 3, 4});
  const EngineStats st = engine->stats();
  EXPECT_EQ(rec.admitted, 5);
  EXPECT_EQ(rec.tokens, 35);
  EXPECT_EQ(rec.first_tokens, 5);
  EXPECT_EQ(rec.step_tokens, st.tokens_generated);
  EXPECT_EQ(rec.pass_rows, st.pass_rows);
  EXPECT_EQ(rec.rows_per_loop, st.pass_rows);
  EXPECT_EQ(rec.finished[FinishReason::kLength], 5);
  EXPECT_EQ(rec.completion, 35);
  EXPECT_EQ(rec.last.kv_blocks_used, 0);
  EXPECT_EQ(rec.last.running, 0);
  int loops_seen = 0;
  for (const RunResult& r : out) {
    for (int l : r.loops) {
      (void)l;
      ++loops_seen;
    }
  }
  int by_loops = 0;
  for (auto [l, n] : rec.token_loops) by_loops += n;
  EXPECT_EQ(by_loops, loops_seen);
}

TEST(EngineObserver, CancelReportsFinishAndFreedBlocks) {
  TempDir dir;
  Recorder rec;
  const std::unique_ptr<Engine> engine = ObservedEngine("vanilla", &dir, &rec);
  ASSERT_NE(engine, nullptr);
  GenerateRequest r = Greedy({1, 2, 3, 4, 5}, 100);
  r.request_id = "victim";
  auto ch = engine->Submit(r);
  ASSERT_TRUE(ch.ok());
  engine->Step();
  engine->Step();
  EXPECT_GT(rec.last.kv_blocks_used, 0);
  engine->Cancel("victim");
  engine->Step();
  EXPECT_EQ(rec.finished[FinishReason::kCancelled], 1);
  EXPECT_EQ(rec.last.kv_blocks_used, 0);
  EXPECT_EQ(engine->stats().kv_blocks_used, 0);
}

TEST(EngineHeartbeat, AdvancesWhileTheThreadRunsIdle) {
  TempDir dir;
  TinyModelSpec spec;
  auto weights = MakeModel(spec, &dir);
  ASSERT_NE(weights, nullptr);
  auto engine = Engine::Create(weights, EngineConfig());
  ASSERT_TRUE(engine.ok());
  EXPECT_EQ((*engine)->heartbeat(), 0);
  (*engine)->Start();
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while ((*engine)->heartbeat() < 3 && std::chrono::steady_clock::now() < end) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_GE((*engine)->heartbeat(), 3);
  (*engine)->Stop();
  const int64_t stopped = (*engine)->heartbeat();
  std::this_thread::sleep_for(std::chrono::milliseconds(150));
  EXPECT_EQ((*engine)->heartbeat(), stopped);
}

}  // namespace
}  // namespace morserve::testing
