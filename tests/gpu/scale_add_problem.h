// A gated residual add problem (h += scale[row] * b, or h += b without scales) for the kernel
// tests (kernel_scale_add_test on the GPU, kernel_scale_add_emu_test on the CPU emulator):
// random fp32 h, b in fp32 or bf16, per-row gates in [-1, 1], and the bitwise check against
// the CPU backend's arithmetic (ScaleAddRows: h + scale * b in double, rounded once; without
// scales the fp32 sum).
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "tests/gpu/gpu_testutil.h"
#include "tests/gpu/host_tensor.h"

namespace morserve::testing {

struct ScaleAddProblem {
  int rows = 0, dim = 0;
  bool with_scale = false;
  std::vector<float> h, scale;  // h [rows, dim] (the kernel updates a copy), scale [rows]
  HostTensor b;                 // [rows, dim]

  static ScaleAddProblem Make(uint64_t seed, DType b_t, bool with_scale, int rows, int dim) {
    ScaleAddProblem p;
    p.rows = rows;
    p.dim = dim;
    p.with_scale = with_scale;
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> dist(0.0f, 4.0f);
    std::uniform_real_distribution<float> gate(-1.0f, 1.0f);
    const size_t n = static_cast<size_t>(rows) * dim;
    p.h.resize(n);
    p.scale.resize(rows);
    std::vector<float> b(n);
    for (float& v : p.h) v = dist(rng);
    for (float& v : b) v = dist(rng);
    for (float& s : p.scale) s = gate(rng);
    p.b = HostTensor::Of(b_t, std::move(b));
    return p;
  }

  const float* scale_or_null() const { return with_scale ? scale.data() : nullptr; }

  std::string Describe(uint64_t seed) const {
    return "b=" + KernelDTypeName(b.dtype) + " scale=" + (with_scale ? "yes" : "no") +
           " rows=" + std::to_string(rows) + " dim=" + std::to_string(dim) +
           " seed=" + std::to_string(seed);
  }

  // got: h after the kernel.
  void Check(const std::vector<float>& got) const {
    ASSERT_EQ(got.size(), h.size());
    for (size_t i = 0; i < h.size(); ++i) {
      const float bv = b.values[i];
      volatile double prod = with_scale ? static_cast<double>(scale[i / dim]) * bv : bv;
      const float want = with_scale ? static_cast<float>(h[i] + prod) : h[i] + bv;
      ASSERT_EQ(FloatBits(got[i]), FloatBits(want))
          << "element " << i << ": got " << got[i] << " want " << want;
    }
  }
};

}  // namespace morserve::testing
