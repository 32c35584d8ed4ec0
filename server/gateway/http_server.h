// The gateway's HTTP/1.1 server: an acceptor, one coroutine per connection on its own strand
// (keep-alive, request bodies up to --max-body-bytes), the routes, and a graceful stop:
// SIGTERM/SIGINT close the acceptor, requests in flight finish, then the io threads end.
#pragma once

// clang-format off
#include <utility>  // first: Boost 1.74's asio/awaitable.hpp uses std::exchange unincluded
// clang-format on

#include <atomic>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "server/gateway/http_conn.h"

namespace morserve::gateway {

class HttpServer {
 public:
  explicit HttpServer(GatewayContext gateway);

  // Binds host:port (0: ephemeral) and returns the bound port.
  absl::StatusOr<int> Listen(const std::string& host, int port);
  // Accepts and serves on `threads` io threads until SIGTERM/SIGINT and the drain finish.
  void Run(int threads);

 private:
  net::awaitable<void> AcceptLoop();
  net::awaitable<void> Serve(net::ip::tcp::socket socket);
  net::awaitable<void> Drain();

  GatewayContext gateway_;
  net::io_context ioc_;
  std::unique_ptr<net::ip::tcp::acceptor> acceptor_;
  std::atomic<int> in_flight_{0};
};

}  // namespace morserve::gateway
