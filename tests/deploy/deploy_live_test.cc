// The deploy/ files against the real processes on 127.0.0.1: a tiny model served by
// `morserve serve`, `morserve-gateway` in front of it, and a real Prometheus started from
// deploy/prometheus/prometheus.yml (targets rewritten to the live ports, 1 s scrapes, the
// repo's alert rules). Checks: every metric and label the dashboards, alert rules, HPA and
// prometheus-adapter name is in the live expositions; Prometheus scrapes both jobs, loads
// every alert rule, and each dashboard query returns finite data after real traffic; the
// container health check script follows the server's gRPC health; and the flags written in
// the Kubernetes ConfigMap/args and in the Compose file start the real binaries.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <regex>
#include <thread>

#include "engine/tools/mkmodel.h"
#include "nlohmann/json.hpp"
#include "tests/child_process.h"
#include "tests/deploy/deploy_testutil.h"
#include "tests/engine_harness.h"
#include "tests/gateway/gateway_process.h"
#include "tests/server/server_process.h"
#include "tests/server/test_models.h"
#include "tests/testutil.h"
#include "yaml-cpp/yaml.h"

namespace morserve::testing {
namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;

std::string UrlEncode(const std::string& s) {
  std::string q;
  for (char c : s) {
    if (std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.') {
      q += c;
    } else {
      char buf[4];
      std::snprintf(buf, sizeof buf, "%%%02X", static_cast<unsigned char>(c));
      q += buf;
    }
  }
  return q;
}

// An instant query's JSON "data" (discarded when the query failed).
json PromQuery(int port, const std::string& promql) {
  const auto body = HttpGet(port, "/api/v1/query?query=" + UrlEncode(promql));
  if (!body) return json::value_t::discarded;
  json j = json::parse(*body, nullptr, false);
  if (j.is_discarded() || j.value("status", "") != "success") return json::value_t::discarded;
  return j["data"];
}

std::optional<double> PromScalar(int port, const std::string& promql) {
  const json d = PromQuery(port, promql);
  if (d.is_discarded() || d["result"].empty()) return std::nullopt;
  return std::stod(d["result"][0]["value"][1].get<std::string>());
}

std::string FindPrometheus() {
  for (const char* p : {"/usr/bin/prometheus", "/usr/local/bin/prometheus"}) {
    if (access(p, X_OK) == 0) return p;
  }
  return "";
}

std::string WriteModel(const TempDir& dir) {
  const std::string path = dir.File("model");
  EXPECT_TRUE(WriteTinyModel(ServingSpec("mor-ec"), path).ok());
  return path;
}

// curl for HTTP POSTs to the gateway; returns the body ("" on failure).
std::string CurlPost(int port, const std::string& path, const json& body) {
  const ShellResult r =
      RunShell("curl -sS -f -H 'Content-Type: application/json' --max-time 60 -d " +
               ShellQuote(body.dump()) + " http://127.0.0.1:" + std::to_string(port) + path);
  return r.rc == 0 ? r.out : "";
}

// ---- one server, one gateway and Prometheus for the whole suite ------------------------------

class DeployLiveTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    model_ = WriteModel(*dir_);
    server_ = new ServerProcess();
    if (!server_->Start(model_, {"--max-batch", "8"}) || !server_->WaitHealth(true)) {
      setup_error_ = "server: " + server_->output();
      return;
    }
    gateway_ = new GatewayProcess();
    if (!gateway_->Start({"--backend", server_->address(), "--host", "127.0.0.1"}) ||
        !gateway_->WaitHealth(200, 60)) {
      setup_error_ = "gateway: " + gateway_->output();
    }
  }
  static void TearDownTestSuite() {
    delete gateway_;
    delete server_;
    delete dir_;
  }
  void SetUp() override { ASSERT_EQ(setup_error_, ""); }

  // Sends traffic: gRPC Generate calls to the server and streamed and plain completions
  // through the gateway. Returns the tokens generated.
  static int SendTraffic(int rounds) {
    int tokens = 0;
    auto stub = server_->Stub();
    for (int i = 0; i < rounds; ++i) {
      const std::vector<int> prompt = MakePrompts(1, 4, 16, 256, 7 + i)[0];
      StreamResult r = GenerateAll(stub.get(), TokenRequest(prompt, 8 + i));
      EXPECT_TRUE(r.status.ok()) << r.status.error_message();
      tokens += static_cast<int>(r.tokens.size());
      for (bool stream : {false, true}) {
        const std::string body = CurlPost(gateway_->port(), "/v1/completions",
                                          {{"model", ModelId()},
                                           {"prompt", prompt},
                                           {"max_tokens", 6},
                                           {"temperature", 0},
                                           {"stream", stream}});
        EXPECT_FALSE(body.empty()) << "completion through the gateway failed";
        tokens += body.empty() ? 0 : 6;
      }
    }
    return tokens;
  }
  static std::string ModelId() {
    const auto body = HttpGet(gateway_->port(), "/v1/models");
    if (!body) return "";
    const json j = json::parse(*body, nullptr, false);
    return j.is_discarded() || j["data"].empty() ? "" : j["data"][0].value("id", "");
  }

  static inline TempDir* dir_ = nullptr;
  static inline std::string model_;
  static inline ServerProcess* server_ = nullptr;
  static inline GatewayProcess* gateway_ = nullptr;
  static inline std::string setup_error_;
};

