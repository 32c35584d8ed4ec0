// Automatic prefix caching through the real server: `morserve serve` (default --prefix-cache
// on) and a second one on the same model with --prefix-cache off, both on 127.0.0.1 port 0,
// a tiny vanilla model on a `morserve mktokenizer` tokenizer with a plain chat template,
// generated gRPC stubs as the client. A second chat turn that resends the first (system
// prompt of several 16-token blocks, user message, the assistant's reply) plus a new user
// message reports usage.cached_tokens > 0, in whole blocks, and generates what the cache-off
// server generates; cache_salt keeps namespaces apart (another salt, or none, finds
// nothing); the cache-off server reports 0; the prefix cache metrics are in a real scrape
// and hits grow by the cached tokens; a bad --prefix-cache value is an error naming the flag.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <thread>

#include "absl/strings/str_cat.h"
#include "tests/server/served_suite.h"
#include "tests/server/server_process.h"
#include "tests/server/test_models.h"

namespace morserve::testing {
namespace {

constexpr int kBlock = 16;  // the engine's default --block-size

// A long system prompt of words from the tokenizer's corpus (the repository README), made
// distinct from the first tokens on by `tag`, so no test finds another test's blocks.
std::string LongText(const std::string& tag) {
  static const char* kWords[] = {"the",     "server", "model",     "engine",  "batch",
                                 "request", "tokens", "recursive", "loop",    "depth",
                                 "cache",   "block",  "gateway",   "metrics", "stream",
                                 "prompt",  "shared", "layer",     "router",  "test"};
  std::string out = tag + ":";
  uint32_t x = 2166136261u;
  for (char c : tag) x = (x ^ static_cast<uint8_t>(c)) * 16777619u;
  for (int i = 0; i < 90; ++i) {
    x = x * 1664525u + 1013904223u;
    absl::StrAppend(&out, " ", kWords[(x >> 16) % 20]);
  }
  return out + ".";
}

v1::GenerateRequest Chat(const std::vector<std::pair<std::string, std::string>>& messages,
                         int max_tokens, const std::string& salt = "") {
  v1::GenerateRequest r;
  for (const auto& [role, content] : messages) {
    v1::ChatMessage* m = r.mutable_chat()->add_messages();
    m->set_role(role);
    m->set_content(content);
  }
  r.set_max_tokens(max_tokens);
  r.set_ignore_eos(true);
  r.mutable_sampling()->set_temperature(0);
  r.set_cache_salt(salt);
  return r;
}

class ServerPrefixCacheTest : public ServedSuite<ServerPrefixCacheTest, ServedTextModel> {
 protected:
  static void SetUpTestSuite() {
    StartSuite("vanilla", [](TinyModelSpec* spec, const TempDir&) { spec->max_pos = 512; });
    off_ = new ServerProcess();
    ASSERT_NO_FATAL_FAILURE(StartOrDie(off_, served_->model_dir(), {"--prefix-cache", "off"}));
  }
  static void TearDownTestSuite() {
    if (off_ != nullptr && off_->pid() > 0) EXPECT_EQ(off_->Terminate(), 0) << off_->output();
    delete off_;
    off_ = nullptr;
    ServedSuite::TearDownTestSuite();
  }

  // Generates and checks the call succeeded with usage.
  static StreamResult Run(v1::Morserve::Stub* stub, const v1::GenerateRequest& r) {
    StreamResult got = GenerateAll(stub, r);
    EXPECT_TRUE(got.status.ok()) << got.status.error_message();
    EXPECT_TRUE(got.finished.has_value() && got.finished->has_usage());
    return got;
  }
  static int Cached(const StreamResult& r) {
    return r.finished ? r.finished->usage().cached_tokens() : -1;
  }
  // The prompt ids the server makes of a request's chat input.
  std::vector<int> PromptIds(const v1::GenerateRequest& r) {
    grpc::ClientContext ctx;
    v1::TokenizeRequest req;
    *req.mutable_chat() = r.chat();
    v1::TokenizeResponse resp;
    const grpc::Status s = stub_->Tokenize(&ctx, req, &resp);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return {resp.ids().begin(), resp.ids().end()};
  }
  static double Metric(const std::string& series) {
    const std::optional<std::string> text = HttpGet(served_->server().metrics_port(), "/metrics");
    if (!text) return -1;
    return ScrapeValue(*text, series).value_or(-1);
  }

