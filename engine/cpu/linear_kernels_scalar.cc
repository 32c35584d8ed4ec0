// The scalar linear kernel set: the L8 order of linear_kernels.h written out one element at a
// time. It is the reference every vector set is tested against bit for bit, and the path of
// hosts without AVX2. Compiled with -ffp-contract=off: every rounding is the one written.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "engine/core/check.h"
#include "engine/cpu/kernel_choice.h"
#include "engine/cpu/linear_kernels.h"

namespace morserve {
namespace {

constexpr int kLanes = 8;

float DotL8(const float* x, const float* w, int kp) {
  float acc[kLanes] = {};
  for (int k0 = 0; k0 < kp; k0 += kLanes) {
    for (int l = 0; l < kLanes; ++l) acc[l] = std::fma(x[k0 + l], w[k0 + l], acc[l]);
  }
  float s4[4], s2[2];
  for (int i = 0; i < 4; ++i) s4[i] = acc[i] + acc[i + 4];
  for (int i = 0; i < 2; ++i) s2[i] = s4[i] + s4[i + 2];
  return s2[0] + s2[1];
}

void RunScalar(const LinearArgs& a, int n0, int n1) {
  const int k = a.w->k(), kp = (k + kLanes - 1) / kLanes * kLanes;
  std::vector<float> x(static_cast<size_t>(a.m) * kp, 0.0f), w(kp, 0.0f);
  for (int i = 0; i < a.m; ++i) std::copy_n(a.x + i * a.ldx, k, &x[static_cast<size_t>(i) * kp]);
  for (int j = n0; j < n1; ++j) {
    a.w->DecodeRow(j, w.data());
    for (int i = 0; i < a.m; ++i) {
      const float s = DotL8(&x[static_cast<size_t>(i) * kp], w.data(), kp);
      float& y = a.y[i * a.ldy + j];
      y = a.accumulate ? y + s : s;
    }
  }
}

int ScalarChunkRows(int, int) { return 16; }

}  // namespace

const LinearKernelSet& ScalarLinearKernels() {
  static const LinearKernelSet set{"scalar", &RunScalar, &ScalarChunkRows};
  return set;
}

const LinearKernelSet& BestLinearKernels() {
  static const LinearKernelSet* best = [] {
    const std::string_view want = RequestedCpuKernels();
    if (want == "scalar") return &ScalarLinearKernels();
    const LinearKernelSet* avx2 = Avx2LinearKernels();
    const LinearKernelSet* avx512 = Avx512LinearKernels();
    MORSERVE_CHECK(want != "avx2" || avx2 != nullptr,
                   "MORSERVE_CPU_KERNELS=avx2: this CPU lacks AVX2/FMA/F16C");
    MORSERVE_CHECK(want != "avx512" || avx512 != nullptr,
                   "MORSERVE_CPU_KERNELS=avx512: this CPU lacks AVX-512 F/BW/DQ/VL");
    if (want == "avx2") return avx2;
    if (avx512 != nullptr) return avx512;
    return avx2 != nullptr ? avx2 : &ScalarLinearKernels();
  }();
  return *best;
}

}  // namespace morserve
