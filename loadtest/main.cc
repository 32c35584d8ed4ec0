// morserve-loadtest: load generator and benchmark report for morserve's gRPC API and any
// OpenAI-compatible HTTP server. `run` (the default) sends a workload, prints the table and
// the metric definitions, and writes --out JSON and --plots SVGs; `report` puts several
// runs' JSON side by side (markdown + JSON + SVG). See options.cc for the flags.
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "engine/tools/flags.h"
#include "loadtest/chat_runner.h"
#include "loadtest/chat_workload.h"
#include "loadtest/compare_report.h"
#include "loadtest/cpu_time.h"
#include "loadtest/grpc_target.h"
#include "loadtest/http_get.h"
#include "loadtest/http_target.h"
#include "loadtest/metrics_scraper.h"
#include "loadtest/options.h"
#include "loadtest/plots.h"
#include "loadtest/prompt_cache_report.h"

namespace morserve::loadtest {
namespace {

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "morserve-loadtest: %s\n", std::string(s.message()).c_str());
  return s.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
}

// The first model id of an OpenAI server's GET /v1/models.
absl::StatusOr<std::string> FirstModel(const LoadTestOptions& o) {
  Url models = o.endpoint;
  models.target = "/v1/models";
  auto body = HttpGet(models, 10000, o.api_key);
  if (!body.ok()) return body.status();
  const nlohmann::json j = nlohmann::json::parse(*body, nullptr, false);
  if (!j.is_object() || !j.contains("data") || !j["data"].is_array() || j["data"].empty() ||
      !j["data"][0].contains("id") || !j["data"][0]["id"].is_string()) {
    return absl::UnavailableError("GET /v1/models: no model id in the answer; pass --model NAME");
  }
  return j["data"][0]["id"].get<std::string>();
}

// Makes the target; fills `server` with what the server says about itself.
absl::StatusOr<std::unique_ptr<Target>> MakeTarget(LoadTestOptions& o, nlohmann::json* server) {
  if (!o.grpc.empty()) {
    auto t = std::make_unique<GrpcTarget>(o.grpc, o.send);
    auto info = t->ModelInfo(60);
    if (!info.ok()) return info.status();
    if (o.workload.vocab_size == 0) o.workload.vocab_size = info->vocab_size();
    o.workload.context_length = info->context_length();
    *server = {{"model_dir", info->model_dir()},
               {"family", info->family()},
               {"batching_mode", info->batching_mode()},
               {"max_batch_rows", info->max_batch_rows()},
               {"kv_blocks_total", info->kv_blocks_total()},
               {"kv_block_size", info->kv_block_size()},
               {"vocab_size", info->vocab_size()},
               {"context_length", info->context_length()},
               {"num_recursions", info->num_recursions()},
               {"prefix_cache", info->prefix_cache()}};
    return std::unique_ptr<Target>(std::move(t));
  }
  if (o.model.empty()) {
    auto m = FirstModel(o);
    if (!m.ok()) return m.status();
    o.model = *m;
  }
  *server = {{"model", o.model}};
  auto t =
      std::make_unique<HttpTarget>(o.endpoint, o.model, o.api_key, o.send, o.run.max_concurrency);
  if (t->chat() && o.workload.kind != "jsonl" && !o.is_chat()) {
    return absl::InvalidArgumentError(
        "a chat endpoint takes text prompts: use --workload jsonl with \"prompt\" strings, or "
        "--workload chat");
  }
  if (!t->chat() && o.is_chat()) {
    return absl::InvalidArgumentError(
        "--workload chat needs a /v1/chat/completions URL (or --grpc)");
  }
  return std::unique_ptr<Target>(std::move(t));
}

// --out and --plots must be writable before any request goes out, not after the run.
absl::Status CheckOutputs(const LoadTestOptions& o) {
  if (!o.out_json.empty() && !std::ofstream(o.out_json, std::ios::app)) {
    return absl::InvalidArgumentError(absl::StrCat("--out ", o.out_json, ": cannot write"));
  }
  if (!o.plots_dir.empty() && mkdir(o.plots_dir.c_str(), 0755) != 0 && errno != EEXIST) {
    return absl::InvalidArgumentError(
        absl::StrCat("--plots ", o.plots_dir, ": cannot create (", std::strerror(errno), ")"));
  }
  return absl::OkStatus();
}

