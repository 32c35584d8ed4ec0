// Test helpers for the gateway: `morserve-gateway` as a subprocess (a ChildProcess: port 0,
// the port read from its one stdout line, SIGTERM to stop, SIGKILL if it outlives the test)
// and `curl` as the HTTP client (status code and body of one request).
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "nlohmann/json.hpp"
#include "tests/child_process.h"

namespace morserve::testing {

class GatewayProcess {
 public:
  // Starts `morserve-gateway --port 0 EXTRA...`; false (output() says why) on failure.
  bool Start(const std::vector<std::string>& extra, int timeout_s = 30);
  // Exit status, -1 on timeout (then killed).
  int Terminate(int timeout_s = 30) { return child_.Terminate(timeout_s); }
  bool Running() { return child_.Running(); }

  int port() const { return port_; }
  pid_t pid() const { return child_.pid(); }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  // Everything it wrote so far (after why it could not start, when it could not).
  std::string output() {
    return (child_.error().empty() ? "" : "cannot start: " + child_.error() + "\n") +
           child_.output();
  }

 private:
  ChildProcess child_;
  int port_ = 0;
};

struct HttpResult {
  int status = 0;  // 0: curl failed
  std::string body;
  nlohmann::json Json() const;  // the body parsed (discarded value if not JSON)
};

// curl -sS [-X METHOD] URL with `body` (when non-empty) as the request body and `headers`.
HttpResult Curl(const std::string& method, const std::string& url, const std::string& body = "",
                const std::vector<std::string>& headers = {"Content-Type: application/json"});

// The body's SSE "data:" payloads in order (fails the test on a line that is neither
// "data: ..." nor empty).
std::vector<std::string> SseData(const std::string& body);

std::string GatewayBinary();

}  // namespace morserve::testing
