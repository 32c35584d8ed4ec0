// Gateway subprocess and curl helpers (see gateway_process.h).
#include "tests/gateway/gateway_process.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <regex>
#include <sstream>
#include <thread>

#include "tests/testutil.h"

namespace morserve::testing {

// $MORSERVE_GATEWAY overrides the built binary (e.g. a sanitizer build's).
std::string GatewayBinary() {
  const char* env = std::getenv("MORSERVE_GATEWAY");
  return env != nullptr && *env != '\0' ? env : MORSERVE_GATEWAY_BINARY;
}

bool GatewayProcess::Start(const std::vector<std::string>& extra, int timeout_s) {
  std::vector<std::string> argv = {GatewayBinary(), "--port", "0"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  if (!child_.Start(argv)) return false;
  const auto port =
      child_.WaitForLine(std::regex("^gateway listening on \\S+:([0-9]+)$"), timeout_s);
  if (!port) return false;
  port_ = std::stoi((*port)[1]);
  return true;
}

bool GatewayProcess::WaitHealth(int status, int timeout_s) const {
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  while (Curl("GET", url() + "/health", "", {}).status != status) {
    if (std::chrono::steady_clock::now() >= end) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
  return true;
}

void GatewayStack::Start(const TinyModelSpec& spec) {
  ASSERT_NO_FATAL_FAILURE(ServedTextModel::Start(spec));
  ASSERT_TRUE(gateway_.Start({"--backend", server().address(), "--health-interval-ms", "200"}))
      << gateway_.output();
  // Until its first health check the gateway knows no serving backend (503).
  ASSERT_TRUE(gateway_.WaitHealth(200)) << "the gateway never saw the backend serving\n"
                                        << gateway_.output();
}

void GatewayStack::Stop() {
  if (gateway_.pid() > 0) EXPECT_EQ(gateway_.Terminate(), 0) << gateway_.output();
  ServedTextModel::Stop();
}

nlohmann::json HttpResult::Json() const {
  return nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
}

namespace {

std::string Quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) {
    if (c == '\'') {
      q += "'\\''";
    } else {
      q += c;
    }
  }
  return q + "'";
}

}  // namespace

HttpResult Curl(const std::string& method, const std::string& url, const std::string& body,
                const std::vector<std::string>& headers) {
  TempDir dir;
  std::string cmd = "curl -sS -N --max-time 120 -o " + Quote(dir.File("out")) +
                    " -w '%{http_code}' -X " + method + " -H 'Expect:'";
  for (const std::string& h : headers) cmd += " -H " + Quote(h);
  if (!body.empty()) {
    WriteFile(dir.File("in"), body);
    cmd += " --data-binary @" + Quote(dir.File("in"));
  }
  cmd += " " + Quote(url);
  CommandResult r = RunCommand(cmd);
  HttpResult out;
  try {
    out.status = std::stoi(r.output.substr(r.output.size() >= 3 ? r.output.size() - 3 : 0));
  } catch (...) {
    out.status = 0;
  }
  std::ifstream in(dir.File("out"), std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  out.body = ss.str();
  return out;
}

std::vector<std::string> SseData(const std::string& body) {
  std::vector<std::string> data;
  std::istringstream in(body);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    if (line.rfind("data: ", 0) != 0) {
      ADD_FAILURE() << "not an SSE data line: " << line;
      continue;
    }
    data.push_back(line.substr(6));
  }
  return data;
}

}  // namespace morserve::testing
