// Drives the multi-turn chat workload (chat_workload.h): conversations start on the arrival
// schedule (--request-rate is conversations per second, Poisson or gamma gaps as for other
// workloads); within a conversation turn k+1 is sent as soon as turn k has finished, with
// turn k's reply in its messages. A failed turn ends its conversation (its later turns are
// not sent). --max-concurrency bounds the requests in flight (a conversation has at most
// one). The first RunOptions::warmup conversations run first, to the end, at once, and are
// excluded; at --duration requests still open are cancelled (failure "cut_at_duration") and
// no more turns or conversations start. Records carry conversation and turn.
#pragma once

#include <functional>

#include "absl/status/statusor.h"
#include "loadtest/chat_workload.h"
#include "loadtest/runner.h"
#include "loadtest/target.h"

namespace morserve::loadtest {

// The target must collect output text (SendOptions::collect_text). RunResult::not_sent counts
// the measured turns never sent (after a failure or the deadline).
absl::StatusOr<RunResult> RunChat(
    Target& target, const ChatWorkload& workload, const RunOptions& options,
    const std::function<void(Clock::time_point)>& on_measured_start = {});

}  // namespace morserve::loadtest
