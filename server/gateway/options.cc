// Gateway flag parsing (see options.h).
#include "server/gateway/options.h"

#include <map>
#include <optional>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "server/gateway/backend_discovery.h"

namespace morserve::gateway {
namespace {

absl::Status ParseInt(const std::string& flag, const std::string& value, int64_t lo, int64_t hi,
                      int64_t* out) {
  int64_t v = 0;
  if (!absl::SimpleAtoi(value, &v) || v < lo || v > hi) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, ": expected an integer in [", lo, ", ", hi, "], got '", value, "'"));
  }
  *out = v;
  return absl::OkStatus();
}

// "host:port" or "dns:name:port" with a non-empty host and a port in [1, 65535].
absl::Status CheckBackend(const std::string& b) { return ParseBackendSpec(b).status(); }

absl::Status Apply(const std::string& flag, const std::string& value, GatewayOptions* o) {
  int64_t n = 0;
  if (flag == "--backend") {
    for (absl::string_view part : absl::StrSplit(value, ',', absl::SkipWhitespace())) {
      std::string b(absl::StripAsciiWhitespace(part));
      if (auto s = CheckBackend(b); !s.ok()) return s;
      o->backends.push_back(std::move(b));
    }
    return absl::OkStatus();
  }
  if (flag == "--backend-file") {
    if (value.empty()) return absl::InvalidArgumentError("--backend-file: must not be empty");
    o->backend_files.push_back(value);
    return absl::OkStatus();
  }
  if (flag == "--resolve-interval-ms") {
    if (auto s = ParseInt(flag, value, 10, 3600000, &n); !s.ok()) return s;
    o->resolve_interval_ms = static_cast<int>(n);
    return absl::OkStatus();
  }
  if (flag == "--write-timeout-s") {
    if (auto s = ParseInt(flag, value, 1, 86400, &n); !s.ok()) return s;
    o->write_timeout_s = static_cast<int>(n);
    return absl::OkStatus();
  }
  if (flag == "--host") {
    if (value.empty()) return absl::InvalidArgumentError("--host: must not be empty");
    o->host = value;
    return absl::OkStatus();
  }
  if (flag == "--port") {
    if (auto s = ParseInt(flag, value, 0, 65535, &n); !s.ok()) return s;
    o->port = static_cast<int>(n);
    return absl::OkStatus();
  }
  if (flag == "--api-key") {
    if (value.empty()) return absl::InvalidArgumentError("--api-key: must not be empty");
    o->api_key = value;
    return absl::OkStatus();
  }
  if (flag == "--threads") {
    if (auto s = ParseInt(flag, value, 1, 256, &n); !s.ok()) return s;
    o->threads = static_cast<int>(n);
    return absl::OkStatus();
  }
  if (flag == "--max-body-bytes") {
    if (auto s = ParseInt(flag, value, 1, int64_t{1} << 34, &n); !s.ok()) return s;
    o->max_body_bytes = n;
    return absl::OkStatus();
  }
  if (flag == "--served-model-name") {
    if (value.empty()) return absl::InvalidArgumentError("--served-model-name: must not be empty");
    o->served_model_name = value;
    return absl::OkStatus();
  }
  if (flag == "--health-interval-ms") {
    if (auto s = ParseInt(flag, value, 10, 3600000, &n); !s.ok()) return s;
    o->health_interval_ms = static_cast<int>(n);
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown flag '", flag, "'\n", GatewayUsage()));
}

}  // namespace

const char* GatewayUsage() {
  return "usage: morserve-gateway --backend HOST:PORT|dns:NAME:PORT [...] | --backend-file PATH\n"
         "  --backend HOST:PORT      morserve gRPC server (repeatable, or comma-separated)\n"
         "  --backend dns:NAME:PORT  one backend per address NAME resolves to, re-resolved\n"
         "                           (a Kubernetes headless Service: one per ready pod)\n"
         "  --backend-file PATH      HOST:PORT per line ('#' comments), re-read (repeatable)\n"
         "  --resolve-interval-ms N  re-resolve dns: names / re-read files (default 5000)\n"
         "  --write-timeout-s N      close a connection whose response write stalls N s and\n"
         "                           cancel its backend calls (default 60)\n"
         "  --host HOST              listen address (default 127.0.0.1)\n"
         "  --port N                 listen port (default 8000; 0 = ephemeral)\n"
         "  --api-key KEY            require 'Authorization: Bearer KEY' on /v1 and /tokenize\n"
         "  --threads N              HTTP io threads (default 2)\n"
         "  --max-body-bytes N       request body limit, 413 above (default 1048576)\n"
         "  --served-model-name NAME model id (default: basename of the backend's model_dir)\n"
         "  --health-interval-ms N   backend health check period (default 1000)\n";
}

absl::StatusOr<GatewayOptions> ParseGatewayOptions(int argc, char** argv) {
  GatewayOptions o;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") return absl::NotFoundError(GatewayUsage());
    if (!absl::StartsWith(arg, "--")) {
      return absl::InvalidArgumentError(
          absl::StrCat("unexpected argument '", arg, "'\n", GatewayUsage()));
    }
    std::string value;
    if (const size_t eq = arg.find('='); eq != std::string::npos) {
      value = arg.substr(eq + 1);
      arg.resize(eq);
    } else if (i + 1 < argc) {
      value = argv[++i];
    } else {
      return absl::InvalidArgumentError(absl::StrCat(arg, ": missing value"));
    }
    if (auto s = Apply(arg, value, &o); !s.ok()) return s;
  }
  if (o.backends.empty() && o.backend_files.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--backend or --backend-file: at least one is required\n", GatewayUsage()));
  }
  return o;
}

}  // namespace morserve::gateway
