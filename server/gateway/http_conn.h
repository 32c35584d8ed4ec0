// One HTTP/1.1 connection of the gateway as the handlers see it: the Beast stream (bound to
// the connection's strand), the read buffer, the shared gateway state, and helpers that
// write whole JSON responses. Handlers are C++20 coroutines on that strand, so a
// connection's state needs no lock; only gRPC callbacks cross threads (see call_events.h).
#pragma once

// clang-format off
#include <utility>  // first: Boost 1.74's asio/awaitable.hpp uses std::exchange unincluded
// clang-format on

#include <atomic>
#include <boost/asio/awaitable.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <optional>
#include <string>

#include "server/gateway/api_error.h"
#include "server/gateway/backend_pool.h"
#include "server/gateway/gateway_metrics.h"
#include "server/gateway/options.h"

namespace morserve::gateway {

namespace beast = boost::beast;
namespace http = boost::beast::http;
namespace net = boost::asio;

using Clock = std::chrono::steady_clock;
using HttpRequest = http::request<http::string_body>;

struct GatewayContext {
  const GatewayOptions* options = nullptr;
  BackendPool* pool = nullptr;
  GatewayMetrics* metrics = nullptr;
};

struct HttpConn {
  beast::tcp_stream stream;
  beast::flat_buffer buffer;
  GatewayContext* gateway;
  bool keep_alive = true;
  Clock::time_point started;  // the current request's arrival
};

// Writes a complete response (throws boost::system::system_error when the client is gone).
net::awaitable<void> WriteBody(HttpConn& c, int status, std::string body, const char* content_type);
net::awaitable<void> WriteJson(HttpConn& c, int status, std::string body);
net::awaitable<void> WriteError(HttpConn& c, const ApiError& e);

// The served model's name, or the error to send: 503 when no backend has answered yet, 404
// when `requested` (non-empty) names another model.
std::optional<ApiError> CheckModel(const BackendPool& pool, const std::string& requested,
                                   ServedModel* model);

}  // namespace morserve::gateway
