// A GEMM problem for LtGemm (kernels/gemm.cuh: y[m, n] = x[m, k] · w[n, k]^T, bf16 in) in the
// kernel tests (kernel_gemm_test on the GPU through cuBLASLt, kernel_gemm_emu_test on the CPU
// cuBLASLt emulation): random bf16 x (stddev 1) and w (stddev 0.05, a Linear's scale), and the
// check of a bf16 or fp32 y against a CPU GEMM in double. Error bound per element:
// |got - ref| <= tol * sum_k |x_k w_k|, tol 1e-2 for bf16 output (one bf16 rounding) and 1e-3
// for fp32 output (fp32 accumulation over k). Also what both tests run the same way: the
// status assertion, the engine's shapes and the algorithm-cache check.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "kernels/gemm.cuh"
#include "tests/gpu/host_tensor.h"

// Asserts that a cuBLASLt call succeeded, naming the status.
#define MORSERVE_LT_EXPECT_OK(expr)                                              \
  do {                                                                           \
    const cublasStatus_t morserve_st_ = (expr);                                  \
    ASSERT_EQ(morserve_st_, CUBLAS_STATUS_SUCCESS)                               \
        << #expr << ": " << ::morserve::kernels::GemmStatusString(morserve_st_); \
  } while (0)

namespace morserve::testing {

struct GemmProblem {
  int m = 0, n = 0, k = 0;
  HostTensor x;  // [m, k] bf16
  HostTensor w;  // [n, k] bf16

  static GemmProblem Make(uint64_t seed, int m, int n, int k) {
    GemmProblem p;
    p.m = m;
    p.n = n;
    p.k = k;
    std::mt19937_64 rng(seed);
    p.x = HostTensor::Of(DType::kBF16, Normal(static_cast<size_t>(m) * k, 1.0f, rng));
    p.w = HostTensor::Of(DType::kBF16, Normal(static_cast<size_t>(n) * k, 0.05f, rng));
    return p;
  }

  static std::vector<float> Normal(size_t count, float stddev, std::mt19937_64& rng) {
    std::normal_distribution<float> dist(0.0f, stddev);
    std::vector<float> v(count);
    for (float& f : v) f = dist(rng);
    return v;
  }

  size_t y_bytes(DType y_dtype) const {
    return static_cast<size_t>(m) * n * KernelDTypeBytes(y_dtype);
  }

  std::string Describe(uint64_t seed) const {
    return "m=" + std::to_string(m) + " n=" + std::to_string(n) + " k=" + std::to_string(k) +
           " seed=" + std::to_string(seed);
  }

  // raw: y's bytes (y_dtype elements, [m, n] row-major).
  void Check(DType y_dtype, const std::vector<uint8_t>& raw) const {
    ASSERT_EQ(raw.size(), y_bytes(y_dtype));
    const double tol = y_dtype == DType::kBF16 ? 1e-2 : 1e-3;
    for (int r = 0; r < m; ++r) {
      const float* xr = &x.values[static_cast<size_t>(r) * k];
      for (int c = 0; c < n; ++c) {
        const float* wc = &w.values[static_cast<size_t>(c) * k];
        double ref = 0, mag = 0;
        for (int i = 0; i < k; ++i) {
          const double t = static_cast<double>(xr[i]) * wc[i];
          ref += t;
          mag += std::abs(t);
        }
        const double got = ReadKernelOutput(y_dtype, raw, static_cast<size_t>(r) * n + c);
        ASSERT_TRUE(std::abs(got - ref) <= tol * mag)
            << (y_dtype == DType::kBF16 ? "bf16" : "f32") << " y[" << r << ", " << c
            << "] = " << got << ", want " << ref << " (sum |x w| " << mag << ")";
      }
    }
  }
};

// check(m, n, k) for the engine's shapes (SmolLM-360M projections and a SmolLM-135M-wide
// lm_head) at decode and prefill row counts, stopping at the first fatal failure.
template <typename CheckFn>
void ForEachEngineGemmShape(CheckFn check) {
  ASSERT_NO_FATAL_FAILURE(check(1, 960, 960));    // o_proj, decode
  ASSERT_NO_FATAL_FAILURE(check(7, 1600, 960));   // fused QKV (15 + 2 * 5 heads of 64)
  ASSERT_NO_FATAL_FAILURE(check(64, 5120, 960));  // fused gate/up
  ASSERT_NO_FATAL_FAILURE(check(33, 960, 2560));  // down_proj
  ASSERT_NO_FATAL_FAILURE(check(3, 49152, 576));  // lm_head (SmolLM-135M width)
  ASSERT_NO_FATAL_FAILURE(check(200, 64, 8));     // tiny k
}

// On a freshly initialised LtGemm: descriptors cached per (m, n, k, y dtype), one algorithm
// pinned per (n, k, y dtype) whatever m, and a second Init refused.
inline void CheckAlgorithmsAreCachedPerShape(kernels::LtGemm& gemm) {
  EXPECT_EQ(gemm.num_cached_shapes(), 0u);
  EXPECT_EQ(gemm.num_pinned(), 0u);
  EXPECT_EQ(gemm.pinned_algorithm_id(960, 960, DType::kBF16), -1);
  MORSERVE_LT_EXPECT_OK(gemm.Prepare(8, 960, 960, DType::kBF16));
  MORSERVE_LT_EXPECT_OK(gemm.Prepare(8, 960, 960, DType::kBF16));
  EXPECT_EQ(gemm.num_cached_shapes(), 1u);
  EXPECT_EQ(gemm.num_pinned(), 1u);
  const int id = gemm.pinned_algorithm_id(960, 960, DType::kBF16);
  EXPECT_GE(id, 0);
  MORSERVE_LT_EXPECT_OK(gemm.Prepare(8, 960, 960, DType::kF32));
  MORSERVE_LT_EXPECT_OK(gemm.Prepare(16, 960, 960, DType::kBF16));
  EXPECT_EQ(gemm.num_cached_shapes(), 3u);
  EXPECT_EQ(gemm.num_pinned(), 2u);
  EXPECT_EQ(gemm.pinned_algorithm_id(960, 960, DType::kBF16), id);
  MORSERVE_LT_EXPECT_OK(gemm.Pin(2560, 960, DType::kBF16));
  EXPECT_EQ(gemm.num_pinned(), 3u);
  EXPECT_EQ(gemm.num_cached_shapes(), 3u);
  EXPECT_EQ(gemm.Pin(12, 960, DType::kBF16), CUBLAS_STATUS_INVALID_VALUE);  // n % 8 != 0
  EXPECT_EQ(gemm.Init(), CUBLAS_STATUS_INVALID_VALUE);                      // a second Init
}

}  // namespace morserve::testing
