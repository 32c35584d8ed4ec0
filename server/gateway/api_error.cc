// OpenAI error JSON and the gRPC -> HTTP table (see api_error.h).
#include "server/gateway/api_error.h"

#include <cctype>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace morserve::gateway {
namespace {

// The backend's messages start with the field at fault ("max_tokens: ...", "temperature must
// be ..."): that word is the OpenAI param.
std::string LeadingField(const std::string& msg) {
  size_t i = 0;
  while (i < msg.size() && (std::isalnum(static_cast<unsigned char>(msg[i])) || msg[i] == '_' ||
                            msg[i] == '.' || msg[i] == '[' || msg[i] == ']')) {
    ++i;
  }
  if (i == 0 || i == msg.size() || (msg[i] != ':' && msg[i] != ' ')) return "";
  return msg.substr(0, i);
}

}  // namespace

std::string ApiError::ToJson() const {
  nlohmann::ordered_json e;
  e["message"] = message;
  e["type"] = type;
  e["param"] = param.empty() ? nlohmann::ordered_json() : nlohmann::ordered_json(param);
  e["code"] = code.empty() ? nlohmann::ordered_json() : nlohmann::ordered_json(code);
  nlohmann::ordered_json j;
  j["error"] = std::move(e);
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

ApiError InvalidRequest(std::string message, std::string param) {
  return {400, "invalid_request_error", std::move(message), std::move(param), ""};
}

ApiError Unauthorized() {
  return {401, "authentication_error",
          "invalid or missing API key: send 'Authorization: Bearer <key>'", "", "invalid_api_key"};
}

ApiError NotFound(std::string message, std::string code) {
  return {404, "not_found_error", std::move(message), "", std::move(code)};
}

ApiError BodyTooLarge(long long limit) {
  return {413, "invalid_request_error",
          absl::StrCat("request body is larger than the limit of ", limit, " bytes"), "",
          "request_too_large"};
}

ApiError NoServingBackend() {
  return {503, "service_unavailable_error", "no backend is serving (all are down or loading)", "",
          "service_unavailable"};
}

// One table: the backend's gRPC code decides the HTTP status. The backend's message names the
// field (e.g. "max_tokens: 600 plus the prompt's 12 tokens exceeds the context of 512
// tokens"), so it is passed through.
ApiError FromGrpc(const grpc::Status& status) {
  const std::string& msg = status.error_message();
  switch (status.error_code()) {
    case grpc::StatusCode::INVALID_ARGUMENT:
    case grpc::StatusCode::FAILED_PRECONDITION:
    case grpc::StatusCode::OUT_OF_RANGE: {
      ApiError e = InvalidRequest(msg, LeadingField(msg));
      if (msg.find("context of") != std::string::npos) e.code = "context_length_exceeded";
      return e;
    }
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
      return {429, "rate_limit_error", absl::StrCat("the backend is overloaded: ", msg), "",
              "rate_limit_exceeded"};
    case grpc::StatusCode::UNAVAILABLE:
      return {503, "service_unavailable_error", absl::StrCat("backend unavailable: ", msg), "",
              "service_unavailable"};
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return {504, "timeout_error", absl::StrCat("backend deadline exceeded: ", msg), "",
              "timeout"};
    case grpc::StatusCode::CANCELLED:
      return {499, "cancelled", absl::StrCat("the request was cancelled: ", msg), "", "cancelled"};
    default:
      return {500, "internal_error", absl::StrCat("backend error: ", msg), "", "internal_error"};
  }
}

}  // namespace morserve::gateway
