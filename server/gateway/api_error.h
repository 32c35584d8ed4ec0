// OpenAI-shaped errors: `{"error": {"message", "type", "param", "code"}}` with the HTTP status
// the issue fixes (400 invalid parameters / prompt over the context, 401 bad key, 404 unknown
// model or path, 413 body too large, 429 backends rejecting for load, 503 nothing serving),
// and the one table that maps a backend's gRPC status onto them.
#pragma once

#include <grpcpp/grpcpp.h>

#include <string>

namespace morserve::gateway {

struct ApiError {
  int http_status = 500;
  std::string type;  // "invalid_request_error", ...
  std::string message;
  std::string param;  // the request field at fault; empty: null
  std::string code;   // machine-readable code; empty: null

  std::string ToJson() const;
};

ApiError InvalidRequest(std::string message, std::string param = "");
ApiError Unauthorized();
ApiError NotFound(std::string message, std::string code);
ApiError BodyTooLarge(long long limit);
ApiError NoServingBackend();
// A backend's non-OK status on Generate / Tokenize.
ApiError FromGrpc(const grpc::Status& status);

}  // namespace morserve::gateway
