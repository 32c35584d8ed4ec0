// The numbers of a run from its request records: latency summaries (TTFT, TPOT, ITL, E2E),
// throughput, goodput under SLOs, failures by reason, token counts against the server's
// usage, and throughput over time. ReportJson() is the --out file's "results" object;
// PrintTable() the terminal table; Definitions() what every number means.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "loadtest/request_record.h"
#include "loadtest/stats.h"
#include "nlohmann/json.hpp"

namespace morserve::loadtest {

// Service-level objectives in milliseconds; a request counts for goodput when it succeeded
// and meets every one that is set (vLLM's --goodput semantics).
struct Slo {
  std::optional<double> ttft_ms, tpot_ms, itl_ms, e2e_ms;
  bool any() const { return ttft_ms || tpot_ms || itl_ms || e2e_ms; }
};
// "ttft:500,tpot:50,itl:100,e2e:2000" (milliseconds).
absl::StatusOr<Slo> ParseSlo(const std::vector<std::string>& items);

struct RunStats {
  int sent = 0, completed = 0, failed = 0;
  std::map<std::string, int> failures;
  double duration_s = 0;
  int64_t input_tokens = 0, output_tokens = 0, measured_tokens = 0, usage_tokens = 0;
  int usage_mismatches = 0;  // requests whose streamed token count != their usage
  Summary ttft_ms, tpot_ms, itl_ms, e2e_ms;
  int good = 0;
  double request_throughput() const { return duration_s > 0 ? completed / duration_s : 0; }
  double output_throughput() const { return duration_s > 0 ? output_tokens / duration_s : 0; }
  double total_throughput() const {
    return duration_s > 0 ? (input_tokens + output_tokens) / duration_s : 0;
  }
  double goodput() const { return duration_s > 0 ? good / duration_s : 0; }
};

// Measured records only (warm-up ones are skipped). The duration runs from the run's start
// (time 0) to the last request's end.
RunStats ComputeStats(const std::vector<RequestRecord>& records, const Slo& slo);
bool MeetsSlo(const RequestRecord& r, const Slo& slo);
// A request's TTFT: to its first chunk with output (its whole latency when none came).
double TtftSeconds(const RequestRecord& r);
// Per-request values for CDFs (ms): ttft, tpot, itl, e2e.
std::map<std::string, std::vector<double>> LatencySamples(
    const std::vector<RequestRecord>& records);
// Output tokens and completed requests per `bin_s` bin since the start.
nlohmann::json ThroughputOverTime(const std::vector<RequestRecord>& records, double bin_s);

nlohmann::json ReportJson(const RunStats& s, const Slo& slo);
std::string FormatTable(const RunStats& s, const Slo& slo);
const std::vector<std::pair<std::string, std::string>>& Definitions();

}  // namespace morserve::loadtest
