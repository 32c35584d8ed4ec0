// RunLinearKernelSet: one kernel set over columns [n0, n1) of w for the m rows of x (row-major,
// k columns), starting from y0 (m x n): the call the linear-kernel tests make.
#pragma once

#include <vector>

#include "engine/cpu/linear_kernels.h"
#include "engine/cpu/linear_weights.h"

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

}  // namespace morserve::testing
