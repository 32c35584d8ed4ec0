// morserve-loadtest's HTTP keep-alive pool end to end: the real binary against the real
// `morserve-gateway` and `morserve serve` on 127.0.0.1 (port 0), through a counting TCP proxy
// (tcp_counting_proxy.h) that counts the connections the run opened. Keep-alive reuses
// connections (at most --max-concurrency), --no-keep-alive opens one per request, and a
// server that closes after every response (Connection: close) still gets every request
// through without a failed reuse; token counts are exact in all three (--logprobs 0, with a
// byte-level BPE tokenizer trained on the spot by `morserve mktokenizer`).
#include <gtest/gtest.h>

#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/tools/mkmodel.h"
#include "nlohmann/json.hpp"
#include "tests/gateway/gateway_process.h"
#include "tests/loadtest/tcp_counting_proxy.h"
#include "tests/server/server_process.h"
#include "tests/server/test_models.h"
#include "tests/testutil.h"

namespace morserve::testing {
namespace {

using Json = nlohmann::json;

constexpr int kRequests = 24;
constexpr int kConcurrency = 4;
constexpr int kOutputLen = 8;
constexpr int kInputLen = 5;

class LoadTestKeepAlive : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    const CommandResult tok = RunCommand(absl::StrCat(
        MorserveBinary(), " mktokenizer --corpus /usr/share/common-licenses/Apache-2.0",
        " --vocab-size 320 --out ", dir_->File("tok"), " 2>&1"));
    ASSERT_EQ(tok.exit_code, 0) << tok.output;
    TinyModelSpec spec = ServingSpec("mor-ec");
    ASSERT_TRUE(UseTokenizer(dir_->File("tok"), &spec).ok());
    ASSERT_TRUE(WriteTinyModel(spec, dir_->File("model")).ok());
    server_ = new ServerProcess();
    ASSERT_TRUE(server_->Start(dir_->File("model"), {"--threads", "1", "--max-batch", "8"}))
        << server_->output();
    ASSERT_TRUE(server_->WaitHealth(true)) << server_->output();
    gateway_ = new GatewayProcess();
    ASSERT_TRUE(gateway_->Start({"--backend", server_->address(), "--served-model-name", "m"}))
        << gateway_->output();
    // The gateway listens before its first health check marks the backend serving (that
    // check has a 1 s deadline a loaded machine can miss): wait for its /health.
    ASSERT_TRUE(gateway_->WaitHealth(200)) << gateway_->output();
  }
  static void TearDownTestSuite() {
    delete gateway_;
    delete server_;
    delete dir_;
  }

  void SetUp() override {
    if (HasFatalFailure() || !gateway_ || gateway_->port() == 0)
      GTEST_SKIP() << "set-up failed (see above)";
  }

  // One run through `proxy`: kRequests random prompts, kConcurrency at a time. --model is
  // given so that no GET /v1/models connection is counted.
  static Json Run(const TcpCountingProxy& proxy, const std::string& name,
                  std::vector<std::string> extra) {
    std::vector<std::string> args = {
        "--url",
        absl::StrCat("http://127.0.0.1:", proxy.port(), "/v1/completions"),
        "--model",
        "m",
        "--input-len",
        std::to_string(kInputLen),
        "--output-len",
        std::to_string(kOutputLen),
        "--vocab-size",
        "256",
        "--num-requests",
        std::to_string(kRequests),
        "--max-concurrency",
        std::to_string(kConcurrency),
        "--logprobs",
        "0",
        "--no-progress",
        "--out",
        dir_->File(name + ".json")};
    args.insert(args.end(), extra.begin(), extra.end());
    const CommandResult r = RunCommand(
        absl::StrCat(MORSERVE_LOADTEST_BINARY, " '", absl::StrJoin(args, "' '"), "' 2>&1"));
    EXPECT_EQ(r.exit_code, 0) << r.output;
    std::ifstream in(dir_->File(name + ".json"));
    Json j = Json::parse(in, nullptr, false);
    EXPECT_TRUE(j.is_object()) << r.output;
    return j.is_object() ? j : Json::object();
  }

  // Every request completed with exactly its tokens, streamed and in usage.
  static void ExpectExactCounts(const Json& j) {
    const Json& res = j["results"];
    EXPECT_EQ(res["requests"]["completed"], kRequests) << res.dump();
    EXPECT_EQ(res["requests"]["failed"], 0) << res["failures"].dump();
    EXPECT_EQ(res["total_output_tokens"], kRequests * kOutputLen);
    EXPECT_EQ(res["total_input_tokens"], kRequests * kInputLen);
    EXPECT_EQ(res["token_counts"]["streamed"], kRequests * kOutputLen);
    EXPECT_EQ(res["token_counts"]["usage"], kRequests * kOutputLen);
    EXPECT_EQ(res["token_counts"]["requests_streamed_ne_usage"], 0);
  }

