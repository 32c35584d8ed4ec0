// The AVX-512 BF16 linear kernel set (engine/cpu/linear_kernels_avx512_bf16.cc) on amx-bf16
// weights: bit for bit a scalar emulation of its documented order (VDPBF16PS as the Intel SDM
// writes it: per pair of k, the odd product added first, each add rounded, denormals flushed)
// over odd shapes, M 1..130, both write modes and column ranges starting at any group of 64; a
// row's bits the same alone and at every place of batches of 1..64 rows on 1 and 2 threads; the
// format's routing in CpuLinear. Skipped where the host has no AVX-512 BF16.
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

#define SKIP_WITHOUT_AVX512_BF16() \
  if (Avx512Bf16LinearKernels() == nullptr) GTEST_SKIP() << "no AVX-512 BF16 on this host"

// Denormals to signed zero (the instruction's DAZ on inputs and FTZ on its result).
float Flush(float v) { return std::fpclassify(v) == FP_SUBNORMAL ? std::copysign(0.0f, v) : v; }

float RoundBf16(float v) { return Flush(Bf16ToF32(F32ToBf16(v))); }

// The set's order for one output element: x and w are the row's and the column's k values.
float EmulatedDot(const float* x, const float* w, int k) {
  float acc = 0.0f;
  for (int p = 0; p < k; p += 2) {
    const float x1 = p + 1 < k ? RoundBf16(x[p + 1]) : 0.0f;
    const float w1 = p + 1 < k ? RoundBf16(w[p + 1]) : 0.0f;
    acc = Flush(std::fmaf(x1, w1, acc));  // the product is exact: one rounding per add
    acc = Flush(std::fmaf(RoundBf16(x[p]), RoundBf16(w[p]), acc));
  }
  return acc;
}

std::vector<float> Emulate(const std::vector<float>& wf, int n, int k, const std::vector<float>& x,
                           int m, bool accumulate, const std::vector<float>& y0, int n0) {
  std::vector<float> y = y0;
  for (int i = 0; i < m; ++i) {
    for (int j = n0; j < n; ++j) {
      const float s =
          EmulatedDot(&x[static_cast<size_t>(i) * k], &wf[static_cast<size_t>(j) * k], k);
      float& out = y[static_cast<size_t>(i) * n + j];
      out = accumulate ? out + s : s;
    }
  }
  return y;
}

std::vector<float> RunSet(const LinearWeights& w, const std::vector<float>& x, int m,
                          bool accumulate, const std::vector<float>& y0, int n0) {
  return testing::RunLinearKernelSet(*Avx512Bf16LinearKernels(), w, x, m, y0, accumulate, n0,
                                     w.n());
}

TEST(Avx512Bf16LinearKernelsTest, EqualsTheDocumentedOrderBitwise) {
  SKIP_WITHOUT_AVX512_BF16();
  struct Shape {
    int n, k;
  };
  for (const Shape s : {Shape{1, 1}, Shape{13, 7}, Shape{64, 96}, Shape{70, 45}, Shape{130, 203},
                        Shape{29, 1000}}) {
    const auto wf = UniformRandom(static_cast<size_t>(s.n) * s.k, 7 + s.k);
    const LinearWeights w = LinearWeights::FromF32(wf.data(), s.n, s.k, WeightFormat::kAmxBf16);
    for (int m : {1, 2, 3, 4, 5, 6, 7, 8, 11, 13, 16, 17, 40, 48, 49, 64, 97, 130}) {
      const auto x = UniformRandom(static_cast<size_t>(m) * s.k, 50 + m);
      const auto y0 = UniformRandom(static_cast<size_t>(m) * s.n, 60 + m, 2.0f);
      for (bool acc : {false, true}) {
        for (int n0 : {0, 64}) {
          if (n0 >= s.n) continue;
          const auto want = Emulate(wf, s.n, s.k, x, m, acc, y0, n0);
          const auto got = RunSet(w, x, m, acc, y0, n0);
          ASSERT_EQ(Bits(want.data(), want.size()), Bits(got.data(), got.size()))
              << "n=" << s.n << " k=" << s.k << " m=" << m << " accumulate=" << acc << " n0=" << n0;
        }
      }
    }
  }
}

