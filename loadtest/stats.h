// Order statistics for the report: mean, median, p90, p99 and max of a sample. Percentiles
// interpolate linearly between closest ranks (numpy's default, "linear"), as vLLM's
// benchmark_serving reports them, so numbers are comparable with that tool.
#pragma once

#include <vector>

#include "nlohmann/json.hpp"

namespace morserve::loadtest {

// The q-th percentile (0..100) of `values` (any order); 0 for an empty sample.
double Percentile(std::vector<double> values, double q);

// `points` evenly spaced percentiles from 0 to 100 (for CDF plots); one sort.
std::vector<double> Quantiles(std::vector<double> values, int points);

struct Summary {
  int count = 0;
  double mean = 0, median = 0, p90 = 0, p99 = 0, max = 0;
};
Summary Summarize(const std::vector<double>& values);
nlohmann::json ToJson(const Summary& s);

}  // namespace morserve::loadtest
