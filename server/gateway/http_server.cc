// The HTTP server: accept loop, connections, graceful stop (see http_server.h).
#include "server/gateway/http_server.h"

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "server/gateway/routes.h"

namespace morserve::gateway {

using net::ip::tcp;

namespace {

constexpr auto kIdleTimeout = std::chrono::seconds(300);
constexpr auto kDrainLimit = std::chrono::seconds(120);
// After a 413 the unread rest of the body is read and dropped (a lingering close, as nginx's
// lingering_close) so the client can finish sending and read the answer; closing with unread
// data would reset the connection under a client still sending. Bounded in time and bytes.
constexpr auto kLingerTime = std::chrono::seconds(10);
constexpr size_t kLingerBytes = size_t{256} << 20;

}  // namespace

net::awaitable<void> WriteBody(HttpConn& c, int status, std::string body,
                               const char* content_type) {
  http::response<http::string_body> res;
  res.result(static_cast<unsigned>(status));
  res.version(11);
  res.set(http::field::server, "morserve-gateway");
  res.set(http::field::content_type, content_type);
  res.keep_alive(c.keep_alive);
  res.body() = std::move(body);
  res.prepare_payload();
  c.stream.expires_after(std::chrono::seconds(c.gateway->options->write_timeout_s));
  co_await http::async_write(c.stream, res, net::use_awaitable);
  c.stream.expires_never();
}

net::awaitable<void> WriteJson(HttpConn& c, int status, std::string body) {
  co_await WriteBody(c, status, std::move(body), "application/json");
}

net::awaitable<void> WriteError(HttpConn& c, const ApiError& e) {
  co_await WriteJson(c, e.http_status, e.ToJson());
}

std::optional<ApiError> CheckModel(const BackendPool& pool, const std::string& requested,
                                   ServedModel* model) {
  *model = pool.model();
  if (model->context_length == 0) return NoServingBackend();
  if (!requested.empty() && requested != model->name) {
    return NotFound(absl::StrCat("The model '", requested,
                                 "' does not exist (this gateway "
                                 "serves '",
                                 model->name, "')"),
                    "model_not_found");
  }
  return std::nullopt;
}

HttpServer::HttpServer(GatewayContext gateway) : gateway_(gateway) {}

absl::StatusOr<int> HttpServer::Listen(const std::string& host, int port) {
  boost::system::error_code ec;
  net::ip::address addr = net::ip::make_address(host, ec);
  if (ec) {  // a name such as "localhost": its first address
    tcp::resolver resolver(ioc_);
    auto results = resolver.resolve(host, "", ec);
    if (ec || results.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("--host: cannot resolve '", host, "'"));
    }
    addr = results.begin()->endpoint().address();
  }
  acceptor_ = std::make_unique<tcp::acceptor>(net::make_strand(ioc_));
  const tcp::endpoint ep(addr, static_cast<unsigned short>(port));
  acceptor_->open(ep.protocol(), ec);
  if (!ec) acceptor_->set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) acceptor_->bind(ep, ec);
  if (!ec) acceptor_->listen(net::socket_base::max_listen_connections, ec);
  if (ec) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", host, ":", port, ": ", ec.message()));
  }
  return acceptor_->local_endpoint().port();
}

net::awaitable<void> HttpServer::AcceptLoop() {
  for (;;) {
    boost::system::error_code ec;
    tcp::socket socket = co_await acceptor_->async_accept(
        net::make_strand(ioc_), net::redirect_error(net::use_awaitable, ec));
    if (ec == net::error::operation_aborted || !acceptor_->is_open()) co_return;
    if (ec) continue;  // e.g. EMFILE: the next accept may succeed
    socket.set_option(tcp::no_delay(true), ec);
    auto ex = socket.get_executor();
    net::co_spawn(ex, Serve(std::move(socket)), net::detached);
  }
}

