// The AMX linear kernel set (engine/cpu/linear_kernels_amx.cc) on amx-bf16 weights: within the
// fp32 summation bound of the exact product of the bf16-rounded inputs, a row's bits the same
// alone and at every place of batches of 1..40 rows and for any column split, the layout's
// decode and the format's routing in CpuLinear. Skipped where the host has no usable AMX. (The
// tile unit's order inside an instruction is not documented; on a Xeon with AMX it matched
// neither a sequential fp32 sum of the products nor pair-first nor a single rounding per pair
// for every element, so the test holds it to the bound, not to an emulation.)
#include <gtest/gtest.h>

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

float RoundBf16(float v) { return Bf16ToF32(F32ToBf16(v)); }

std::vector<float> RunAmx(const LinearWeights& w, const std::vector<float>& x, int m,
                          bool accumulate, const std::vector<float>& y0, int n0, int n1) {
  return testing::RunLinearKernelSet(*AmxLinearKernels(), w, x, m, y0, accumulate, n0, n1);
}

#define SKIP_WITHOUT_AMX() \
  if (AmxLinearKernels() == nullptr) GTEST_SKIP() << "no usable AMX-BF16 on this host"

TEST(AmxLinearKernelsTest, LayoutDecodesToTheRoundedWeights) {
  const int n = 70, k = 45;  // a partial group of 64 columns and a partial k block
  const auto wf = UniformRandom(n * k, 5);
  const LinearWeights w = LinearWeights::FromF32(wf.data(), n, k, WeightFormat::kAmxBf16);
  EXPECT_EQ(w.format(), WeightFormat::kAmxBf16);
  EXPECT_EQ(w.owned_bytes(), 128 * 64 * 2);  // n to 128 columns, k to 64
  std::vector<float> row(k);
  for (int j = 0; j < n; ++j) {
    w.DecodeRow(j, row.data());
    for (int p = 0; p < k; ++p) ASSERT_EQ(row[p], RoundBf16(wf[j * k + p])) << j << "," << p;
  }
}

// |y - sum x^ w^| <= k 2^-24 sum |x^ w^| (each of k fp32 additions rounds once), in double.
TEST(AmxLinearKernelsTest, WithinTheFp32SumBoundOfTheRoundedProduct) {
  SKIP_WITHOUT_AMX();
  struct Shape {
    int n, k;
  };
  for (const Shape s :
       {Shape{1, 1}, Shape{13, 7}, Shape{64, 96}, Shape{130, 203}, Shape{29, 1000}}) {
    const auto wf = UniformRandom(static_cast<size_t>(s.n) * s.k, 7 + s.k);
    const LinearWeights w = LinearWeights::FromF32(wf.data(), s.n, s.k, WeightFormat::kAmxBf16);
    for (int m : {1, 3, 16, 17, 40}) {
      const auto x = UniformRandom(static_cast<size_t>(m) * s.k, 50 + m);
      const auto y0 = UniformRandom(static_cast<size_t>(m) * s.n, 60 + m, 2.0f);
      for (bool acc : {false, true}) {
        const auto y = RunAmx(w, x, m, acc, y0, 0, s.n);
        for (int i = 0; i < m; ++i) {
          for (int j = 0; j < s.n; ++j) {
            double ref = 0, mag = 0;
            for (int p = 0; p < s.k; ++p) {
              const double t =
                  static_cast<double>(RoundBf16(x[i * s.k + p])) * RoundBf16(wf[j * s.k + p]);
              ref += t;
              mag += std::fabs(t);
            }
            const double base = acc ? y0[i * s.n + j] : 0.0;
            const double bound = (s.k + 1) * std::ldexp(mag + std::fabs(base), -24) + 1e-30;
            ASSERT_LE(std::fabs(y[i * s.n + j] - (base + ref)), bound)
                << "n=" << s.n << " k=" << s.k << " m=" << m << " row " << i << " col " << j;
          }
        }
      }
    }
  }
}

// Row r of x gives the same bits alone, at every place of batches of 1..40 rows, and for column
// ranges split at any group of 64, through CpuLinear on 1 and 2 threads.
TEST(AmxLinearKernelsTest, BatchInvariantBitwise) {
  SKIP_WITHOUT_AMX();
  const int n = 200, k = 131;
  const auto wf = UniformRandom(n * k, 11);
  const auto probe = UniformRandom(k, 12);
  ThreadPool one(1), two(2);
  for (ThreadPool* pool : {&one, &two}) {
    const CpuLinear lin(LinearWeights::FromF32(wf.data(), n, k, WeightFormat::kAmxBf16), pool);
    EXPECT_EQ(lin.kernel_name(), "amx");
    ASSERT_NO_FATAL_FAILURE(testing::ExpectRowBatchInvariant(lin, probe, {1, 2, 15, 16, 17, 33, 40},
                                                             pool->num_threads(), "amx"));
    // A column range starting at the second group gives the same bits as the whole.
    const LinearWeights w = LinearWeights::FromF32(wf.data(), n, k, WeightFormat::kAmxBf16);
    const auto whole = RunAmx(w, probe, 1, false, std::vector<float>(n), 0, n);
    const auto part = RunAmx(w, probe, 1, false, std::vector<float>(n), 64, n);
    EXPECT_EQ(Bits(&whole[64], n - 64), Bits(&part[64], n - 64));
  }
}

// The format picks the AMX set where the host has AMX (linear_kernels_avx512_bf16_test covers
// the hosts without it); the other sets refuse it, it refuses the other formats.
TEST(AmxLinearKernelsTest, CpuLinearRoutesTheFormat) {
  SKIP_WITHOUT_AMX();
  const auto wf = UniformRandom(16 * 8, 14);
  EXPECT_EQ(CpuLinear(wf.data(), 16, 8, WeightFormat::kAmxBf16).kernel_name(), "amx");
  EXPECT_EQ(CpuLinear(wf.data(), 16, 8, WeightFormat::kBF16).kernel_name(),
            BestLinearKernels().name);
  EXPECT_DEATH(CpuLinear(wf.data(), 16, 8, WeightFormat::kBF16, nullptr, AmxLinearKernels()),
               "kernel sets run amx-bf16 weights");
}

}  // namespace
}  // namespace morserve
