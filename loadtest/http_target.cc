// OpenAI-compatible HTTP target (see http_target.h).
#include "loadtest/http_target.h"

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <limits>
#include <optional>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "loadtest/http_connection_pool.h"
#include "loadtest/sse_parser.h"
#include "nlohmann/json.hpp"

namespace morserve::loadtest {

namespace beast = boost::beast;
namespace http = beast::http;
namespace asio = boost::asio;
using tcp = asio::ip::tcp;

class HttpCall;

// The open calls and the idle connections; touched only on the I/O thread.
struct HttpTarget::Shared {
  Shared(bool keep_alive, int max_idle) : pool(keep_alive, max_idle) {}
  std::set<std::shared_ptr<HttpCall>> open;
  HttpConnectionPool pool;
};

void ApplyOpenAiEvent(const std::string& data, bool chat, double t, RequestRecord* r, bool* done,
                      bool collect_text) {
  if (data == "[DONE]") {
    *done = true;
    return;
  }
  const nlohmann::json j = nlohmann::json::parse(data, nullptr, false);
  if (!j.is_object()) {
    if (r->failure.empty()) r->failure = "bad_sse_json";
    return;
  }
  if (j.contains("error")) {
    if (r->failure.empty()) r->failure = "stream_error";
    return;
  }
  if (j.contains("usage") && j["usage"].is_object()) {
    const nlohmann::json& u = j["usage"];
    if (u.contains("prompt_tokens") && u["prompt_tokens"].is_number_integer())
      r->usage_prompt_tokens = u["prompt_tokens"].get<int>();
    if (u.contains("completion_tokens") && u["completion_tokens"].is_number_integer())
      r->usage_completion_tokens = u["completion_tokens"].get<int>();
    const nlohmann::json details = u.value("prompt_tokens_details", nlohmann::json());
    if (details.is_object() && details.contains("cached_tokens") &&
        details["cached_tokens"].is_number_integer()) {
      r->usage_cached_tokens = details["cached_tokens"].get<int>();
    }
  }
  if (!j.contains("choices") || !j["choices"].is_array() || j["choices"].empty()) return;
  const nlohmann::json& c = j["choices"][0];
  const bool finishing = c.contains("finish_reason") && c["finish_reason"].is_string();
  if (finishing) r->finish_reason = c["finish_reason"].get<std::string>();
  std::string text;
  bool role_only = false;
  if (chat) {
    const nlohmann::json delta = c.value("delta", nlohmann::json::object());
    if (delta.contains("content") && delta["content"].is_string())
      text = delta["content"].get<std::string>();
    role_only = delta.contains("role") && text.empty();
  } else if (c.contains("text") && c["text"].is_string()) {
    text = c["text"].get<std::string>();
  }
  if (collect_text) r->output_text += text;
  // With logprobs requested the chunk lists its tokens: an exact count, text or not.
  int tokens = 0;
  const nlohmann::json lp = c.value("logprobs", nlohmann::json());
  if (lp.is_object()) {
    const char* key = chat ? "content" : "tokens";
    if (lp.contains(key) && lp[key].is_array()) tokens = static_cast<int>(lp[key].size());
  } else if (!text.empty() || (!finishing && !role_only)) {
    // Without logprobs: one token per chunk with output. A token may decode to no text (a
    // partial character): a content chunk before the finish still carries one.
    tokens = 1;
  }
  if (tokens > 0) {
    r->chunk_s.push_back(t);
    r->chunk_tokens.push_back(tokens);
    r->measured_tokens += tokens;
  }
}

class HttpCall : public std::enable_shared_from_this<HttpCall> {
 public:
  HttpCall(asio::io_context& io, std::shared_ptr<HttpTarget::Shared> shared, const Url& url,
           http::request<http::string_body> req, bool chat, bool collect_text, int timeout_s,
           RequestRecord record, Clock::time_point epoch, Target::Done done)
      : io_(io),
        shared_(std::move(shared)),
        url_(url),
        req_(std::move(req)),
        chat_(chat),
        collect_text_(collect_text),
        timeout_s_(timeout_s),
        resolver_(io),
        record_(std::move(record)),
        epoch_(epoch),
        done_(std::move(done)),
        sse_([this](const std::string& data) {
          ApplyOpenAiEvent(data, chat_, SecondsSince(sent_, Clock::now()), &record_, &saw_done_,
                           collect_text_);
        }) {}

