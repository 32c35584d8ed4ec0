// Integer length distributions for prompts and outputs, parsed from the command line:
// "N" or "fixed:N", "uniform:LO:HI" (inclusive), "normal:MEAN:STD" (rounded). Every sample
// is clamped to [1, cap] so a request is always valid.
#pragma once

#include <random>
#include <string>

#include "absl/status/statusor.h"

namespace morserve::loadtest {

class LengthDistribution {
 public:
  enum class Kind { kFixed, kUniform, kNormal };
  static absl::StatusOr<LengthDistribution> Parse(const std::string& text);
  static LengthDistribution Fixed(int n);
  static LengthDistribution Uniform(int lo, int hi);  // lo <= hi
  static LengthDistribution Normal(double mean, double stddev);

  int Sample(std::mt19937_64& rng, int cap) const;
  std::string Describe() const;
  Kind kind() const { return kind_; }

 private:
  Kind kind_ = Kind::kFixed;
  double a_ = 1, b_ = 0;  // fixed: a; uniform: [a, b]; normal: mean a, std b
};

}  // namespace morserve::loadtest