nlohmann::json CdfJson(const std::vector<RequestRecord>& records) {
  nlohmann::json out = nlohmann::json::object();
  for (auto& [metric, values] : LatencySamples(records)) out[metric] = Quantiles(values, 201);
  return out;
}

nlohmann::json WarmupJson(const std::vector<RequestRecord>& records) {
  int sent = 0, failed = 0;
  for (const RequestRecord& r : records) {
    if (!r.warmup) continue;
    ++sent;
    failed += r.ok ? 0 : 1;
  }
  return {{"sent", sent}, {"failed", failed}};
}

void PrintDefinitions() {
  std::printf("Definitions:\n");
  for (const auto& [name, text] : Definitions())
    std::printf("  %-18s %s\n", name.c_str(), text.c_str());
}

int RunCommand(const std::vector<std::string>& args) {
  auto parsed = ParseLoadTestOptions(args);
  if (!parsed.ok()) {
    std::fprintf(stderr, "morserve-loadtest: %s\n\n%s",
                 std::string(parsed.status().message()).c_str(), Usage());
    return 2;
  }
  LoadTestOptions& o = *parsed;
  if (absl::Status s = CheckOutputs(o); !s.ok()) return Fail(s);
  nlohmann::json server;
  auto target = MakeTarget(o, &server);
  if (!target.ok()) return Fail(target.status());
  std::vector<RequestSpec> specs;
  ChatWorkload chat;
  if (o.is_chat()) {
    ChatWorkloadOptions c = o.chat;
    c.conversations += o.run.warmup;  // the warm-up conversations come first
    auto w = MakeChatWorkload(c);
    if (!w.ok()) return Fail(w.status());
    chat = *std::move(w);
  } else {
    auto made = MakeWorkload(o.workload, o.run.warmup + o.num_requests);
    if (!made.ok()) return Fail(made.status());
    specs = *std::move(made);
  }

  std::unique_ptr<MetricsScraper> scraper;
  if (!o.metrics_url.empty())
    scraper = std::make_unique<MetricsScraper>(o.metrics, o.scrape_interval_ms);
  std::vector<double> cpu_before(o.cpu_pids.size(), NAN);
  o.run.progress = !o.no_progress && isatty(STDERR_FILENO);
  auto on_start = [&](Clock::time_point epoch) {
    if (scraper) scraper->Start(epoch);
    for (size_t i = 0; i < o.cpu_pids.size(); ++i) {
      auto c = ProcessCpuSeconds(o.cpu_pids[i]);
      if (c.ok()) cpu_before[i] = *c;
    }
  };
  auto result = o.is_chat() ? RunChat(**target, chat, o.run, on_start)
                            : Run(**target, specs, o.run, on_start);
  if (!result.ok()) return Fail(result.status());
  if (scraper) scraper->Stop();

  const RunStats stats = ComputeStats(result->records, o.slo);
  nlohmann::json out = {
      {"tool", "morserve-loadtest"},
      {"label", o.label},
      {"date", absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", absl::Now(), absl::UTCTimeZone())},
      {"target", {{"kind", o.grpc.empty() ? "http" : "grpc"}, {"describe", (*target)->Describe()}}},
      {"server", server},
      {"config", ConfigJson(o)},
      {"warmup", WarmupJson(result->records)},
      {"stopped_by_duration", result->hit_duration},
      {"not_sent", result->not_sent},
      {"results", ReportJson(stats, o.slo)},
      {"cdf_ms", CdfJson(result->records)},
      {"throughput_over_time", ThroughputOverTime(result->records, 1.0)},
      {"prompt_cache", PromptCacheJson(result->records)}};
  if (o.is_chat()) out["chat_turns"] = ChatTurnsJson(result->records);
  if (scraper) out["server_metrics"] = scraper->ToJson();
  const auto* http = dynamic_cast<const HttpTarget*>(target->get());
  if (http) out["target"]["connections"] = http->ConnectionStats();
  nlohmann::json cpu = nlohmann::json::array();
  for (size_t i = 0; i < o.cpu_pids.size(); ++i) {
    auto after = ProcessCpuSeconds(o.cpu_pids[i]);
    if (!after.ok() || std::isnan(cpu_before[i])) {
      cpu.push_back(
          {{"name", o.cpu_names[i]}, {"pid", o.cpu_pids[i]}, {"error", "process not readable"}});
      continue;
    }
    const double s = *after - cpu_before[i];
    cpu.push_back({{"name", o.cpu_names[i]},
                   {"pid", o.cpu_pids[i]},
                   {"cpu_seconds", s},
                   {"cpu_us_per_output_token",
                    stats.output_tokens > 0 ? s * 1e6 / stats.output_tokens : 0.0}});
  }
  if (!cpu.empty()) out["cpu"] = cpu;
  nlohmann::json defs = nlohmann::json::object();
  for (const auto& [name, text] : Definitions()) defs[name] = text;
  out["definitions"] = defs;

  std::printf("target: %s\n%s", (*target)->Describe().c_str(), FormatTable(stats, o.slo).c_str());
  if (const nlohmann::json& pc = out["prompt_cache"]; !pc.is_null()) {
    std::printf("prompt tokens: %s computed, %s cached (%.1f%%)\n",
                pc["computed_prompt_tokens"].dump().c_str(), pc["cached_tokens"].dump().c_str(),
                100 * pc["cached_fraction"].get<double>());
  }
  if (http) std::printf("http connections: %s\n", out["target"]["connections"].dump().c_str());
  for (const nlohmann::json& c : cpu) std::printf("cpu of pid %s\n", c.dump().c_str());
  if (result->hit_duration)
    std::printf("stopped at --duration: %d requests not sent\n", result->not_sent);
  PrintDefinitions();
  if (!o.out_json.empty()) {
    std::ofstream f(o.out_json);
    if (!(f << out.dump(1) << "\n"))
      return Fail(absl::InternalError("cannot write --out " + o.out_json));
  }
  if (!o.plots_dir.empty()) {
    auto svgs = WritePlots(o.plots_dir, {{o.label, out}});
    if (!svgs.ok()) return Fail(svgs.status());
    for (const std::string& s : *svgs) std::printf("plot: %s\n", s.c_str());
  }
  return 0;
}

int ReportCommand(const std::vector<std::string>& args) {
  auto f = Flags::Parse(args, {"input", "out-dir", "title"}, {});
  if (!f.ok()) return Fail(f.status());
  if (!f->Has("input") || !f->Has("out-dir")) {
    std::fprintf(stderr, "%s", Usage());
    return 2;
  }
  std::vector<LabelledRun> runs;
  for (const std::string& item : f->GetList("input")) {
    std::vector<std::string> kv = absl::StrSplit(item, absl::MaxSplits('=', 1));
    if (kv.size() != 2 || kv[0].empty())
      return Fail(absl::InvalidArgumentError("--input '" + item + "': expected LABEL=FILE.json"));
    std::ifstream in(kv[1]);
    if (!in) return Fail(absl::NotFoundError("--input " + kv[1] + ": cannot open"));
    nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
    if (!j.is_object() || !j.contains("results"))
      return Fail(absl::InvalidArgumentError(kv[1] + ": not a morserve-loadtest --out file"));
    runs.emplace_back(kv[0], std::move(j));
  }
  const std::string dir = f->Get("out-dir");
  const std::string title = f->Get("title", "Load test comparison");
  auto svgs = WritePlots(dir, runs);
  if (!svgs.ok()) return Fail(svgs.status());
  std::vector<std::string> names;
  for (const std::string& s : *svgs) names.push_back(s.substr(s.rfind('/') + 1));
  const std::string md = CompareMarkdown(title, runs, names);
  std::ofstream(dir + "/report.md") << md;
  std::ofstream(dir + "/report.json") << CompareJson(title, runs).dump(1) << "\n";
  std::printf("%s\nwrote %s/report.md, %s/report.json\n", md.c_str(), dir.c_str(), dir.c_str());
  return 0;
}

}  // namespace
}  // namespace morserve::loadtest

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (!args.empty() && (args[0] == "-h" || args[0] == "--help" || args[0] == "help")) {
    std::printf("%s", morserve::loadtest::Usage());
    return 0;
  }
  if (!args.empty() && args[0] == "report") {
    return morserve::loadtest::ReportCommand({args.begin() + 1, args.end()});
  }
  if (!args.empty() && args[0] == "run") args.erase(args.begin());
  return morserve::loadtest::RunCommand(args);
}