  void Start() {
    shared_->open.insert(shared_from_this());
    sent_ = Clock::now();
    record_.send_s = SecondsSince(epoch_, sent_);
    deadline_ = sent_ + std::chrono::seconds(timeout_s_);
    stream_ = shared_->pool.Take();
    if (!stream_) return Dial();
    reused_ = true;
    Write();
  }

  void Cancel() {
    cancelled_ = true;
    resolver_.cancel();
    if (stream_) stream_->cancel();
  }

 private:
  void Dial() {
    reused_ = false;
    stream_ = std::make_unique<beast::tcp_stream>(io_);
    resolver_.async_resolve(
        url_.host, url_.port,
        [self = shared_from_this()](beast::error_code ec, const tcp::resolver::results_type& r) {
          self->OnResolve(ec, r);
        });
  }

  void OnResolve(beast::error_code ec, const tcp::resolver::results_type& results) {
    if (ec) return Fail("connect", ec);
    if (cancelled_) return Complete("cancelled");
    stream_->expires_at(deadline_);
    stream_->async_connect(results,
                           [self = shared_from_this()](beast::error_code ec, const tcp::endpoint&) {
                             if (ec) return self->Fail("connect", ec);
                             self->shared_->pool.CountDialled();
                             self->Write();
                           });
  }

  // The request on stream_ (new or reused), then the response header. The whole request,
  // connect to last byte, has one --timeout deadline.
  void Write() {
    stream_->expires_at(deadline_);
    buffer_.clear();
    parser_.emplace();
    parser_->body_limit(std::numeric_limits<std::uint64_t>::max());  // streams have no bound
    http::async_write(*stream_, req_, [self = shared_from_this()](beast::error_code ec, size_t) {
      if (ec) return self->FailOrRedial("write", ec);
      http::async_read_header(*self->stream_, self->buffer_, *self->parser_,
                              [self](beast::error_code ec, size_t) { self->OnHeader(ec); });
    });
  }

  // A reused connection the server closed just as it was taken fails before any response
  // byte: the request was not processed, so it is sent again once on a new connection.
  void FailOrRedial(const char* stage, beast::error_code ec) {
    const bool closed = ec == http::error::end_of_stream || ec == asio::error::eof ||
                        ec == asio::error::connection_reset || ec == asio::error::broken_pipe;
    if (reused_ && closed && !cancelled_ && !parser_->got_some()) {
      shared_->pool.CountRetried();
      shared_->pool.Give(std::move(stream_), false);
      return Dial();
    }
    Fail(stage, ec);
  }

  void OnHeader(beast::error_code ec) {
    if (ec == http::error::need_buffer) ec = {};  // body bytes came with the header
    if (ec) return FailOrRedial("read", ec);
    const int code = parser_->get().result_int();
    if (code != 200) return Complete(absl::StrCat("http_", code));
    ReadBody();
  }

  // read_some, not read: read fills the whole buffer before it returns, which would hold
  // back the chunks of a slow stream and ruin their timing.
  void ReadBody() {
    parser_->get().body().data = chunk_;
    parser_->get().body().size = sizeof chunk_;
    http::async_read_some(
        *stream_, buffer_, *parser_, [self = shared_from_this()](beast::error_code ec, size_t) {
          if (ec == http::error::need_buffer) ec = {};
          if (ec) return self->Fail("read", ec);
          const size_t got = sizeof self->chunk_ - self->parser_->get().body().size;
          self->sse_.Feed(std::string_view(self->chunk_, got));
          if (self->parser_->is_done()) return self->Complete("");
          self->ReadBody();
        });
  }

  void Fail(const char* stage, beast::error_code ec) {
    if (cancelled_) return Complete("cancelled");
    if (ec == beast::error::timeout) return Complete("timeout");
    Complete(absl::StrCat(stage, "_error (", ec.message(), ")"));
  }

  // The connection goes back to the pool only after a response read to its end (chunked
  // terminator included) that keeps it open, with no bytes beyond it.
  bool Reusable() const {
    return stream_ && parser_ && parser_->is_done() && parser_->keep_alive() &&
           buffer_.size() == 0 && !cancelled_;
  }

