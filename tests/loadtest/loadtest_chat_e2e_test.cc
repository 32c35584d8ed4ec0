// The multi-turn chat workload end to end: the real morserve-loadtest binary against a real
// `morserve serve` (prefix cache on; a tiny vanilla model on a `morserve mktokenizer`
// tokenizer with a plain chat template, no npm) over gRPC, and through the real
// `morserve-gateway` on /v1/chat/completions, all on 127.0.0.1 port 0. Every turn completes;
// later turns carry the conversation so far (more prompt tokens); the report's prompt_cache
// adds up the usage, and after the shared system prompt is cached the later requests report
// cached tokens that equal the server's own prefix cache hits over the run.
#include <gtest/gtest.h>

#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"
#include "tests/gateway/gateway_process.h"
#include "tests/server/server_process.h"
#include "tests/server/test_models.h"
#include "tests/testutil.h"

namespace morserve::testing {
namespace {

using Json = nlohmann::json;

// Runs the binary with `args` and --out OUT; the parsed report (null on failure).
Json RunLoadTest(const std::vector<std::string>& args, const std::string& out,
                 std::string* output) {
  std::vector<std::string> quoted;
  for (const std::string& a : args) quoted.push_back("'" + a + "'");
  const CommandResult r = RunCommand(absl::StrCat(
      MORSERVE_LOADTEST_BINARY, " ", absl::StrJoin(quoted, " "), " --out '", out, "'"));
  *output = r.output;
  if (r.exit_code != 0) return nullptr;
  std::ifstream in(out);
  return Json::parse(in, nullptr, false);
}

class LoadTestChatE2E : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    absl::StatusOr<TinyModelSpec> spec = ReadmeTokenizerSpec(*dir_, "vanilla");
    ASSERT_TRUE(spec.ok()) << spec.status();
    spec->max_pos = 512;
    ASSERT_TRUE(WriteTinyModel(*spec, dir_->File("model")).ok());
    WriteFile(dir_->File("model/chat_template.jinja"), kPlainChatTemplate);
  }
  static void TearDownTestSuite() { delete dir_; }

  static std::vector<std::string> ChatFlags() {
    return {"--workload",   "chat", "--conversations",       "3",  "--turns",      "3",
            "--warmup",     "1",    "--system-prompt-words", "60", "--user-words", "6",
            "--output-len", "4",    "--request-rate",        "50", "--no-progress"};
  }

  // The checks both targets share.
  static void CheckChatReport(const Json& j, const std::string& output) {
    ASSERT_TRUE(j.is_object()) << output;
    const Json& res = j["results"];
    EXPECT_EQ(res["requests"]["sent"], 9) << output;
    EXPECT_EQ(res["requests"]["completed"], 9) << res["failures"].dump();
    EXPECT_EQ(j["warmup"]["sent"], 3) << "the warm-up conversation's turns";
    EXPECT_EQ(j["config"]["turns"], 3);
    const Json& turns = j["chat_turns"];
    ASSERT_EQ(turns.size(), 3u) << j.dump();
    for (int t = 0; t < 3; ++t) {
      EXPECT_EQ(turns[t]["turn"], t);
      EXPECT_EQ(turns[t]["completed"], 3);
      EXPECT_EQ(turns[t]["ttft_ms"]["count"], 3);
    }
    // Each turn resends the conversation so far: more prompt tokens.
    EXPECT_LT(turns[0]["mean_prompt_tokens"].get<double>(),
              turns[1]["mean_prompt_tokens"].get<double>());
    EXPECT_LT(turns[1]["mean_prompt_tokens"].get<double>(),
              turns[2]["mean_prompt_tokens"].get<double>());
    const Json& pc = j["prompt_cache"];
    ASSERT_TRUE(pc.is_object()) << j.dump();
    EXPECT_EQ(pc["requests_with_usage"], 9);
    EXPECT_EQ(pc["prompt_tokens"], res["total_input_tokens"]);
    EXPECT_EQ(pc["computed_prompt_tokens"].get<int64_t>(),
              pc["prompt_tokens"].get<int64_t>() - pc["cached_tokens"].get<int64_t>());
    // The warm-up conversation cached the system prompt: every measured request finds it.
    EXPECT_GT(pc["cached_tokens"].get<int64_t>(), 0) << pc.dump();
    for (const Json& t : turns) EXPECT_GT(t["mean_cached_tokens"].get<double>(), 0) << t.dump();
    const Json& totals = j["server_metrics"]["totals"];
    EXPECT_EQ(totals["prefix_cache_hits"].get<double>(), pc["cached_tokens"].get<double>())
        << totals.dump();
    EXPECT_GT(totals["prefix_cache_queries"].get<double>(),
              totals["prefix_cache_hits"].get<double>());
  }

  static inline TempDir* dir_ = nullptr;
};

TEST_F(LoadTestChatE2E, GrpcAndGatewayChatTurns) {
  ServerProcess server;
  ASSERT_NO_FATAL_FAILURE(StartOrDie(&server, dir_->File("model"), {"--threads", "1"}));
  const std::string metrics = absl::StrCat("http://127.0.0.1:", server.metrics_port(), "/metrics");
  std::vector<std::string> args = {"--grpc", server.address(), "--metrics-url", metrics};
  for (const std::string& f : ChatFlags()) args.push_back(f);
  std::string output;
  const Json grpc = RunLoadTest(args, dir_->File("grpc.json"), &output);
  {
    SCOPED_TRACE("grpc");
    CheckChatReport(grpc, output);
  }
  EXPECT_EQ(grpc["server"]["prefix_cache"], true);

  GatewayProcess gateway;
  ASSERT_TRUE(gateway.Start({"--backend", server.address(), "--host", "127.0.0.1"}))
      << gateway.output();
  ASSERT_TRUE(gateway.WaitHealth(200)) << gateway.output();
  args = {"--url",         absl::StrCat(gateway.url(), "/v1/chat/completions"),
          "--metrics-url", metrics,
          "--seed",        "5"};  // other conversations than the gRPC run's
  for (const std::string& f : ChatFlags()) args.push_back(f);
  const Json http = RunLoadTest(args, dir_->File("http.json"), &output);
  {
    SCOPED_TRACE("http");
    CheckChatReport(http, output);
  }
  // A completions URL does not take the chat workload.
  args = {"--url", absl::StrCat(gateway.url(), "/v1/completions")};
  for (const std::string& f : ChatFlags()) args.push_back(f);
  EXPECT_TRUE(RunLoadTest(args, dir_->File("bad.json"), &output).is_null());
  EXPECT_NE(output.find("--workload chat needs a /v1/chat/completions URL"), std::string::npos)
      << output;
  EXPECT_EQ(gateway.Terminate(), 0) << gateway.output();
  EXPECT_EQ(server.Terminate(), 0) << server.output();
}

}  // namespace
}  // namespace morserve::testing
