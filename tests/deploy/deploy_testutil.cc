// Helpers for the deploy tests (see deploy_testutil.h).
#include "tests/deploy/deploy_testutil.h"

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "nlohmann/json.hpp"
#include "yaml-cpp/yaml.h"

namespace morserve::testing {

std::string RepoPath(const std::string& relative) {
  return std::string(MORSERVE_SOURCE_DIR) + "/" + relative;
}

std::string ReadTextFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

void WriteTextFile(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
}

std::string ShellQuote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

ShellResult RunShell(const std::string& command) {
  char err_path[] = "/tmp/morserve-deploy-stderr-XXXXXX";
  const int fd = mkstemp(err_path);
  if (fd >= 0) close(fd);
  ShellResult r;
  const std::string full = "(" + command + ") </dev/null 2>" + err_path;
  FILE* p = popen(full.c_str(), "r");
  if (!p) return r;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  const int status = pclose(p);
  r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.err = ReadTextFile(err_path);
  std::remove(err_path);
  return r;
}

bool HaveCommand(const std::string& name) {
  return RunShell("command -v " + ShellQuote(name) + " >/dev/null").rc == 0;
}

// ---- PromQL ---------------------------------------------------------------------------------

namespace {

bool IsIdentStart(char c) {
  return std::isalpha(static_cast<unsigned char>(c)) || c == '_' || c == ':';
}
bool IsIdentChar(char c) { return IsIdentStart(c) || std::isdigit(static_cast<unsigned char>(c)); }

const std::set<std::string>& Keywords() {
  static const std::set<std::string> k = {
      "and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right", "bool",
      "offset", "inf", "nan", "atan2",
      // aggregation operators (may be followed by a by/without clause before their '(')
      "sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values", "bottomk",
      "topk", "quantile"};
  return k;
}

bool IsGroupingKeyword(const std::string& w) {
  return w == "by" || w == "without" || w == "on" || w == "ignoring" || w == "group_left" ||
         w == "group_right";
}

struct Lexer {
  const std::string& s;
  size_t i = 0;
  void SkipSpace() {
    while (i < s.size()) {
      if (std::isspace(static_cast<unsigned char>(s[i]))) {
        ++i;
      } else if (s[i] == '#') {  // comment to end of line
        while (i < s.size() && s[i] != '\n') ++i;
      } else {
        break;
      }
    }
  }
  char Peek() {
    SkipSpace();
    return i < s.size() ? s[i] : '\0';
  }
  bool SkipString() {  // at a quote: to the matching quote
    const char q = s[i++];
    while (i < s.size() && s[i] != q) i += (s[i] == '\\' && q != '`') ? 2 : 1;
    if (i >= s.size()) return false;
    ++i;
    return true;
  }
  std::string Ident() {
    const size_t b = i;
    while (i < s.size() && IsIdentChar(s[i])) ++i;
    return s.substr(b, i - b);
  }
};

// Reads a "(a, b, c)" label list after a grouping keyword.
bool ReadLabelList(Lexer& lx, std::set<std::string>* out) {
  if (lx.Peek() != '(') return false;
  ++lx.i;
  while (lx.Peek() != ')') {
    if (lx.i >= lx.s.size()) return false;
    if (lx.s[lx.i] == ',') {
      ++lx.i;
      continue;
    }
    if (!IsIdentStart(lx.s[lx.i])) return false;
    out->insert(lx.Ident());
  }
  ++lx.i;
  return true;
}

// Reads a "{label op "value", ...}" matcher list.
bool ReadMatchers(Lexer& lx, std::set<std::string>* labels) {
  ++lx.i;  // '{'
  while (lx.Peek() != '}') {
    if (lx.i >= lx.s.size()) return false;
    const char c = lx.s[lx.i];
    if (c == ',') {
      ++lx.i;
    } else if (IsIdentStart(c)) {
      labels->insert(lx.Ident());
      lx.SkipSpace();
      while (lx.i < lx.s.size() && std::string("=!~").find(lx.s[lx.i]) != std::string::npos) ++lx.i;
      if (lx.Peek() != '"' && lx.Peek() != '\'' && lx.Peek() != '`') return false;
      if (!lx.SkipString()) return false;
    } else {
      return false;
    }
  }
  ++lx.i;
  return true;
}

}  // namespace

PromQlRefs ParsePromQlRefs(const std::string& expr) {
  PromQlRefs refs;
  Lexer lx{expr};
  while (lx.Peek() != '\0') {
    const char c = lx.s[lx.i];
    if (c == '"' || c == '\'' || c == '`') {
      if (!lx.SkipString()) refs.error = "unterminated string";
    } else if (c == '[') {  // range or subquery: durations only
      const size_t close = expr.find(']', lx.i);
      if (close == std::string::npos) {
        refs.error = "unterminated [";
        return refs;
      }
      lx.i = close + 1;
    } else if (c == '{') {  // matchers without a metric name
      std::set<std::string> ignored;
      if (!ReadMatchers(lx, &ignored)) refs.error = "bad matchers";
    } else if (std::isdigit(static_cast<unsigned char>(c)) || c == '.') {
      while (lx.i < expr.size() &&
             (std::isalnum(static_cast<unsigned char>(expr[lx.i])) || expr[lx.i] == '.')) {
        ++lx.i;
      }
    } else if (IsIdentStart(c)) {
      const std::string word = lx.Ident();
      const char next = lx.Peek();
      if (IsGroupingKeyword(word)) {
        if (next == '(' && !ReadLabelList(lx, &refs.grouping_labels)) refs.error = "bad " + word;
      } else if (word == "offset") {
        while (lx.i < expr.size() && std::isalnum(static_cast<unsigned char>(expr[lx.i]))) ++lx.i;
      } else if (Keywords().count(word) || next == '(') {
        // operator, aggregation or function name
      } else {
        std::set<std::string>& labels = refs.metrics[word];
        if (next == '{' && !ReadMatchers(lx, &labels)) refs.error = "bad matchers of " + word;
      }
    } else {
      ++lx.i;  // operators, parentheses, commas
    }
    if (!refs.error.empty()) return refs;
  }
  return refs;
}

std::string SubstituteGrafanaVariables(const std::string& expr, const std::string& range) {
  std::string out;
  for (size_t i = 0; i < expr.size();) {
    if (expr[i] != '$') {
      out += expr[i++];
      continue;
    }
    size_t j = i + 1;
    std::string name;
    if (j < expr.size() && expr[j] == '{') {
      const size_t close = expr.find('}', j);
      name = expr.substr(j + 1, close - j - 1);
      j = close + 1;
    } else {
      while (j < expr.size() && IsIdentChar(expr[j])) ++j;
      name = expr.substr(i + 1, j - i - 1);
    }
    out += (name == "__rate_interval" || name == "__interval" || name == "__range") ? range : ".*";
    i = j;
  }
  return out;
}

// ---- dashboards and rules ---------------------------------------------------------------

std::vector<std::string> DashboardFiles() {
  std::vector<std::string> files;
  for (const auto& e : std::filesystem::directory_iterator(RepoPath("deploy/grafana/dashboards"))) {
    if (e.path().extension() == ".json") files.push_back(e.path().string());
  }
  std::sort(files.begin(), files.end());
  return files;
}

namespace {

void CollectPanels(const nlohmann::json& panels, const std::string& file,
                   std::vector<DashboardQuery>* out) {
  if (!panels.is_array()) return;
  for (const auto& p : panels) {
    if (p.contains("panels")) CollectPanels(p["panels"], file, out);
    if (!p.contains("targets")) continue;
    for (const auto& t : p["targets"]) {
      out->push_back({file, p.value("title", ""), t.value("refId", ""), t.value("expr", "")});
    }
  }
}

}  // namespace

std::vector<DashboardQuery> LoadDashboardQueries() {
  std::vector<DashboardQuery> out;
  for (const std::string& f : DashboardFiles()) {
    const auto j = nlohmann::json::parse(ReadTextFile(f), nullptr, false);
    if (j.is_discarded()) continue;  // the parse test reports it
    CollectPanels(j.value("panels", nlohmann::json::array()),
                  std::filesystem::path(f).filename().string(), &out);
  }
  return out;
}

std::vector<AlertRule> LoadAlertRules(const std::string& path) {
  std::vector<AlertRule> out;
  const YAML::Node doc = YAML::LoadFile(path);
  for (const auto& g : doc["groups"]) {
    for (const auto& r : g["rules"]) {
      out.push_back({g["name"].as<std::string>(),
                     r["alert"] ? r["alert"].as<std::string>() : r["record"].as<std::string>(),
                     r["expr"].as<std::string>()});
    }
  }
  return out;
}

// ---- expositions ---------------------------------------------------------------------------

std::map<std::string, std::set<std::string>> ExposedSeries(const std::string& exposition) {
  std::map<std::string, std::set<std::string>> out;
  std::istringstream in(exposition);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    size_t i = 0;
    while (i < line.size() && IsIdentChar(line[i])) ++i;
    std::set<std::string>& labels = out[line.substr(0, i)];
    if (i >= line.size() || line[i] != '{') continue;
    ++i;
    while (i < line.size() && line[i] != '}') {
      const size_t b = i;
      while (i < line.size() && IsIdentChar(line[i])) ++i;
      labels.insert(line.substr(b, i - b));
      i = line.find('"', i);
      if (i == std::string::npos) break;
      for (++i; i < line.size() && line[i] != '"'; ++i) {
        if (line[i] == '\\') ++i;
      }
      ++i;  // closing quote
      if (i < line.size() && line[i] == ',') ++i;
    }
  }
  return out;
}

std::vector<std::string> CheckRefsAgainstExposition(
    const PromQlRefs& refs, const std::map<std::string, std::set<std::string>>& exposed,
    const std::string& where) {
  std::vector<std::string> problems;
  if (!refs.error.empty())
    problems.push_back(where + ": cannot read the expression: " + refs.error);
  const std::set<std::string> target_labels = {"instance", "job"};
  std::set<std::string> all_labels = target_labels;
  for (const auto& [metric, labels] : refs.metrics) {
    if (metric == "up") continue;  // Prometheus' own per-target series
    auto it = exposed.find(metric);
    if (it == exposed.end()) {
      problems.push_back(where + ": metric " + metric + " is not exported");
      continue;
    }
    all_labels.insert(it->second.begin(), it->second.end());
    for (const std::string& l : labels) {
      if (!it->second.count(l) && !target_labels.count(l)) {
        problems.push_back(where + ": " + metric + " has no label " + l);
      }
    }
  }
  for (const std::string& l : refs.grouping_labels) {
    if (!all_labels.count(l))
      problems.push_back(where + ": grouping label " + l + " is on no metric");
  }
  return problems;
}

}  // namespace morserve::testing
