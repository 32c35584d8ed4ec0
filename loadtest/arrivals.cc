// Gamma-renewal arrivals (see arrivals.h).
#include "loadtest/arrivals.h"

#include <cmath>

#include "absl/strings/str_cat.h"

namespace morserve::loadtest {

absl::StatusOr<ArrivalProcess> ArrivalProcess::Create(double rate, double burstiness,
                                                      uint64_t seed) {
  if (!(rate > 0))
    return absl::InvalidArgumentError(
        absl::StrCat("--request-rate ", rate, ": must be > 0 (inf: all at once)"));
  if (!(burstiness > 0) || !std::isfinite(burstiness)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--burstiness ", burstiness, ": must be a finite number > 0"));
  }
  return ArrivalProcess(rate, burstiness, seed);
}

ArrivalProcess::ArrivalProcess(double rate, double burstiness, uint64_t seed)
    : unbounded_(std::isinf(rate)),
      rng_(seed),
      // Gamma(shape k, scale theta) has mean k*theta = 1/rate and CV 1/sqrt(k).
      gap_(burstiness, unbounded_ ? 1.0 : 1.0 / (rate * burstiness)) {}

double ArrivalProcess::NextGapSeconds() { return unbounded_ ? 0.0 : gap_(rng_); }

}  // namespace morserve::loadtest
