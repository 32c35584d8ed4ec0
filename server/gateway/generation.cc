// Completions and chat completions over Generate calls (see generation.h).
#include "server/gateway/generation.h"

#include <sys/socket.h>

#include <boost/asio/redirect_error.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <cerrno>
#include <memory>
#include <vector>

#include "server/gateway/call_events.h"
#include "server/gateway/generate_call.h"
#include "server/gateway/openai_response.h"
#include "server/gateway/write_watchdog.h"

namespace morserve::gateway {
namespace {

struct ChoiceState {
  BackendRef backend;
  int attempts = 0;
  bool received = false;  // a message of this choice arrived
  bool done = false;
  bool role_sent = false;
  bool prompt_seen = false;  // the choice's first message (echo, prompt logprobs) was handled
  int text_offset = 0;
  ChoiceResult result;
};

class GenerationRun {
 public:
  GenerationRun(HttpConn& c, OpenAiRequest req, std::string model)
      : c_(c),
        g_(*c.gateway),
        req_(std::move(req)),
        header_(NewResponseHeader(req_.endpoint, std::move(model))),
        chunks_(req_, header_),
        sink_(std::make_shared<EventSink>(c.stream.get_executor())),
        choices_(req_.calls.size()),
        watchdog_(c.stream.socket(), std::chrono::seconds(g_.options->write_timeout_s)) {}

  net::awaitable<int> Run();

 private:
  bool StartChoice(int i, const Backend* exclude);
  void WatchClient();
  // Applies one event; false when the request must end with `error_` before streaming.
  bool Apply(CallEvent& e);
  void OnMessage(int i, const v1::GenerateResponse& m);
  bool OnDone(int i, const grpc::Status& s);
  bool Ready() const;  // every choice has had a first event
  net::awaitable<bool> Flush(bool last);
  net::awaitable<bool> FlushNow(bool last);
  net::awaitable<int> Fail(const ApiError& e);
  std::vector<ChoiceResult> MoveResults() {
    std::vector<ChoiceResult> out;
    out.reserve(choices_.size());
    for (ChoiceState& s : choices_) out.push_back(std::move(s.result));
    return out;
  }

