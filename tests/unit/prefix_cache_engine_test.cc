// Prefix caching through the engine, for every model variant the engine covers (each family,
// routers, both KV modes, LoRA, early exit skip/propagate, recurrent layers) in depth-wise and
// sequence-wise batching: a request that starts from cached KV gives the same tokens, loop
// counts, usage and logits, bit for bit, as the same request on an engine without the cache.
// Covered: a full-block prefix, a partial one, a prefix one token past a block boundary, the
// same prompt again, requests sharing a prefix at once and while the prefix is being computed,
// hits after preemption, eviction under pressure (nothing lost, every block accounted for), and
// cache_salt / exit-threshold namespaces that never share.
#include <gtest/gtest.h>

#include "tests/engine_harness.h"

namespace morserve {
namespace {

using testing::FamilyCase;
using testing::Greedy;
using testing::RunResult;

TinyModelSpec Spec(const std::string& family) { return testing::F32Spec(family); }

constexpr int kBlock = 4;

EngineConfig Config(BatchingMode mode, bool cache) {
  EngineConfig cfg;
  cfg.mode = mode;
  cfg.max_batch_rows = 12;
  cfg.max_step_tokens = 10;  // prompts arrive in chunks
  cfg.block_size = kBlock;
  cfg.num_kv_blocks = 4096;
  cfg.prefix_cache = cache;
  return cfg;
}

std::string ModeName(BatchingMode mode) {
  return mode == BatchingMode::kDepthWise ? "depth" : "sequence";
}

// Tokens, loops, finish, usage (cached tokens aside) and every logit bit for bit.
void ExpectSame(const RunResult& got, const RunResult& want, const std::string& label) {
  ASSERT_EQ(got.tokens, want.tokens) << label;
  EXPECT_EQ(got.loops, want.loops) << label;
  EXPECT_EQ(got.finish, want.finish) << label;
  EXPECT_EQ(got.usage.prompt_tokens, want.usage.prompt_tokens) << label;
  EXPECT_EQ(got.usage.completion_tokens, want.usage.completion_tokens) << label;
  if (got.usage.preemptions == 0 && want.usage.preemptions == 0) {
    EXPECT_EQ(got.usage.recursion_loops, want.usage.recursion_loops) << label;
  }
  ASSERT_EQ(got.logits.size(), want.logits.size()) << label;
  for (size_t t = 0; t < want.logits.size(); ++t) {
    EXPECT_EQ(got.logits[t], want.logits[t]) << label << " token " << t;
  }
}

// Every block is empty, cached or held by a running request, and none is held when idle.
void ExpectAccounted(const Engine& engine, const std::string& label) {
  const KvBlockPool& pool = engine.kv_pool();
  EXPECT_EQ(pool.num_used(), 0) << label;
  EXPECT_EQ(pool.num_free(), pool.num_blocks()) << label;
  EXPECT_EQ(pool.num_empty() + pool.num_cached_idle(), pool.num_blocks()) << label;
  EXPECT_EQ(pool.num_cached(), pool.num_cached_idle()) << label;
  for (int id = 0; id < pool.num_blocks(); ++id) EXPECT_EQ(pool.refs(id), 0) << label;
}

class PrefixCacheEngineTest : public ::testing::TestWithParam<FamilyCase> {
 protected:
  void SetUp() override {
    weights_ = testing::MakeModel(GetParam().spec, &dir_);
    ASSERT_NE(weights_, nullptr);
    vocab_ = weights_->config.vocab_size;
  }
  // `requests` alone, each on an engine without the cache.
  std::vector<RunResult> Misses(BatchingMode mode, const std::vector<GenerateRequest>& requests) {
    std::vector<RunResult> out;
    for (const GenerateRequest& r : requests) {
      auto engine = Engine::Create(weights_, Config(mode, false));
      EXPECT_TRUE(engine.ok()) << engine.status();
      out.push_back(testing::RunStaggered(engine->get(), {r}, {0})[0]);
      EXPECT_EQ(out.back().usage.cached_tokens, 0);
    }
    return out;
  }
  std::vector<int> Prompt(int len, uint64_t seed) {
    return testing::MakePrompts(1, len, len, vocab_, seed)[0];
  }

