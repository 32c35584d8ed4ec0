// Server subprocess and client helpers (see server_process.h).
#include "tests/server/server_process.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <sstream>

#include "tests/testutil.h"

namespace morserve::testing {
namespace {

using Clock = std::chrono::steady_clock;

// The value after `key` on a line of `text`, up to the line's end.
std::optional<std::string> AfterKey(const std::string& text, const std::string& key) {
  size_t p = text.find(key);
  if (p == std::string::npos) return std::nullopt;
  p += key.size();
  const size_t e = text.find('\n', p);
  if (e == std::string::npos) return std::nullopt;
  return text.substr(p, e - p);
}

}  // namespace

ServerProcess::~ServerProcess() {
  if (pid_ > 0) {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
  if (reader_.joinable()) reader_.join();
}

bool ServerProcess::Start(const std::string& model_dir, const std::vector<std::string>& extra,
                          int timeout_s) {
  int fds[2];
  if (pipe(fds) != 0) return false;
  std::vector<std::string> argv = {MorserveBinary(), "serve", "--model", model_dir, "--port", "0",
                                   "--metrics-port", "0"};
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
  reader_ = std::thread([this, fd = fds[0]] { ReadLoop(fd); });
  if (!WaitForLine("metrics on ", timeout_s)) return false;
  const std::string out = output();
  auto addr = AfterKey(out, "listening on ");
  auto metrics = AfterKey(out, "metrics on ");
  if (!addr || !metrics) return false;
  address_ = *addr;
  metrics_port_ = std::stoi(metrics->substr(metrics->rfind(':') + 1));
  channel_ = grpc::CreateChannel(address_, grpc::InsecureChannelCredentials());
  return true;
}

void ServerProcess::ReadLoop(int fd) {
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
}

bool ServerProcess::WaitForLine(const std::string& text, int timeout_s) {
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_for(lock, std::chrono::seconds(timeout_s), [&] {
    const size_t p = output_.find(text);
    return (p != std::string::npos && output_.find('\n', p) != std::string::npos) || eof_;
  }) && output_.find(text) != std::string::npos;
}

std::string ServerProcess::output() {
  std::lock_guard<std::mutex> lock(mu_);
  return output_;
}

std::optional<grpc::health::v1::HealthCheckResponse::ServingStatus> ServerProcess::Health() {
  auto stub = grpc::health::v1::Health::NewStub(channel_);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
  grpc::health::v1::HealthCheckRequest req;
  grpc::health::v1::HealthCheckResponse resp;
  if (!stub->Check(&ctx, req, &resp).ok()) return std::nullopt;
  return resp.status();
}

bool ServerProcess::WaitHealth(bool serving, int timeout_s) {
  const auto want = serving ? grpc::health::v1::HealthCheckResponse::SERVING
                            : grpc::health::v1::HealthCheckResponse::NOT_SERVING;
  const auto end = Clock::now() + std::chrono::seconds(timeout_s);
  while (Clock::now() < end) {
    if (Health() == want) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}

void ServerProcess::Signal(int sig) {
  if (pid_ > 0) kill(pid_, sig);
}

int ServerProcess::Terminate(int timeout_s) {
  if (pid_ <= 0) return -1;
  kill(pid_, SIGTERM);
  const auto end = Clock::now() + std::chrono::seconds(timeout_s);
  int status = 0;
  while (Clock::now() < end) {
    const pid_t r = waitpid(pid_, &status, WNOHANG);
    if (r == pid_) {
      pid_ = -1;
      if (reader_.joinable()) reader_.join();
      return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  kill(pid_, SIGKILL);
  waitpid(pid_, nullptr, 0);
  pid_ = -1;
  return -1;
}

v1::GenerateRequest TokenRequest(const std::vector<int>& prompt, int max_tokens) {
  v1::GenerateRequest r;
  for (int t : prompt) r.mutable_token_ids()->add_ids(t);
  r.mutable_sampling()->set_temperature(0);
  r.set_max_tokens(max_tokens);
  r.set_ignore_eos(true);
  return r;
}

StreamResult GenerateAll(v1::Morserve::Stub* stub, const v1::GenerateRequest& request,
                         int deadline_s) {
  StreamResult out;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(deadline_s));
  auto reader = stub->Generate(&ctx, request);
  v1::GenerateResponse resp;
  while (reader->Read(&resp)) {
    ++out.messages;
    for (const v1::Token& t : resp.tokens()) {
      out.tokens.push_back(t.id());
      out.loops.push_back(t.loops());
      out.logprobs.push_back(t.logprob());
    }
    out.echoed.insert(out.echoed.end(), resp.prompt_ids().begin(), resp.prompt_ids().end());
    out.text += resp.text();
    out.prompt_text += resp.prompt_text();
    if (resp.prompt_logprobs_size() > 0) {
      out.prompt_logprob_messages.push_back(out.messages - 1);
      out.prompt_logprobs.insert(out.prompt_logprobs.end(), resp.prompt_logprobs().begin(),
                                 resp.prompt_logprobs().end());
    }
    if (resp.has_finished()) out.finished = resp.finished();
  }
  out.status = reader->Finish();
  return out;
}

std::optional<std::string> HttpGet(int port, const std::string& path_and_query) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return std::nullopt;
  timeval tv{5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    close(fd);
    return std::nullopt;
  }
  const std::string req = "GET " + path_and_query +
                          " HTTP/1.0\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
  if (write(fd, req.data(), req.size()) != static_cast<ssize_t>(req.size())) {
    close(fd);
    return std::nullopt;
  }
  std::string resp;
  char buf[8192];
  ssize_t n;
  while ((n = read(fd, buf, sizeof buf)) > 0) resp.append(buf, n);
  close(fd);
  if (resp.compare(0, 12, "HTTP/1.0 200") != 0 && resp.compare(0, 12, "HTTP/1.1 200") != 0) {
    return std::nullopt;
  }
  const size_t body = resp.find("\r\n\r\n");
  return body == std::string::npos ? std::string() : resp.substr(body + 4);
}

int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = 0;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  socklen_t len = sizeof addr;
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  const int port = ntohs(addr.sin_port);
  close(fd);
  return port;
}

std::optional<double> ScrapeValue(const std::string& exposition, const std::string& series) {
  std::istringstream in(exposition);
  std::string line;
  while (std::getline(in, line)) {
    if (line.compare(0, series.size(), series) == 0 && line.size() > series.size() &&
        line[series.size()] == ' ') {
      return std::stod(line.substr(series.size() + 1));
    }
  }
  return std::nullopt;
}

}  // namespace morserve::testing