namespace {

// Ends our side (the client sees the answer complete), then reads and drops what the client
// still sends until it closes, kLingerTime passes or kLingerBytes were dropped.
net::awaitable<void> DropUnreadBody(HttpConn& c) {
  boost::system::error_code ec;
  c.stream.socket().shutdown(tcp::socket::shutdown_send, ec);
  c.buffer.consume(c.buffer.size());
  std::vector<char> sink(64 * 1024);
  size_t dropped = 0;
  c.stream.expires_after(kLingerTime);
  while (!ec && dropped < kLingerBytes) {
    dropped += co_await c.stream.async_read_some(net::buffer(sink), net::redirect_error(net::use_awaitable, ec));
  }
  c.stream.expires_never();
}

}  // namespace

net::awaitable<void> HttpServer::Serve(tcp::socket socket) {
  HttpConn c{beast::tcp_stream(std::move(socket)), beast::flat_buffer(), &gateway_};
  GatewayMetrics& metrics = *gateway_.metrics;
  metrics.open_connections().Increment();
  try {
    while (c.keep_alive) {
      http::request_parser<http::string_body> parser;
      parser.body_limit(static_cast<uint64_t>(gateway_.options->max_body_bytes));
      parser.header_limit(64 * 1024);
      boost::system::error_code ec;
      c.stream.expires_after(kIdleTimeout);
      co_await http::async_read(c.stream, c.buffer, parser,
                                net::redirect_error(net::use_awaitable, ec));
      c.stream.expires_never();
      if (ec == http::error::end_of_stream || ec == net::error::eof ||
          ec == beast::error::timeout || ec == net::error::connection_reset ||
          ec == net::error::operation_aborted) {
        break;
      }
      c.started = Clock::now();
      if (ec) {
        // The body was not read, so the connection cannot be reused.
        c.keep_alive = false;
        const ApiError e =
            ec == http::error::body_limit
                ? BodyTooLarge(gateway_.options->max_body_bytes)
                : InvalidRequest(absl::StrCat("malformed HTTP request: ", ec.message()));
        co_await WriteError(c, e);
        metrics.OnRequest("other", e.http_status, 0);
        if (ec == http::error::body_limit) co_await DropUnreadBody(c);
        break;
      }
      HttpRequest req = parser.release();
      c.keep_alive = req.keep_alive();
      in_flight_.fetch_add(1);
      metrics.in_flight().Increment();
      std::string endpoint;
      int code = 500;
      try {
        code = co_await Route(c, req, &endpoint);
      } catch (...) {
        in_flight_.fetch_sub(1);
        metrics.in_flight().Decrement();
        throw;
      }
      in_flight_.fetch_sub(1);
      metrics.in_flight().Decrement();
      metrics.OnRequest(endpoint, code,
                        std::chrono::duration<double>(Clock::now() - c.started).count());
    }
  } catch (const std::exception&) {
    // The client went away mid-write (or a handler failed): drop the connection.
  }
  boost::system::error_code ignored;
  c.stream.socket().shutdown(tcp::socket::shutdown_send, ignored);
  metrics.open_connections().Decrement();
}

net::awaitable<void> HttpServer::Drain() {
  net::steady_timer timer(ioc_);
  const auto deadline = Clock::now() + kDrainLimit;
  while (in_flight_.load() > 0 && Clock::now() < deadline) {
    timer.expires_after(std::chrono::milliseconds(20));
    co_await timer.async_wait(net::use_awaitable);
  }
  ioc_.stop();
}

void HttpServer::Run(int threads) {
  net::signal_set signals(ioc_, SIGINT, SIGTERM);
  signals.async_wait([this](const boost::system::error_code& ec, int) {
    if (ec) return;
    // On the acceptor's strand: stop accepting; requests in flight finish.
    net::post(acceptor_->get_executor(), [this] {
      boost::system::error_code ignored;
      acceptor_->close(ignored);
      net::co_spawn(ioc_, Drain(), net::detached);
    });
  });
  net::co_spawn(acceptor_->get_executor(), AcceptLoop(), net::detached);
  std::vector<std::thread> pool;
  for (int i = 1; i < threads; ++i) pool.emplace_back([this] { ioc_.run(); });
  ioc_.run();
  for (std::thread& t : pool) t.join();
}

}  // namespace morserve::gateway
