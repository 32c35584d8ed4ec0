// CpuLinear against a double-precision GEMM, plus bitwise batch invariance and thread-count
// independence for every weight format. Tolerance: |y - ref| <= tol * sum_k |x_k w_k| per
// element against the weights as the format stores them (decoded), tol 1e-5 (fp32 sums).
#include "engine/cpu/cpu_linear.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "tests/random_values.h"

namespace morserve {
namespace {

using testing::UniformRandom;

// The weights a format stores, decoded: the values the kernels multiply.
std::vector<float> Decoded(const CpuLinear& lin) {
  std::vector<float> w(static_cast<size_t>(lin.n()) * lin.k());
  for (int j = 0; j < lin.n(); ++j)
    lin.weights().DecodeRow(j, &w[static_cast<size_t>(j) * lin.k()]);
  return w;
}

// Checks y (or y - y0 when given) against x · W^T in double.
void ExpectClose(const std::vector<float>& x, const std::vector<float>& w,
                 const std::vector<float>& y, int m, int n, int k, double tol,
                 const std::vector<float>* y0 = nullptr) {
  double worst = 0;
  for (int i = 0; i < m; ++i) {
    for (int j = 0; j < n; ++j) {
      double acc = y0 ? (*y0)[static_cast<size_t>(i) * n + j] : 0.0, mag = 0;
      for (int p = 0; p < k; ++p) {
        const double t = static_cast<double>(x[static_cast<size_t>(i) * k + p]) *
                         w[static_cast<size_t>(j) * k + p];
        acc += t;
        mag += std::fabs(t);
      }
      const double err = std::fabs(y[static_cast<size_t>(i) * n + j] - acc) / (mag + 1e-30);
      worst = std::max(worst, err);
    }
  }
  EXPECT_LT(worst, tol) << "m=" << m << " n=" << n << " k=" << k;
}

class CpuLinearTest : public ::testing::TestWithParam<WeightFormat> {};

TEST_P(CpuLinearTest, MatchesDoubleGemm) {
  struct Shape {
    int m, n, k;
  };
  for (const Shape s : {Shape{5, 64, 128}, Shape{3, 1, 100}, Shape{1, 1, 1}, Shape{33, 37, 203},
                        Shape{17, 1536, 576}, Shape{40, 576, 1536}, Shape{16, 300, 17}}) {
    const auto w = UniformRandom(static_cast<size_t>(s.n) * s.k, 1);
    const auto x = UniformRandom(static_cast<size_t>(s.m) * s.k, 2);
    CpuLinear lin(w.data(), s.n, s.k, GetParam());
    std::vector<float> y(static_cast<size_t>(s.m) * s.n, NAN);
    lin.Forward(x.data(), s.m, y.data());
    ExpectClose(x, Decoded(lin), y, s.m, s.n, s.k, 1e-5);
  }
}

TEST_P(CpuLinearTest, ZeroRowsIsNoOp) {
  const auto w = UniformRandom(64 * 128, 1);
  CpuLinear lin(w.data(), 64, 128, GetParam());
  float y = 42.0f;
  lin.Forward(nullptr, 0, &y);
  lin.ForwardAccumulate(nullptr, 0, &y);
  EXPECT_EQ(y, 42.0f);
}

TEST_P(CpuLinearTest, AccumulateAddsToOutput) {
  const int m = 19, n = 96, k = 72;
  const auto w = UniformRandom(n * k, 3);
  const auto x = UniformRandom(m * k, 4);
  const auto y0 = UniformRandom(m * n, 5, 3.0f);
  CpuLinear lin(w.data(), n, k, GetParam());
  std::vector<float> y = y0;
  lin.ForwardAccumulate(x.data(), m, y.data());
  ExpectClose(x, Decoded(lin), y, m, n, k, 1e-5 + 1e-6, &y0);
}

// Row r computed inside batches of every size 1..64, at different positions, among random
// neighbours, is bitwise identical to the row computed alone.
void ExpectBatchInvariant(int n, int k, WeightFormat format, uint32_t seed, ThreadPool* pool) {
  SCOPED_TRACE("n=" + std::to_string(n) + " k=" + std::to_string(k) +
               " seed=" + std::to_string(seed));
  const int rows = 64;
  const auto w = UniformRandom(static_cast<size_t>(n) * k, seed);
  const auto x = UniformRandom(static_cast<size_t>(rows) * k, 7);
  CpuLinear lin(w.data(), n, k, format, pool);
  std::vector<float> alone(static_cast<size_t>(rows) * n);
  for (int r = 0; r < rows; ++r)
    lin.Forward(&x[static_cast<size_t>(r) * k], 1, &alone[static_cast<size_t>(r) * n]);
  int checked = 0;
  for (int batch = 1; batch <= rows; ++batch) {
    auto xb = UniformRandom(static_cast<size_t>(batch) * k, 100 + batch, 5.0f);
    std::vector<float> y(static_cast<size_t>(batch) * n);
    const int r = (batch * 7) % rows, pos = (batch * 5) % batch;
    std::memcpy(&xb[static_cast<size_t>(pos) * k], &x[static_cast<size_t>(r) * k],
                k * sizeof(float));
    lin.Forward(xb.data(), batch, y.data());
    ASSERT_EQ(0, std::memcmp(&y[static_cast<size_t>(pos) * n], &alone[static_cast<size_t>(r) * n],
                             n * sizeof(float)))
        << "row " << r << " differs in a batch of " << batch << " at position " << pos;
    ++checked;
  }
  EXPECT_EQ(checked, rows);
}

TEST_P(CpuLinearTest, BatchInvariantBitwise) {
  ThreadPool pool(3);
  ExpectBatchInvariant(320, 200, GetParam(), 6, nullptr);
  ExpectBatchInvariant(77, 129, GetParam(), 7, &pool);
}

// LoRA factor shapes (A [rank, hidden], B [out, rank]): narrow outputs and small K.
TEST_P(CpuLinearTest, BatchInvariantBitwiseLoraShapes) {
  for (const auto [n, k] : {std::pair{4, 64}, std::pair{32, 4}, std::pair{4, 96}, std::pair{8, 64},
                            std::pair{64, 8}, std::pair{2, 33}}) {
    for (uint32_t seed = 0; seed < 3; ++seed) ExpectBatchInvariant(n, k, GetParam(), seed, nullptr);
  }
}

TEST_P(CpuLinearTest, IndependentOfThreadCount) {
  const int n = 700, k = 160;
  const auto w = UniformRandom(n * k, 8);
  for (int m : {1, 3, 45}) {
    const auto x = UniformRandom(m * k, 9);
    std::vector<float> first;
    for (int threads : {1, 2, 3, 5}) {
      ThreadPool pool(threads);
      CpuLinear lin(w.data(), n, k, GetParam(), &pool);
      std::vector<float> y(static_cast<size_t>(m) * n);
      lin.Forward(x.data(), m, y.data());
      if (first.empty()) {
        first = y;
      } else {
        EXPECT_EQ(0, std::memcmp(first.data(), y.data(), y.size() * sizeof(float)))
            << threads << " threads, m=" << m;
      }
    }
  }
}

// Each call counts the bytes of W it read once, in the resident format.
TEST_P(CpuLinearTest, CountsWeightBytes) {
  const int n = 48, k = 64;
  const auto w = UniformRandom(n * k, 1);
  int64_t bytes = 0;
  CpuLinear lin(LinearWeights::FromF32(w.data(), n, k, GetParam()), nullptr, nullptr, &bytes);
  std::vector<float> x(5 * k, 1.0f), y(5 * n);
  lin.Forward(x.data(), 1, y.data());
  lin.Forward(x.data(), 5, y.data());
  EXPECT_EQ(bytes, 2 * WeightRowBytes(GetParam(), k) * n);
}

INSTANTIATE_TEST_SUITE_P(Formats, CpuLinearTest,
                         ::testing::Values(WeightFormat::kF32, WeightFormat::kBF16,
                                           WeightFormat::kF16, WeightFormat::kQ8,
                                           WeightFormat::kBF16Quads, WeightFormat::kQ8Octets),
                         [](const auto& info) {
                           std::string name(WeightFormatName(info.param));
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

}  // namespace
}  // namespace morserve
