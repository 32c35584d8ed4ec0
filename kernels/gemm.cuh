// cuBLASLt GEMM for the linear layers: y[m, n] = x[m, k] · w[n, k]^T with bf16 x and w
// (row-major: activations and a Linear's [out, in] weight), fp32 accumulation (compute type
// CUBLAS_COMPUTE_32F, fp32 alpha = 1, beta = 0), y in bf16 or fp32.
//
// In cuBLAS's column-major terms this is y^T[n, m] = op_T(w) · x^T: A = w (k x n, lda k,
// transposed), B = x (k x m, ldb k), C = D = y^T (n x m, ldc n), so the small token
// dimension m is cuBLAS's n (narrow tiles) and no copy or transpose is made.
//
// One LtGemm owns one cuBLASLt handle and one 32 MiB workspace (the Hopper recommendation),
// both made by Init() (cudaMalloc: call it before any graph capture).
//
// Batch invariance: a row's bits must not depend on how many rows share the GEMM. cuBLASLt's
// heuristic picks a different kernel as m changes (narrow problems favour kernels that slice
// k across warps and add the slices at the end), and two kernels sum an element's k range in
// different orders even without split-K. So each (n, k, y dtype) gets one algorithm for the
// LtGemm's lifetime, pinned by Pin() (or by the first Run() of that shape): among the
// algorithms without a split-K reduction (reduction scheme NONE, split-K count 1) that the
// heuristic offers at any M bucket 1, 2, 4, ..., kPinMaxM, the one with the best sum of ranks
// over the buckets (a bucket that does not offer it counts as the list's length) that runs at
// every bucket: offered there, or accepted by cublasLtMatmulAlgoCheck within the workspace.
// (On an H200 with CUDA 13 the heuristic's lists at m = 1 and m = 8192 share no algorithm, so
// a pin must rest on the check, not on the offers.) A Run() with m over the buckets checked so
// far checks the pinned algorithm at the buckets up to m (CUBLAS_STATUS_NOT_SUPPORTED if it
// cannot run there: never a silent switch). Every m then runs the same kernel, whose per-element k
// order does not depend on m (tests/gpu/kernel_gemm_test checks rows bitwise across m on the GPU;
// the emulated cuBLASLt's algorithms sum in algorithm-dependent orders, so kernel_gemm_emu_test and
// the engine's invariance tests fail on the emulator when a shape is not pinned). Prepare() also
// makes the descriptors of one m ahead of time (for CUDA-graph batch sizes); Run() itself only
// launches once its shape is prepared, so it is graph-capturable.
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
#include <string>
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
  // The largest M bucket Pin() checks (powers of two from 1).
  static constexpr int kPinMaxM = 8192;

  // Pins the algorithm of (n, k, y dtype) (see above); a second call for a pinned shape does
  // nothing. CUBLAS_STATUS_NOT_SUPPORTED when no algorithm without split-K runs at every
  // bucket.
  cublasStatus_t Pin(int n, int k, DType y_dtype);
  // Pins the shape's algorithm and makes the descriptors for m.
  cublasStatus_t Prepare(int m, int n, int k, DType y_dtype);
  // y = x · w^T on `stream`.
  cublasStatus_t Run(const GemmParams& p, cudaStream_t stream);

  // Shapes (m, n, k, y dtype) with descriptors; pinned (n, k, y dtype) shapes.
  size_t num_cached_shapes() const;
  size_t num_pinned() const;
  // One line for logs: per M bucket how many algorithms the heuristic offers (all, and without
  // split-K), and the configuration pinned for (n, k, y dtype) (pinning it if needed).
  std::string Describe(int n, int k, DType y_dtype);
  // CUBLASLT_ALGO_CONFIG_ID of the algorithm pinned for (n, k, y dtype); -1 when not pinned.
  int pinned_algorithm_id(int n, int k, DType y_dtype) const;

 private:
  using Key = std::tuple<int, int, int, DType>;  // m, n, k, y dtype
  using PinKey = std::tuple<int, int, DType>;    // n, k, y dtype
  struct Plan {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    cublasLtMatmulAlgo_t algo{};
  };
  struct Pinned {
    cublasLtMatmulAlgo_t algo{};
    int checked_m = 0;  // the largest M bucket the algorithm was checked at
  };
  // The pinned algorithm of a shape, pinning it (or checking it up to m) as needed; nullptr
  // and *status on failure. mu_ held.
  const Pinned* PinLocked(int m, int n, int k, DType y_dtype, cublasStatus_t* status);
  // The cached plan for a shape, creating it on first use; nullptr and *status on failure.
  const Plan* FindOrCreate(int m, int n, int k, DType y_dtype, cublasStatus_t* status);
  static void Destroy(Plan& plan);

  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  mutable std::mutex mu_;
  std::map<Key, Plan> plans_;
  std::map<PinKey, Pinned> pinned_;
};

// Human-readable name of a status (cublasLtGetStatusString).
const char* GemmStatusString(cublasStatus_t status);

}  // namespace morserve::kernels
