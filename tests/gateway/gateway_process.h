// Test helpers for the gateway: `morserve-gateway` as a subprocess (a ChildProcess: port 0,
// the port read from its one stdout line, SIGTERM to stop, SIGKILL if it outlives the test),
// `curl` as the HTTP client (status code and body of one request), and GatewayStack: a
// text-taking tiny model in the real server with the real gateway in front, for a test suite.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "nlohmann/json.hpp"
#include "tests/child_process.h"
#include "tests/server/server_process.h"
#include "tests/server/test_models.h"

namespace morserve::testing {

class GatewayProcess {
 public:
  // Starts `morserve-gateway --port 0 EXTRA...`; false (output() says why) on failure.
  bool Start(const std::vector<std::string>& extra, int timeout_s = 30);
  // Exit status, -1 on timeout (then killed).
  int Terminate(int timeout_s = 30) { return child_.Terminate(timeout_s); }
  bool Running() { return child_.Running(); }
  // Polls GET /health until it answers `status` (200: a backend serving; 503: none); false
  // after timeout_s.
  bool WaitHealth(int status, int timeout_s = 30) const;

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

// A ServedTextModel with `morserve-gateway` in front (--health-interval-ms 200, 127.0.0.1
// port 0), for a test suite.
class GatewayStack : public ServedTextModel {
 public:
  // Starts the model's server (ServedTextModel::Start), then the gateway, and waits until the
  // gateway's /health is 200 (its first health check saw the backend serving); fatal test
  // failures with the output (ASSERT_NO_FATAL_FAILURE).
  void Start(const TinyModelSpec& spec) override;
  // Terminates the gateway, then the server (those started); each must exit 0.
  void Stop() override;

  GatewayProcess& gateway() { return gateway_; }
  // POST `body` to the gateway's `path` with curl.
  HttpResult Post(const std::string& path, const nlohmann::json& body) {
    return Curl("POST", gateway_.url() + path, body.dump());
  }

 private:
  GatewayProcess gateway_;
};

}  // namespace morserve::testing
