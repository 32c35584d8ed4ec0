// Command-line options of `morserve-gateway` (the OpenAI-compatible HTTP gateway) and their
// parsing. Every malformed flag is an error naming the flag; nothing here touches the network.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace morserve::gateway {

struct GatewayOptions {
  // HOST:PORT or dns:NAME:PORT of morserve gRPC servers, and files listing HOST:PORT lines
  // (backend_discovery.h); at least one of the two.
  std::vector<std::string> backends;
  std::vector<std::string> backend_files;
  int resolve_interval_ms = 5000;  // how often dns: names and backend files are re-read
  int write_timeout_s = 60;        // a response write stalled this long closes the connection
  std::string host = "127.0.0.1";
  int port = 8000;      // 0: an ephemeral port (printed on start)
  std::string api_key;  // empty: no authentication
  int threads = 2;      // HTTP io threads
  int64_t max_body_bytes = 1 << 20;
  std::string served_model_name;  // empty: the basename of the backend's model_dir
  int health_interval_ms = 1000;
};

// Parses argv[1..] (flags as `--name value` or `--name=value`). `--help` gives a
// NotFound status whose message is the usage text.
absl::StatusOr<GatewayOptions> ParseGatewayOptions(int argc, char** argv);

const char* GatewayUsage();

}  // namespace morserve::gateway