  void Complete(std::string failure) {
    if (completed_) return;
    completed_ = true;
    record_.end_s = SecondsSince(epoch_, Clock::now());
    if (failure.empty()) failure = record_.failure;
    if (failure.empty() && !saw_done_) failure = "no_done_event";
    if (failure.empty() && record_.finish_reason == "error") failure = "finish_error";
    record_.failure = failure;
    record_.ok = failure.empty();
    shared_->pool.Give(std::move(stream_), Reusable());
    auto self = shared_from_this();  // keeps this alive past the erase
    shared_->open.erase(self);
    done_(std::move(record_));
  }

  asio::io_context& io_;
  std::shared_ptr<HttpTarget::Shared> shared_;
  Url url_;
  http::request<http::string_body> req_;
  bool chat_, collect_text_;
  int timeout_s_;
  tcp::resolver resolver_;
  std::unique_ptr<beast::tcp_stream> stream_;
  beast::flat_buffer buffer_;
  std::optional<http::response_parser<http::buffer_body>> parser_;
  char chunk_[16384];
  RequestRecord record_;
  Clock::time_point epoch_, sent_, deadline_;
  Target::Done done_;
  SseParser sse_;
  bool saw_done_ = false, cancelled_ = false, completed_ = false, reused_ = false;
};

HttpTarget::HttpTarget(Url url, std::string model, std::string api_key, SendOptions options,
                       int max_idle_connections)
    : url_(std::move(url)),
      model_(std::move(model)),
      api_key_(std::move(api_key)),
      options_(options),
      chat_(absl::StrContains(url_.target, "chat/completions")),
      work_(asio::make_work_guard(io_)),
      shared_(std::make_shared<Shared>(options.keep_alive, max_idle_connections)),
      thread_([this] { io_.run(); }) {}

HttpTarget::~HttpTarget() {
  CancelAll();
  asio::post(io_, [shared = shared_] { shared->pool.CloseAll(); });
  work_.reset();
  thread_.join();
}

std::string HttpTarget::Describe() const {
  return absl::StrCat("http://", url_.host, ":", url_.port, url_.target);
}

std::string HttpTarget::Body(const RequestSpec& spec) const {
  nlohmann::json j = {{"model", model_},
                      {"max_tokens", spec.max_tokens},
                      {"temperature", options_.temperature},
                      {"stream", true},
                      {"stream_options", {{"include_usage", true}}},
                      {"ignore_eos", options_.ignore_eos}};
  if (options_.logprobs >= 0 && chat_) {
    j["logprobs"] = true;
    j["top_logprobs"] = options_.logprobs;
  } else if (options_.logprobs >= 0) {
    j["logprobs"] = options_.logprobs;
  }
  if (chat_ && !spec.messages.empty()) {
    j["messages"] = nlohmann::json::array();
    for (const ChatMessage& m : spec.messages) {
      j["messages"].push_back({{"role", m.role}, {"content", m.content}});
    }
  } else if (chat_) {
    j["messages"] = nlohmann::json::array({{{"role", "user"}, {"content", spec.prompt_text}}});
  } else if (spec.prompt_text.empty()) {
    j["prompt"] = spec.prompt_ids;
  } else {
    j["prompt"] = spec.prompt_text;
  }
  return j.dump();
}

void HttpTarget::Send(const RequestSpec& spec, RequestRecord record, Clock::time_point epoch,
                      Done done) {
  http::request<http::string_body> req(http::verb::post, url_.target, 11);
  req.set(http::field::host, url_.host);
  req.set(http::field::content_type, "application/json");
  req.set(http::field::accept, "text/event-stream");
  if (!api_key_.empty()) req.set(http::field::authorization, "Bearer " + api_key_);
  if (!options_.keep_alive) req.keep_alive(false);  // Connection: close
  req.body() = Body(spec);
  req.prepare_payload();
  auto call =
      std::make_shared<HttpCall>(io_, shared_, url_, std::move(req), chat_, options_.collect_text,
                                 options_.timeout_s, std::move(record), epoch, std::move(done));
  asio::post(io_, [call] { call->Start(); });
}

nlohmann::json HttpTarget::ConnectionStats() const { return shared_->pool.StatsJson(); }

void HttpTarget::CancelAll() {
  asio::post(io_, [shared = shared_] {
    for (const std::shared_ptr<HttpCall>& call : shared->open) call->Cancel();
  });
}

}  // namespace morserve::loadtest
