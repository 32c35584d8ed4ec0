// POST /v1/completions and /v1/chat/completions: one request's fan-out of Generate calls
// (n > 1 or several prompts: one call per choice) over the least-loaded serving backends,
// and the answer: one JSON object, or Server-Sent Events as the tokens arrive.
//
// Invariants:
//   - Nothing is sent before every choice's first event: an error any call reports before
//     streaming (invalid parameter, context, queue full) is the HTTP status; after the stream
//     started it is an in-band error event and the stream still ends with [DONE].
//   - A call that fails UNAVAILABLE before anything of its choice was sent moves to another
//     serving backend (the failed one is marked down until its health check recovers).
//   - A client that goes away (read side closed or a write fails) cancels every call; the
//     backends free the requests' KV blocks. The calls outlive the handler safely.
#pragma once

// clang-format off
#include <utility>  // first: Boost 1.74's asio/awaitable.hpp uses std::exchange unincluded
// clang-format on

#include <boost/asio/awaitable.hpp>
#include <optional>

#include "server/gateway/http_conn.h"
#include "server/gateway/openai_request.h"

namespace morserve::gateway {

// Handles the request; returns the HTTP status for the metrics (499: the client went away).
net::awaitable<int> HandleGeneration(HttpConn& c, Endpoint endpoint, const HttpRequest& req);

}  // namespace morserve::gateway
