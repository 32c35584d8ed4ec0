// The fixed-order GEMM: y[m, n] = x[m, k] · w[n, k]^T with bf16 x and w (row-major: activations
// and a Linear's [out, in] weight) and fp32 y, on tensor cores (mma.sync m16n8k16, fp32
// accumulation), in one summation order that does not depend on m. The CUDA runner uses it
// for every GEMM with `--cuda-gemm fixed`, and for a shape cuBLASLt cannot pin (kernels/gemm.cuh:
// no algorithm without split-K that runs at every M bucket) with `--cuda-gemm auto`.
//
// The order, which is the kernel's contract: k is cut into chunks of kFixedGemmChunk (the last
// may be shorter); chunk c's partial p_c of an element is a chain of mma.sync instructions over
// its 32-wide k spans in ascending order, starting from +0; the element is
// (((p_0 + p_1) + p_2) + ...) in fp32. Within a span, each mma sums 16 of its k values (a fixed
// permutation of the span, the same for every element). An element's mma chain reads only its
// own row of x and row of w, so its bits are the same at every m, every tile shape and either
// schedule below (tests/gpu/kernel_fixed_gemm_test checks rows bitwise across m and schedules):
// - one pass: a warp owns a 16-column x (8, 16 or 32)-row tile and adds its chunks in
//   registers;
// - split: at small m and narrow n (too few tiles to keep the GPU's memory busy) a warp owns
//   one chunk of a 16 x 8 tile and writes p_c to the workspace; a second kernel adds the
//   partials in chunk order. The same sums, so the same bits.
// The schedule is picked from the shape and the workspace given (FixedGemmWorkspaceBytes).
//
// Batch-1 decode is a GEMV here: an mma's 8-token side carries 1 real row, but tensor cores have
// 8x the throughput the weight read needs, so the kernel stays bound by reading w (16-byte
// loads, a fixed chunk per warp, many warps in flight).
//
// Requirements (cudaErrorInvalidValue otherwise): m, n, k > 0, k % 8 == 0 (16-byte rows),
// x and w 16-byte aligned, y non-null; a non-null workspace of workspace_bytes when the
// split schedule is wanted (a smaller one means the one-pass schedule: the same bits).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace morserve::kernels {

// k per partial sum: part of the arithmetic (changing it changes every element's bits).
constexpr int kFixedGemmChunk = 128;

// Which schedule runs: picked from the shape and the workspace, or forced (the tests run each
// one to check they give the same bits).
enum class FixedGemmSchedule {
  kAuto,
  kOnePass8,   // one pass, 8 x rows per warp
  kOnePass16,  // 16
  kOnePass32,  // 32
  kSplit,      // needs k > kFixedGemmChunk and FixedGemmWorkspaceBytes(kSplit, ...) of workspace
};

struct FixedGemmParams {
  const uint16_t* x = nullptr;  // [m, k] bf16
  const uint16_t* w = nullptr;  // [n, k] bf16
  float* y = nullptr;           // [m, n] fp32
  int m = 0;
  int n = 0;
  int k = 0;
  float* workspace = nullptr;  // the split schedule's partials
  size_t workspace_bytes = 0;
  FixedGemmSchedule schedule = FixedGemmSchedule::kAuto;
};

// The workspace a call of this shape wants: what the split schedule needs where kAuto would
// split given enough of it (0 where it runs in one pass); kSplit: what it needs.
size_t FixedGemmWorkspaceBytes(int m, int n, int k,
                               FixedGemmSchedule schedule = FixedGemmSchedule::kAuto);

// True when a call of this shape with `workspace_bytes` runs the split schedule (two launches).
bool FixedGemmSplits(int m, int n, int k, size_t workspace_bytes,
                     FixedGemmSchedule schedule = FixedGemmSchedule::kAuto);

// Launches on `stream` (one kernel, or two for the split schedule; graph-capturable: no
// allocation, no synchronisation).
cudaError_t fixed_gemm_forward(const FixedGemmParams& p, cudaStream_t stream);

}  // namespace morserve::kernels
