// An early-exit confidence problem for the kernel tests (kernel_exit_confidence_test on the GPU,
// kernel_exit_confidence_emu_test on the CPU emulator): rows of random logits in fp32 or bf16,
// from flat to confident, with a padded row stride, per-row thresholds (row 0 equal to its
// float-rounded max probability; the others 10% below it, 10% above it, or drawn from [0, 1) at
// least 1e-9 away), and the check against the executor's MaxProb (double, sequential): the max
// probability to 1e-10 relative (two double sums in different orders), decisions consistent
// with the reported probability, and exact against the reference away from the equality row.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "tests/gpu/host_tensor.h"

namespace morserve::testing {

// The executor's rule: the largest softmax probability of a row, in double.
inline double MaxProb(const float* logits, int vocab) {
  const double m = *std::max_element(logits, logits + vocab);
  double sum = 0;
  for (int i = 0; i < vocab; ++i) sum += std::exp(logits[i] - m);
  return 1.0 / sum;
}

struct ExitConfidenceProblem {
  int rows = 0, vocab = 0;
  int64_t stride = 0;
  HostTensor logits;              // [rows, stride]
  std::vector<double> ref;        // MaxProb of each row
  std::vector<float> thresholds;  // [rows]

  static ExitConfidenceProblem Make(uint64_t seed, DType t, int rows, int vocab, int pad) {
    ExitConfidenceProblem p;
    p.rows = rows;
    p.vocab = vocab;
    p.stride = vocab + pad;
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    std::uniform_real_distribution<double> unit(0.0, 1.0);
    std::vector<float> values(static_cast<size_t>(rows) * p.stride, 0.0f);
    for (int r = 0; r < rows; ++r) {
      const float sharpness = 1.0f + 4.0f * (r % 5);  // from flat to confident rows
      for (int i = 0; i < vocab; ++i) values[r * p.stride + i] = dist(rng) * sharpness;
    }
    p.logits = HostTensor::Of(t, std::move(values));
    p.ref.resize(rows);
    p.thresholds.resize(rows);
    for (int r = 0; r < rows; ++r) {
      p.ref[r] = MaxProb(&p.logits.values[r * p.stride], vocab);
      float th;
      if (r % 3 == 1) {
        th = static_cast<float>(p.ref[r] * 0.9);  // exits
      } else if (r % 3 == 2) {
        th = static_cast<float>(p.ref[r] * 1.1);  // does not
      } else {
        do {
          th = static_cast<float>(unit(rng));
        } while (std::abs(th - p.ref[r]) < 1e-9);
      }
      p.thresholds[r] = th;
    }
    p.thresholds[0] = static_cast<float>(p.ref[0]);  // equality case (float-rounded)
    return p;
  }

  std::string Describe(uint64_t seed) const {
    return KernelDTypeName(logits.dtype) + " vocab=" + std::to_string(vocab) +
           " seed=" + std::to_string(seed);
  }

  void Check(const std::vector<int32_t>& exit, const std::vector<double>& prob) const {
    ASSERT_EQ(exit.size(), static_cast<size_t>(rows));
    ASSERT_EQ(prob.size(), static_cast<size_t>(rows));
    for (int r = 0; r < rows; ++r) {
      ASSERT_NEAR(prob[r], ref[r], 1e-10 * ref[r]) << "row " << r;
      ASSERT_EQ(exit[r], prob[r] >= thresholds[r] ? 1 : 0) << "row " << r;
      if (r > 0) ASSERT_EQ(exit[r], ref[r] >= thresholds[r] ? 1 : 0) << "row " << r;
    }
  }
};

}  // namespace morserve::testing