// Every reference of every dashboard query, alert rule, the HPA and the adapter rule.
std::vector<std::pair<std::string, std::string>> AllExpressions() {
  std::vector<std::pair<std::string, std::string>> out;
  for (const DashboardQuery& q : LoadDashboardQueries()) {
    out.push_back(
        {q.dashboard + " / " + q.panel + " / " + q.ref_id, SubstituteGrafanaVariables(q.expr)});
  }
  for (const AlertRule& a : LoadAlertRules(RepoPath("deploy/prometheus/alerts.yml"))) {
    out.push_back({"alerts.yml / " + a.name, a.expr});
  }
  const YAML::Node adapter =
      YAML::LoadFile(RepoPath("deploy/kubernetes/prometheus-adapter/values.yaml"));
  for (const auto& rule : adapter["rules"]["custom"]) {
    // namespace and pod come from the ServiceMonitor's relabelling, not the exposition.
    std::string q = rule["seriesQuery"].as<std::string>();
    q = std::regex_replace(q, std::regex("namespace!=\"\",pod!=\"\""), "");
    out.push_back({"prometheus-adapter seriesQuery", q});
  }
  const YAML::Node hpa = YAML::LoadFile(RepoPath("deploy/kubernetes/base/server-hpa.yaml"));
  out.push_back(
      {"server-hpa.yaml", hpa["spec"]["metrics"][0]["pods"]["metric"]["name"].as<std::string>()});
  return out;
}

TEST_F(DeployLiveTest, EveryReferencedMetricAndLabelIsExported) {
  SendTraffic(1);  // label values such as endpoint/code appear with the first requests
  const auto server_text = HttpGet(server_->metrics_port(), "/metrics");
  const auto gateway_text = HttpGet(gateway_->port(), "/metrics");
  ASSERT_TRUE(server_text && gateway_text);
  auto exposed = ExposedSeries(*server_text);
  const auto gateway_series = ExposedSeries(*gateway_text);
  exposed.insert(gateway_series.begin(), gateway_series.end());
  ASSERT_GT(exposed.count("morserve_requests_waiting"), 0u);
  ASSERT_GT(exposed.count("morserve_gateway_requests_total"), 0u);
  const auto expressions = AllExpressions();
  EXPECT_GE(expressions.size(), 60u);
  std::set<std::string> used;
  for (const auto& [where, expr] : expressions) {
    const PromQlRefs refs = ParsePromQlRefs(expr);
    for (const auto& [m, l] : refs.metrics) used.insert(m);
    for (const std::string& p : CheckRefsAgainstExposition(refs, exposed, where))
      ADD_FAILURE() << p;
  }
  // And the check can fail: a name the server does not export is reported.
  EXPECT_EQ(
      CheckRefsAgainstExposition(ParsePromQlRefs("rate(morserve_requests_total[1m])"), exposed, "x")
          .size(),
      1u);
  EXPECT_EQ(CheckRefsAgainstExposition(
                ParsePromQlRefs("sum by (loop) (morserve_exits_per_loop_total)"), exposed, "x")
                .size(),
            1u)
      << "exits per loop is labelled `loops`, not `loop`";
  std::cout << used.size() << " metric names referenced, all exported\n";
}

