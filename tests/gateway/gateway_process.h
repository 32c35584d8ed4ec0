// Test helpers for the gateway: `morserve-gateway` as a subprocess (port 0, the port read
// from its one stdout line, SIGTERM to stop, SIGKILL if it outlives the test) and `curl` as
// the HTTP client (status code and body of one request).
#pragma once

#include <sys/types.h>

#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "nlohmann/json.hpp"

namespace morserve::testing {

class GatewayProcess {
 public:
  GatewayProcess() = default;
  ~GatewayProcess();

  // Starts `morserve-gateway --port 0 EXTRA...`; false (output() says why) on failure.
  bool Start(const std::vector<std::string>& extra, int timeout_s = 30);
  int Terminate(int timeout_s = 30);  // exit status, -1 on timeout (then killed)
  bool Running();

  int port() const { return port_; }
  pid_t pid() const { return pid_; }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  std::string output();

 private:
  pid_t pid_ = -1;
  int port_ = 0;
  std::thread reader_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::string output_;
  bool eof_ = false;
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
