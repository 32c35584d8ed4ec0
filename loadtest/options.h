// Command-line options of `morserve-loadtest run`, parsed and checked before anything is
// sent: a bad value is an error naming the flag. Usage() prints them all.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "loadtest/chat_workload.h"
#include "loadtest/report.h"
#include "loadtest/runner.h"
#include "loadtest/target.h"
#include "loadtest/url.h"
#include "loadtest/workload.h"
#include "nlohmann/json.hpp"

namespace morserve::loadtest {

struct LoadTestOptions {
  // Target: exactly one of grpc / url.
  std::string grpc;     // HOST:PORT of `morserve serve`
  std::string url;      // http://HOST:PORT/v1/completions or /v1/chat/completions
  Url endpoint;         // parsed url or grpc address
  std::string model;    // HTTP "model"; default: the first of GET /v1/models
  std::string api_key;  // HTTP bearer token
  bool allow_remote_host = false;

  WorkloadOptions workload;
  ChatWorkloadOptions chat;  // --workload chat
  int num_requests = 100;    // chat: conversations x turns
  bool is_chat() const { return workload.kind == "chat"; }
  RunOptions run;
  SendOptions send;
  Slo slo;

  std::string metrics_url;
  Url metrics;
  int scrape_interval_ms = 500;
  std::vector<int> cpu_pids;
  std::vector<std::string> cpu_names;  // one per pid

  std::string out_json;
  std::string plots_dir;
  std::string label;
  bool no_progress = false;
};

absl::StatusOr<LoadTestOptions> ParseLoadTestOptions(const std::vector<std::string>& args);
const char* Usage();
nlohmann::json ConfigJson(const LoadTestOptions& o);

}  // namespace morserve::loadtest