TEST_F(DeployLiveTest, PrometheusFromTheRepoConfigScrapesAndDashboardsReturnData) {
  const std::string prometheus = FindPrometheus();
  ASSERT_FALSE(prometheus.empty())
      << "the Prometheus server is required (Debian package prometheus)";
  // deploy/prometheus/prometheus.yml with the Compose targets swapped for the live ports.
  YAML::Node config = YAML::LoadFile(RepoPath("deploy/prometheus/prometheus.yml"));
  config["global"]["scrape_interval"] = "1s";
  config["global"]["evaluation_interval"] = "1s";
  config["rule_files"][0] = RepoPath("deploy/prometheus/alerts.yml");
  const std::map<std::string, int> ports = {{"morserve-server", server_->metrics_port()},
                                            {"morserve-gateway", gateway_->port()}};
  for (auto sc : config["scrape_configs"]) {
    const std::string job = sc["job_name"].as<std::string>();
    ASSERT_TRUE(ports.count(job)) << job;
    sc["static_configs"][0]["targets"][0] = "127.0.0.1:" + std::to_string(ports.at(job));
  }
  YAML::Emitter e;
  e << config;
  WriteTextFile(dir_->File("prometheus.yml"), e.c_str());
  const int prom_port = FreePort();
  ChildProcess prom;
  ASSERT_TRUE(
      prom.Start(ChildOptions{{prometheus, "--config.file=" + dir_->File("prometheus.yml"),
                               "--storage.tsdb.path=" + dir_->File("tsdb"),
                               "--web.listen-address=127.0.0.1:" + std::to_string(prom_port)},
                              {},
                              dir_->File("prometheus.log")}))
      << prom.error();
  // Both jobs up.
  auto end = Clock::now() + std::chrono::seconds(90);
  std::optional<double> up_server, up_gateway;
  while (Clock::now() < end && prom.Running()) {
    up_server = PromScalar(prom_port, "up{job=\"morserve-server\"}");
    up_gateway = PromScalar(prom_port, "up{job=\"morserve-gateway\"}");
    if (up_server == 1.0 && up_gateway == 1.0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
  }
  ASSERT_EQ(up_server, 1.0) << prom.output();
  ASSERT_EQ(up_gateway, 1.0) << prom.output();
  // Traffic while Prometheus scrapes, so rates over the last minute are non-zero; then wait
  // for a scrape that saw all of it.
  std::this_thread::sleep_for(std::chrono::seconds(2));
  SendTraffic(4);
  const auto exposition = HttpGet(server_->metrics_port(), "/metrics");
  ASSERT_TRUE(exposition);
  const auto generated = ScrapeValue(*exposition, "morserve_generation_tokens_total");
  ASSERT_TRUE(generated);
  end = Clock::now() + std::chrono::seconds(60);
  while (Clock::now() < end &&
         PromScalar(prom_port, "morserve_generation_tokens_total") != *generated) {
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
  }
  ASSERT_EQ(PromScalar(prom_port, "morserve_generation_tokens_total"), *generated);
  std::this_thread::sleep_for(std::chrono::seconds(3));  // a few more scrapes for rate()
  // Every dashboard query returns series, at least one with a finite value (a panel split
  // by endpoint may hold NaN for an endpoint idle during the last minute, as Grafana shows
  // a gap).
  int checked = 0;
  for (const DashboardQuery& q : LoadDashboardQueries()) {
    const std::string expr = SubstituteGrafanaVariables(q.expr, "1m");
    const json d = PromQuery(prom_port, expr);
    const std::string where = q.dashboard + " / " + q.panel + " / " + q.ref_id + ": " + expr;
    ASSERT_FALSE(d.is_discarded()) << where;
    EXPECT_FALSE(d["result"].empty()) << where << " returned no series";
    bool finite = false;
    for (const auto& s : d["result"])
      finite |= std::isfinite(std::stod(s["value"][1].get<std::string>()));
    EXPECT_TRUE(finite) << where << " = " << d["result"].dump();
    ++checked;
  }
  EXPECT_GE(checked, 40);
  // Key panels return the values the traffic implies.
  EXPECT_GT(PromScalar(prom_port, "sum(rate(morserve_generation_tokens_total[1m]))").value_or(0),
            0);
  EXPECT_GT(PromScalar(prom_port,
                       "histogram_quantile(0.5, sum by (le) "
                       "(rate(morserve_time_to_first_token_seconds_bucket[1m])))")
                .value_or(0),
            0);
  EXPECT_GT(
      PromScalar(prom_port, "sum(rate(morserve_gateway_completion_tokens_total[1m]))").value_or(0),
      0);
  // Prometheus loaded every alert rule of the repo's file, all healthy, none firing.
  const auto rules = HttpGet(prom_port, "/api/v1/rules");
  ASSERT_TRUE(rules);
  const json j = json::parse(*rules);
  size_t loaded = 0;
  for (const auto& g : j["data"]["groups"]) {
    for (const auto& r : g["rules"]) {
      ++loaded;
      EXPECT_EQ(r.value("health", ""), "ok") << r.dump();
      EXPECT_NE(r.value("state", ""), "firing") << r.dump();
    }
  }
  EXPECT_EQ(loaded, LoadAlertRules(RepoPath("deploy/prometheus/alerts.yml")).size());
}

// ---- the container health check ----------------------------------------------------------

TEST(DeployHealthCheckTest, ScriptFollowsTheServersGrpcHealth) {
  ASSERT_TRUE(HaveCommand("curl"));
  const std::string script = ShellQuote(RepoPath("deploy/docker/morserve-grpc-health"));
  TempDir dir;
  const std::string model = WriteModel(dir);
  ServerProcess server;
  // While loading (the delay keeps it there), health is NOT_SERVING.
  ASSERT_TRUE(server.Start(model, {"--debug-load-delay-ms", "4000"})) << server.output();
  ShellResult r = RunShell(script + " " + server.address());
  EXPECT_EQ(r.rc, 1) << r.out << r.err;
  EXPECT_NE(r.err.find("not serving (answer 00000000020802)"), std::string::npos) << r.err;
  ASSERT_TRUE(server.WaitHealth(true)) << server.output();
  r = RunShell(script + " " + server.address());
  EXPECT_EQ(r.rc, 0) << r.out << r.err;
  // Nothing listening: no answer.
  r = RunShell(script + " 127.0.0.1:" + std::to_string(FreePort()));
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("no answer"), std::string::npos) << r.err;
  EXPECT_EQ(server.Terminate(), 0) << server.output();
}

