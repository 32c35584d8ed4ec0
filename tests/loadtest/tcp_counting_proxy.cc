// The counting TCP proxy (see tcp_counting_proxy.h).
#include "tests/loadtest/tcp_counting_proxy.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>

namespace morserve::testing {
namespace {

int ConnectLoopback(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (fd >= 0 && connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) return fd;
  if (fd >= 0) close(fd);
  return -1;
}

bool SendAll(int fd, const char* p, size_t n) {
  while (n > 0) {
    const ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
    if (w <= 0) return false;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

}  // namespace

TcpCountingProxy::~TcpCountingProxy() {
  stop_ = true;
  if (acceptor_.joinable()) acceptor_.join();
  std::lock_guard<std::mutex> lock(mu_);
  for (std::thread& t : pumps_) t.join();
  if (listen_fd_ >= 0) close(listen_fd_);
}

bool TcpCountingProxy::Start(int upstream_port, bool close_after_response, int idle_close_ms) {
  upstream_port_ = upstream_port;
  idle_close_ms_ = idle_close_ms;
  close_after_response_ = close_after_response;
  listen_fd_ = socket(AF_INET, SOCK_STREAM, 0);
  if (listen_fd_ < 0) return false;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  if (bind(listen_fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      listen(listen_fd_, 128) != 0 ||
      getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    return false;
  }
  port_ = ntohs(a.sin_port);
  acceptor_ = std::thread([this] { AcceptLoop(); });
  return true;
}

void TcpCountingProxy::AcceptLoop() {
  while (!stop_) {
    pollfd p{listen_fd_, POLLIN, 0};
    if (poll(&p, 1, 50) <= 0) continue;
    const int client = accept(listen_fd_, nullptr, nullptr);
    if (client < 0) continue;
    ++accepted_;
    std::lock_guard<std::mutex> lock(mu_);
    pumps_.emplace_back([this, client] { Pump(client); });
  }
}

// Both directions on one thread: poll, forward what arrived, pass each EOF on as a
// half-close; ends when both directions ended (or either errs, the connection idled past
// idle_close_ms, or the proxy stops).
void TcpCountingProxy::Pump(int client) {
  const int upstream = ConnectLoopback(upstream_port_);
  bool up_open = upstream >= 0, down_open = upstream >= 0;
  bool head_edited = !close_after_response_;
  std::string head;  // the first request's bytes until its request line ends
  char buf[16384];
  auto last = std::chrono::steady_clock::now();
  while (!stop_ && (up_open || down_open)) {
    pollfd p[2] = {{up_open ? client : -1, POLLIN, 0}, {down_open ? upstream : -1, POLLIN, 0}};
    if (poll(p, 2, 5) <= 0) {
      if (idle_close_ms_ > 0 &&
          std::chrono::steady_clock::now() - last > std::chrono::milliseconds(idle_close_ms_)) {
        break;
      }
      continue;
    }
    last = std::chrono::steady_clock::now();
    if (p[0].revents) {
      const ssize_t n = recv(client, buf, sizeof buf, 0);
      if (n <= 0) {
        shutdown(upstream, SHUT_WR);
        up_open = false;
      } else if (!head_edited) {
        head.append(buf, static_cast<size_t>(n));
        const size_t eol = head.find("\r\n");
        if (eol != std::string::npos) {
          head.insert(eol + 2, "Connection: close\r\n");
          head_edited = true;
          if (!SendAll(upstream, head.data(), head.size())) break;
        }
      } else if (!SendAll(upstream, buf, static_cast<size_t>(n))) {
        break;
      }
    }
    if (p[1].revents) {
      const ssize_t n = recv(upstream, buf, sizeof buf, 0);
      if (n <= 0) {
        shutdown(client, SHUT_WR);
        down_open = false;
      } else if (!SendAll(client, buf, static_cast<size_t>(n))) {
        break;
      }
    }
  }
  if (upstream >= 0) close(upstream);
  close(client);
}

}  // namespace morserve::testing
