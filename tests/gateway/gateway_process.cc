// Gateway subprocess and curl helpers (see gateway_process.h).
#include "tests/gateway/gateway_process.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "tests/testutil.h"

namespace morserve::testing {

// $MORSERVE_GATEWAY overrides the built binary (e.g. a sanitizer build's).
std::string GatewayBinary() {
  const char* env = std::getenv("MORSERVE_GATEWAY");
  return env != nullptr && *env != '\0' ? env : MORSERVE_GATEWAY_BINARY;
}

GatewayProcess::~GatewayProcess() {
  if (pid_ > 0) {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
  if (reader_.joinable()) reader_.join();
}

bool GatewayProcess::Start(const std::vector<std::string>& extra, int timeout_s) {
  int fds[2];
  if (pipe(fds) != 0) return false;
  std::vector<std::string> argv = {GatewayBinary(), "--port", "0"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  pid_ = fork();
  if (pid_ == 0) {
    dup2(fds[1], STDOUT_FILENO);
    dup2(fds[1], STDERR_FILENO);
    close(fds[0]);
    close(fds[1]);
    std::vector<char*> args;
    for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execv(args[0], args.data());
    _exit(127);
  }
  close(fds[1]);
  reader_ = std::thread([this, fd = fds[0]] {
    char buf[4096];
    for (;;) {
      const ssize_t n = read(fd, buf, sizeof buf);
      if (n <= 0) break;
      std::lock_guard<std::mutex> lock(mu_);
      output_.append(buf, n);
      cv_.notify_all();
    }
    close(fd);
    std::lock_guard<std::mutex> lock(mu_);
    eof_ = true;
    cv_.notify_all();
  });
  const std::string key = "gateway listening on ";
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, std::chrono::seconds(timeout_s), [&] {
    const size_t p = output_.find(key);
    return (p != std::string::npos && output_.find('\n', p) != std::string::npos) || eof_;
  });
  const size_t p = output_.find(key);
  if (p == std::string::npos) return false;
  const size_t e = output_.find('\n', p);
  const std::string addr = output_.substr(p + key.size(), e - p - key.size());
  port_ = std::stoi(addr.substr(addr.rfind(':') + 1));
  return true;
}

bool GatewayProcess::Running() {
  if (pid_ <= 0) return false;
  int status = 0;
  if (waitpid(pid_, &status, WNOHANG) == pid_) {
    pid_ = -1;
    return false;
  }
  return true;
}

int GatewayProcess::Terminate(int timeout_s) {
  if (pid_ <= 0) return -1;
  kill(pid_, SIGTERM);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  int status = 0;
  while (std::chrono::steady_clock::now() < deadline) {
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      if (reader_.joinable()) reader_.join();
      return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    }
    usleep(20000);
  }
  kill(pid_, SIGKILL);
  waitpid(pid_, nullptr, 0);
  pid_ = -1;
  return -1;
}

std::string GatewayProcess::output() {
  std::lock_guard<std::mutex> lock(mu_);
  return output_;
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
