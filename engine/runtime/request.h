// The engine's request and event types: what the edges (gRPC, HTTP, CLI) submit, after they
// parsed and validated it, and what the engine streams back. The engine pushes events into
// a per-request EventChannel and never blocks on it; handlers drain it at their own pace.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "engine/model/config.h"
#include "engine/runtime/prompt_logprobs.h"
#include "engine/runtime/sampler.h"
#include "engine/runtime/sampling_params.h"

namespace morserve {

struct GenerateRequest {
  std::string request_id;  // echoed in logs; uniqueness is the caller's concern
  std::vector<int> prompt;
  SamplingParams params;
  // Early-exit models: overrides recursion.early_exit.threshold. Ouro: overrides the exit
  // gate's cumulative threshold (docs/models.md#serving-looped-checkpoints).
  std::optional<float> exit_threshold;
  // Looped checkpoints with an exit rule (Ouro): full or adaptive depth; absent: the model's
  // default (looped.json, else full). Adaptive on a model without an exit rule is an error.
  std::optional<LoopMode> loop_mode;
  // Huginn-0125 (docs/models.md#huginn-0125): recurrences per token (1 .. the model's, which
  // the cache holds: looped.json's num_steps, else mean_recurrence; absent: all of them) and
  // the initial state's scale (absent: looped.json's, else 0, zeros; otherwise drawn from the
  // request's seed and the token's position).
  std::optional<int> num_steps;
  std::optional<float> init_scale;
  bool return_logits = false;  // tests and debugging: each TokenEvent carries the raw logits
  // Prefix caching (docs/design.md#prefix-cache): requests share cached KV only when their
  // salts are equal (empty: the default namespace), so tenants cannot probe each other.
  std::string cache_salt;
};

enum class FinishReason { kNone, kLength, kStop, kCancelled, kError };
const char* FinishReasonName(FinishReason r);  // "length", "stop", "cancelled", "error"

struct TokenEvent {
  int token = -1;
  float logprob = 0.0f;
  std::vector<TokenLogprob> top_logprobs;
  int loops = 0;              // loops of the shared block the forward that produced this token ran
  std::vector<float> logits;  // only with GenerateRequest::return_logits
};

struct Usage {
  int prompt_tokens = 0;
  int completion_tokens = 0;
  int64_t recursion_loops = 0;  // shared-block loops over all of the request's tokens
  int preemptions = 0;
  int cached_tokens = 0;  // prompt tokens whose KV came from the prefix cache (not computed)
};

// One message on a request's stream: zero or more tokens, and a final one with a reason.
struct RequestEvent {
  std::vector<TokenEvent> tokens;
  // With params.prompt_logprobs, once: on the event of the first generated token (the final
  // event when max_tokens is 0). Entry i scores prompt token i + 1; the first prompt token
  // has no context to be scored from, so a prompt of n tokens has n - 1 entries.
  std::optional<std::vector<PromptTokenLogprob>> prompt_logprobs;
  FinishReason finish = FinishReason::kNone;
  std::string stop_string;  // the stop string that matched, when finish == kStop by string
  absl::Status error;       // when finish == kError
  Usage usage;              // filled on the final event
  bool final() const { return finish != FinishReason::kNone; }
};

// Unbounded single-producer (engine) single-consumer (handler) queue of events. It grows by
// at most one token per engine step, and the engine stops producing once it finishes the
// request, so its length is bounded by max_tokens + 1.
//
// A listener (the gRPC reactor's wake-up) runs after every Push, on the pushing thread and
// outside the channel's mutex, so it may take its own locks; it must not block.
class EventChannel {
 public:
  void Push(RequestEvent e);
  // Replaces the listener (nullptr: none). Events pushed before it was set do not call it:
  // the consumer drains once after setting it.
  void SetListener(std::function<void()> listener);
  // Blocks until an event is available or `timeout_ms` passes (nullopt).
  std::optional<RequestEvent> Pop(int timeout_ms);
  std::optional<RequestEvent> TryPop();
  // Reads events until the final one; returns all of them (CLI, tests).
  std::vector<RequestEvent> DrainUntilFinal();

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<RequestEvent> events_;
  std::shared_ptr<const std::function<void()>> listener_;
};

}  // namespace morserve
