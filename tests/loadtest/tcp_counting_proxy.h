// Test helper: a TCP proxy on 127.0.0.1 (port 0) in front of a local server that counts the
// connections its clients open. Bytes pass through unchanged, except with
// `close_after_response`: it adds "Connection: close" to the head of each connection's first
// request, so the real server answers with Connection: close and closes after that response
// (a server that does not keep connections alive); with `idle_close_ms` > 0 it closes a
// connection that carried no bytes for that long (a server's idle timeout, unannounced).
// Real sockets, one thread per connection.
#pragma once

#include <atomic>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace morserve::testing {

class TcpCountingProxy {
 public:
  TcpCountingProxy() = default;
  ~TcpCountingProxy();  // stops accepting, ends the open connections, joins the threads

  // Listens and forwards to 127.0.0.1:upstream_port; false on a socket error.
  bool Start(int upstream_port, bool close_after_response, int idle_close_ms = 0);
  int port() const { return port_; }
  int accepted() const { return accepted_.load(); }

 private:
  void AcceptLoop();
  void Pump(int client);

  int listen_fd_ = -1, port_ = 0, upstream_port_ = 0;
  bool close_after_response_ = false;
  int idle_close_ms_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<int> accepted_{0};
  std::thread acceptor_;
  std::mutex mu_;
  std::vector<std::thread> pumps_;
};

}  // namespace morserve::testing
