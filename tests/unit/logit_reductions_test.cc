// The sampler's full-vocabulary reductions (engine/cpu/logit_reductions.h): every set the
// host runs equals the scalar set bit for bit (rows of every length 1..70 and vocabulary
// sizes, -inf and NaN entries, ties); the scalar set follows the contract as written (max and
// argmax against a sequential scan, sum_exp against a hand-written lane sum of expf); expf
// stays within 2 float ulps of exp; log-sum-exp within 3e-7 of a long double sum.
#include "engine/cpu/logit_reductions.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "engine/cpu/logit_reductions_expf.h"
#include "engine/runtime/sampler.h"

namespace morserve {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

std::vector<const LogitReductionSet*> AllSets() {
  std::vector<const LogitReductionSet*> sets{&ScalarLogitReductions()};
  if (Avx2LogitReductions() != nullptr) sets.push_back(Avx2LogitReductions());
  return sets;
}

// A row of logits in [-30, 30) with some ties, -inf entries and (if asked) NaN entries.
std::vector<float> Row(int64_t n, std::mt19937* rng, bool with_nan) {
  std::uniform_real_distribution<float> u(-30.0f, 30.0f);
  std::vector<float> x(n);
  for (float& v : x) v = u(*rng);
  std::uniform_int_distribution<int64_t> at(0, n - 1);
  if (n > 3) {
    x[at(*rng)] = -kInf;
    const int64_t a = at(*rng), b = at(*rng);
    x[b] = x[a] = 31.0f;  // a tie for the largest
  }
  if (with_nan && n > 2) x[at(*rng)] = kNaN;
  return x;
}

uint64_t Bits(double v) {
  uint64_t b;
  std::memcpy(&b, &v, sizeof(b));
  return b;
}

int64_t SequentialArgmax(const std::vector<float>& x) {
  int64_t best = 0;
  for (int64_t i = 1; i < static_cast<int64_t>(x.size()); ++i) {
    if (x[i] > x[best]) best = i;
  }
  return best;
}

std::vector<int64_t> Lengths() {
  std::vector<int64_t> n;
  for (int64_t i = 1; i <= 70; ++i) n.push_back(i);
  for (int64_t v : {255, 4097, 32000, 49152, 151936}) n.push_back(v);
  return n;
}

TEST(LogitReductionsTest, EverySetEqualsTheScalarSetBitForBit) {
  std::mt19937 rng(7);
  const LogitReductionSet& ref = ScalarLogitReductions();
  for (const LogitReductionSet* set : AllSets()) {
    for (int64_t n : Lengths()) {
      for (bool nan : {false, true}) {
        const std::vector<float> x = Row(n, &rng, nan);
        SCOPED_TRACE(std::string(set->name) + " n=" + std::to_string(n) + (nan ? " with NaN" : ""));
        const float m = ref.max(x.data(), n);
        EXPECT_EQ(Bits(set->max(x.data(), n)), Bits(m));
        EXPECT_EQ(Argmax(*set, x.data(), n), Argmax(ref, x.data(), n));
        EXPECT_EQ(set->find(x.data(), n, x[n / 2]), ref.find(x.data(), n, x[n / 2]));
        EXPECT_EQ(set->find(x.data(), n, 1e30f), n);
        EXPECT_EQ(Bits(set->sum_exp(x.data(), n, m)), Bits(ref.sum_exp(x.data(), n, m)));
      }
    }
  }
}

TEST(LogitReductionsTest, MaxAndArgmaxFollowASequentialScan) {
  std::mt19937 rng(11);
  for (const LogitReductionSet* set : AllSets()) {
    for (int64_t n : Lengths()) {
      for (bool nan : {false, true}) {
        const std::vector<float> x = Row(n, &rng, nan);
        SCOPED_TRACE(std::string(set->name) + " n=" + std::to_string(n));
        float m = -kInf;
        for (float v : x) m = std::max(m, v);
        EXPECT_EQ(set->max(x.data(), n), m);
        EXPECT_EQ(Argmax(*set, x.data(), n), SequentialArgmax(x));
      }
    }
    // The lowest index wins a tie; a NaN first entry is the sequential scan's answer (0); a
    // row of -inf is 0 too.
    const std::vector<float> tie{1.0f, 3.0f, -kInf, 3.0f, 2.0f, 3.0f, 0.0f, 1.0f, 3.0f, 3.0f};
    EXPECT_EQ(Argmax(*set, tie.data(), tie.size()), 1);
    const std::vector<float> nan_first{kNaN, 5.0f, 7.0f};
    EXPECT_EQ(Argmax(*set, nan_first.data(), nan_first.size()), 0);
    const std::vector<float> nan_later{1.0f, kNaN, 7.0f, kNaN, 7.0f};
    EXPECT_EQ(Argmax(*set, nan_later.data(), nan_later.size()), 2);
    const std::vector<float> all_neg_inf(13, -kInf);
    EXPECT_EQ(Argmax(*set, all_neg_inf.data(), all_neg_inf.size()), 0);
    EXPECT_EQ(set->max(all_neg_inf.data(), all_neg_inf.size()), -kInf);
  }
}

TEST(LogitReductionsTest, SumExpIsTheLaneSumOfExpf) {
  std::mt19937 rng(13);
  for (int64_t n : {1, 7, 8, 9, 100, 49152}) {
    const std::vector<float> x = Row(n, &rng, false);
    const float m = ScalarLogitReductions().max(x.data(), n);
    double lane[8] = {};
    for (int64_t i = 0; i < n; ++i) lane[i % 8] += static_cast<double>(expf_l8::Exp(x[i] - m));
    const double want = ((lane[0] + lane[4]) + (lane[2] + lane[6])) + ((lane[1] + lane[5]) + (lane[3] + lane[7]));
    for (const LogitReductionSet* set : AllSets()) {
      EXPECT_EQ(Bits(set->sum_exp(x.data(), n, m)), Bits(want)) << set->name << " n=" << n;
    }
  }
}

TEST(LogitReductionsTest, ExpfIsWithinTwoUlpsAndZeroBelowItsRange) {
  float worst = 0.0f;
  for (float d = -87.0f; d <= 0.0f; d += 0.000731f) {
    const double exact = std::exp(static_cast<double>(d));
    const float got = expf_l8::Exp(d);
    const float ulp = std::nextafter(static_cast<float>(exact), kInf) - static_cast<float>(exact);
    worst = std::max(worst, static_cast<float>(std::fabs(got - exact) / ulp));
  }
  EXPECT_LE(worst, 2.0f);
  EXPECT_EQ(expf_l8::Exp(0.0f), 1.0f);
  EXPECT_EQ(expf_l8::Exp(-88.0f), 0.0f);
  EXPECT_EQ(expf_l8::Exp(-kInf), 0.0f);
  EXPECT_EQ(expf_l8::Exp(kNaN), 0.0f);
}

TEST(LogitReductionsTest, NaNMakesSumExpNaNInEverySet) {
  std::mt19937 rng(17);
  for (const LogitReductionSet* set : AllSets()) {
    for (int64_t n : {3, 8, 17, 49152}) {
      const std::vector<float> x = Row(n, &rng, true);
      const float m = set->max(x.data(), n);
      EXPECT_TRUE(std::isnan(set->sum_exp(x.data(), n, m))) << set->name << " n=" << n;
    }
  }
}

TEST(LogitReductionsTest, LogSumExpMatchesALongDoubleSum) {
  std::mt19937 rng(19);
  for (int64_t n : {1, 5, 64, 49152, 151936}) {
    const std::vector<float> x = Row(n, &rng, false);
    long double m = -kInf, sum = 0;
    for (float v : x) m = std::max<long double>(m, v);
    for (float v : x) sum += std::exp(static_cast<long double>(v) - m);
    const double want = static_cast<double>(m + std::log(sum));
    // expf is within 2 ulps (2.4e-7 relative) of each term, so the sum's log is within
    // about 2.4e-7 absolute; the double lane sums add nothing visible at these sizes.
    EXPECT_NEAR(LogSumExp(x), want, 3e-7 * std::max(1.0, std::fabs(want))) << "n=" << n;
  }
}

}  // namespace
}  // namespace morserve
