// A real Prometheus server (Debian package `prometheus`) scrapes the server's /metrics every
// second; PromQL over the scraped data must return the counts the client saw. Prometheus
// cannot bind port 0, so the test picks a free port for it. Also checks the exposition
// itself (every metric family the issue names is present).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cctype>
#include <chrono>
#include <cstdlib>
#include <thread>

#include "nlohmann/json.hpp"
#include "tests/child_process.h"
#include "tests/engine_harness.h"
#include "tests/server/server_process.h"
#include "tests/server/test_models.h"

namespace morserve::testing {
namespace {

std::string FindPrometheus() {
  for (const char* p : {"/usr/bin/prometheus", "/usr/local/bin/prometheus"}) {
    if (access(p, X_OK) == 0) return p;
  }
  return "";
}

// Runs an instant PromQL query; the scalar value of the first result, if any.
std::optional<double> Query(int port, const std::string& promql) {
  std::string q;
  for (char c : promql) {
    if (std::isalnum(static_cast<unsigned char>(c)) || c == '_') {
      q += c;
    } else {
      char buf[4];
      std::snprintf(buf, sizeof buf, "%%%02X", static_cast<unsigned char>(c));
      q += buf;
    }
  }
  auto body = HttpGet(port, "/api/v1/query?query=" + q);
  if (!body) return std::nullopt;
  auto j = nlohmann::json::parse(*body, nullptr, false);
  if (j.is_discarded() || j.value("status", "") != "success") return std::nullopt;
  const auto& result = j["data"]["result"];
  if (!result.is_array() || result.empty()) return std::nullopt;
  return std::stod(result[0]["value"][1].get<std::string>());
}

TEST(ServerPrometheusTest, PrometheusScrapesTheCountsTheClientSaw) {
  const std::string prometheus = FindPrometheus();
  ASSERT_FALSE(prometheus.empty())
      << "the Prometheus server is required (scripts/install_deps.sh installs `prometheus`)";
  TempDir dir;
  ASSERT_TRUE(WriteTinyModel(ServingSpec("mor-ec"), dir.File("model")).ok());
  ServerProcess server;
  ASSERT_TRUE(server.Start(dir.File("model"), {})) << server.output();
  ASSERT_TRUE(server.WaitHealth(true)) << server.output();

  auto stub = server.Stub();
  int tokens = 0, prompt_tokens = 0;
  const int kRequests = 3;
  for (int i = 0; i < kRequests; ++i) {
    const std::vector<int> prompt = MakePrompts(1, 4, 20, 256, 100 + i)[0];
    StreamResult r = GenerateAll(stub.get(), TokenRequest(prompt, 10 * (i + 1)));
    ASSERT_TRUE(r.status.ok()) << r.status.error_message();
    tokens += static_cast<int>(r.tokens.size());
    prompt_tokens += static_cast<int>(prompt.size());
  }
  EXPECT_EQ(tokens, 60);

  // The exposition carries every family (checked directly, before Prometheus).
  auto text = HttpGet(server.metrics_port(), "/metrics");
  ASSERT_TRUE(text.has_value());
  for (const char* family :
       {"morserve_requests_running", "morserve_requests_waiting", "morserve_kv_cache_usage_ratio",
        "morserve_kv_cache_blocks", "morserve_time_to_first_token_seconds",
        "morserve_inter_token_latency_seconds", "morserve_e2e_request_latency_seconds",
        "morserve_request_queue_time_seconds", "morserve_prompt_tokens_total",
        "morserve_generation_tokens_total", "morserve_requests_finished_total",
        "morserve_preemptions_total", "morserve_requests_rejected_total",
        "morserve_rows_per_loop_total", "morserve_exits_per_loop_total", "morserve_batch_fill_ratio",
        "morserve_step_duration_seconds", "morserve_tokens_per_step", "morserve_loops_per_token",
        "morserve_engine_step_phase_seconds_total"}) {
    EXPECT_NE(text->find(std::string("# TYPE ") + family + " "), std::string::npos) << family;
  }
  EXPECT_EQ(ScrapeValue(*text, "morserve_generation_tokens_total"), tokens);
  EXPECT_EQ(ScrapeValue(*text, "morserve_time_to_first_token_seconds_count"), kRequests);
  // The steps' phases: every phase that ran model work took time, and together they fit
  // inside the steps' wall time.
  double phase_sum = 0;
  for (const char* phase : {"schedule", "enter", "pass", "tail", "sample"}) {
    const std::optional<double> v = ScrapeValue(
        *text, std::string("morserve_engine_step_phase_seconds_total{phase=\"") + phase + "\"}");
    ASSERT_TRUE(v.has_value()) << phase;
    EXPECT_GT(*v, 0.0) << phase;
    phase_sum += *v;
  }
  const std::optional<double> step_sum = ScrapeValue(*text, "morserve_step_duration_seconds_sum");
  ASSERT_TRUE(step_sum.has_value());
  EXPECT_LE(phase_sum, *step_sum * (1 + 1e-9));

  const int prom_port = FreePort();
  const std::string config = dir.File("prometheus.yml");
  WriteFile(config, "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
                    "scrape_configs:\n  - job_name: morserve\n    static_configs:\n"
                    "      - targets: ['127.0.0.1:" + std::to_string(server.metrics_port()) + "']\n");
  ChildProcess prom;
  ASSERT_TRUE(prom.Start({prometheus, "--config.file=" + config,
                          "--storage.tsdb.path=" + dir.File("tsdb"),
                          "--web.listen-address=127.0.0.1:" + std::to_string(prom_port)}))
      << prom.error();

  // Wait for a scrape that saw every request (Prometheus needs a few seconds to start).
  std::optional<double> generated, finished, prompt, up, loops;
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(90);
  while (std::chrono::steady_clock::now() < end && prom.Running()) {
    up = Query(prom_port, "up{job=\"morserve\"}");
    generated = Query(prom_port, "morserve_generation_tokens_total");
    if (up == 1.0 && generated == tokens) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
  }
  ASSERT_EQ(up, 1.0) << prom.output();
  EXPECT_EQ(generated, tokens);
  finished = Query(prom_port, "sum(morserve_requests_finished_total{reason=\"length\"})");
  EXPECT_EQ(finished, kRequests);
  prompt = Query(prom_port, "morserve_prompt_tokens_total");
  EXPECT_EQ(prompt, prompt_tokens);
  // Every generated token came out of some loop count: the histogram's count matches.
  loops = Query(prom_port, "morserve_loops_per_token_count");
  EXPECT_EQ(loops, tokens);
  EXPECT_EQ(server.Terminate(), 0) << server.output();
}

}  // namespace
}  // namespace morserve::testing
