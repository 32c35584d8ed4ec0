// Full-vocabulary reductions of one logits row, for the sampler (engine/runtime/sampler.cc)
// and prompt scoring: the largest value, the lowest index of the largest value, and
// sum(exp(x - m)) for log-sum-exp. One pass of each over a 50k-256k entry row per generated
// token, so they are vectorised: before, a double std::exp per entry made host sampling
// 75-80% of a GPU engine step (docs/benchmarks.md, "First GPU run").
//
// One order for every kernel set (the scalar set is the reference every vector set equals
// bit for bit, as in linear_kernels.h): entries go to 8 lanes by index (lane = i % 8; the last
// block padded with -inf), each lane reduces in index order, and the lanes combine as
//   ((l0 o l4) o (l2 o l6)) o ((l1 o l5) o (l3 o l7)).
// exp is Cephes' single-precision expf (range reduction by ln 2 in two parts, degree-5
// polynomial, 2^n by exponent bits; within 2 float ulps of the exact value); arguments below
// ln(FLT_MIN) (-inf included) give 0. Lane sums are in double. NaN: max and argmax skip NaN
// entries (as a sequential `if (x[i] > x[best])` scan does: argmax is 0 when x[0] is NaN),
// sum_exp returns NaN when any x - m is NaN.
#pragma once

#include <cstdint>
#include <string_view>

namespace morserve {

struct LogitReductionSet {
  std::string_view name;  // "scalar", "avx2"
  // Largest non-NaN entry; -inf when there is none (n > 0).
  float (*max)(const float* x, int64_t n) = nullptr;
  // Lowest index i with x[i] == v; n when there is none.
  int64_t (*find)(const float* x, int64_t n, float v) = nullptr;
  // sum over i of exp(x[i] - m), in the order above.
  double (*sum_exp)(const float* x, int64_t n, float m) = nullptr;
};

const LogitReductionSet& ScalarLogitReductions();
// nullptr when the host lacks AVX2.
const LogitReductionSet* Avx2LogitReductions();
// The fastest set the host runs, unless $MORSERVE_CPU_KERNELS names one (kernel_choice.h).
const LogitReductionSet& BestLogitReductions();

// Lowest index of the largest entry by the rule above, given m = set.max(x, n) (n > 0).
int64_t ArgmaxGivenMax(const LogitReductionSet& set, const float* x, int64_t n, float m);
// The same, computing the max.
int64_t Argmax(const LogitReductionSet& set, const float* x, int64_t n);

}  // namespace morserve