// Inputs and sums below fp32's normal range, flushed as the documented order says: products of
// values near 1e-19 (about 1e-38, sums that stay denormal or cross into the normal range), and
// bf16 denormal inputs (1e-39) times weights of 1e20, which would give 1e-19 were they kept.
TEST(Avx512Bf16LinearKernelsTest, FlushesDenormalsAsDocumented) {
  SKIP_WITHOUT_AVX512_BF16();
  const int n = 64, k = 64, m = 2;
  for (const bool input_denormals : {false, true}) {
    auto wf = UniformRandom(static_cast<size_t>(n) * k, 3, input_denormals ? 1e20f : 1e-19f);
    auto x = UniformRandom(static_cast<size_t>(m) * k, 4, 1e-19f);
    if (input_denormals)
      for (float& v : x) v = std::copysign(1e-39f, v);
    const LinearWeights w = LinearWeights::FromF32(wf.data(), n, k, WeightFormat::kAmxBf16);
    const std::vector<float> y0(static_cast<size_t>(m) * n, 0.0f);
    const auto want = Emulate(wf, n, k, x, m, false, y0, 0);
    const auto got = RunSet(w, x, m, false, y0, 0);
    EXPECT_EQ(Bits(want.data(), want.size()), Bits(got.data(), got.size()))
        << "input denormals " << input_denormals;
  }
}

// Row r of x gives the same bits alone and at every place of batches of 1..64 rows, through
// CpuLinear with the set on 1 and 2 threads.
TEST(Avx512Bf16LinearKernelsTest, BatchInvariantBitwise) {
  SKIP_WITHOUT_AVX512_BF16();
  const int n = 200, k = 131;
  const auto wf = UniformRandom(n * k, 11);
  const auto probe = UniformRandom(k, 12);
  ThreadPool one(1), two(2);
  for (ThreadPool* pool : {&one, &two}) {
    const CpuLinear lin(LinearWeights::FromF32(wf.data(), n, k, WeightFormat::kAmxBf16), pool,
                        Avx512Bf16LinearKernels());
    EXPECT_EQ(lin.kernel_name(), "avx512-bf16");
    std::vector<int> ms(64);
    for (int m = 1; m <= 64; ++m) ms[m - 1] = m;
    ASSERT_NO_FATAL_FAILURE(
        testing::ExpectRowBatchInvariant(lin, probe, ms, pool->num_threads(), "avx512-bf16"));
  }
}

// amx-bf16 weights run on the AMX set where there is one, else on this set, else nowhere; this
// set refuses the other formats.
TEST(Avx512Bf16LinearKernelsTest, CpuLinearRoutesTheFormat) {
  const auto wf = UniformRandom(16 * 8, 14);
  if (AmxBf16BestLinearKernels() == nullptr) {
    EXPECT_DEATH(CpuLinear(wf.data(), 16, 8, WeightFormat::kAmxBf16),
                 "neither a usable AMX-BF16 nor AVX-512 BF16");
    return;
  }
  const std::string_view want = AmxLinearKernels() != nullptr ? "amx" : "avx512-bf16";
  EXPECT_EQ(CpuLinear(wf.data(), 16, 8, WeightFormat::kAmxBf16).kernel_name(), want);
  if (Avx512Bf16LinearKernels() != nullptr) {
    EXPECT_DEATH(
        CpuLinear(wf.data(), 16, 8, WeightFormat::kBF16, nullptr, Avx512Bf16LinearKernels()),
        "kernel sets run amx-bf16 weights");
  }
}

}  // namespace
}  // namespace morserve
