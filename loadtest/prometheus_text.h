// The Prometheus text exposition format, as much as a scraper of morserve's /metrics needs:
// one sample per line "name{label="v",...} value [timestamp]"; comments and blank lines
// skipped. Series are keyed by their full text before the value (name plus labels as
// written), so `Get("morserve_rows_per_loop_total{loop=\"2\"}")` finds one sample.
#pragma once

#include <map>
#include <optional>
#include <string>

namespace morserve::loadtest {

class PrometheusSample {
 public:
  static PrometheusSample Parse(const std::string& text);
  std::optional<double> Get(const std::string& series) const;
  // Sum over every series whose name (before '{') is `name`.
  std::optional<double> Sum(const std::string& name) const;
  // Values of `name{label="X"}` by X.
  std::map<std::string, double> ByLabel(const std::string& name, const std::string& label) const;
  size_t size() const { return values_.size(); }

 private:
  std::map<std::string, double> values_;
};

}  // namespace morserve::loadtest
