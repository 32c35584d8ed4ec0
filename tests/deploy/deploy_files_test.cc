// The deploy/ files on their own, no live server: every JSON and YAML file parses; the
// dashboards have the panels the issue asks for; promtool checks the alert rules, the
// dashboards' expressions (as a generated recording-rules file) and the Prometheus config,
// and runs the alert unit tests; the Kubernetes PrometheusRule carries the same rules; the
// Compose file, prometheus.yml and Grafana provisioning agree on names and ports (and
// docker-compose validates the Compose file); the Dockerfile's builder runs ./test.sh's build
// commands, its images run as non-root with a health check, and the runtime image's package
// list provides every shared library the built binaries load.
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
  // ratio, step time, and the gateway's series.
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
  // The issue's four: queue growing, KV near full, error rate, no tokens.
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
    for (const auto& [k, v] : kv) s += k + ":" + v + ",";
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
            "server:" + FlagValue(s["server"]["command"], "--port"));
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

// ---- Dockerfile ------------------------------------------------------------------------------

// Logical lines of a shell script or Dockerfile: continuations joined, comments and blank
// lines dropped, whitespace collapsed.
std::vector<std::string> LogicalLines(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  std::string line, current;
  while (std::getline(in, line)) {
    const size_t first = line.find_first_not_of(" \t");
    if (first == std::string::npos || line[first] == '#') continue;
    const bool continued = !line.empty() && line.back() == '\\';
    current += " " + (continued ? line.substr(0, line.size() - 1) : line);
    if (!continued) {
      out.push_back(std::regex_replace(current, std::regex("^\\s+|\\s+$"), ""));
      out.back() = std::regex_replace(out.back(), std::regex("\\s+"), " ");
      current.clear();
    }
  }
  return out;
}

struct Stage {
  std::string base, name;
  std::vector<std::pair<std::string, std::string>> instructions;  // (INSTRUCTION, rest)
};

std::vector<Stage> ParseDockerfile(const std::string& path) {
  std::vector<Stage> stages;
  for (const std::string& l : LogicalLines(ReadTextFile(path))) {
    const size_t sp = l.find(' ');
    const std::string ins = l.substr(0, sp), rest = sp == std::string::npos ? "" : l.substr(sp + 1);
    if (ins == "FROM") {
      std::smatch m;
      std::regex_match(rest, m, std::regex("(\\S+)(?: AS (\\S+))?"));
      stages.push_back({m[1], m[2], {}});
    } else if (!stages.empty()) {
      stages.back().instructions.push_back({ins, rest});
    }
  }
  return stages;
}

const Stage* FindStage(const std::vector<Stage>& stages, const std::string& name) {
  for (const Stage& s : stages) {
    if (s.name == name) return &s;
  }
  return nullptr;
}

// The stages a stage builds on, itself first (FROM ${VARIANT}-style bases resolved to every
// variant, so "runtime-${VARIANT}" gives both runtime-cpu and runtime-gpu chains).
void StageChain(const std::vector<Stage>& stages, const std::string& name,
                std::vector<const Stage*>* out) {
  const Stage* s = FindStage(stages, name);
  if (!s) return;
  out->push_back(s);
  const size_t var = s->base.find("${VARIANT}");
  if (var == std::string::npos) {
    StageChain(stages, s->base, out);
  } else {
    for (const char* v : {"cpu", "gpu"}) {
      StageChain(stages, s->base.substr(0, var) + v + s->base.substr(var + 10), out);
    }
  }
}

const std::string kDockerfile = "deploy/docker/Dockerfile";

TEST(DeployDockerfileTest, BuilderRunsTheBuildCommandsOfTestSh) {
  // test.sh's commands before ctest, without the shell setup and the timer.
  std::vector<std::string> expected;
  for (const std::string& l : LogicalLines(ReadTextFile(RepoPath("test.sh")))) {
    if (l.rfind("ctest", 0) == 0) break;
    if (l.rfind("set ", 0) == 0 || l.rfind("cd ", 0) == 0 || l.rfind("start=", 0) == 0) continue;
    expected.push_back(l);
  }
  ASSERT_GE(expected.size(), 3u);
  EXPECT_EQ(expected[expected.size() - 3], "scripts/install_deps.sh");
  // The builder's RUN commands, split at &&.
  const auto stages = ParseDockerfile(RepoPath(kDockerfile));
  std::vector<const Stage*> chain;
  StageChain(stages, "builder", &chain);
  ASSERT_FALSE(chain.empty());
  std::vector<std::string> commands;
  for (const auto& [ins, rest] : chain[0]->instructions) {
    if (ins != "RUN") continue;
    size_t b = 0;
    for (size_t e; (e = rest.find(" && ", b)) != std::string::npos; b = e + 4) {
      commands.push_back(rest.substr(b, e - b));
    }
    commands.push_back(rest.substr(b));
  }
  size_t next = 0;
  for (const std::string& c : commands) {
    if (next < expected.size() && c == expected[next]) ++next;
  }
  EXPECT_EQ(next, expected.size())
      << "the builder stage of " << kDockerfile << " does not run, in order, test.sh's line: "
      << (next < expected.size() ? expected[next] : "");
  // The variants set what test.sh reads from the environment.
  const auto env_of = [&](const char* stage) {
    std::string env;
    for (const auto& [ins, rest] : FindStage(stages, stage)->instructions) {
      if (ins == "ENV") env += rest + " ";
    }
    return env;
  };
  EXPECT_NE(env_of("builder-cpu").find("MORSERVE_CUDA=OFF"), std::string::npos);
  EXPECT_NE(env_of("builder-gpu").find("MORSERVE_CUDA=ON"), std::string::npos);
}

