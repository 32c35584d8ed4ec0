// CTA-wide reductions shared by kernel bodies. Like the *_kernels.cuh headers it is compiled
// by nvcc, or on the CPU by tests/gpu/cuda_emu.h (MORSERVE_CUDA_EMU), so it uses nothing but
// the CUDA keywords and intrinsics the emulator defines; include it after either.
#pragma once

namespace morserve::kernels {

// Sum over the CTA of one value per thread: a shuffle tree in each warp, then the kNumWarps
// warps' partials added in warp order, so the result depends only on the launch shape. Every
// thread gets the result. scratch: kNumWarps floats of shared memory; it may be reused by the
// next call (the trailing barrier guards it).
template <int kNumWarps>
__device__ float BlockSum(float v, float* scratch) {
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = v;
  __syncthreads();
  float total = 0.0f;
  for (int w = 0; w < kNumWarps; ++w) total += scratch[w];
  __syncthreads();  // scratch may be reused by the next call
  return total;
}

}  // namespace morserve::kernels
