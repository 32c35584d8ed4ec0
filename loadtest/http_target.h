// Any OpenAI-compatible HTTP server as a load-test target: streamed POSTs to
// /v1/completions (token-id or text prompts) or /v1/chat/completions (text prompts as one
// user message, or the chat workload's messages) with stream_options.include_usage and vLLM's
// ignore_eos, over Boost.Beast's async HTTP/1.1 client on one I/O thread. Connections are kept
// alive and reused through a pool (http_connection_pool.h), as aiohttp (vLLM's benchmark_serving),
// k6 and wrk do; with SendOptions::keep_alive false every request sends Connection: close on a new
// connection. Each SSE event with output is a chunk: with --logprobs its token count is the length
// of its logprobs list (exact), otherwise one token per event with text (or a content event
// before the finish), as vLLM's benchmark counts; the usage chunk gives the server's counts.
// A server that sends no event for tokens without text (morserve-gateway on a model without
// a tokenizer) needs --logprobs for per-token timing.
#pragma once

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <memory>
#include <string>
#include <thread>

#include "loadtest/target.h"
#include "loadtest/url.h"
#include "nlohmann/json.hpp"

namespace morserve::loadtest {

class HttpTarget : public Target {
 public:
  // At most `max_idle_connections` idle connections are kept (0: no bound).
  HttpTarget(Url url, std::string model, std::string api_key, SendOptions options,
             int max_idle_connections = 0);
  ~HttpTarget() override;  // cancels open requests and joins the I/O thread

  void Send(const RequestSpec& spec, RequestRecord record, Clock::time_point epoch,
            Done done) override;
  void CancelAll() override;
  std::string Describe() const override;
  bool chat() const { return chat_; }
  // The pool's counters: {"keep_alive", "dialled", "reused", "retried", "dropped_closed_idle"}.
  nlohmann::json ConnectionStats() const;

  // The request body for `spec` (public for the unit test).
  std::string Body(const RequestSpec& spec) const;

  struct Shared;  // the open calls (http_target.cc)

 private:
  Url url_;
  std::string model_, api_key_;
  SendOptions options_;
  bool chat_;
  boost::asio::io_context io_;
  boost::asio::executor_work_guard<boost::asio::io_context::executor_type> work_;
  std::shared_ptr<Shared> shared_;
  std::thread thread_;
};

// Applies one SSE event's data to the record (public for the unit test): "[DONE]" sets
// *done; a JSON chunk adds a token chunk, a finish reason, usage (with
// prompt_tokens_details.cached_tokens) or an error; with collect_text its text is appended to
// record->output_text.
void ApplyOpenAiEvent(const std::string& data, bool chat, double t_since_send,
                      RequestRecord* record, bool* done, bool collect_text = false);

}  // namespace morserve::loadtest
