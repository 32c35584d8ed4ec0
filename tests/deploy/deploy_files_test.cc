// The deploy/ files on their own, no live server: every JSON and YAML file parses; the
// dashboards have the panels the issue asks for; promtool checks the alert rules, the
// dashboards' expressions (as a generated recording-rules file) and the Prometheus config,
// and runs the alert unit tests; the Kubernetes PrometheusRule carries the same rules; the
// Compose file, prometheus.yml and Grafana provisioning agree on names and ports (and
// docker-compose validates the Compose file). The Dockerfile: deploy_dockerfile_test.cc.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <regex>
#include <set>
#include <sstream>

#include "nlohmann/json.hpp"
#include "tests/deploy/deploy_testutil.h"
#include "tests/testutil.h"
#include "yaml-cpp/yaml.h"

namespace morserve::testing {
namespace {

namespace fs = std::filesystem;

TEST(DeployFilesTest, EveryJsonAndYamlFileParses) {
  int json = 0, yaml = 0;
  for (const std::string dir : {"deploy", "tests/deploy"}) {
    for (const auto& e : fs::recursive_directory_iterator(RepoPath(dir))) {
      const std::string ext = e.path().extension().string();
      const std::string path = e.path().string();
      if (ext == ".json") {
        ++json;
        EXPECT_FALSE(nlohmann::json::parse(ReadTextFile(path), nullptr, false).is_discarded())
            << path;
      } else if (ext == ".yml" || ext == ".yaml") {
        ++yaml;
        try {
          const auto docs = YAML::LoadAllFromFile(path);
          EXPECT_FALSE(docs.empty()) << path;
          for (const auto& d : docs) EXPECT_TRUE(d.IsMap()) << path << ": a document is not a map";
        } catch (const YAML::Exception& ex) {
          ADD_FAILURE() << path << ": " << ex.what();
        }
      }
    }
  }
  EXPECT_GE(json, 2);
  EXPECT_GE(yaml, 18);
}

TEST(DeployFilesTest, DashboardsHaveTheRequiredPanels) {
  std::set<std::string> uids;
  std::string all_exprs;
  for (const std::string& f : DashboardFiles()) {
    const auto d = nlohmann::json::parse(ReadTextFile(f));
    EXPECT_TRUE(uids.insert(d.value("uid", "")).second) << f << ": duplicate or missing uid";
    EXPECT_FALSE(d.value("title", "").empty()) << f;
    // Panels: a Prometheus data source through the ${datasource} variable, non-empty
    // expressions, unique refIds, inside Grafana's 24-column grid.
    for (const auto& p : d["panels"]) {
      const auto& g = p["gridPos"];
      EXPECT_LE(g["x"].get<int>() + g["w"].get<int>(), 24) << f << ": " << p["title"];
      if (p["type"] == "row") continue;
      EXPECT_EQ(p["datasource"]["uid"], "${datasource}") << f << ": " << p["title"];
      std::set<std::string> refs;
      ASSERT_TRUE(p.contains("targets")) << p["title"];
      for (const auto& t : p["targets"]) {
        EXPECT_TRUE(refs.insert(t.value("refId", "")).second) << p["title"];
        EXPECT_FALSE(t.value("expr", "").empty()) << p["title"];
        all_exprs += t.value("expr", "") + "\n";
      }
    }
    bool has_instance_variable = false;
    for (const auto& v : d["templating"]["list"]) has_instance_variable |= v["name"] == "instance";
    EXPECT_TRUE(has_instance_variable) << f;
  }
  // What the issue lists: request rate, TTFT / ITL / E2E percentiles, tokens/s, running vs
  // waiting, KV usage, finish reasons, preemptions, rows per loop, exits per loop, batch fill
  // ratio, step time, the prefix cache (issue 20), and the gateway's series.
  for (const char* needle :
       {"rate(morserve_requests_finished_total",
        "histogram_quantile(0.99, sum by (le) (rate(morserve_time_to_first_token_seconds_bucket",
        "histogram_quantile(0.99, sum by (le) (rate(morserve_inter_token_latency_seconds_bucket",
        "histogram_quantile(0.99, sum by (le) (rate(morserve_e2e_request_latency_seconds_bucket",
        "rate(morserve_generation_tokens_total",
        "morserve_requests_running",
        "morserve_requests_waiting",
        "morserve_kv_cache_usage_ratio",
        "sum by (reason) (rate(morserve_requests_finished_total",
        "rate(morserve_preemptions_total",
        "sum by (loop) (rate(morserve_rows_per_loop_total",
        "rate(morserve_exits_per_loop_total",
        "morserve_batch_fill_ratio_sum",
        "morserve_step_duration_seconds_bucket",
        "rate(morserve_prefix_cache_hits_total",
        "rate(morserve_prefix_cache_queries_total",
        "rate(morserve_prefix_cache_evictions_total",
        "morserve_prefix_cache_blocks",
        "morserve_gateway_requests_total",
        "morserve_gateway_request_duration_seconds_bucket",
        "morserve_gateway_time_to_first_token_seconds_bucket",
        "morserve_gateway_completion_tokens_total",
        "morserve_gateway_backend_up",
        "morserve_gateway_backend_outstanding_requests",
        "morserve_gateway_open_connections",
        "morserve_gateway_requests_in_flight"}) {
    EXPECT_NE(all_exprs.find(needle), std::string::npos) << "no panel queries " << needle;
  }
}

TEST(DeployFilesTest, PromQlReferencesAreReadFromExpressions) {
  // The reader the live test relies on, on expressions with every construct the files use.
  PromQlRefs r = ParsePromQlRefs(
      "histogram_quantile(0.9, sum by (le, endpoint) (rate(a_bucket{instance=~\".*\", "
      "x!=\"}\"}[1m]))) / on (instance) group_left (pod) b offset 5m and vector(0) "
      "# comment mentions c\n + sum without (q) (up{job=~\"m.*\"})");
  EXPECT_EQ(r.error, "");
  EXPECT_EQ(r.metrics.size(), 3u);
  EXPECT_EQ(r.metrics["a_bucket"], (std::set<std::string>{"instance", "x"}));
  EXPECT_TRUE(r.metrics.count("b"));
  EXPECT_EQ(r.metrics["up"], (std::set<std::string>{"job"}));
  EXPECT_EQ(r.grouping_labels, (std::set<std::string>{"le", "endpoint", "instance", "pod", "q"}));
  EXPECT_NE(ParsePromQlRefs("a{b=\"c\"").error, "");
  EXPECT_EQ(SubstituteGrafanaVariables("rate(x{i=~\"$instance\"}[$__rate_interval]) ${y}"),
            "rate(x{i=~\".*\"}[1m]) .*");
  const auto exposed = ExposedSeries(
      "# TYPE h histogram\nh_bucket{le=\"0.1\",loop=\"1\"} 1\nh_sum 2\nc{reason=\"a\\\"b\"} 3\n");
  EXPECT_EQ(exposed.at("h_bucket"), (std::set<std::string>{"le", "loop"}));
  EXPECT_EQ(exposed.at("c"), (std::set<std::string>{"reason"}));
  EXPECT_TRUE(exposed.count("h_sum"));
  const auto problems = CheckRefsAgainstExposition(
      ParsePromQlRefs("sum by (le, nope) (h_bucket{loops=\"1\"}) + missing"), exposed, "x");
  EXPECT_EQ(problems.size(), 3u) << ::testing::PrintToString(problems);
}

TEST(DeployFilesTest, PromtoolChecksTheAlertRules) {
  ASSERT_TRUE(HaveCommand("promtool")) << "promtool (Debian package prometheus) is required";
  const std::string rules = RepoPath("deploy/prometheus/alerts.yml");
  const ShellResult r = RunShell("promtool check rules " + ShellQuote(rules));
  EXPECT_EQ(r.rc, 0) << r.out << r.err;
  const size_t n = LoadAlertRules(rules).size();
  EXPECT_GE(n, 5u);
  EXPECT_NE(r.out.find("SUCCESS: " + std::to_string(n) + " rules found"), std::string::npos)
      << r.out;
  // The four: queue growing, KV near full, error rate, no tokens.
  std::set<std::string> names;
  for (const auto& a : LoadAlertRules(rules)) names.insert(a.name);
  for (const char* a : {"MorserveQueueGrowing", "MorserveKvCacheNearFull", "MorserveRequestErrors",
                        "MorserveNoTokens", "MorserveGatewayErrors"}) {
    EXPECT_TRUE(names.count(a)) << a;
  }
}

TEST(DeployFilesTest, PromtoolUnitTestsOfTheAlerts) {
  ASSERT_TRUE(HaveCommand("promtool"));
  const ShellResult r = RunShell("cd " + ShellQuote(RepoPath("tests/deploy")) +
                                 " && promtool test rules alerts_test.yml");
  EXPECT_EQ(r.rc, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("SUCCESS"), std::string::npos) << r.out << r.err;
}

// The dashboards' expressions as recording rules, so promtool parses every one of them.
std::string DashboardRecordingRules(const std::vector<DashboardQuery>& queries) {
  YAML::Emitter out;
  out << YAML::BeginMap << YAML::Key << "groups" << YAML::Value << YAML::BeginSeq;
  out << YAML::BeginMap << YAML::Key << "name" << YAML::Value << "dashboards";
  out << YAML::Key << "rules" << YAML::Value << YAML::BeginSeq;
  int i = 0;
  for (const DashboardQuery& q : queries) {
    out << YAML::BeginMap << YAML::Key << "record" << YAML::Value
        << "dashboard:query_" + std::to_string(i++) << YAML::Key << "expr" << YAML::Value
        << SubstituteGrafanaVariables(q.expr) << YAML::EndMap;
  }
  out << YAML::EndSeq << YAML::EndMap << YAML::EndSeq << YAML::EndMap;
  return out.c_str();
}

TEST(DeployFilesTest, PromtoolParsesEveryDashboardExpression) {
  ASSERT_TRUE(HaveCommand("promtool"));
  TempDir dir;
  const auto queries = LoadDashboardQueries();
  ASSERT_GE(queries.size(), 40u);
  WriteTextFile(dir.File("dashboards.rules.yml"), DashboardRecordingRules(queries));
  ShellResult r = RunShell("promtool check rules " + ShellQuote(dir.File("dashboards.rules.yml")));
  EXPECT_EQ(r.rc, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("SUCCESS: " + std::to_string(queries.size()) + " rules found"),
            std::string::npos)
      << r.out << r.err;
  // The same route rejects a broken expression (so the check above can fail).
  std::vector<DashboardQuery> broken = {
      {"x", "x", "A", "sum(rate(morserve_preemptions_total[1m])"}};
  WriteTextFile(dir.File("broken.rules.yml"), DashboardRecordingRules(broken));
  r = RunShell("promtool check rules " + ShellQuote(dir.File("broken.rules.yml")));
  EXPECT_NE(r.rc, 0) << r.out;
}

// A YAML tree as one canonical string (maps with sorted keys), for comparing documents.
std::string Canonical(const YAML::Node& n) {
  if (n.IsMap()) {
    std::map<std::string, std::string> kv;
    for (const auto& e : n) kv[e.first.as<std::string>()] = Canonical(e.second);
    std::string s = "{";
    for (const auto& [k, v] : kv) s.append(k).append(":").append(v).append(",");
    return s + "}";
  }
  if (n.IsSequence()) {
    std::string s = "[";
    for (const auto& e : n) s += Canonical(e) + ",";
    return s + "]";
  }
  return n.IsScalar() ? nlohmann::json(n.as<std::string>()).dump() : "null";
}

TEST(DeployFilesTest, KubernetesPrometheusRuleCarriesTheAlertRules) {
  const YAML::Node file = YAML::LoadFile(RepoPath("deploy/prometheus/alerts.yml"));
  const YAML::Node cr = YAML::LoadFile(RepoPath("deploy/kubernetes/base/prometheus-rule.yaml"));
  EXPECT_EQ(cr["kind"].as<std::string>(), "PrometheusRule");
  EXPECT_EQ(Canonical(cr["spec"]["groups"]), Canonical(file["groups"]))
      << "deploy/kubernetes/base/prometheus-rule.yaml differs from deploy/prometheus/alerts.yml";
}

TEST(DeployFilesTest, PromtoolChecksThePrometheusConfig) {
  ASSERT_TRUE(HaveCommand("promtool"));
  TempDir dir;
  YAML::Node config = YAML::LoadFile(RepoPath("deploy/prometheus/prometheus.yml"));
  // In the Compose stack the rules file is mounted at /etc/prometheus/alerts.yml.
  ASSERT_EQ(config["rule_files"][0].as<std::string>(), "/etc/prometheus/alerts.yml");
  config["rule_files"][0] = RepoPath("deploy/prometheus/alerts.yml");
  YAML::Emitter e;
  e << config;
  WriteTextFile(dir.File("prometheus.yml"), e.c_str());
  const ShellResult r = RunShell("promtool check config " + ShellQuote(dir.File("prometheus.yml")));
  EXPECT_EQ(r.rc, 0) << r.out << r.err;
  std::set<std::string> jobs;
  for (const auto& s : config["scrape_configs"]) jobs.insert(s["job_name"].as<std::string>());
  EXPECT_EQ(jobs, (std::set<std::string>{"morserve-server", "morserve-gateway"}));
}

// The value after `flag` in a Compose command list.
std::string FlagValue(const YAML::Node& command, const std::string& flag) {
  for (size_t i = 0; i + 1 < command.size(); ++i) {
    if (command[i].as<std::string>() == flag) return command[i + 1].as<std::string>();
  }
  return "";
}

TEST(DeployFilesTest, ComposeStackIsWiredTogether) {
  const YAML::Node compose = YAML::LoadFile(RepoPath("deploy/docker-compose.yml"));
  const YAML::Node s = compose["services"];
  for (const char* name : {"server", "gateway", "prometheus", "grafana"}) {
    ASSERT_TRUE(s[name]) << "service " << name;
  }
  // Prometheus scrapes the ports the server and gateway listen on.
  const YAML::Node prom = YAML::LoadFile(RepoPath("deploy/prometheus/prometheus.yml"));
  std::map<std::string, std::string> targets;
  for (const auto& sc : prom["scrape_configs"]) {
    targets[sc["job_name"].as<std::string>()] =
        sc["static_configs"][0]["targets"][0].as<std::string>();
  }
  EXPECT_EQ(targets["morserve-server"],
            "server:" + FlagValue(s["server"]["command"], "--metrics-port"));
  EXPECT_EQ(targets["morserve-gateway"], "gateway:" + FlagValue(s["gateway"]["command"], "--port"));
  EXPECT_EQ(FlagValue(s["gateway"]["command"], "--backend"),
            "dns:server:" + FlagValue(s["server"]["command"], "--port"));
  EXPECT_EQ(FlagValue(s["server"]["command"], "--host"), "0.0.0.0");
  EXPECT_EQ(FlagValue(s["gateway"]["command"], "--host"), "0.0.0.0");
  // Both images come from deploy/docker/Dockerfile, built from the repository root.
  for (const char* name : {"server", "gateway"}) {
    EXPECT_EQ(s[name]["build"]["context"].as<std::string>(), "..") << name;
    EXPECT_EQ(s[name]["build"]["dockerfile"].as<std::string>(), "deploy/docker/Dockerfile") << name;
    EXPECT_TRUE(fs::exists(RepoPath(s[name]["build"]["dockerfile"].as<std::string>())));
  }
  // Mounts: what Prometheus and Grafana read exists in deploy/ and lands where their
  // configs look for it.
  std::map<std::string, std::string> mounts;  // container path -> host path (relative to deploy/)
  for (const char* name : {"prometheus", "grafana"}) {
    for (const auto& v : s[name]["volumes"]) {
      const std::string spec = v.as<std::string>();
      const size_t colon = spec.find(':');
      const std::string host = spec.substr(0, colon);
      const std::string rest = spec.substr(colon + 1);
      const std::string target = rest.substr(0, rest.find(':'));
      if (host.rfind("./", 0) == 0) {
        EXPECT_TRUE(fs::exists(RepoPath("deploy/" + host.substr(2)))) << spec;
        mounts[target] = host.substr(2);
      }
    }
  }
  EXPECT_EQ(mounts["/etc/prometheus/prometheus.yml"], "prometheus/prometheus.yml");
  EXPECT_EQ(mounts["/etc/prometheus/" +
                   fs::path(prom["rule_files"][0].as<std::string>()).filename().string()],
            "prometheus/alerts.yml");
  EXPECT_EQ(mounts["/etc/grafana/provisioning"], "grafana/provisioning");
  const YAML::Node providers =
      YAML::LoadFile(RepoPath("deploy/grafana/provisioning/dashboards/morserve.yml"));
  EXPECT_EQ(mounts[providers["providers"][0]["options"]["path"].as<std::string>()],
            "grafana/dashboards");
  const YAML::Node ds =
      YAML::LoadFile(RepoPath("deploy/grafana/provisioning/datasources/prometheus.yml"));
  EXPECT_EQ(ds["datasources"][0]["url"].as<std::string>(), "http://prometheus:9090");
  EXPECT_EQ(ds["datasources"][0]["type"].as<std::string>(), "prometheus");
  // The dashboards' ${datasource} variable defaults to the provisioned data source's uid.
  for (const std::string& f : DashboardFiles()) {
    const auto d = nlohmann::json::parse(ReadTextFile(f));
    for (const auto& v : d["templating"]["list"]) {
      if (v["name"] == "datasource") {
        EXPECT_EQ(v["current"]["value"], ds["datasources"][0]["uid"].as<std::string>()) << f;
      }
    }
  }
}

TEST(DeployFilesTest, DockerComposeValidatesTheComposeFiles) {
  if (!HaveCommand("docker-compose")) {
    GTEST_SKIP() << "docker-compose not installed (scripts/install_deps.sh installs it)";
  }
  const std::string d = ShellQuote(RepoPath("deploy"));
  ShellResult r = RunShell("cd " + d + " && docker-compose -f docker-compose.yml config -q");
  EXPECT_EQ(r.rc, 0) << r.out << r.err;
  r = RunShell("cd " + d +
               " && docker-compose -f docker-compose.yml -f docker-compose.gpu.yml config");
  EXPECT_EQ(r.rc, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("VARIANT: gpu"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("driver: nvidia"), std::string::npos) << r.out;
  // And rejects a broken one (a service key Compose does not know).
  TempDir dir;
  WriteTextFile(dir.File("docker-compose.yml"),
                "services:\n  a:\n    image: x\n    not_a_key: 1\n");
  r = RunShell("cd " + ShellQuote(dir.path()) + " && docker-compose config -q");
  EXPECT_NE(r.rc, 0);
}

}  // namespace
}  // namespace morserve::testing
