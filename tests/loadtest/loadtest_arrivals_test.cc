// The arrival process with a fixed seed: the gaps of a Poisson process at rate R have mean
// 1/R and coefficient of variation 1 and pass a Kolmogorov-Smirnov test against the
// exponential law at the 1% level; gamma gaps with burstiness B keep the mean and have CV
// 1/sqrt(B); an infinite rate sends everything at once; bad parameters are errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "loadtest/arrivals.h"

namespace morserve::loadtest {
namespace {

std::vector<double> Gaps(double rate, double burstiness, int n, uint64_t seed = 7) {
  auto a = ArrivalProcess::Create(rate, burstiness, seed);
  EXPECT_TRUE(a.ok());
  std::vector<double> g(n);
  for (double& x : g) x = a->NextGapSeconds();
  return g;
}

double Mean(const std::vector<double>& v) {
  return std::accumulate(v.begin(), v.end(), 0.0) / v.size();
}

double Cv(const std::vector<double>& v) {
  const double m = Mean(v);
  double ss = 0;
  for (double x : v) ss += (x - m) * (x - m);
  return std::sqrt(ss / (v.size() - 1)) / m;
}

TEST(Arrivals, PoissonMeanCvAndKolmogorovSmirnov) {
  const double rate = 40;
  const int n = 20000;
  std::vector<double> g = Gaps(rate, 1.0, n);
  // Standard error of the mean is (1/R)/sqrt(n) = 0.7%: 3% is > 4 sigma.
  EXPECT_NEAR(Mean(g) * rate, 1.0, 0.03);
  EXPECT_NEAR(Cv(g), 1.0, 0.04);
  std::sort(g.begin(), g.end());
  double d = 0;
  for (int i = 0; i < n; ++i) {
    const double cdf = 1 - std::exp(-rate * g[i]);
    d = std::max({d, cdf - static_cast<double>(i) / n, static_cast<double>(i + 1) / n - cdf});
  }
  EXPECT_LT(d, 1.63 / std::sqrt(n)) << "KS statistic";  // 1% critical value
  // The arrival times themselves: 20000 gaps at 40/s span about 500 s.
  const double span = std::accumulate(g.begin(), g.end(), 0.0);
  EXPECT_NEAR(n / span, rate, rate * 0.03);
}

TEST(Arrivals, GammaBurstinessChangesCvNotRate) {
  for (double b : {0.25, 4.0}) {
    const std::vector<double> g = Gaps(10, b, 40000);
    EXPECT_NEAR(Mean(g) * 10, 1.0, 0.04) << "burstiness " << b;
    EXPECT_NEAR(Cv(g), 1 / std::sqrt(b), 0.06 / std::sqrt(b)) << "burstiness " << b;
  }
}

TEST(Arrivals, SameSeedSameSchedule) {
  EXPECT_EQ(Gaps(5, 1, 100, 3), Gaps(5, 1, 100, 3));
  EXPECT_NE(Gaps(5, 1, 100, 3), Gaps(5, 1, 100, 4));
}

TEST(Arrivals, InfiniteRateIsAllAtOnce) {
  for (double x : Gaps(INFINITY, 1, 10)) EXPECT_EQ(x, 0);
}

TEST(Arrivals, BadParameters) {
  EXPECT_FALSE(ArrivalProcess::Create(0, 1, 0).ok());
  EXPECT_FALSE(ArrivalProcess::Create(-3, 1, 0).ok());
  EXPECT_FALSE(ArrivalProcess::Create(NAN, 1, 0).ok());
  EXPECT_FALSE(ArrivalProcess::Create(1, 0, 0).ok());
  EXPECT_FALSE(ArrivalProcess::Create(1, INFINITY, 0).ok());
}

}  // namespace
}  // namespace morserve::loadtest
