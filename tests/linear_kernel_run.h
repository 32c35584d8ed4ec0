// What the linear-kernel tests share: RunLinearKernelSet, one kernel set over columns [n0, n1)
// of w for the m rows of x (row-major, k columns), starting from y0 (m x n); Bits, for bitwise
// comparisons that gtest prints; ExpectRowBatchInvariant, a row's bits alone and inside batches.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "engine/cpu/cpu_linear.h"
#include "engine/cpu/linear_kernels.h"
#include "engine/cpu/linear_weights.h"
#include "tests/random_values.h"

namespace morserve::testing {

inline std::vector<float> RunLinearKernelSet(const LinearKernelSet& set, const LinearWeights& w,
                                             const std::vector<float>& x, int m,
                                             const std::vector<float>& y0, bool accumulate, int n0,
                                             int n1) {
  std::vector<float> y = y0;
  LinearArgs a;
  a.x = x.data();
  a.ldx = w.k();
  a.m = m;
  a.w = &w;
  a.y = y.data();
  a.ldy = w.n();
  a.accumulate = accumulate;
  if (set.prepare != nullptr) set.prepare(a);
  set.run(a, n0, n1);
  return y;
}

// The bit patterns of n floats.
inline std::vector<uint32_t> Bits(const float* p, size_t n) {
  std::vector<uint32_t> out(n);
  std::memcpy(out.data(), p, n * sizeof(float));
  return out;
}

// `probe` (one row of lin.k() values) gives the same bits through `lin` alone and at rows 0, m / 2
// and m - 1 of a batch of m random rows (seeded 13 + m), for every m in `ms`; a failure names
// `label`, m, the row and the pool's threads. Call it inside ASSERT_NO_FATAL_FAILURE.
inline void ExpectRowBatchInvariant(const CpuLinear& lin, const std::vector<float>& probe,
                                    const std::vector<int>& ms, int threads,
                                    const std::string& label) {
  const int n = lin.n(), k = lin.k();
  std::vector<float> alone(n);
  lin.Forward(probe.data(), 1, alone.data());
  for (int m : ms) {
    auto x = UniformRandom(static_cast<size_t>(m) * k, 13 + m);
    for (int at : {0, m / 2, m - 1}) {
      std::copy(probe.begin(), probe.end(), x.begin() + static_cast<size_t>(at) * k);
      std::vector<float> y(static_cast<size_t>(m) * n);
      lin.Forward(x.data(), m, y.data());
      ASSERT_EQ(Bits(alone.data(), n), Bits(&y[static_cast<size_t>(at) * n], n))
          << label << " m=" << m << " at " << at << " threads " << threads;
    }
  }
}

}  // namespace morserve::testing