// ---- the flags in the manifests start the real binaries ----------------------------------

// Drops FLAG VALUE pairs for `drop` and replaces the values of `replace`.
std::vector<std::string> Rewrite(const std::vector<std::string>& args,
                                 const std::set<std::string>& drop,
                                 const std::map<std::string, std::string>& replace) {
  std::vector<std::string> out;
  for (size_t i = 0; i < args.size(); ++i) {
    if (drop.count(args[i]) && i + 1 < args.size()) {
      ++i;
    } else if (replace.count(args[i]) && i + 1 < args.size()) {
      out.push_back(args[i]);
      out.push_back(replace.at(args[i]));
      ++i;
    } else {
      out.push_back(args[i]);
    }
  }
  return out;
}

// Container args of a rendered Deployment with $(VAR) taken from its ConfigMap.
std::vector<std::string> KubernetesArgs(const std::string& rendered,
                                        const std::string& deployment) {
  std::map<std::string, std::string> vars;
  YAML::Node container;
  for (const auto& o : YAML::LoadAll(rendered)) {
    if (!o.IsMap()) continue;
    if (o["kind"].as<std::string>() == "Deployment" &&
        o["metadata"]["name"].as<std::string>() == deployment) {
      container = o["spec"]["template"]["spec"]["containers"][0];
    }
  }
  EXPECT_TRUE(container) << deployment;
  if (!container) return {};
  const std::string cm = container["envFrom"][0]["configMapRef"]["name"].as<std::string>();
  for (const auto& o : YAML::LoadAll(rendered)) {
    if (o.IsMap() && o["kind"].as<std::string>() == "ConfigMap" &&
        o["metadata"]["name"].as<std::string>() == cm) {
      for (const auto& kv : o["data"])
        vars[kv.first.as<std::string>()] = kv.second.as<std::string>();
    }
  }
  std::vector<std::string> args;
  for (const auto& a : container["args"]) {
    std::string s = a.as<std::string>();
    std::smatch m;
    if (std::regex_match(s, m, std::regex("\\$\\(([A-Z_0-9]+)\\)"))) s = vars[m[1]];
    args.push_back(s);
  }
  return args;
}

