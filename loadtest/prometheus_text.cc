// Prometheus text parsing (see prometheus_text.h).
#include "loadtest/prometheus_text.h"

#include <cstdlib>
#include <sstream>

namespace morserve::loadtest {

PrometheusSample PrometheusSample::Parse(const std::string& text) {
  PrometheusSample s;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    // The value follows the series; labels may hold spaces, so split after the closing '}'.
    const size_t close = line.rfind('}');
    const size_t space = line.find(' ', close == std::string::npos ? 0 : close);
    if (space == std::string::npos) continue;
    const std::string series = line.substr(0, space);
    const char* begin = line.c_str() + space + 1;
    char* end = nullptr;
    const double v = std::strtod(begin, &end);
    if (end == begin) continue;
    s.values_[series] = v;
  }
  return s;
}

std::optional<double> PrometheusSample::Get(const std::string& series) const {
  auto it = values_.find(series);
  if (it == values_.end()) return std::nullopt;
  return it->second;
}

std::optional<double> PrometheusSample::Sum(const std::string& name) const {
  std::optional<double> total;
  for (const auto& [series, v] : values_) {
    if (series == name || series.rfind(name + "{", 0) == 0) total = total.value_or(0) + v;
  }
  return total;
}

std::map<std::string, double> PrometheusSample::ByLabel(const std::string& name,
                                                        const std::string& label) const {
  std::map<std::string, double> out;
  const std::string prefix = name + "{";
  const std::string key = label + "=\"";
  for (const auto& [series, v] : values_) {
    if (series.rfind(prefix, 0) != 0) continue;
    const size_t p = series.find(key, prefix.size());
    if (p == std::string::npos) continue;
    const size_t start = p + key.size();
    const size_t stop = series.find('"', start);
    if (stop == std::string::npos) continue;
    out[series.substr(start, stop - start)] = v;
  }
  return out;
}

}  // namespace morserve::loadtest
