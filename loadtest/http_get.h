// A blocking HTTP/1.1 GET (Boost.Beast) for the side channels of a run: the server's
// Prometheus /metrics and an OpenAI server's /v1/models. One connection per call.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "loadtest/url.h"

namespace morserve::loadtest {

// The body of a 200 response; an error naming the URL otherwise.
absl::StatusOr<std::string> HttpGet(const Url& url, int timeout_ms,
                                    const std::string& bearer_token = "");

}  // namespace morserve::loadtest
