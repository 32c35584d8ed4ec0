// Helpers for the deploy tests (tests/deploy): repository paths, running a command, the
// metric and label names a PromQL expression refers to, the queries of the Grafana dashboards
// and the alert rules, and the series names of a Prometheus text exposition.
#pragma once

#include <map>
#include <set>
#include <string>
#include <vector>

namespace morserve::testing {

// MORSERVE_SOURCE_DIR + "/" + relative.
std::string RepoPath(const std::string& relative);

struct ShellResult {
  int rc = -1;      // exit status; -1 when it did not exit normally
  std::string out;  // stdout
  std::string err;  // stderr
};
// Runs `sh -c command` with stdin from /dev/null.
ShellResult RunShell(const std::string& command);
// True when `name` is an executable on PATH.
bool HaveCommand(const std::string& name);
// Single-quotes `s` for sh.
std::string ShellQuote(const std::string& s);

// What a PromQL expression refers to: each vector selector's metric name with the label
// names of its matchers, and the label names of by / without / on / ignoring / group_left /
// group_right clauses. `error` is set when the lexer cannot follow the expression.
struct PromQlRefs {
  std::map<std::string, std::set<std::string>> metrics;  // metric -> matcher label names
  std::set<std::string> grouping_labels;
  std::string error;
};
PromQlRefs ParsePromQlRefs(const std::string& expr);

// Grafana's variables replaced by values Prometheus accepts: $__rate_interval and
// $__interval by `range`, $instance / ${instance} (and any other $var) by ".*".
std::string SubstituteGrafanaVariables(const std::string& expr, const std::string& range = "1m");

struct DashboardQuery {
  std::string dashboard;  // file name
  std::string panel;      // panel title
  std::string ref_id;
  std::string expr;  // as written in the dashboard
};
// Every target of every panel (rows' nested panels included) of the dashboard JSON files in
// deploy/grafana/dashboards.
std::vector<DashboardQuery> LoadDashboardQueries();
std::vector<std::string> DashboardFiles();

struct AlertRule {
  std::string group, name, expr;
};
std::vector<AlertRule> LoadAlertRules(const std::string& path);

// Series name -> label names, from the samples of a text exposition (so histograms appear
// as NAME_bucket {le, ...}, NAME_sum, NAME_count).
std::map<std::string, std::set<std::string>> ExposedSeries(const std::string& exposition);

// Checks that everything `refs` names is exposed: each metric (or is Prometheus' own `up`),
// each matcher label on that metric, each grouping label on some metric of the expression.
// Labels Prometheus attaches at scrape time (instance, job) are always allowed. Returns one
// line per problem, prefixed by `where`.
std::vector<std::string> CheckRefsAgainstExposition(
    const PromQlRefs& refs, const std::map<std::string, std::set<std::string>>& exposed,
    const std::string& where);

std::string ReadTextFile(const std::string& path);
void WriteTextFile(const std::string& path, const std::string& text);

}  // namespace morserve::testing
