// A server under test. Send() starts one streaming request and returns at once; `done` runs
// exactly once, on a transport thread, with the filled record. CancelAll() ends the streams
// still open (their records fail with reason "cancelled"). Implementations: GrpcTarget
// (morserve's Generate) and HttpTarget (any OpenAI-compatible /v1/completions or
// /v1/chat/completions endpoint).
#pragma once

#include <chrono>
#include <functional>
#include <string>

#include "loadtest/request_record.h"
#include "loadtest/workload.h"

namespace morserve::loadtest {

using Clock = std::chrono::steady_clock;

struct SendOptions {
  bool ignore_eos = true;
  double temperature = 0;
  int timeout_s = 600;  // per request
  // HTTP: ask for logprobs (top N, 0 = the sampled token only) so that every chunk lists its
  // tokens; -1: not asked (vLLM's benchmark default; one token counted per text chunk).
  int logprobs = -1;
  // HTTP: reuse connections (keep-alive pool); false: Connection: close, one per request.
  bool keep_alive = true;
  // Keep each request's output text in RequestRecord::output_text (the chat workload sends
  // the replies back in the next turn).
  bool collect_text = false;
};

class Target {
 public:
  using Done = std::function<void(RequestRecord)>;
  virtual ~Target() = default;
  // `record` has index, warmup and prompt_tokens set; the target fills the rest. `epoch` is
  // the run's start for send_s / end_s.
  virtual void Send(const RequestSpec& spec, RequestRecord record, Clock::time_point epoch,
                    Done done) = 0;
  virtual void CancelAll() = 0;
  virtual std::string Describe() const = 0;
};

inline double SecondsSince(Clock::time_point t0, Clock::time_point t) {
  return std::chrono::duration<double>(t - t0).count();
}

}  // namespace morserve::loadtest
