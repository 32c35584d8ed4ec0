// gnuplot SVGs (see plots.h).
#include "loadtest/plots.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "loadtest/json_path.h"

namespace morserve::loadtest {
namespace {

const char* kMetrics[] = {"ttft", "tpot", "itl", "e2e"};
const char* kTitles[] = {"TTFT (ms)", "TPOT (ms)", "ITL (ms)", "E2E latency (ms)"};

std::string Quote(const std::string& s) {
  return "\"" + absl::StrReplaceAll(s, {{"\\", "\\\\"}, {"\"", "\\\""}}) + "\"";
}

std::string Header(const std::string& svg, int w, int h) {
  return absl::StrCat("set terminal svg size ", w, ",", h,
                      " dynamic enhanced font 'sans,11' background rgb 'white'\n", "set output ",
                      Quote(svg), "\nset grid\nset key bottom right\n");
}

// "plot" clause for each run's data file; an empty panel when none has data (e.g. no ITL
// samples when every stream came in one chunk). The empty panel needs its own ranges:
// gnuplot fails on "plot NaN" with autoscaled axes ("all points y value undefined").
std::string PlotClause(const std::vector<std::string>& parts) {
  std::string out;
  for (const std::string& p : parts) out += (out.empty() ? "plot " : ", ") + p;
  return out.empty() ? "plot [0:1] [0:1] NaN title 'no data'" : out;
}

absl::Status RunGnuplot(const std::string& script) {
  const std::string cmd = absl::StrCat("gnuplot ", Quote(script), " 2>&1");
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return absl::InternalError("cannot run gnuplot");
  std::string out;
  char buf[512];
  while (size_t n = fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  const int rc = pclose(p);
  if (rc != 0) {
    return absl::InternalError(absl::StrCat("gnuplot ", script, " failed (", rc, "): ", out,
                                            rc == 127 * 256 ? " (install gnuplot-nox)" : ""));
  }
  return absl::OkStatus();
}

std::string LatencyScript(const std::string& dir, const std::vector<LabelledRun>& runs) {
  std::string gp = Header(dir + "/latency_cdf.svg", 1000, 700);
  gp += "set multiplot layout 2,2 title 'Latency CDFs'\nset ylabel 'cumulative fraction'\n";
  for (int m = 0; m < 4; ++m) {
    std::vector<std::string> parts;
    for (size_t r = 0; r < runs.size(); ++r) {
      const nlohmann::json q = JsonAt(runs[r].second, {"cdf_ms", kMetrics[m]});
      if (!q.is_array() || q.empty()) continue;
      const std::string file = absl::StrCat(dir, "/data/cdf_", kMetrics[m], "_", r, ".dat");
      std::ofstream out(file);
      for (size_t i = 0; i < q.size(); ++i) {
        out << q[i].get<double>() << " " << static_cast<double>(i) / (q.size() - 1) << "\n";
      }
      parts.push_back(
          absl::StrCat(Quote(file), " using 1:2 with lines lw 2 title ", Quote(runs[r].first)));
    }
    gp += absl::StrCat("set xlabel '", kTitles[m], "'\nset title '", kTitles[m], "'\n",
                       PlotClause(parts), "\n");
  }
  return gp + "unset multiplot\n";
}

std::string ThroughputScript(const std::string& dir, const std::vector<LabelledRun>& runs) {
  std::string gp = Header(dir + "/throughput.svg", 1000, 700);
  gp +=
      "set multiplot layout 2,1 title 'Throughput over time (1 s bins)'\nset xlabel 'time since "
      "start (s)'\n";
  std::vector<std::string> tok, req;
  for (size_t r = 0; r < runs.size(); ++r) {
    const nlohmann::json t = JsonAt(runs[r].second, {"throughput_over_time"});
    if (!t.is_array() || t.empty()) continue;
    const std::string file = absl::StrCat(dir, "/data/throughput_", r, ".dat");
    std::ofstream out(file);
    for (const nlohmann::json& p : t) {
      out << p["t_s"].get<double>() << " " << p["output_tokens_per_s"].get<double>() << " "
          << p["requests_per_s"].get<double>() << "\n";
    }
    tok.push_back(
        absl::StrCat(Quote(file), " using 1:2 with steps lw 2 title ", Quote(runs[r].first)));
    req.push_back(
        absl::StrCat(Quote(file), " using 1:3 with steps lw 2 title ", Quote(runs[r].first)));
  }
  gp += "set ylabel 'output tokens/s'\nset title 'Output tokens/s'\n" + PlotClause(tok) + "\n";
  gp += "set ylabel 'requests/s'\nset title 'Completed requests/s'\n" + PlotClause(req) + "\n";
  return gp + "unset multiplot\n";
}

// Empty when no run has scraped server metrics.
std::string ServerScript(const std::string& dir, const std::vector<LabelledRun>& runs) {
  std::vector<std::string> fill, rows, kv;
  for (size_t r = 0; r < runs.size(); ++r) {
    const nlohmann::json series = JsonAt(runs[r].second, {"server_metrics", "series"});
    if (!series.is_array() || series.empty()) continue;
    std::set<std::string> loops;
    for (const nlohmann::json& p : series) {
      for (const auto& [loop, v] : p["rows_per_loop"].items()) loops.insert(loop);
    }
    const std::string file = absl::StrCat(dir, "/data/server_", r, ".dat");
    std::ofstream out(file);
    for (const nlohmann::json& p : series) {
      const double f = p["fill_ratio"].get<double>();
      out << p["t_s"].get<double>() << " " << (f < 0 ? std::string("NaN") : std::to_string(f))
          << " " << p["kv_usage"].get<double>();
      for (const std::string& l : loops) out << " " << p["rows_per_loop"].value(l, 0.0);
      out << "\n";
    }
    const std::string& label = runs[r].first;
    fill.push_back(absl::StrCat(Quote(file), " using 1:2 with linespoints lw 2 pt 7 ps 0.3 title ",
                                Quote(label)));
    kv.push_back(absl::StrCat(Quote(file), " using 1:3 with linespoints lw 2 pt 7 ps 0.3 title ",
                              Quote(label)));
    int col = 4;
    for (const std::string& l : loops) {
      rows.push_back(absl::StrCat(Quote(file), " using 1:", col++,
                                  " with linespoints lw 2 pt 7 ps 0.3 title ",
                                  Quote(absl::StrCat(label, " loop ", l))));
    }
  }
  if (fill.empty()) return "";
  std::string gp = Header(dir + "/server_metrics.svg", 1000, 900);
  gp +=
      "set multiplot layout 3,1 title 'Server metrics scraped during the run'\nset xlabel 'time "
      "since start (s)'\n";
  gp +=
      "set ylabel 'fill ratio'\nset yrange [0:1.05]\nset title 'Batch fill ratio (mean over steps "
      "in the interval)'\n" +
      PlotClause(fill) + "\n";
  gp +=
      "set autoscale y\nset ylabel 'rows / step'\nset title 'Rows per loop of the shared block, "
      "per engine step'\n" +
      PlotClause(rows) + "\n";
  gp += "set ylabel 'KV usage'\nset yrange [0:1.05]\nset title 'KV cache usage'\n" +
        PlotClause(kv) + "\n";
  return gp + "unset multiplot\n";
}

}  // namespace

absl::StatusOr<std::vector<std::string>> WritePlots(const std::string& dir,
                                                    const std::vector<LabelledRun>& runs) {
  for (const std::string& d : {dir, dir + "/data"}) {
    if (mkdir(d.c_str(), 0755) != 0 && errno != EEXIST) {
      return absl::InvalidArgumentError(
          absl::StrCat("cannot create directory ", d, ": ", std::strerror(errno)));
    }
  }
  std::vector<std::string> written;
  const std::pair<std::string, std::string> scripts[] = {
      {"latency_cdf", LatencyScript(dir, runs)},
      {"throughput", ThroughputScript(dir, runs)},
      {"server_metrics", ServerScript(dir, runs)}};
  for (const auto& [name, gp] : scripts) {
    if (gp.empty()) continue;
    const std::string script = absl::StrCat(dir, "/data/", name, ".gp");
    std::ofstream(script) << gp;
    if (absl::Status s = RunGnuplot(script); !s.ok()) return s;
    written.push_back(absl::StrCat(dir, "/", name, ".svg"));
  }
  return written;
}

}  // namespace morserve::loadtest
