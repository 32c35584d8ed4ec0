// Routing, authentication and the small endpoints (see routes.h).
#include "server/gateway/routes.h"

#include <boost/asio/use_awaitable.hpp>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "server/gateway/call_events.h"
#include "server/gateway/generation.h"
#include "server/gateway/openai_request.h"

namespace morserve::gateway {
namespace {

using ojson = nlohmann::ordered_json;

bool Authorized(const GatewayOptions& o, const HttpRequest& req) {
  if (o.api_key.empty()) return true;
  const auto it = req.find(http::field::authorization);
  if (it == req.end()) return false;
  return it->value() == absl::StrCat("Bearer ", o.api_key);
}

net::awaitable<int> Models(HttpConn& c) {
  ServedModel model;
  if (auto e = CheckModel(*c.gateway->pool, "", &model)) {
    co_await WriteError(c, *e);
    co_return e->http_status;
  }
  ojson m = {{"id", model.name},
             {"object", "model"},
             {"created", model.created},
             {"owned_by", "morserve"},
             {"root", model.name},
             {"parent", nullptr},
             {"max_model_len", model.context_length}};
  ojson list = {{"object", "list"}, {"data", ojson::array({m})}};
  co_await WriteJson(c, 200, list.dump());
  co_return 200;
}

net::awaitable<int> Health(HttpConn& c) {
  if (!c.gateway->pool->AnyServing()) {
    const ApiError e = NoServingBackend();
    co_await WriteError(c, e);
    co_return e.http_status;
  }
  co_await WriteJson(c, 200, "{\"status\":\"ok\"}");
  co_return 200;
}

net::awaitable<int> Metrics(HttpConn& c) {
  co_await WriteBody(c, 200, c.gateway->metrics->Serialize(),
                     "text/plain; version=0.0.4; charset=utf-8");
  co_return 200;
}

// POST /tokenize (vLLM's shape): {"count", "max_model_len", "tokens"}.
net::awaitable<int> Tokenize(HttpConn& c, const HttpRequest& req) {
  std::string requested;
  auto state = std::make_shared<
      std::tuple<grpc::ClientContext, v1::TokenizeRequest, v1::TokenizeResponse>>();
  auto& [ctx, request, response] = *state;
  std::optional<ApiError> error = ParseTokenizeRequest(req.body(), &requested, &request);
  ServedModel model;
  if (!error) error = CheckModel(*c.gateway->pool, requested, &model);
  BackendRef b = error ? nullptr : c.gateway->pool->Acquire();
  if (!error && b == nullptr) error = NoServingBackend();
  if (error) {
    co_await WriteError(c, *error);
    co_return error->http_status;
  }
  auto sink = std::make_shared<EventSink>(c.stream.get_executor());
  BackendPool* pool = c.gateway->pool;
  b->stub->async()->Tokenize(&ctx, &request, &response, [state, sink, pool, b](grpc::Status s) {
    pool->Release(b.get());
    CallEvent e;
    e.done = true;
    e.status = std::move(s);
    sink->Push(std::move(e));
  });
  std::vector<CallEvent> events;
  while (events.empty()) {
    co_await sink->Wait();
    sink->Take(&events);
  }
  if (!events[0].status.ok()) {
    const ApiError e = FromGrpc(events[0].status);
    co_await WriteError(c, e);
    co_return e.http_status;
  }
  ojson out = {{"count", response.ids_size()},
               {"max_model_len", model.context_length},
               {"tokens", std::vector<int>(response.ids().begin(), response.ids().end())}};
  co_await WriteJson(c, 200, out.dump());
  co_return 200;
}

}  // namespace

net::awaitable<int> Route(HttpConn& c, const HttpRequest& req, std::string* endpoint) {
  std::string target(req.target().data(), req.target().size());
  target = target.substr(0, target.find('?'));
  const std::string method(req.method_string().data(), req.method_string().size());
  const bool get = req.method() == http::verb::get;
  const bool post = req.method() == http::verb::post;
  struct RouteEntry {
    const char* path;
    const char* label;
    bool post;
  };
  static const RouteEntry kRoutes[] = {
      {"/v1/completions", "completions", true}, {"/v1/chat/completions", "chat_completions", true},
      {"/v1/models", "models", false},          {"/health", "health", false},
      {"/metrics", "metrics", false},           {"/tokenize", "tokenize", true}};
  const RouteEntry* route = nullptr;
  for (const RouteEntry& r : kRoutes) {
    if (target == r.path) route = &r;
  }
  *endpoint = route ? route->label : "other";
  std::optional<ApiError> error;
  if (route == nullptr) {
    error = NotFound(absl::StrCat("no route for ", method, " ", target), "unknown_url");
  } else if (route->post ? !post : !get) {
    error = ApiError{405, "invalid_request_error",
                     absl::StrCat(target, " takes ", route->post ? "POST" : "GET"), "",
                     "method_not_allowed"};
  } else if ((absl::StartsWith(target, "/v1/") || target == "/tokenize") &&
             !Authorized(*c.gateway->options, req)) {
    error = Unauthorized();
  }
  if (error) {
    co_await WriteError(c, *error);
    co_return error->http_status;
  }
  if (target == "/v1/completions")
    co_return co_await HandleGeneration(c, Endpoint::kCompletions, req);
  if (target == "/v1/chat/completions")
    co_return co_await HandleGeneration(c, Endpoint::kChat, req);
  if (target == "/v1/models") co_return co_await Models(c);
  if (target == "/health") co_return co_await Health(c);
  if (target == "/metrics") co_return co_await Metrics(c);
  co_return co_await Tokenize(c, req);
}

}  // namespace morserve::gateway
