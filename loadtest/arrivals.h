// Request arrival times: a renewal process whose gaps are gamma distributed with shape
// `burstiness` and mean 1/rate (vLLM's benchmark_serving convention). burstiness 1 is a
// Poisson process (exponential gaps, coefficient of variation 1); below 1 traffic is
// burstier (CV = 1/sqrt(burstiness)), above 1 more regular. An infinite rate sends every
// request at once (gaps of 0). Seeded, so a run's schedule is reproducible.
#pragma once

#include <cstdint>
#include <random>

#include "absl/status/statusor.h"

namespace morserve::loadtest {

class ArrivalProcess {
 public:
  // rate in requests/s (> 0, may be +inf); burstiness > 0.
  static absl::StatusOr<ArrivalProcess> Create(double rate, double burstiness, uint64_t seed);
  double NextGapSeconds();
  bool unbounded() const { return unbounded_; }

 private:
  ArrivalProcess(double rate, double burstiness, uint64_t seed);
  bool unbounded_;
  std::mt19937_64 rng_;
  std::gamma_distribution<double> gap_;
};

}  // namespace morserve::loadtest
