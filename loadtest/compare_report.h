// The side-by-side report of several runs (each its --out JSON with a label): a markdown
// table of throughput, latency percentiles, failures and the server's own counters, one
// column per run, plus a JSON holding the same rows. Used by `morserve-loadtest report` and
// so by loadtest/compare.
#pragma once

#include <string>
#include <vector>

#include "loadtest/plots.h"
#include "nlohmann/json.hpp"

namespace morserve::loadtest {

std::string CompareMarkdown(const std::string& title, const std::vector<LabelledRun>& runs,
                            const std::vector<std::string>& svg_names);
nlohmann::json CompareJson(const std::string& title, const std::vector<LabelledRun>& runs);

}  // namespace morserve::loadtest
