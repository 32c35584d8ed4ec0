// The shared online-softmax pieces (engine/cpu/online_softmax.h): ExpF against std::exp in
// double over the range softmax weights use (relative error <= 3e-7, about 2 ulp), its edge
// cases, and FoldChunk folding chunks one by one against a direct softmax.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "engine/cpu/online_softmax.h"

namespace morserve {
namespace {

TEST(ExpFTest, MatchesExpOverTheSoftmaxRange) {
  double worst = 0;
  for (int i = 0; i < 2000000; ++i) {  // (-87, 0]: at -87 and below ExpF flushes to 0
    const float x = -87.0f * static_cast<float>(i) / 2000000.0f;
    const double want = std::exp(static_cast<double>(x));
    worst = std::max(worst, std::abs(ExpF(x) - want) / want);
  }
  EXPECT_LE(worst, 3e-7);
  for (float x : {0.5f, 1.0f, 10.0f, 80.0f}) {  // positive arguments stay accurate too
    EXPECT_NEAR(ExpF(x) / std::exp(static_cast<double>(x)), 1.0, 3e-7) << x;
  }
}

TEST(ExpFTest, EdgeCases) {
  EXPECT_EQ(ExpF(0.0f), 1.0f);
  EXPECT_EQ(ExpF(-std::numeric_limits<float>::infinity()), 0.0f);  // the first fold's correction
  EXPECT_EQ(ExpF(-87.5f), 0.0f);
  EXPECT_EQ(ExpF(-1000.0f), 0.0f);
  EXPECT_TRUE(std::isnan(ExpF(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_GT(ExpF(-86.9f), 0.0f);
}

TEST(FoldChunkTest, ChunkedFoldsEqualDirectSoftmax) {
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> dist(-6.0f, 6.0f);
  const int n = 53, hd = 12;
  std::vector<float> scores(n), values(static_cast<size_t>(n) * hd);
  for (float& s : scores) s = dist(rng);
  for (float& v : values) v = dist(rng);
  std::vector<const float*> rows(n);
  for (int j = 0; j < n; ++j) rows[j] = &values[static_cast<size_t>(j) * hd];
  std::vector<float> acc(hd, 0.0f), out(hd);
  SoftmaxState st;
  st.acc = acc.data();
  for (int start = 0; start < n; start += 8) {  // chunks of 8, the last one partial
    FoldChunk(st, &scores[start], &rows[start], std::min(8, n - start), hd);
  }
  NormaliseState(st, hd, out.data());
  double m = -1e300, sum = 0;
  for (float s : scores) m = std::max(m, static_cast<double>(s));
  for (float s : scores) sum += std::exp(s - m);
  for (int d = 0; d < hd; ++d) {
    double want = 0;
    for (int j = 0; j < n; ++j) want += std::exp(scores[j] - m) / sum * values[static_cast<size_t>(j) * hd + d];
    EXPECT_NEAR(out[d], want, 1e-5) << d;
  }
}

}  // namespace
}  // namespace morserve