  static TempDir* dir_;
  static ServerProcess* server_;
  static GatewayProcess* gateway_;
};
TempDir* LoadTestKeepAlive::dir_ = nullptr;
ServerProcess* LoadTestKeepAlive::server_ = nullptr;
GatewayProcess* LoadTestKeepAlive::gateway_ = nullptr;

TEST_F(LoadTestKeepAlive, ReusesConnectionsBoundedByConcurrency) {
  TcpCountingProxy proxy;
  ASSERT_TRUE(proxy.Start(gateway_->port(), false));
  const Json j = Run(proxy, "keepalive", {});
  ExpectExactCounts(j);
  const Json& c = j["target"]["connections"];
  EXPECT_EQ(c["keep_alive"], true);
  EXPECT_GE(proxy.accepted(), 1);
  EXPECT_LE(proxy.accepted(), kConcurrency);  // 24 requests over at most 4 connections
  EXPECT_EQ(c["dialled"], proxy.accepted()) << c.dump();
  EXPECT_EQ(c["reused"], kRequests - proxy.accepted()) << c.dump();
  EXPECT_EQ(c["retried"], 0);
  EXPECT_EQ(j["config"]["keep_alive"], true);
}

TEST_F(LoadTestKeepAlive, NoKeepAliveOpensOneConnectionPerRequest) {
  TcpCountingProxy proxy;
  ASSERT_TRUE(proxy.Start(gateway_->port(), false));
  const Json j = Run(proxy, "nokeepalive", {"--no-keep-alive"});
  ExpectExactCounts(j);
  const Json& c = j["target"]["connections"];
  EXPECT_EQ(proxy.accepted(), kRequests);
  EXPECT_EQ(c["keep_alive"], false);
  EXPECT_EQ(c["dialled"], kRequests) << c.dump();
  EXPECT_EQ(c["reused"], 0);
  EXPECT_EQ(j["config"]["keep_alive"], false);
}

// The proxy makes every connection's request say Connection: close, so the gateway answers
// with Connection: close and closes: the pool must not reuse any (no retried request either).
TEST_F(LoadTestKeepAlive, ServerThatClosesAfterEachResponseStillWorks) {
  TcpCountingProxy proxy;
  ASSERT_TRUE(proxy.Start(gateway_->port(), true));
  const Json j = Run(proxy, "serverclose", {});
  ExpectExactCounts(j);
  const Json& c = j["target"]["connections"];
  EXPECT_EQ(proxy.accepted(), kRequests);
  EXPECT_EQ(c["keep_alive"], true);
  EXPECT_EQ(c["dialled"], kRequests) << c.dump();
  EXPECT_EQ(c["reused"], 0) << c.dump();
  EXPECT_EQ(c["retried"], 0) << c.dump();
  EXPECT_EQ(c["dropped_closed_idle"], 0) << c.dump();  // never pooled: the header was honoured
}

// The proxy closes connections idle for 200 ms, unannounced (long enough not to cut a
// response on a loaded machine); Poisson arrivals ~330 ms apart leave pooled connections
// idle that long: they are found closed when taken (or, closed just as
// one is taken, the request is re-sent) and new ones dialled; nothing fails.
TEST_F(LoadTestKeepAlive, IdleConnectionsClosedByTheServerAreDroppedAndRedialled) {
  TcpCountingProxy proxy;
  ASSERT_TRUE(proxy.Start(gateway_->port(), false, 200));
  const Json j = Run(proxy, "idleclose", {"--request-rate", "3", "--seed", "3"});
  ExpectExactCounts(j);
  const Json& c = j["target"]["connections"];
  EXPECT_EQ(c["dialled"], proxy.accepted()) << c.dump();
  EXPECT_GE(c["dropped_closed_idle"].get<int>() + c["retried"].get<int>(), 1) << c.dump();
  EXPECT_EQ(c["reused"].get<int>() - c["retried"].get<int>() + proxy.accepted(), kRequests)
      << c.dump();
}

TEST_F(LoadTestKeepAlive, NoKeepAliveIsRefusedForGrpc) {
  const CommandResult r = RunCommand(
      absl::StrCat(MORSERVE_LOADTEST_BINARY, " --grpc 127.0.0.1:1 --no-keep-alive 2>&1"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("--no-keep-alive: only for an HTTP target"), std::string::npos)
      << r.output;
}

}  // namespace
}  // namespace morserve::testing