  static inline ServerProcess* off_ = nullptr;
};

TEST_F(ServerPrefixCacheTest, SecondChatTurnReusesTheFirstTurnsBlocks) {
  const std::string system = LongText("turns");
  const v1::GenerateRequest first = Chat({{"system", system}, {"user", "describe the engine"}}, 6);
  const StreamResult one = Run(stub_.get(), first);
  EXPECT_EQ(Cached(one), 0) << "a prompt the server has not seen";
  const v1::GenerateRequest second = Chat({{"system", system},
                                           {"user", "describe the engine"},
                                           {"assistant", one.text},
                                           {"user", "and the gateway"}},
                                          6);
  const std::vector<int> p1 = PromptIds(first), p2 = PromptIds(second);
  ASSERT_GE(p1.size(), 4u * kBlock) << "the shared prefix must span several blocks";
  size_t common = 0;
  while (common < p1.size() && common < p2.size() && p1[common] == p2[common]) ++common;
  const StreamResult two = Run(stub_.get(), second);
  const int cached = Cached(two);
  EXPECT_GT(cached, 0);
  EXPECT_EQ(cached % kBlock, 0) << cached;
  // Every whole block of the first turn's prompt that the second shares, less at most one
  // (an engine may recompute the block holding the prompt's last token).
  EXPECT_GE(cached, static_cast<int>(common / kBlock * kBlock) - kBlock)
      << "common prefix " << common << " of " << p1.size() << " and " << p2.size();
  EXPECT_LT(cached, static_cast<int>(p2.size()));
  EXPECT_EQ(two.finished->usage().prompt_tokens(), static_cast<int>(p2.size()));

  // The cached KV gives what computing the whole prompt gives.
  auto off_stub = off_->Stub();
  const StreamResult full = Run(off_stub.get(), second);
  EXPECT_EQ(Cached(full), 0);
  EXPECT_EQ(two.tokens, full.tokens);
  ASSERT_EQ(two.logprobs.size(), full.logprobs.size());
  for (size_t i = 0; i < full.logprobs.size(); ++i) {
    EXPECT_NEAR(two.logprobs[i], full.logprobs[i], 1e-4) << "token " << i;
  }
}

TEST_F(ServerPrefixCacheTest, OnlyTheSameSaltSharesCachedBlocks) {
  const std::vector<std::pair<std::string, std::string>> m = {{"system", LongText("salts")},
                                                              {"user", "hello"}};
  EXPECT_EQ(Cached(Run(stub_.get(), Chat(m, 2, "tenant-a"))), 0);
  EXPECT_GT(Cached(Run(stub_.get(), Chat(m, 2, "tenant-a"))), 0) << "the same salt shares";
  EXPECT_EQ(Cached(Run(stub_.get(), Chat(m, 2, "tenant-b"))), 0) << "another salt does not";
  EXPECT_EQ(Cached(Run(stub_.get(), Chat(m, 2, ""))), 0) << "nor does no salt";
  EXPECT_GT(Cached(Run(stub_.get(), Chat(m, 2, "tenant-b"))), 0) << "b's own blocks";
  EXPECT_GT(Cached(Run(stub_.get(), Chat(m, 2, ""))), 0) << "the default namespace's own";
}

TEST_F(ServerPrefixCacheTest, CacheOffReportsNoCachedTokens) {
  auto off_stub = off_->Stub();
  const v1::GenerateRequest r = Chat({{"system", LongText("off")}, {"user", "hi"}}, 2);
  EXPECT_EQ(Cached(Run(off_stub.get(), r)), 0);
  EXPECT_EQ(Cached(Run(off_stub.get(), r)), 0);
  for (const auto& [server, on] : {std::pair<ServerProcess*, bool>{&served_->server(), true},
                                   std::pair<ServerProcess*, bool>{off_, false}}) {
    auto stub = server->Stub();
    grpc::ClientContext ctx;
    v1::ModelInfo info;
    ASSERT_TRUE(stub->GetModelInfo(&ctx, v1::GetModelInfoRequest(), &info).ok());
    EXPECT_EQ(info.prefix_cache(), on);
  }
  const std::optional<std::string> text = HttpGet(off_->metrics_port(), "/metrics");
  ASSERT_TRUE(text.has_value());
  EXPECT_EQ(ScrapeValue(*text, "morserve_prefix_cache_hits_total"), 0);
  EXPECT_EQ(ScrapeValue(*text, "morserve_prefix_cache_blocks"), 0);
}

TEST_F(ServerPrefixCacheTest, MetricsCountQueriesAndHitsInTokens) {
  const std::optional<std::string> text = HttpGet(served_->server().metrics_port(), "/metrics");
  ASSERT_TRUE(text.has_value());
  for (const char* family : {"# TYPE morserve_prefix_cache_queries_total counter",
                             "# TYPE morserve_prefix_cache_hits_total counter",
                             "# TYPE morserve_prefix_cache_evictions_total counter",
                             "# TYPE morserve_prefix_cache_blocks gauge"}) {
    EXPECT_NE(text->find(family), std::string::npos) << family;
  }
  const double queries0 = Metric("morserve_prefix_cache_queries_total");
  const double hits0 = Metric("morserve_prefix_cache_hits_total");
  ASSERT_GE(queries0, 0);
  ASSERT_GE(hits0, 0);
  const v1::GenerateRequest r = Chat({{"system", LongText("metrics")}, {"user", "count"}}, 3);
  const StreamResult miss = Run(stub_.get(), r);
  const StreamResult hit = Run(stub_.get(), r);
  ASSERT_EQ(Cached(miss), 0);
  ASSERT_GT(Cached(hit), 0);
  // The engine reports a step after its events went out: wait for the counters to catch up.
  double queries = 0, hits = 0;
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (std::chrono::steady_clock::now() < end) {
    queries = Metric("morserve_prefix_cache_queries_total") - queries0;
    hits = Metric("morserve_prefix_cache_hits_total") - hits0;
    if (hits >= Cached(hit)) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(hits, Cached(hit));
  // Both prompts were looked up; the first found nothing.
  EXPECT_GT(queries, hits);
  EXPECT_LE(queries, 2.0 * miss.finished->usage().prompt_tokens());
  EXPECT_GT(Metric("morserve_prefix_cache_blocks"), 0);
}

TEST_F(ServerPrefixCacheTest, BadFlagValueNamesTheFlag) {
  const CommandResult r = RunCommand(MorserveBinary() + " serve --model " + served_->model_dir() +
                                     " --port 0 --metrics-port 0 --prefix-cache maybe");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--prefix-cache: on or off, got 'maybe'"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace morserve::testing
