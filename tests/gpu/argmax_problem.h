// A greedy argmax problem for the kernel tests (kernel_argmax_test on the GPU,
// kernel_argmax_emu_test on the CPU emulator): rows of random logits in fp32 or bf16 with a
// padded row stride (the padding holds 1e30, which must not be read as a logit), planted cases
// where vocab > 10 (a tie at both ends, the last and the first index, a NaN that must not win,
// a row of -inf, two +inf), and the exact check against the CPU sampler's rule: the largest
// logit, the lowest index on ties, NaN never wins; the reported maximum bitwise.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "tests/gpu/gpu_testutil.h"
#include "tests/gpu/host_tensor.h"

namespace morserve::testing {

struct ArgmaxProblem {
  static constexpr int kPlantedRows = 6;  // rows 0..5 hold the planted cases
  int rows = 0, vocab = 0;
  int64_t stride = 0;
  HostTensor logits;  // [rows, stride]

  float at(int r, int i) const { return logits.values[static_cast<size_t>(r) * stride + i]; }
  bool planted() const { return vocab > 10 && rows >= kPlantedRows; }

  // coarse: logits rounded to whole numbers first, so ties for the largest are common.
  static ArgmaxProblem Make(uint64_t seed, DType t, int rows, int vocab, int pad, bool coarse) {
    ArgmaxProblem p;
    p.rows = rows;
    p.vocab = vocab;
    p.stride = vocab + pad;
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> dist(0.0f, 3.0f);
    std::vector<float> values(static_cast<size_t>(rows) * p.stride);
    for (size_t i = 0; i < values.size(); ++i) {
      const float v = coarse ? std::round(dist(rng)) : dist(rng);
      values[i] = i % p.stride >= static_cast<size_t>(vocab) ? 1e30f : v;
    }
    auto set = [&](int r, int i) -> float& {
      return values[static_cast<size_t>(r) * p.stride + i];
    };
    if (p.planted()) {
      const float nan = std::numeric_limits<float>::quiet_NaN();
      const float inf = std::numeric_limits<float>::infinity();
      set(0, 3) = set(0, vocab - 1) = 100.0f;  // tie: lowest index wins
      set(1, vocab - 1) = 100.0f;              // the last index
      set(2, 0) = 100.0f;                      // the first index
      set(3, 5) = nan;                         // NaN never wins
      set(3, 6) = 50.0f;
      for (int i = 0; i < vocab; ++i) set(4, i) = -inf;  // all -inf: index 0
      set(5, 7) = inf;
      set(5, 9) = inf;
    }
    p.logits = HostTensor::Of(t, std::move(values));
    return p;
  }

  std::string Describe(uint64_t seed) const {
    return KernelDTypeName(logits.dtype) + " vocab=" + std::to_string(vocab) +
           " seed=" + std::to_string(seed);
  }

  // The sampler's loop, skipping NaN.
  int Want(int r) const {
    int best = -1;
    for (int i = 0; i < vocab; ++i) {
      if (std::isnan(at(r, i))) continue;
      if (best < 0 || at(r, i) > at(r, best)) best = i;
    }
    return best;
  }

  void Check(const std::vector<int32_t>& tokens, const std::vector<float>& maxes) const {
    ASSERT_EQ(tokens.size(), static_cast<size_t>(rows));
    ASSERT_EQ(maxes.size(), static_cast<size_t>(rows));
    for (int r = 0; r < rows; ++r) {
      const int best = Want(r);
      ASSERT_EQ(tokens[r], best) << "row " << r;
      ASSERT_EQ(FloatBits(maxes[r]), FloatBits(at(r, best))) << "row " << r;
    }
    if (planted()) {
      EXPECT_EQ(tokens[0], 3);
      EXPECT_EQ(tokens[1], vocab - 1);
      EXPECT_EQ(tokens[2], 0);
      EXPECT_EQ(tokens[3], 6);
      EXPECT_EQ(tokens[4], 0);
      EXPECT_EQ(tokens[5], 7);
    }
  }
};

}  // namespace morserve::testing
