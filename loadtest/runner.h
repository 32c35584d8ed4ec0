// Drives a run: sends the warm-up requests (at once, bounded by --max-concurrency) and waits
// for them; then sends the measured ones on the arrival schedule (request rate with Poisson
// or gamma gaps), never more than --max-concurrency in flight, until all are sent or
// --duration has passed. At the deadline requests still open are cancelled and fail with
// "cut_at_duration", so every request sent is either completed or failed.
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <vector>

#include "absl/status/statusor.h"
#include "loadtest/request_record.h"
#include "loadtest/target.h"
#include "loadtest/workload.h"

namespace morserve::loadtest {

struct RunOptions {
  double request_rate = std::numeric_limits<double>::infinity();
  double burstiness = 1.0;
  uint64_t seed = 0;
  int max_concurrency = 0;  // 0: unbounded
  int warmup = 0;           // the first `warmup` specs
  double duration_s = 0;    // 0: no limit
  bool progress = false;    // a progress bar on stderr
};

struct RunResult {
  std::vector<RequestRecord> records;  // warm-up and measured, in completion order
  Clock::time_point epoch;             // the measured phase's start
  double wall_s = 0;                   // measured phase, until the last request ended
  bool hit_duration = false;           // stopped sending because --duration passed
  int not_sent = 0;                    // specs left unsent at the deadline
};

// `on_measured_start` runs right before the first measured request (e.g. to start scraping).
absl::StatusOr<RunResult> Run(Target& target, const std::vector<RequestSpec>& specs,
                              const RunOptions& options,
                              const std::function<void(Clock::time_point)>& on_measured_start = {});

}  // namespace morserve::loadtest
