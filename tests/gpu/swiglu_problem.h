// A SwiGLU problem (out[r, i] = silu(gate_up[r, i]) * gate_up[r, inter + i]) for the kernel
// tests (kernel_swiglu_test on the GPU, kernel_swiglu_emu_test on the CPU emulator): random
// gate_up in fp32 or bf16, and the check of an fp32 or bf16 output against the definition in
// double (SiluMulRows): relative error under 1e-2 for bf16 output (one rounding), 1e-5 for
// fp32 output (fp32 evaluation).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "tests/gpu/host_tensor.h"

namespace morserve::testing {

struct SwigluProblem {
  int rows = 0, inter = 0;
  DType out_dtype = DType::kF32;
  HostTensor gate_up;  // [rows, 2 * inter]: gate, then up

  static SwigluProblem Make(uint64_t seed, DType in_t, DType out_t, int rows, int inter) {
    SwigluProblem p;
    p.rows = rows;
    p.inter = inter;
    p.out_dtype = out_t;
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> dist(0.0f, 3.0f);
    std::vector<float> values(static_cast<size_t>(rows) * 2 * inter);
    for (float& v : values) v = dist(rng);
    p.gate_up = HostTensor::Of(in_t, std::move(values));
    return p;
  }

  size_t out_count() const { return static_cast<size_t>(rows) * inter; }
  size_t out_bytes() const { return out_count() * KernelDTypeBytes(out_dtype); }

  std::string Describe(uint64_t seed) const {
    return "in=" + KernelDTypeName(gate_up.dtype) + " out=" + KernelDTypeName(out_dtype) +
           " rows=" + std::to_string(rows) + " inter=" + std::to_string(inter) +
           " seed=" + std::to_string(seed);
  }

  // raw: the output's bytes (out_dtype elements).
  void Check(const std::vector<uint8_t>& raw) const {
    ASSERT_EQ(raw.size(), out_bytes());
    const double tol = out_dtype == DType::kBF16 ? 1e-2 : 1e-5;
    for (int r = 0; r < rows; ++r) {
      for (int i = 0; i < inter; ++i) {
        const double g = gate_up.values[static_cast<size_t>(r) * 2 * inter + i];
        const double u = gate_up.values[static_cast<size_t>(r) * 2 * inter + inter + i];
        const double want = g / (1.0 + std::exp(-g)) * u;
        const double got = ReadKernelOutput(out_dtype, raw, static_cast<size_t>(r) * inter + i);
        ASSERT_TRUE(std::abs(got - want) <= tol * std::abs(want) + 1e-30)
            << "row " << r << " element " << i << ": got " << got << " want " << want;
      }
    }
  }
};

}  // namespace morserve::testing