TEST(DeployDockerfileTest, ImagesRunAsNonRootWithAHealthCheck) {
  const auto stages = ParseDockerfile(RepoPath(kDockerfile));
  EXPECT_EQ(stages.back().name, "server") << "the default target is the server";
  for (const char* target : {"server", "gateway"}) {
    const Stage* s = FindStage(stages, target);
    ASSERT_NE(s, nullptr) << target;
    std::map<std::string, std::string> last;
    for (const auto& [ins, rest] : s->instructions) last[ins] = rest;
    EXPECT_TRUE(std::regex_match(last["USER"], std::regex("[1-9][0-9]*:[1-9][0-9]*")))
        << target << ": USER must be a numeric non-root uid:gid (Kubernetes runAsNonRoot), got "
        << last["USER"];
    EXPECT_NE(last["HEALTHCHECK"].find("CMD"), std::string::npos) << target;
    EXPECT_FALSE(last["ENTRYPOINT"].empty()) << target;
    // Runtime chains end on debian:bookworm-slim: no compilers, no headers.
    std::vector<const Stage*> chain;
    StageChain(stages, target, &chain);
    for (const Stage* c : chain) {
      if (!FindStage(stages, c->base) && c->base.find("${") == std::string::npos) {
        EXPECT_EQ(c->base, "debian:bookworm-slim") << target << " via " << c->name;
      }
    }
  }
  // The server's health check is the gRPC one, and the gateway's is GET /health.
  std::string server_hc, gateway_hc;
  for (const auto& [ins, rest] : FindStage(stages, "server")->instructions) {
    if (ins == "HEALTHCHECK") server_hc = rest;
  }
  for (const auto& [ins, rest] : FindStage(stages, "gateway")->instructions) {
    if (ins == "HEALTHCHECK") gateway_hc = rest;
  }
  EXPECT_NE(server_hc.find("morserve-grpc-health"), std::string::npos);
  EXPECT_NE(gateway_hc.find("/health"), std::string::npos);
  // COPY sources outside other stages exist in the repository.
  for (const Stage& s : stages) {
    for (const auto& [ins, rest] : s.instructions) {
      if (ins != "COPY" || rest.find("--from=") != std::string::npos) continue;
      const std::string src = rest.substr(0, rest.find(' '));
      if (src != ".") EXPECT_TRUE(fs::exists(RepoPath(src))) << "COPY " << rest;
    }
  }
}

// dpkg's database of installed packages (no network, no apt lists): name -> the package
// names its Depends and Pre-Depends mention (every alternative), and the Essential set.
struct Dpkg {
  std::map<std::string, std::vector<std::string>> depends;
  std::vector<std::string> essential;
};

Dpkg ReadDpkg() {
  Dpkg d;
  std::stringstream in(
      RunShell("dpkg-query -W -f='${Package}\\t${Essential}\\t${Depends}, ${Pre-Depends}\\n'").out);
  const std::regex name("([a-z0-9][a-z0-9+.-]+)");
  for (std::string line; std::getline(in, line);) {
    const size_t t1 = line.find('\t'), t2 = line.find('\t', t1 + 1);
    if (t2 == std::string::npos) continue;
    const std::string pkg = line.substr(0, t1);
    if (line.substr(t1 + 1, t2 - t1 - 1) == "yes") d.essential.push_back(pkg);
    std::stringstream deps(line.substr(t2 + 1));
    for (std::string clause; std::getline(deps, clause, ',');) {
      std::stringstream alts(clause);
      for (std::string alt; std::getline(alts, alt, '|');) {
        std::smatch m;
        if (std::regex_search(alt, m, name)) d.depends[pkg].push_back(m[1]);
      }
    }
  }
  return d;
}

std::set<std::string> DependencyClosure(const Dpkg& dpkg, std::vector<std::string> todo) {
  std::set<std::string> seen;
  while (!todo.empty()) {
    const std::string p = todo.back();
    todo.pop_back();
    if (!seen.insert(p).second) continue;
    auto it = dpkg.depends.find(p);
    if (it != dpkg.depends.end()) todo.insert(todo.end(), it->second.begin(), it->second.end());
  }
  return seen;
}