TEST(DeployFlagsTest, KubernetesAndComposeFlagsStartTheServerAndGateway) {
  ASSERT_TRUE(HaveCommand("kubectl"));
  const ShellResult k =
      RunShell("kubectl kustomize " + ShellQuote(RepoPath("deploy/kubernetes/base")));
  ASSERT_EQ(k.rc, 0) << k.err;
  const YAML::Node compose = YAML::LoadFile(RepoPath("deploy/docker-compose.yml"));
  std::map<std::string, std::vector<std::string>> server_args, gateway_args;
  server_args["kubernetes"] = KubernetesArgs(k.out, "morserve-server");
  gateway_args["kubernetes"] = KubernetesArgs(k.out, "morserve-gateway");
  for (const auto& a : compose["services"]["server"]["command"])
    server_args["compose"].push_back(a.as<std::string>());
  for (const auto& a : compose["services"]["gateway"]["command"])
    gateway_args["compose"].push_back(a.as<std::string>());
  TempDir dir;
  const std::string model = WriteModel(dir);
  for (const char* source : {"kubernetes", "compose"}) {
    SCOPED_TRACE(source);
    // ServerProcess adds --model DIR --port 0 --metrics-port 0 itself.
    const auto extra = Rewrite(server_args[source], {"--model", "--port", "--metrics-port"},
                               {{"--host", "127.0.0.1"}});
    ASSERT_GE(extra.size(), 6u);
    ServerProcess server;
    ASSERT_TRUE(server.Start(model, extra)) << server.output();
    ASSERT_TRUE(server.WaitHealth(true)) << server.output();
    GatewayProcess gateway;
    const auto gargs =
        Rewrite(gateway_args[source], {},
                {{"--backend", server.address()}, {"--host", "127.0.0.1"}, {"--port", "0"}});
    ASSERT_TRUE(gateway.Start(gargs)) << gateway.output();
    EXPECT_TRUE(gateway.WaitHealth(200, 60)) << gateway.output();
    EXPECT_EQ(server.Terminate(), 0) << server.output();
  }
}

}  // namespace
}  // namespace morserve::testing
