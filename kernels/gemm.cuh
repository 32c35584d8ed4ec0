// cuBLASLt GEMM for the linear layers: y[m, n] = x[m, k] · w[n, k]^T with bf16 x and w
// (row-major: activations and a Linear's [out, in] weight), fp32 accumulation (compute type
// CUBLAS_COMPUTE_32F, fp32 alpha = 1, beta = 0), y in bf16 or fp32.
//
// In cuBLAS's column-major terms this is y^T[n, m] = op_T(w) · x^T: A = w (k x n, lda k,
// transposed), B = x (k x m, ldb k), C = D = y^T (n x m, ldc n), so the small token
// dimension m is cuBLAS's n (narrow tiles) and no copy or transpose is made.
//
// One LtGemm owns one cuBLASLt handle and one 32 MiB workspace (the Hopper recommendation),
// both made by Init() (cudaMalloc: call it before any graph capture). The algorithm for a
// shape (m, n, k, y dtype) is chosen once by cublasLtMatmulAlgoGetHeuristic and cached with
// its descriptors; Prepare() does that ahead of time (for every CUDA-graph batch size), and
// Run() does it on a first use. Run() itself only launches, so it is graph-capturable once
// its shape is prepared.
//
// Batch invariance: only algorithms without a split-K reduction are accepted (reduction
// scheme NONE, split-K count 1), so each output element's k-sum is one sequence inside one
// CTA. Whether the chosen kernels for different m sum in the same order is the cuBLAS
// implementation's business; tests/gpu/kernel_gemm_test checks rows bitwise across m.
//
// Requirements (checked, CUBLAS_STATUS_INVALID_VALUE otherwise): m, n, k > 0, k and n
// multiples of 8 (16-byte rows), x, w and y 16-byte aligned, y_dtype kBF16 or kF32.
// Thread safety: Prepare and Run may be called from several threads (the cache is locked);
// launches on one stream at a time share the workspace, as cuBLAS requires.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <tuple>

#include "engine/model/dtype.h"

namespace morserve::kernels {

struct GemmParams {
  const uint16_t* x = nullptr;  // [m, k] bf16
  const uint16_t* w = nullptr;  // [n, k] bf16
  void* y = nullptr;            // [m, n], y_dtype
  DType y_dtype = DType::kBF16;
  int m = 0;
  int n = 0;
  int k = 0;
};

class LtGemm {
 public:
  static constexpr size_t kWorkspaceBytes = size_t{32} << 20;

  LtGemm() = default;
  ~LtGemm();
  LtGemm(const LtGemm&) = delete;
  LtGemm& operator=(const LtGemm&) = delete;

  // Creates the handle and the workspace. CUBLAS_STATUS_ALLOC_FAILED when the workspace
  // cannot be allocated; calling it twice is an error (CUBLAS_STATUS_INVALID_VALUE).
  cublasStatus_t Init();
  // Chooses and caches the algorithm for a shape. CUBLAS_STATUS_NOT_SUPPORTED when cuBLASLt
  // offers no algorithm without a split-K reduction.
  cublasStatus_t Prepare(int m, int n, int k, DType y_dtype);
  // y = x · w^T on `stream`.
  cublasStatus_t Run(const GemmParams& p, cudaStream_t stream);

  size_t num_cached_shapes() const;

 private:
  using Key = std::tuple<int, int, int, DType>;
  struct Plan {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    cublasLtMatmulAlgo_t algo{};
  };
  // The cached plan for a shape, creating it on first use; nullptr and *status on failure.
  const Plan* FindOrCreate(int m, int n, int k, DType y_dtype, cublasStatus_t* status);
  static void Destroy(Plan& plan);

  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  mutable std::mutex mu_;
  std::map<Key, Plan> plans_;
};

// Human-readable name of a status (cublasLtGetStatusString).
const char* GemmStatusString(cublasStatus_t status);

}  // namespace morserve::kernels
