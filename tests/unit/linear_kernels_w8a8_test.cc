// The w8a8 linear kernel sets (engine/cpu/linear_kernels_w8a8.cc): the layout holds int8's
// values, the scalar set computes the arithmetic linear_kernels_w8a8.cc states (written out again
// here from the definition, bit for bit), the error against the exact product of the int8
// weights stays inside the activation quantization's bound, the VNNI and AVX2 sets give the
// scalar set's bits for odd shapes and m 1..64, a row's bits do not change with its batch or the
// thread count on either, and CpuLinear routes the format. Each vector set's cases run where the
// host has its instructions.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "engine/cpu/cpu_linear.h"
#include "engine/cpu/linear_kernels.h"
#include "engine/cpu/linear_weights.h"
#include "engine/model/dtype.h"
#include "tests/linear_kernel_run.h"
#include "tests/random_values.h"

namespace morserve {
namespace {

using testing::Bits;
using testing::UniformRandom;

constexpr int kGroup = LinearWeights::kQ8Group;

struct Shape {
  int n, k;
};
constexpr Shape kShapes[] = {{1, 1}, {13, 7}, {16, 32}, {37, 45}, {130, 203}, {29, 1000}};

// The definition in linear_kernels_w8a8.cc, one element at a time.
float Expected(const float* x, const std::vector<float>& wf, int j, int k, float y0,
               bool accumulate) {
  const int kq = (k + kGroup - 1) / kGroup * kGroup;
  std::vector<int8_t> wq(kq);
  std::vector<uint16_t> dw(kq / kGroup);
  QuantizeRowQ8(&wf[static_cast<size_t>(j) * k], k, wq.data(), dw.data());
  float acc = 0.0f;
  for (int g = 0; g < kq / kGroup; ++g) {
    float amax = 0.0f;
    for (int p = g * kGroup; p < std::min(k, (g + 1) * kGroup); ++p)
      amax = std::max(amax, std::fabs(x[p]));
    const float dx = amax / 127.0f;
    int64_t dot = 0;
    for (int p = g * kGroup; p < std::min(k, (g + 1) * kGroup); ++p) {
      const int xq = dx > 0.0f ? static_cast<int>(std::nearbyint(x[p] / dx)) : 0;
      dot += static_cast<int64_t>(std::clamp(xq, -127, 127)) * wq[p];
    }
    const float t = F16ToF32(dw[g]) * dx;
    acc = std::fma(static_cast<float>(dot), t, acc);
  }
  return accumulate ? y0 + acc : acc;
}

std::vector<float> RunSet(const LinearKernelSet& set, const LinearWeights& w,
                          const std::vector<float>& x, int m, bool accumulate,
                          const std::vector<float>& y0, int n0, int n1) {
  return testing::RunLinearKernelSet(set, w, x, m, y0, accumulate, n0, n1);
}

// The vector sets this host runs.
std::vector<const LinearKernelSet*> VectorSets() {
  std::vector<const LinearKernelSet*> out;
  for (const LinearKernelSet* s : {W8A8VnniLinearKernels(), W8A8Avx2LinearKernels()})
    if (s != nullptr) out.push_back(s);
  return out;
}

#define SKIP_WITHOUT_VECTOR_SETS() \
  if (VectorSets().empty()) GTEST_SKIP() << "neither AVX-512 VNNI nor AVX2 on this host"

TEST(W8A8LinearKernelsTest, LayoutHoldsTheInt8Values) {
  for (const Shape s : kShapes) {
    const auto wf = UniformRandom(static_cast<size_t>(s.n) * s.k, 5 + s.k);
    const LinearWeights w = LinearWeights::FromF32(wf.data(), s.n, s.k, WeightFormat::kW8A8);
    const LinearWeights q8 = LinearWeights::FromF32(wf.data(), s.n, s.k, WeightFormat::kQ8);
    const int np = (s.n + 15) / 16 * 16, kq = (s.k + kGroup - 1) / kGroup * kGroup;
    EXPECT_EQ(w.owned_bytes(), static_cast<int64_t>(np) * kq + np * (kq / kGroup) * 2);
    EXPECT_EQ(w.bytes(), q8.bytes());
    std::vector<float> got(s.k), want(s.k);
    for (int j = 0; j < s.n; ++j) {
      w.DecodeRow(j, got.data());
      q8.DecodeRow(j, want.data());
      ASSERT_EQ(Bits(got.data(), s.k), Bits(want.data(), s.k)) << "n=" << s.n << " row " << j;
    }
  }
}

TEST(W8A8LinearKernelsTest, ScalarSetIsTheDefinition) {
  for (const Shape s : kShapes) {
    const auto wf = UniformRandom(static_cast<size_t>(s.n) * s.k, 7 + s.k);
    const LinearWeights w = LinearWeights::FromF32(wf.data(), s.n, s.k, WeightFormat::kW8A8);
    for (int m : {1, 3, 9}) {
      auto x = UniformRandom(static_cast<size_t>(m) * s.k, 50 + m);
      std::fill_n(x.begin(), std::min(s.k, kGroup), 0.0f);  // an all-zero group: dx = 0
      const auto y0 = UniformRandom(static_cast<size_t>(m) * s.n, 60 + m, 2.0f);
      for (bool acc : {false, true}) {
        const auto y = RunSet(W8A8ScalarLinearKernels(), w, x, m, acc, y0, 0, s.n);
        for (int i = 0; i < m; ++i) {
          for (int j = 0; j < s.n; ++j) {
            const float want = Expected(&x[static_cast<size_t>(i) * s.k], wf, j, s.k,
                                        y0[static_cast<size_t>(i) * s.n + j], acc);
            ASSERT_EQ(Bits(&y[static_cast<size_t>(i) * s.n + j], 1), Bits(&want, 1))
                << "n=" << s.n << " k=" << s.k << " m=" << m << " row " << i << " col " << j;
          }
        }
      }
    }
  }
}

// |y - x · Wq| <= sum_g (dx_g / 2) sum_{p in g} |wq_p| (each x rounds to within half a step),
// plus the fp32 rounding of the k/32 group terms, with Wq the decoded int8 weights.
TEST(W8A8LinearKernelsTest, WithinTheActivationQuantizationBound) {
  const int n = 64, k = 960;
  const auto wf = UniformRandom(static_cast<size_t>(n) * k, 9);
  const LinearWeights w = LinearWeights::FromF32(wf.data(), n, k, WeightFormat::kW8A8);
  const int m = 4;
  const auto x = UniformRandom(static_cast<size_t>(m) * k, 10);
  const auto y = RunSet(W8A8ScalarLinearKernels(), w, x, m, false, std::vector<float>(m * n), 0, n);
  std::vector<float> row(k);
  const int groups = k / kGroup;  // fp32 roundings: one per group term, the scale, the store
  double worst = 0;
  for (int j = 0; j < n; ++j) {
    w.DecodeRow(j, row.data());
    for (int i = 0; i < m; ++i) {
      const float* xi = &x[static_cast<size_t>(i) * k];
      double exact = 0, bound = 0, mag = 0;
      for (int g = 0; g < k / kGroup; ++g) {
        double amax = 0, wsum = 0;
        for (int p = g * kGroup; p < (g + 1) * kGroup; ++p) {
          amax = std::max(amax, static_cast<double>(std::fabs(xi[p])));
          wsum += std::fabs(row[p]);
          exact += static_cast<double>(xi[p]) * row[p];
          mag += std::fabs(static_cast<double>(xi[p]) * row[p]);
        }
        bound += amax / 127.0 / 2.0 * wsum;
      }
      bound += (groups + 2) * std::ldexp(mag + bound, -23);
      const double err = std::fabs(y[static_cast<size_t>(i) * n + j] - exact);
      ASSERT_LE(err, bound) << "row " << i << " col " << j;
      worst = std::max(worst, err / bound);
    }
  }
  std::printf("worst error / bound: %.3f\n", worst);
}

TEST(W8A8LinearKernelsTest, VectorSetsEqualScalarBitwise) {
  SKIP_WITHOUT_VECTOR_SETS();
  for (const LinearKernelSet* set : VectorSets()) {
    for (const Shape s : kShapes) {
      const auto wf = UniformRandom(static_cast<size_t>(s.n) * s.k, 17 + s.k);
      const LinearWeights w = LinearWeights::FromF32(wf.data(), s.n, s.k, WeightFormat::kW8A8);
      for (int m = 1; m <= 64; m += (m < 10 ? 1 : 9)) {
        auto x = UniformRandom(static_cast<size_t>(m) * s.k, 70 + m, 3.0f);
        std::fill_n(x.begin(), std::min(s.k, kGroup), 0.0f);
        const auto y0 = UniformRandom(static_cast<size_t>(m) * s.n, 80 + m, 2.0f);
        for (bool acc : {false, true}) {
          const auto want = RunSet(W8A8ScalarLinearKernels(), w, x, m, acc, y0, 0, s.n);
          const auto got = RunSet(*set, w, x, m, acc, y0, 0, s.n);
          ASSERT_EQ(Bits(got.data(), got.size()), Bits(want.data(), want.size()))
              << set->name << " n=" << s.n << " k=" << s.k << " m=" << m << " accumulate " << acc;
        }
      }
    }
  }
}

// Row r of x gives the same bits alone, at every place of batches of 1..64 rows and for column
// ranges split at any group of 16, through CpuLinear on 1 and 2 threads.
TEST(W8A8LinearKernelsTest, BatchInvariantBitwise) {
  SKIP_WITHOUT_VECTOR_SETS();
  const int n = 200, k = 131;
  const auto wf = UniformRandom(n * k, 11);
  const auto probe = UniformRandom(k, 12);
  ThreadPool one(1), two(2);
  for (const LinearKernelSet* set : VectorSets()) {
    for (ThreadPool* pool : {&one, &two}) {
      const CpuLinear lin(LinearWeights::FromF32(wf.data(), n, k, WeightFormat::kW8A8), pool, set);
      EXPECT_EQ(lin.kernel_name(), set->name);
      ASSERT_NO_FATAL_FAILURE(testing::ExpectRowBatchInvariant(
          lin, probe, {1, 2, 7, 8, 9, 17, 33, 64}, pool->num_threads(), std::string(set->name)));
      const LinearWeights w = LinearWeights::FromF32(wf.data(), n, k, WeightFormat::kW8A8);
      const auto whole = RunSet(*set, w, probe, 1, false, std::vector<float>(n), 0, n);
      const auto part = RunSet(*set, w, probe, 1, false, std::vector<float>(n), 48, n);
      EXPECT_EQ(Bits(&whole[48], n - 48), Bits(&part[48], n - 48));
    }
  }
}

// The format picks the best w8a8 set (VNNI, then AVX2); the other sets refuse it, the w8a8 sets
// refuse other formats.
TEST(W8A8LinearKernelsTest, CpuLinearRoutesTheFormat) {
  const auto wf = UniformRandom(16 * 8, 14);
  if (W8A8BestLinearKernels() == nullptr) {
    EXPECT_DEATH(CpuLinear(wf.data(), 16, 8, WeightFormat::kW8A8), "no AVX2");
  } else {
    EXPECT_EQ(CpuLinear(wf.data(), 16, 8, WeightFormat::kW8A8).kernel_name(),
              W8A8VnniLinearKernels() != nullptr ? "avx512-vnni" : "w8a8-avx2");
  }
  EXPECT_EQ(CpuLinear(wf.data(), 16, 8, WeightFormat::kW8A8, nullptr, &W8A8ScalarLinearKernels())
                .kernel_name(),
            "w8a8-scalar");
  EXPECT_DEATH(CpuLinear(wf.data(), 16, 8, WeightFormat::kW8A8, nullptr, &ScalarLinearKernels()),
               "the w8a8 kernel sets run w8a8 weights");
  EXPECT_DEATH(CpuLinear(wf.data(), 16, 8, WeightFormat::kQ8, nullptr, &W8A8ScalarLinearKernels()),
               "the w8a8 kernel sets run w8a8 weights");
}

}  // namespace
}  // namespace morserve
