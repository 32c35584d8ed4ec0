// Command-line flags for the morserve subcommands: `--name value`, `--name=value` and
// boolean switches; unknown flags and malformed numbers are errors that name the flag.
#pragma once

#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace morserve {

class Flags {
 public:
  static absl::StatusOr<Flags> Parse(const std::vector<std::string>& args,
                                     const std::set<std::string>& value_flags,
                                     const std::set<std::string>& switches);
  bool Has(const std::string& name) const { return values_.count(name) > 0; }
  std::string Get(const std::string& name, const std::string& fallback = "") const;
  absl::StatusOr<int> GetInt(const std::string& name, int fallback) const;
  absl::StatusOr<double> GetDouble(const std::string& name, double fallback) const;
  // Comma-separated values ("a,b,c"); empty when absent.
  std::vector<std::string> GetList(const std::string& name) const;

 private:
  std::map<std::string, std::string> values_;  // switches map to "1"
};

}  // namespace morserve
