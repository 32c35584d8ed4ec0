// CTA-wide reductions and warp scans shared by kernel bodies. Like the *_kernels.cuh headers it is
// compiled by nvcc, or on the CPU by kernels/emu/cuda_emu.h (MORSERVE_CUDA_EMU), so it uses nothing
// but the CUDA keywords and intrinsics the emulator defines; include it after either.
#pragma once

namespace morserve::kernels {

// Sum over the CTA of one value per thread: a shuffle tree in each warp, then the kNumWarps
// warps' partials added in warp order, so the result depends only on the launch shape. Every
// thread gets the result. scratch: kNumWarps values of shared memory (T: float, or double for
// fp64 sums); it may be reused by the next call (the trailing barrier guards it).
template <int kNumWarps, typename T>
__device__ T BlockSum(T v, T* scratch) {
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = v;
  __syncthreads();
  T total = 0;
  for (int w = 0; w < kNumWarps; ++w) total += scratch[w];
  __syncthreads();  // scratch may be reused by the next call
  return total;
}

// Inclusive prefix sum over the 32 lanes of a warp (lane l gets the sum of lanes 0..l), by
// shuffles in a fixed order. Every lane of the warp must call it.
template <typename T>
__device__ T WarpInclusiveScan(T v) {
  const int lane = threadIdx.x % 32;
  for (int off = 1; off < 32; off <<= 1) {
    const T up = __shfl_up_sync(0xffffffffu, v, off);
    if (lane >= off) v += up;
  }
  return v;
}

}  // namespace morserve::kernels
