// The gateway's routes: method and path to handler, authentication (Bearer --api-key on /v1/*
// and /tokenize; /health and /metrics stay open for probes and scrapers), and the small
// endpoints (/v1/models, /health, /metrics, /tokenize). Generation is in generation.h.
#pragma once

// clang-format off
#include <utility>  // first: Boost 1.74's asio/awaitable.hpp uses std::exchange unincluded
// clang-format on

#include <boost/asio/awaitable.hpp>
#include <optional>
#include <string>

#include "server/gateway/http_conn.h"

namespace morserve::gateway {

// Handles one request and writes its response; returns the status code and sets `endpoint`
// (the metrics label).
net::awaitable<int> Route(HttpConn& c, const HttpRequest& req, std::string* endpoint);

}  // namespace morserve::gateway