  HttpConn& c_;
  GatewayContext& g_;
  OpenAiRequest req_;
  ResponseHeader header_;
  ChunkWriter chunks_;
  std::shared_ptr<EventSink> sink_;
  std::vector<ChoiceState> choices_;
  std::shared_ptr<bool> client_gone_ = std::make_shared<bool>(false);
  std::optional<ApiError> error_;
  bool headers_sent_ = false;
  bool first_token_ = false;
  int remaining_ = 0;
  std::string out_;  // SSE bytes not yet written
  UsageTotals usage_;
  http::response<http::empty_body> sse_head_;
  std::optional<http::response_serializer<http::empty_body>> sse_serializer_;
  WriteWatchdog watchdog_;
};

bool GenerationRun::StartChoice(int i, const Backend* exclude) {
  BackendRef b = g_.pool->Acquire(exclude);
  if (b == nullptr) return false;
  choices_[i].backend = b;
  ++choices_[i].attempts;
  GenerateCall::Start(g_.pool, std::move(b), req_.calls[i], i, sink_);
  return true;
}

// Readable while a request is handled means the client closed (HTTP/1.1 clients do not send
// more until the answer; a pipelined request just ends the watch).
void GenerationRun::WatchClient() {
  auto& socket = c_.stream.socket();
  socket.async_wait(net::socket_base::wait_read,
                    [gone = client_gone_, sink = sink_,
                     fd = socket.native_handle()](const boost::system::error_code& ec) {
                      if (ec) return;
                      char ch;
                      const ssize_t n = ::recv(fd, &ch, 1, MSG_PEEK | MSG_DONTWAIT);
                      if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) {
                        *gone = true;
                        sink->Wake();
                      }
                    });
}

bool GenerationRun::Ready() const {
  for (const ChoiceState& s : choices_) {
    if (!s.received && !s.done) return false;
  }
  return true;
}

void GenerationRun::OnMessage(int i, const v1::GenerateResponse& m) {
  ChoiceState& s = choices_[i];
  s.received = true;
  if (!first_token_ && m.tokens_size() > 0) {
    first_token_ = true;
    g_.metrics->OnFirstToken(std::chrono::duration<double>(Clock::now() - c_.started).count());
  }
  const bool first = !s.prompt_seen;
  s.prompt_seen = true;
  if (!req_.stream) {
    if (req_.echo) s.result.text.append(m.prompt_text());
    s.result.text.append(m.text());
    if (req_.logprobs >= 0) s.result.tokens.MergeFrom(m.tokens());
    if (req_.return_loops) {
      for (const v1::Token& t : m.tokens()) s.result.token_loops.push_back(t.loops());
    }
    s.result.prompt_tokens.MergeFrom(m.prompt_logprobs());
  } else {
    if (req_.endpoint == Endpoint::kChat && !s.role_sent) {
      chunks_.Role(i, &out_);
      s.role_sent = true;
    }
    const bool scored = req_.echo_logprobs() || req_.prompt_logprobs >= 0;
    if (first && ((req_.echo && !m.prompt_text().empty()) || scored)) {
      chunks_.Prompt(i, m, &s.text_offset, &out_);
    }
    if (!m.text().empty() || ((req_.logprobs >= 0 || req_.return_loops) && m.tokens_size() > 0)) {
      chunks_.Delta(i, m.text(), m, &s.text_offset, &out_);
    }
  }
  if (!m.has_finished()) return;
  const v1::Finished& f = m.finished();
  s.result.finished = f;
  if (i % req_.n == 0) {
    usage_.prompt += f.usage().prompt_tokens();
    usage_.cached += f.usage().cached_tokens();
  }
  usage_.completion += f.usage().completion_tokens();
  usage_.recursion_loops += f.usage().recursion_loops();
  if (f.reason() == v1::FINISH_REASON_ERROR) {
    ApiError e{500, "internal_error", "generation failed: " + f.error(), "", "internal_error"};
    if (!req_.stream) {
      error_ = e;
    } else {
      ChunkWriter::Error(e, &out_);
    }
  }
  if (req_.stream) chunks_.Finish(i, f, &out_);
}

bool GenerationRun::OnDone(int i, const grpc::Status& s) {
  ChoiceState& st = choices_[i];
  if (s.ok()) {
    st.done = true;
    --remaining_;
    return !error_;
  }
  // Unreachable backend: another one, while nothing of this choice went to the client.
  const bool retry = s.error_code() == grpc::StatusCode::UNAVAILABLE &&
                     (!st.received || !req_.stream) && !*client_gone_ &&
                     st.attempts < static_cast<int>(g_.pool->size()) + 1;
  if (retry) {
    g_.pool->MarkDown(st.backend.get());
    st.received = false;
    st.prompt_seen = false;
    st.result = ChoiceResult();
    if (StartChoice(i, st.backend.get())) return true;
  }
  st.done = true;
  --remaining_;
  const ApiError e = FromGrpc(s);
  if (!headers_sent_ || !req_.stream) {
    error_ = e;
    return false;
  }
  ChunkWriter::Error(e, &out_);
  return true;
}

bool GenerationRun::Apply(CallEvent& e) {
  if (e.done) return OnDone(e.choice, e.status);
  OnMessage(e.choice, e.message);
  return !error_;
}

// Writes the SSE headers (once) and the pending chunks; false when the client is gone.
// Straight to the socket: tcp_stream's per-operation timeout would arm and cancel a timer
// for every chunk; the watchdog closes the socket when a write stalls (a client that stops
// reading) with one timer wait per timeout period instead.
net::awaitable<bool> GenerationRun::Flush(bool last) {
  watchdog_.Begin();
  const bool ok = co_await FlushNow(last);
  watchdog_.End();
  co_return ok;
}

net::awaitable<bool> GenerationRun::FlushNow(bool last) {
  boost::system::error_code ec;
  auto& socket = c_.stream.socket();
  if (!headers_sent_) {
    headers_sent_ = true;
    sse_head_.result(http::status::ok);
    sse_head_.version(11);
    sse_head_.set(http::field::server, "morserve-gateway");
    sse_head_.set(http::field::content_type, "text/event-stream");
    sse_head_.set(http::field::cache_control, "no-cache");
    sse_head_.keep_alive(c_.keep_alive);
    sse_head_.chunked(true);
    sse_serializer_.emplace(sse_head_);
    co_await http::async_write_header(socket, *sse_serializer_,
                                      net::redirect_error(net::use_awaitable, ec));
    if (ec) co_return false;
  }
  if (!out_.empty()) {
    co_await net::async_write(socket, http::make_chunk(net::buffer(out_)),
                              net::redirect_error(net::use_awaitable, ec));
    out_.clear();
    if (ec) co_return false;
  }
  if (last) {
    co_await net::async_write(socket, http::make_chunk_last(),
                              net::redirect_error(net::use_awaitable, ec));
    if (ec) co_return false;
  }
  co_return true;
}

net::awaitable<int> GenerationRun::Fail(const ApiError& e) {
  sink_->CancelAll();
  co_await WriteError(c_, e);
  co_return e.http_status;
}

net::awaitable<int> GenerationRun::Run() {
  remaining_ = static_cast<int>(choices_.size());
  for (size_t i = 0; i < choices_.size(); ++i) {
    if (!StartChoice(static_cast<int>(i), nullptr)) co_return co_await Fail(NoServingBackend());
  }
  WatchClient();
  std::vector<CallEvent> events;
  while (remaining_ > 0) {
    co_await sink_->Wait();
    if (*client_gone_) break;
    sink_->Take(&events);
    for (CallEvent& e : events) {
      if (!Apply(e)) {
        c_.stream.socket().cancel();  // the client watch
        co_return co_await Fail(*error_);
      }
    }
    if (req_.stream && (headers_sent_ || Ready()) && remaining_ > 0) {
      if (!co_await Flush(false)) *client_gone_ = true;
    }
  }
  if (*client_gone_) {
    sink_->CancelAll();
    c_.keep_alive = false;
    co_return 499;
  }
  c_.stream.socket().cancel();  // the client watch
  g_.metrics->OnTokens(static_cast<int>(usage_.prompt), static_cast<int>(usage_.completion));
  if (!req_.stream) {
    co_await WriteJson(c_, 200, RenderResponse(req_, header_, MoveResults(), usage_));
    co_return 200;
  }
  if (req_.include_usage) chunks_.Usage(usage_, &out_);
  ChunkWriter::Done(&out_);
  if (!co_await Flush(true)) {
    c_.keep_alive = false;
    co_return 499;
  }
  co_return 200;
}

}  // namespace

net::awaitable<int> HandleGeneration(HttpConn& c, Endpoint endpoint, const HttpRequest& req) {
  OpenAiRequest r;
  if (auto e = ParseOpenAiRequest(endpoint, req.body(), &r)) {
    co_await WriteError(c, *e);
    co_return e->http_status;
  }
  ServedModel model;
  if (auto e = CheckModel(*c.gateway->pool, r.model, &model)) {
    co_await WriteError(c, *e);
    co_return e->http_status;
  }
  GenerationRun run(c, std::move(r), model.name);
  co_return co_await run.Run();
}

}  // namespace morserve::gateway