  testing::TempDir dir_;
  std::shared_ptr<const ModelWeights> weights_;
  int vocab_ = 0;
};

// A first request fills the cache; later ones that extend its prompt, one at a time, start
// from its blocks.
TEST_P(PrefixCacheEngineTest, HitEqualsMiss) {
  const std::vector<int> base = Prompt(21, 11);
  auto prefix = [&](int n, std::vector<int> tail) {
    std::vector<int> p(base.begin(), base.begin() + n);
    p.insert(p.end(), tail.begin(), tail.end());
    return Greedy(p, 5);
  };
  const GenerateRequest first = Greedy(base, 4);
  struct Case {
    std::string name;
    GenerateRequest request;
    int cached;
  };
  const std::vector<Case> cases = {
      {"full-block prefix", prefix(16, {1, 2, 3}), 16},
      {"partial prefix", prefix(18, {5}), 16},
      {"one past a boundary", prefix(17, {}), 16},  // 17 tokens: the last is computed
      {"same prompt", first, 20},
      {"inside the first block", prefix(3, {7, 8}), 0},
  };
  std::vector<GenerateRequest> requests;
  for (const Case& c : cases) requests.push_back(c.request);
  for (BatchingMode mode : {BatchingMode::kDepthWise, BatchingMode::kSequenceWise}) {
    const std::vector<RunResult> want = Misses(mode, requests);
    auto engine = Engine::Create(weights_, Config(mode, true));
    ASSERT_TRUE(engine.ok()) << engine.status();
    testing::RunStaggered(engine->get(), {first}, {0});
    for (size_t i = 0; i < cases.size(); ++i) {
      const std::string label = GetParam().name + " " + ModeName(mode) + " " + cases[i].name;
      const RunResult got = testing::RunStaggered(engine->get(), {cases[i].request}, {0})[0];
      EXPECT_EQ(got.usage.cached_tokens, cases[i].cached) << label;
      ExpectSame(got, want[i], label);
    }
    const EngineStats st = (*engine)->stats();
    EXPECT_GT(st.prefix_cache_hits, 0);
    EXPECT_GT(st.prefix_cache_queries, st.prefix_cache_hits);
    EXPECT_GT(st.prefix_cache_blocks, 0);
    ExpectAccounted(**engine, GetParam().name + " " + ModeName(mode));
  }
}

// Requests sharing a prefix at once: some arrive while the first still computes it (they hit
// the blocks completed so far), some together after it finished.
TEST_P(PrefixCacheEngineTest, ConcurrentSharersEqualMisses) {
  const std::vector<int> shared = Prompt(28, 21);
  std::vector<GenerateRequest> requests;
  std::vector<int> arrivals;
  for (int i = 0; i < 8; ++i) {
    std::vector<int> p(shared.begin(), shared.begin() + 13 + 2 * i);
    p.push_back((i * 7) % vocab_);
    requests.push_back(Greedy(p, 4 + i % 3));
    arrivals.push_back(i < 4 ? i : 30);
  }
  for (BatchingMode mode : {BatchingMode::kDepthWise, BatchingMode::kSequenceWise}) {
    const std::vector<RunResult> want = Misses(mode, requests);
    auto engine = Engine::Create(weights_, Config(mode, true));
    ASSERT_TRUE(engine.ok()) << engine.status();
    const std::vector<RunResult> got = testing::RunStaggered(engine->get(), requests, arrivals);
    int hits = 0;
    for (size_t i = 0; i < requests.size(); ++i) {
      const std::string label =
          GetParam().name + " " + ModeName(mode) + " request " + std::to_string(i);
      ExpectSame(got[i], want[i], label);
      EXPECT_EQ(got[i].usage.cached_tokens % kBlock, 0) << label;
      hits += got[i].usage.cached_tokens > 0;
    }
    EXPECT_GE(hits, 4) << "the requests arriving after the first finished must hit";
    ExpectAccounted(**engine, GetParam().name + " " + ModeName(mode));
  }
}

// A pool too small for everyone: requests are preempted (their completed blocks stay cached
// and their recompute starts from them) and cached blocks are evicted for running requests.
TEST_P(PrefixCacheEngineTest, PreemptionAndEvictionLoseNothing) {
  const std::vector<int> shared = Prompt(12, 31);
  std::vector<GenerateRequest> requests;
  for (int i = 0; i < 12; ++i) {
    std::vector<int> p = i % 2 ? shared : std::vector<int>{};
    const std::vector<int> own = Prompt(6 + i, 100 + i);
    p.insert(p.end(), own.begin(), own.end());
    requests.push_back(Greedy(p, 6));
  }
  EngineConfig cfg = Config(BatchingMode::kDepthWise, true);
  cfg.max_batch_rows = 16;
  cfg.max_step_tokens = 64;
  cfg.block_size = 2;
  cfg.num_kv_blocks = weights_->plan.num_cache_slots * 28;
  std::vector<RunResult> want;
  for (const GenerateRequest& r : requests) {
    EngineConfig alone = cfg;
    alone.prefix_cache = false;
    alone.num_kv_blocks = 4096;
    auto engine = Engine::Create(weights_, alone);
    ASSERT_TRUE(engine.ok());
    want.push_back(testing::RunStaggered(engine->get(), {r}, {0})[0]);
  }
  auto engine = Engine::Create(weights_, cfg);
  ASSERT_TRUE(engine.ok()) << engine.status();
  // Twice: the second round finds the first round's blocks (those not evicted).
  for (int round = 0; round < 2; ++round) {
    const std::vector<RunResult> got =
        testing::RunStaggered(engine->get(), requests, std::vector<int>(requests.size(), round));
    for (size_t i = 0; i < requests.size(); ++i) {
      ExpectSame(got[i], want[i],
                 GetParam().name + " round " + std::to_string(round) + " request " +
                     std::to_string(i) + " (preempted " + std::to_string(got[i].usage.preemptions) +
                     "x, cached " + std::to_string(got[i].usage.cached_tokens) + ")");
    }
    ExpectAccounted(**engine, GetParam().name + " round " + std::to_string(round));
  }
  const EngineStats st = (*engine)->stats();
  EXPECT_GT(st.preemptions, 0) << "the pool was meant to be too small";
  EXPECT_GT(st.prefix_cache_evictions, 0) << "the pool was meant to be too small to keep all";
  EXPECT_GT(st.prefix_cache_hits, 0);
}

// Different cache_salt values (and early-exit threshold overrides, which change the KV a
// prefix leaves) never share; equal ones do.
TEST_P(PrefixCacheEngineTest, NamespacesNeverShare) {
  GenerateRequest a = Greedy(Prompt(20, 41), 3);
  a.cache_salt = "tenant-a";
  GenerateRequest b = a;
  b.cache_salt = "tenant-b";
  GenerateRequest unsalted = a;
  unsalted.cache_salt.clear();
  GenerateRequest threshold = a;
  threshold.exit_threshold = 0.5f;
  const bool early_exit = weights_->config.recursion.routing == Routing::kEarlyExit;
  auto engine = Engine::Create(weights_, Config(BatchingMode::kDepthWise, true));
  ASSERT_TRUE(engine.ok());
  auto run = [&](const GenerateRequest& r) {
    return testing::RunStaggered(engine->get(), {r}, {0})[0].usage.cached_tokens;
  };
  EXPECT_EQ(run(a), 0);
  EXPECT_EQ(run(b), 0);
  EXPECT_EQ(run(unsalted), 0);
  if (early_exit) EXPECT_EQ(run(threshold), 0);
  EXPECT_EQ(run(a), 16);
  EXPECT_EQ(run(b), 16);
  EXPECT_EQ(run(unsalted), 16);
  if (early_exit) EXPECT_EQ(run(threshold), 16);
}

INSTANTIATE_TEST_SUITE_P(Families, PrefixCacheEngineTest,
                         ::testing::ValuesIn(testing::EngineFamilies(Spec)),
                         testing::FamilyCaseName);

// Two requests that both grow until the pool is short: the newer one is preempted after it
// completed its prompt, its blocks stay cached, the older one evicts only what it needs (the
// newer one's deepest blocks first), and the newer one's recompute starts from the rest.
TEST(PrefixCacheEngine, RecomputeAfterPreemptionStartsFromTheCache) {
  for (const std::string family : {"vanilla", "mor-ec"}) {
    testing::TempDir dir;
    auto weights = testing::MakeModel(Spec(family), &dir);
    ASSERT_NE(weights, nullptr);
    const int vocab = weights->config.vocab_size;
    const std::vector<GenerateRequest> requests = {
        Greedy(testing::MakePrompts(1, 4, 4, vocab, 1)[0], 40),
        Greedy(testing::MakePrompts(1, 24, 24, vocab, 2)[0], 30)};
    EngineConfig cfg = Config(BatchingMode::kDepthWise, true);
    cfg.block_size = 2;
    cfg.max_step_tokens = 64;
    EngineConfig off = cfg;
    off.prefix_cache = false;
    off.num_kv_blocks = 4096;
    std::vector<RunResult> want;
    std::vector<int> peak;  // blocks each request holds at most, alone
    for (const GenerateRequest& r : requests) {
      auto alone = Engine::Create(weights, off);
      ASSERT_TRUE(alone.ok());
      want.push_back(testing::RunStaggered(alone->get(), {r}, {0})[0]);
      peak.push_back((*alone)->stats().max_kv_blocks_used);
    }
    // Room for either alone (and the admission watermark), not for both.
    cfg.num_kv_blocks = std::max(peak[0], peak[1]) + std::min(peak[0], peak[1]) / 3 + 2;
    auto engine = Engine::Create(weights, cfg);
    ASSERT_TRUE(engine.ok());
    const std::vector<RunResult> got = testing::RunStaggered(engine->get(), requests, {0, 1});
    EXPECT_GT(got[1].usage.preemptions, 0) << family << ": the pool was meant to be too small";
    EXPECT_GT(got[1].usage.cached_tokens, 0) << family << ": the recompute found nothing";
    for (size_t i = 0; i < requests.size(); ++i) {
      ExpectSame(got[i], want[i], family + " request " + std::to_string(i));
    }
    ExpectAccounted(**engine, family);
  }
}

// Prompt logprobs need every prompt position's row: such a request computes its whole prompt
// (and its blocks are still cached for others).
TEST(PrefixCacheEngine, PromptLogprobsComputeTheWholePrompt) {
  testing::TempDir dir;
  auto weights = testing::MakeModel(Spec("mor-ec"), &dir);
  ASSERT_NE(weights, nullptr);
  auto engine = Engine::Create(weights, Config(BatchingMode::kDepthWise, true));
  ASSERT_TRUE(engine.ok());
  GenerateRequest r = Greedy(testing::MakePrompts(1, 20, 20, weights->config.vocab_size, 3)[0], 2);
  testing::RunStaggered(engine->get(), {r}, {0});
  GenerateRequest scored = r;
  scored.params.prompt_logprobs = 1;
  const RunResult got = testing::RunStaggered(engine->get(), {scored}, {0})[0];
  EXPECT_EQ(got.usage.cached_tokens, 0);
  ASSERT_TRUE(got.prompt_logprobs.has_value());
  EXPECT_EQ(got.prompt_logprobs->size(), r.prompt.size() - 1);
  EXPECT_EQ(testing::RunStaggered(engine->get(), {r}, {0})[0].usage.cached_tokens, 16);
}

// --prefix-cache off: nothing is cached, nothing is found.
TEST(PrefixCacheEngine, OffCachesNothing) {
  testing::TempDir dir;
  auto weights = testing::MakeModel(Spec("vanilla"), &dir);
  ASSERT_NE(weights, nullptr);
  auto engine = Engine::Create(weights, Config(BatchingMode::kDepthWise, false));
  ASSERT_TRUE(engine.ok());
  const GenerateRequest r =
      Greedy(testing::MakePrompts(1, 20, 20, weights->config.vocab_size, 3)[0], 2);
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(testing::RunStaggered(engine->get(), {r}, {0})[0].usage.cached_tokens, 0);
  }
  EXPECT_EQ((*engine)->kv_pool().num_cached(), 0);
  EXPECT_EQ((*engine)->stats().prefix_cache_queries, 0);
}

}  // namespace
}  // namespace morserve
