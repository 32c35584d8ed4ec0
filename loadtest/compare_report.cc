// Side-by-side report (see compare_report.h).
#include "loadtest/compare_report.h"

#include <algorithm>
#include <cstdio>
#include <functional>
#include <tuple>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "loadtest/json_path.h"

namespace morserve::loadtest {
namespace {

struct Row {
  std::string name;
  std::function<nlohmann::json(const nlohmann::json&)> value;  // null when absent
  const char* format;
};

nlohmann::json At(const nlohmann::json& j, std::initializer_list<const char*> path) {
  return JsonAt(j, path);
}

std::vector<Row> Rows() {
  std::vector<Row> rows = {{"target",
                            [](const nlohmann::json& j) {
                              return At(j, {"target", "kind"});
                            },
                            "%s"},
                           {"model",
                            [](const nlohmann::json& j) {
                              return At(j, {"server", "model_dir"});
                            },
                            "%s"},
                           {"batching mode",
                            [](const nlohmann::json& j) {
                              return At(j, {"server", "batching_mode"});
                            },
                            "%s"},
                           {"max batch rows",
                            [](const nlohmann::json& j) {
                              return At(j, {"server", "max_batch_rows"});
                            },
                            "%.0f"},
                           {"requests sent",
                            [](const nlohmann::json& j) {
                              return At(j, {"results", "requests", "sent"});
                            },
                            "%.0f"},
                           {"completed",
                            [](const nlohmann::json& j) {
                              return At(j, {"results", "requests", "completed"});
                            },
                            "%.0f"},
                           {"failed",
                            [](const nlohmann::json& j) {
                              return At(j, {"results", "requests", "failed"});
                            },
                            "%.0f"},
                           {"duration (s)",
                            [](const nlohmann::json& j) {
                              return At(j, {"results", "duration_s"});
                            },
                            "%.2f"},
                           {"output tokens",
                            [](const nlohmann::json& j) {
                              return At(j, {"results", "total_output_tokens"});
                            },
                            "%.0f"},
                           {"request throughput (req/s)",
                            [](const nlohmann::json& j) {
                              return At(j, {"results", "request_throughput"});
                            },
                            "%.3f"},
                           {"output throughput (tok/s)",
                            [](const nlohmann::json& j) {
                              return At(j, {"results", "output_throughput"});
                            },
                            "%.1f"},
                           {"total throughput (tok/s)",
                            [](const nlohmann::json& j) {
                              return At(j, {"results", "total_token_throughput"});
                            },
                            "%.1f"},
                           {"goodput (req/s)",
                            [](const nlohmann::json& j) {
                              return At(j, {"results", "goodput", "requests_per_s"});
                            },
                            "%.3f"}};
  for (const char* m : {"ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"}) {
    for (const char* s : {"mean", "median", "p90", "p99", "max"}) {
      rows.push_back(
          {absl::AsciiStrToUpper(std::string(m, std::string(m).size() - 3)) + " " + s + " (ms)",
           [m, s](const nlohmann::json& j) {
             return At(j, {"results", m, s});
           },
           "%.2f"});
    }
  }
  rows.push_back({"server: mean batch fill ratio",
                  [](const nlohmann::json& j) {
                    return At(j, {"server_metrics", "totals", "mean_fill_ratio"});
                  },
                  "%.3f"});
  rows.push_back({"server: engine steps",
                  [](const nlohmann::json& j) {
                    return At(j, {"server_metrics", "totals", "engine_steps"});
                  },
                  "%.0f"});
  rows.push_back({"server: tokens sampled",
                  [](const nlohmann::json& j) {
                    return At(j, {"server_metrics", "totals", "generation_tokens"});
                  },
                  "%.0f"});
  rows.push_back({"server: preemptions",
                  [](const nlohmann::json& j) {
                    return At(j, {"server_metrics", "totals", "preemptions"});
                  },
                  "%.0f"});
  // The prefix cache: the server's setting, the usage sums, and its counters over the run.
  rows.push_back({"prefix cache",
                  [](const nlohmann::json& j) {
                    const nlohmann::json on = At(j, {"server", "prefix_cache"});
                    return on.is_boolean() ? nlohmann::json(on.get<bool>() ? "on" : "off") : on;
                  },
                  "%s"});
  for (const auto& [name, key, format] :
       {std::tuple<const char*, const char*, const char*>{"prompt tokens (usage)", "prompt_tokens",
                                                          "%.0f"},
        {"prompt tokens cached", "cached_tokens", "%.0f"},
        {"prompt tokens computed", "computed_prompt_tokens", "%.0f"},
        {"cached fraction", "cached_fraction", "%.3f"}}) {
    const char* k = key;  // a lambda does not capture a structured binding before C++20
    rows.push_back({name,
                    [k](const nlohmann::json& j) {
                      return At(j, {"prompt_cache", k});
                    },
                    format});
  }
  for (const auto& [name, key] :
       {std::pair<const char*, const char*>{"server: prefix cache queries (tokens)",
                                            "prefix_cache_queries"},
        {"server: prefix cache hits (tokens)", "prefix_cache_hits"},
        {"server: prefix cache evictions (blocks)", "prefix_cache_evictions"}}) {
    const char* k = key;
    rows.push_back({name,
                    [k](const nlohmann::json& j) {
                      return At(j, {"server_metrics", "totals", k});
                    },
                    "%.0f"});
  }
  return rows;
}

std::string Cell(const nlohmann::json& v, const char* format) {
  if (v.is_null()) return "-";
  if (v.is_string()) return v.get<std::string>();
  if (v.is_number()) {
    char buf[64];
    std::snprintf(buf, sizeof buf, format, v.get<double>());
    return buf;
  }
  return v.dump();
}

// "cpu <name>" rows from the runs' --cpu-pid measurements, in first-seen order.
std::string CpuRows(const std::vector<LabelledRun>& runs) {
  std::vector<std::string> names;
  for (const LabelledRun& r : runs) {
    for (const nlohmann::json& c : r.second.value("cpu", nlohmann::json::array())) {
      const std::string n = c.value("name", "");
      if (std::find(names.begin(), names.end(), n) == names.end()) names.push_back(n);
    }
  }
  std::string md;
  for (const std::string& n : names) {
    for (const auto& [key, label, format] :
         {std::tuple<const char*, const char*, const char*>{"cpu_seconds", "CPU seconds", "%.2f"},
          {"cpu_us_per_output_token", "CPU us per output token", "%.1f"}}) {
      std::vector<std::string> cells = {absl::StrCat(n, ": ", label)};
      for (const LabelledRun& r : runs) {
        nlohmann::json v;
        for (const nlohmann::json& c : r.second.value("cpu", nlohmann::json::array())) {
          if (c.value("name", "") == n && c.contains(key)) v = c[key];
        }
        cells.push_back(Cell(v, format));
      }
      md += "| " + absl::StrJoin(cells, " | ") + " |\n";
    }
  }
  return md;
}

}  // namespace

std::string CompareMarkdown(const std::string& title, const std::vector<LabelledRun>& runs,
                            const std::vector<std::string>& svg_names) {
  std::string md = absl::StrCat("## ", title, "\n\n");
  std::vector<std::string> head = {"metric"}, sep = {"---"};
  for (const LabelledRun& r : runs) {
    head.push_back(r.first);
    sep.push_back("---:");
  }
  md += "| " + absl::StrJoin(head, " | ") + " |\n| " + absl::StrJoin(sep, " | ") + " |\n";
  for (const Row& row : Rows()) {
    std::vector<std::string> cells = {row.name};
    bool any = false;
    for (const LabelledRun& r : runs) {
      const nlohmann::json v = row.value(r.second);
      any = any || !v.is_null();
      cells.push_back(Cell(v, row.format));
    }
    if (any) md += "| " + absl::StrJoin(cells, " | ") + " |\n";
  }
  md += CpuRows(runs);
  std::vector<std::string> failures;
  for (const LabelledRun& r : runs) {
    const nlohmann::json f = At(r.second, {"results", "failures"});
    if (f.is_object() && !f.empty()) failures.push_back(absl::StrCat(r.first, ": ", f.dump()));
  }
  if (!failures.empty()) md += "\nFailures by reason: " + absl::StrJoin(failures, "; ") + "\n";
  if (!runs.empty()) {
    const nlohmann::json w = At(runs.front().second, {"config"});
    md += "\nWorkload (same for every run): `" + w.dump() + "`\n";
  }
  if (!svg_names.empty()) {
    md += "\nPlots: ";
    std::vector<std::string> links;
    for (const std::string& s : svg_names) links.push_back(absl::StrCat("[", s, "](", s, ")"));
    md += absl::StrJoin(links, ", ") + "\n";
  }
  return md;
}

nlohmann::json CompareJson(const std::string& title, const std::vector<LabelledRun>& runs) {
  nlohmann::json rows = nlohmann::json::array();
  for (const Row& row : Rows()) {
    nlohmann::json values = nlohmann::json::object();
    for (const LabelledRun& r : runs) values[r.first] = row.value(r.second);
    rows.push_back({{"metric", row.name}, {"values", values}});
  }
  nlohmann::json full = nlohmann::json::object();
  for (const LabelledRun& r : runs) {
    nlohmann::json copy = r.second;
    full[r.first] = copy;
  }
  return {{"title", title}, {"rows", rows}, {"runs", full}};
}

}  // namespace morserve::loadtest
