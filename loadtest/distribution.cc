// Length distributions (see distribution.h).
#include "loadtest/distribution.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace morserve::loadtest {

absl::StatusOr<LengthDistribution> LengthDistribution::Parse(const std::string& text) {
  std::vector<std::string> parts = absl::StrSplit(text, ':');
  const auto bad = [&](const std::string& why) {
    return absl::InvalidArgumentError(
        absl::StrCat("length distribution '", text, "': ", why,
                     " (use N, fixed:N, uniform:LO:HI or normal:MEAN:STD)"));
  };
  if (parts.size() == 1) parts.insert(parts.begin(), "fixed");
  std::vector<double> v;
  for (size_t i = 1; i < parts.size(); ++i) {
    double x;
    if (!absl::SimpleAtod(parts[i], &x) || !std::isfinite(x)) return bad("not a number");
    v.push_back(x);
  }
  LengthDistribution d;
  if (parts[0] == "fixed" && v.size() == 1) {
    if (v[0] < 1) return bad("must be >= 1");
    d.kind_ = Kind::kFixed;
    d.a_ = v[0];
  } else if (parts[0] == "uniform" && v.size() == 2) {
    if (v[0] < 1 || v[1] < v[0]) return bad("needs 1 <= LO <= HI");
    d.kind_ = Kind::kUniform;
    d.a_ = v[0];
    d.b_ = v[1];
  } else if (parts[0] == "normal" && v.size() == 2) {
    if (v[0] < 1 || v[1] < 0) return bad("needs MEAN >= 1 and STD >= 0");
    d.kind_ = Kind::kNormal;
    d.a_ = v[0];
    d.b_ = v[1];
  } else {
    return bad("unknown form");
  }
  return d;
}

LengthDistribution LengthDistribution::Fixed(int n) {
  LengthDistribution d;
  d.a_ = n;
  return d;
}

LengthDistribution LengthDistribution::Uniform(int lo, int hi) {
  LengthDistribution d;
  d.kind_ = Kind::kUniform;
  d.a_ = lo;
  d.b_ = hi;
  return d;
}

LengthDistribution LengthDistribution::Normal(double mean, double stddev) {
  LengthDistribution d;
  d.kind_ = Kind::kNormal;
  d.a_ = mean;
  d.b_ = stddev;
  return d;
}

int LengthDistribution::Sample(std::mt19937_64& rng, int cap) const {
  double x = a_;
  if (kind_ == Kind::kUniform) {
    x = std::uniform_int_distribution<int>(static_cast<int>(a_), static_cast<int>(b_))(rng);
  } else if (kind_ == Kind::kNormal) {
    x = std::round(std::normal_distribution<double>(a_, b_)(rng));
  }
  return std::clamp(static_cast<int>(x), 1, std::max(cap, 1));
}

std::string LengthDistribution::Describe() const {
  switch (kind_) {
    case Kind::kFixed:
      return absl::StrCat("fixed:", a_);
    case Kind::kUniform:
      return absl::StrCat("uniform:", a_, ":", b_);
    case Kind::kNormal:
      return absl::StrCat("normal:", a_, ":", b_);
  }
  return "";
}

}  // namespace morserve::loadtest
