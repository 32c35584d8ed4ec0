// SVG plots of one or more runs, drawn by gnuplot (Debian's gnuplot-nox, `set terminal
// svg`): the load tester writes plain data files and a gnuplot script next to the SVGs, so
// a plot can be restyled by editing the script. Each run is its --out JSON (label, report).
//   latency_cdf.svg     CDFs of TTFT, TPOT, ITL and E2E (one line per run)
//   throughput.svg      output tokens/s and completed requests/s over time
//   server_metrics.svg  scraped from /metrics: batch fill ratio, rows per loop per step, KV
//                       usage over time (only when some run has server metrics)
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace morserve::loadtest {

using LabelledRun = std::pair<std::string, nlohmann::json>;

// The SVG paths written; an error when gnuplot is missing or fails (the data stays).
absl::StatusOr<std::vector<std::string>> WritePlots(const std::string& dir,
                                                    const std::vector<LabelledRun>& runs);

}  // namespace morserve::loadtest
