// The scalar logit reductions: logit_reductions.h's lane order and expf written out one
// element at a time, the reference of every vector set and the path of hosts without AVX2.
// Compiled with -ffp-contract=off: every rounding is the one written.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "engine/core/check.h"
#include "engine/cpu/kernel_choice.h"
#include "engine/cpu/logit_reductions.h"
#include "engine/cpu/logit_reductions_expf.h"

namespace morserve {
namespace {

constexpr int kLanes = 8;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// a > b ? a : b: NaN in a gives b (the vector max instruction's rule).
float MaxKeep(float a, float b) { return a > b ? a : b; }

template <typename T, typename Op>
T Tree(const T (&l)[kLanes], Op op) {
  return op(op(op(l[0], l[4]), op(l[2], l[6])), op(op(l[1], l[5]), op(l[3], l[7])));
}

float ScalarMax(const float* x, int64_t n) {
  float lane[kLanes];
  for (float& l : lane) l = kNegInf;
  for (int64_t i = 0; i < n; ++i) lane[i % kLanes] = MaxKeep(x[i], lane[i % kLanes]);
  return Tree(lane, MaxKeep);
}

int64_t ScalarFind(const float* x, int64_t n, float v) {
  for (int64_t i = 0; i < n; ++i) {
    if (x[i] == v) return i;
  }
  return n;
}

double ScalarSumExp(const float* x, int64_t n, float m) {
  double lane[kLanes] = {};
  bool nan = false;
  for (int64_t b = 0; b < n; b += kLanes) {
    for (int l = 0; l < kLanes; ++l) {
      const float v = b + l < n ? x[b + l] : kNegInf;  // the vector set's padded load
      const float d = v - m;
      nan |= std::isnan(d);
      lane[l] += static_cast<double>(expf_l8::Exp(d));
    }
  }
  if (nan) return std::numeric_limits<double>::quiet_NaN();
  return Tree(lane, [](double a, double b) { return a + b; });
}

}  // namespace

const LogitReductionSet& ScalarLogitReductions() {
  static const LogitReductionSet set{"scalar", &ScalarMax, &ScalarFind, &ScalarSumExp};
  return set;
}

int64_t ArgmaxGivenMax(const LogitReductionSet& set, const float* x, int64_t n, float m) {
  if (std::isnan(x[0])) return 0;  // a sequential `x[i] > x[best]` scan never leaves 0
  const int64_t i = set.find(x, n, m);
  return i < n ? i : 0;  // i == n only when m is not an entry (not the set's max)
}

int64_t Argmax(const LogitReductionSet& set, const float* x, int64_t n) {
  return ArgmaxGivenMax(set, x, n, set.max(x, n));
}

const LogitReductionSet& BestLogitReductions() {
  static const LogitReductionSet* best = [] {
    const std::string_view want = RequestedCpuKernels();
    if (want == "scalar") return &ScalarLogitReductions();
    const LogitReductionSet* avx2 = Avx2LogitReductions();
    MORSERVE_CHECK(want != "avx2" || avx2 != nullptr, "MORSERVE_CPU_KERNELS=avx2: this CPU lacks AVX2");
    return avx2 != nullptr ? avx2 : &ScalarLogitReductions();
  }();
  return *best;
}

}  // namespace morserve
