// Report computation and formatting (see report.h).
#include "loadtest/report.h"

#include <cmath>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"

namespace morserve::loadtest {
namespace {

double Ttft(const RequestRecord& r) {
  return r.chunk_s.empty() ? r.latency_s() : r.chunk_s.front();
}

std::optional<double> Tpot(const RequestRecord& r) {
  const int n = r.output_tokens();
  if (n < 2 || r.chunk_s.empty()) return std::nullopt;
  return (r.latency_s() - Ttft(r)) / (n - 1);
}

std::vector<double> Itls(const RequestRecord& r) {
  std::vector<double> out;
  for (size_t i = 1; i < r.chunk_s.size(); ++i) out.push_back(r.chunk_s[i] - r.chunk_s[i - 1]);
  return out;
}

}  // namespace

double TtftSeconds(const RequestRecord& r) { return Ttft(r); }

absl::StatusOr<Slo> ParseSlo(const std::vector<std::string>& items) {
  Slo slo;
  for (const std::string& item : items) {
    std::vector<std::string> kv = absl::StrSplit(item, absl::MaxSplits(':', 1));
    double ms;
    if (kv.size() != 2 || !absl::SimpleAtod(kv[1], &ms) || !(ms > 0) || !std::isfinite(ms)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--slo '", item, "': expected METRIC:MS with MS > 0 (ttft, tpot, itl, e2e)"));
    }
    if (kv[0] == "ttft")
      slo.ttft_ms = ms;
    else if (kv[0] == "tpot")
      slo.tpot_ms = ms;
    else if (kv[0] == "itl")
      slo.itl_ms = ms;
    else if (kv[0] == "e2e")
      slo.e2e_ms = ms;
    else
      return absl::InvalidArgumentError(
          absl::StrCat("--slo '", item, "': unknown metric (ttft, tpot, itl, e2e)"));
  }
  return slo;
}

bool MeetsSlo(const RequestRecord& r, const Slo& slo) {
  if (!r.ok) return false;
  if (slo.ttft_ms && Ttft(r) * 1e3 > *slo.ttft_ms) return false;
  if (slo.tpot_ms) {
    const auto t = Tpot(r);
    if (t && *t * 1e3 > *slo.tpot_ms) return false;
  }
  if (slo.itl_ms) {
    for (double x : Itls(r)) {
      if (x * 1e3 > *slo.itl_ms) return false;
    }
  }
  if (slo.e2e_ms && r.latency_s() * 1e3 > *slo.e2e_ms) return false;
  return true;
}

std::map<std::string, std::vector<double>> LatencySamples(
    const std::vector<RequestRecord>& records) {
  std::map<std::string, std::vector<double>> s;
  for (const RequestRecord& r : records) {
    if (r.warmup || !r.ok) continue;
    s["ttft"].push_back(Ttft(r) * 1e3);
    if (auto t = Tpot(r)) s["tpot"].push_back(*t * 1e3);
    for (double x : Itls(r)) s["itl"].push_back(x * 1e3);
    s["e2e"].push_back(r.latency_s() * 1e3);
  }
  return s;
}

RunStats ComputeStats(const std::vector<RequestRecord>& records, const Slo& slo) {
  RunStats s;
  for (const RequestRecord& r : records) {
    if (r.warmup) continue;
    ++s.sent;
    s.duration_s = std::max(s.duration_s, r.end_s);
    if (!r.ok) {
      ++s.failed;
      ++s.failures[r.failure];
      continue;
    }
    ++s.completed;
    s.input_tokens += r.usage_prompt_tokens >= 0 ? r.usage_prompt_tokens : r.prompt_tokens;
    s.output_tokens += r.output_tokens();
    s.measured_tokens += r.measured_tokens;
    if (r.usage_completion_tokens >= 0) {
      s.usage_tokens += r.usage_completion_tokens;
      if (r.usage_completion_tokens != r.measured_tokens) ++s.usage_mismatches;
    }
    if (slo.any() && MeetsSlo(r, slo)) ++s.good;
  }
  auto samples = LatencySamples(records);
  s.ttft_ms = Summarize(samples["ttft"]);
  s.tpot_ms = Summarize(samples["tpot"]);
  s.itl_ms = Summarize(samples["itl"]);
  s.e2e_ms = Summarize(samples["e2e"]);
  return s;
}

nlohmann::json ThroughputOverTime(const std::vector<RequestRecord>& records, double bin_s) {
  std::vector<double> tokens, done;
  auto bin = [&](double t) {
    const size_t b = static_cast<size_t>(std::max(0.0, t) / bin_s);
    if (b >= tokens.size()) {
      tokens.resize(b + 1, 0);
      done.resize(b + 1, 0);
    }
    return b;
  };
  for (const RequestRecord& r : records) {
    if (r.warmup) continue;
    for (size_t i = 0; i < r.chunk_s.size(); ++i)
      tokens[bin(r.send_s + r.chunk_s[i])] += r.chunk_tokens[i];
    if (r.ok) done[bin(r.end_s)] += 1;
  }
  nlohmann::json out = nlohmann::json::array();
  for (size_t b = 0; b < tokens.size(); ++b) {
    out.push_back({{"t_s", (b + 1) * bin_s},
                   {"output_tokens_per_s", tokens[b] / bin_s},
                   {"requests_per_s", done[b] / bin_s}});
  }
  return out;
}

nlohmann::json ReportJson(const RunStats& s, const Slo& slo) {
  nlohmann::json j = {
      {"requests", {{"sent", s.sent}, {"completed", s.completed}, {"failed", s.failed}}},
      {"failures", s.failures},
      {"duration_s", s.duration_s},
      {"request_throughput", s.request_throughput()},
      {"output_throughput", s.output_throughput()},
      {"total_token_throughput", s.total_throughput()},
      {"total_input_tokens", s.input_tokens},
      {"total_output_tokens", s.output_tokens},
      {"token_counts",
       {{"streamed", s.measured_tokens},
        {"usage", s.usage_tokens},
        {"requests_streamed_ne_usage", s.usage_mismatches}}},
      {"ttft_ms", ToJson(s.ttft_ms)},
      {"tpot_ms", ToJson(s.tpot_ms)},
      {"itl_ms", ToJson(s.itl_ms)},
      {"e2e_ms", ToJson(s.e2e_ms)}};
  if (slo.any()) {
    nlohmann::json limits = nlohmann::json::object();
    if (slo.ttft_ms) limits["ttft_ms"] = *slo.ttft_ms;
    if (slo.tpot_ms) limits["tpot_ms"] = *slo.tpot_ms;
    if (slo.itl_ms) limits["itl_ms"] = *slo.itl_ms;
    if (slo.e2e_ms) limits["e2e_ms"] = *slo.e2e_ms;
    j["goodput"] = {{"slo", limits}, {"good_requests", s.good}, {"requests_per_s", s.goodput()}};
  }
  return j;
}

std::string FormatTable(const RunStats& s, const Slo& slo) {
  std::string o;
  auto line = [&](const std::string& name, const std::string& value) {
    absl::StrAppendFormat(&o, "%-34s %s\n", name, value);
  };
  o += "============ load test result ============\n";
  line("Requests sent", absl::StrCat(s.sent));
  line("Requests completed", absl::StrCat(s.completed));
  line("Requests failed", absl::StrCat(s.failed));
  for (const auto& [why, n] : s.failures) line("  failed: " + why, absl::StrCat(n));
  line("Duration (s)", absl::StrFormat("%.2f", s.duration_s));
  line("Input tokens", absl::StrCat(s.input_tokens));
  line("Output tokens", absl::StrCat(s.output_tokens));
  line("Request throughput (req/s)", absl::StrFormat("%.2f", s.request_throughput()));
  line("Output token throughput (tok/s)", absl::StrFormat("%.2f", s.output_throughput()));
  line("Total token throughput (tok/s)", absl::StrFormat("%.2f", s.total_throughput()));
  if (slo.any()) line("Goodput (req/s)", absl::StrFormat("%.2f (%d good)", s.goodput(), s.good));
  absl::StrAppendFormat(&o, "%-12s %10s %10s %10s %10s %10s\n", "(ms)", "mean", "median", "p90",
                        "p99", "max");
  for (const auto& [name, m] : {std::pair<const char*, const Summary*>{"TTFT", &s.ttft_ms},
                                {"TPOT", &s.tpot_ms},
                                {"ITL", &s.itl_ms},
                                {"E2E", &s.e2e_ms}}) {
    absl::StrAppendFormat(&o, "%-12s %10.2f %10.2f %10.2f %10.2f %10.2f\n", name, m->mean,
                          m->median, m->p90, m->p99, m->max);
  }
  o += "==========================================\n";
  return o;
}

const std::vector<std::pair<std::string, std::string>>& Definitions() {
  static const auto* d = new std::vector<std::pair<std::string, std::string>>{
      {"TTFT",
       "time to first token: from sending the request to the first stream chunk with output"},
      {"TPOT",
       "time per output token after the first: (E2E - TTFT) / (output tokens - 1), requests with "
       ">= 2 tokens"},
      {"ITL",
       "inter-token latency: gap between consecutive output chunks of a request (a chunk may hold "
       "several tokens)"},
      {"E2E", "end-to-end latency: from sending the request to the end of its stream"},
      {"request throughput", "completed requests / duration"},
      {"output throughput",
       "output tokens (server usage when reported) of completed requests / duration"},
      {"total throughput", "(prompt + output tokens) of completed requests / duration"},
      {"goodput", "completed requests meeting every --slo limit / duration"},
      {"duration",
       "from the first measured request's scheduled start to the last one's end; warm-up excluded"},
      {"percentiles",
       "linear interpolation between closest ranks (numpy default); latencies of successful "
       "requests only"},
      {"failed",
       "requests that ended with an error (gRPC status, HTTP status, transport error, or cut at "
       "--duration); sent = completed + failed"}};
  return *d;
}

}  // namespace morserve::loadtest
