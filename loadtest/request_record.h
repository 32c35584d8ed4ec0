// What the load tester saw of one request. Times are seconds on the steady clock relative
// to the run's start; chunk times relative to the request's own send time. A "chunk" is one
// stream message that carried output tokens (a gRPC GenerateResponse, an SSE event): the
// first gives TTFT, the gaps between them give the inter-token latencies.
#pragma once

#include <string>
#include <vector>

namespace morserve::loadtest {

struct RequestRecord {
  int index = 0;
  bool warmup = false;
  double send_s = 0;              // when the request went out
  double end_s = 0;               // when its stream ended (or failed)
  std::vector<double> chunk_s;    // arrival of each token-carrying chunk, since send_s
  std::vector<int> chunk_tokens;  // tokens in each chunk (1 per SSE event)
  int prompt_tokens = 0;          // sent (token ids), or the server's usage for text
  int measured_tokens = 0;        // sum of chunk_tokens
  int usage_prompt_tokens = -1;   // from the server's usage; -1 when it sent none
  int usage_completion_tokens = -1;
  int usage_cached_tokens = -1;  // prompt tokens the server's prefix cache had; -1: not reported
  int conversation = -1, turn = -1;  // the chat workload: which conversation and turn (0-based)
  std::string output_text;           // SendOptions::collect_text: the text that streamed back
  bool ok = false;
  std::string failure;        // reason when !ok (a gRPC code name, "http_503", ...)
  std::string finish_reason;  // "length", "stop", ...

  // Output tokens for the metrics: the server's usage when it gave one, else what arrived.
  int output_tokens() const {
    return usage_completion_tokens >= 0 ? usage_completion_tokens : measured_tokens;
  }
  double latency_s() const { return end_s - send_s; }
};

}  // namespace morserve::loadtest
