// Server subprocess and client helpers (see server_process.h).
#include "tests/server/server_process.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <regex>
#include <sstream>
#include <thread>

#include "tests/testutil.h"

namespace morserve::testing {
namespace {

using Clock = std::chrono::steady_clock;

}  // namespace

bool ServerProcess::Start(const std::string& model_dir, const std::vector<std::string>& extra,
                          int timeout_s) {
  std::vector<std::string> argv = {MorserveBinary(), "serve", "--model", model_dir, "--port", "0",
                                   "--metrics-port", "0"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  if (!child_.Start(argv)) return false;
  // "listening on ADDRESS" comes first, then "metrics on HOST:PORT".
  const auto address = child_.WaitForLine(std::regex("^listening on (\\S+)$"), timeout_s);
  if (!address) return false;
  const auto metrics = child_.WaitForLine(std::regex("^metrics on \\S+:([0-9]+)$"), timeout_s);
  if (!metrics) return false;
  address_ = (*address)[1];
  metrics_port_ = std::stoi((*metrics)[1]);
  channel_ = grpc::CreateChannel(address_, grpc::InsecureChannelCredentials());
  return true;
}

bool ServerProcess::WaitForLine(const std::string& text, int timeout_s) {
  return child_
      .WaitForLine([&](const std::string& line) { return line.find(text) != std::string::npos; },
                   timeout_s)
      .has_value();
}

std::unique_ptr<v1::Morserve::Stub> ServerProcess::Stub() const {
  if (channel_ != nullptr) return v1::Morserve::NewStub(channel_);
  ADD_FAILURE() << "ServerProcess::Stub() on a server that did not start";
  return v1::Morserve::NewStub(grpc::CreateChannel("unix:/nonexistent/morserve-not-started",
                                                   grpc::InsecureChannelCredentials()));
}

std::optional<grpc::health::v1::HealthCheckResponse::ServingStatus> ServerProcess::Health() {
  if (channel_ == nullptr) return std::nullopt;
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

void StartOrDie(ServerProcess* server, const std::string& model,
                const std::vector<std::string>& extra) {
  ASSERT_TRUE(server->Start(model, extra)) << server->output();
  ASSERT_TRUE(server->WaitHealth(true)) << server->output();
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