// The Debian packages owning the shared libraries `binary` loads (CUDA's excepted).
std::set<std::string> PackagesOfSharedLibraries(const std::string& binary) {
  const ShellResult ldd = RunShell("ldd " + ShellQuote(binary));
  EXPECT_EQ(ldd.rc, 0) << ldd.err;
  std::vector<std::string> libs;
  std::string candidates;
  std::smatch m;
  std::string text = ldd.out;
  while (std::regex_search(text, m, std::regex("=> (/\\S+)"))) {
    const std::string lib = m[1];
    text = m.suffix();
    if (lib.rfind("/usr/local/cuda", 0) == 0) continue;  // NVIDIA's packages, GPU variant only
    libs.push_back(lib);
    // dpkg records a file under the path its package ships (/lib or /usr/lib, merged /usr).
    for (const std::string& path : {lib, fs::weakly_canonical(lib).string()}) {
      for (const std::string& p :
           {path, std::regex_replace(path, std::regex("^/usr/lib/"), "/lib/"),
            std::regex_replace(path, std::regex("^/lib/"), "/usr/lib/")}) {
        candidates += " " + ShellQuote(p);
      }
    }
  }
  std::map<std::string, std::string> owner;  // path -> package
  std::stringstream out(RunShell("dpkg-query -S" + candidates + " 2>/dev/null").out);
  for (std::string line; std::getline(out, line);) {
    const size_t sep = line.find(": ");
    if (sep == std::string::npos) continue;
    const std::string pkg = line.substr(0, line.find(':'));
    owner[line.substr(sep + 2)] = pkg;
  }
  std::set<std::string> pkgs;
  for (const std::string& lib : libs) {
    std::string found;
    for (const std::string& path : {lib, fs::weakly_canonical(lib).string()}) {
      for (const std::string& p :
           {path, std::regex_replace(path, std::regex("^/usr/lib/"), "/lib/"),
            std::regex_replace(path, std::regex("^/lib/"), "/usr/lib/")}) {
        if (found.empty() && owner.count(p)) found = owner[p];
      }
    }
    EXPECT_FALSE(found.empty()) << binary << " loads " << lib << ", which no Debian package owns";
    if (!found.empty()) pkgs.insert(found);
  }
  return pkgs;
}

TEST(DeployDockerfileTest, RuntimePackagesProvideEveryLibraryTheBinariesLoad) {
  const auto stages = ParseDockerfile(RepoPath(kDockerfile));
  const Stage* runtime = FindStage(stages, "runtime-cpu");
  ASSERT_NE(runtime, nullptr);
  std::vector<std::string> listed;
  for (const auto& [ins, rest] : runtime->instructions) {
    const size_t at = rest.find("apt-get install");
    if (ins != "RUN" || at == std::string::npos) continue;
    std::stringstream words(rest.substr(at + 15, rest.find("&&", at) - at - 15));
    for (std::string w; words >> w;) {
      if (w[0] != '-') listed.push_back(w);
    }
  }
  ASSERT_GE(listed.size(), 5u);
  // Every listed package is a real bookworm package (installed here as a dependency of the
  // -dev packages install_deps.sh brings, or known to apt).
  for (const std::string& p : listed) {
    const bool installed =
        RunShell("dpkg-query -W -f='${Status}' " + ShellQuote(p)).out == "install ok installed";
    const bool known =
        installed || RunShell("apt-cache show --no-all-versions " + ShellQuote(p)).rc == 0;
    EXPECT_TRUE(known) << "runtime package " << p << " is not a Debian bookworm package";
  }
  // What debian:bookworm-slim has: the Essential packages and apt, with their dependencies.
  const Dpkg dpkg = ReadDpkg();
  std::vector<std::string> base = dpkg.essential;
  base.push_back("apt");
  std::vector<std::string> image = base;
  image.insert(image.end(), listed.begin(), listed.end());
  const std::set<std::string> in_image = DependencyClosure(dpkg, image);
  const std::set<std::string> in_base = DependencyClosure(dpkg, base);
  std::map<std::string, std::set<std::string>> needs;
  for (const std::string& binary :
       {std::string(MORSERVE_BINARY), std::string(MORSERVE_GATEWAY_BINARY)}) {
    if (!fs::exists(binary)) {
      ADD_FAILURE() << binary << " is not built";
      continue;
    }
    needs[binary] = PackagesOfSharedLibraries(binary);
    for (const std::string& p : needs[binary]) {
      EXPECT_TRUE(in_image.count(p)) << fs::path(binary).filename() << " needs package " << p
                                     << ", which the runtime image does not install";
    }
  }
  // And the list carries no package that nothing needs beyond the base (curl and
  // ca-certificates serve the health checks).
  std::set<std::string> needed;
  for (const auto& [binary, pkgs] : needs) needed.insert(pkgs.begin(), pkgs.end());
  for (const std::string& p : listed) {
    if (p == "curl" || p == "ca-certificates") continue;
    EXPECT_TRUE(needed.count(p) || in_base.count(p))
        << "runtime package " << p << " provides no library the binaries load";
  }
}

}  // namespace
}  // namespace morserve::testing
