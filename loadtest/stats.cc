// Percentiles and summaries (see stats.h).
#include "loadtest/stats.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace morserve::loadtest {

namespace {

// The percentile of an already sorted, non-empty sample.
double SortedPercentile(const std::vector<double>& values, double q) {
  q = std::clamp(q, 0.0, 100.0);
  // Rank on [0, n-1]; the value between the two neighbouring order statistics.
  const double rank = q / 100.0 * static_cast<double>(values.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(rank));
  const size_t hi = std::min(lo + 1, values.size() - 1);
  const double frac = rank - static_cast<double>(lo);
  return values[lo] + (values[hi] - values[lo]) * frac;
}

}  // namespace

double Percentile(std::vector<double> values, double q) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  return SortedPercentile(values, q);
}

std::vector<double> Quantiles(std::vector<double> values, int points) {
  std::vector<double> out;
  if (values.empty() || points < 2) return out;
  std::sort(values.begin(), values.end());
  for (int i = 0; i < points; ++i)
    out.push_back(SortedPercentile(values, 100.0 * i / (points - 1)));
  return out;
}

Summary Summarize(const std::vector<double>& values) {
  Summary s;
  s.count = static_cast<int>(values.size());
  if (values.empty()) return s;
  s.mean = std::accumulate(values.begin(), values.end(), 0.0) / values.size();
  std::vector<double> sorted = values;
  std::sort(sorted.begin(), sorted.end());
  s.median = SortedPercentile(sorted, 50);
  s.p90 = SortedPercentile(sorted, 90);
  s.p99 = SortedPercentile(sorted, 99);
  s.max = sorted.back();
  return s;
}

nlohmann::json ToJson(const Summary& s) {
  return {{"count", s.count}, {"mean", s.mean}, {"median", s.median},
          {"p90", s.p90},     {"p99", s.p99},   {"max", s.max}};
}

}  // namespace morserve::loadtest
