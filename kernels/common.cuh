// Helpers shared by the kernels: bf16 <-> fp32 conversion on the device and the grid size
// the host launchers of grid-stride kernels use. Device code only sees what is declared under
// __CUDACC__, so the op headers (*.cuh) stay includable from plain C++ (tests, the engine's CUDA
// backend).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

namespace morserve::kernels {

// Blocks of `threads` for a grid-stride loop over n elements: one element per thread, at most
// max_blocks (the loop covers the rest).
inline unsigned GridStrideBlocks(int64_t n, int threads, int64_t max_blocks) {
  return static_cast<unsigned>(std::min<int64_t>((n + threads - 1) / threads, max_blocks));
}

}  // namespace morserve::kernels

#ifdef __CUDACC__
#include <cuda_bf16.h>

namespace morserve::kernels {

// bf16 tensors are passed as raw uint16 bit patterns (the engine's convention); these are the
// exact widening and the round-to-nearest-even narrowing that PyTorch uses.
__device__ __forceinline__ float Bf16BitsToF32(uint16_t b) {
  return __uint_as_float(static_cast<uint32_t>(b) << 16);
}
__device__ __forceinline__ uint16_t F32ToBf16Bits(float f) {
  return __bfloat16_as_ushort(__float2bfloat16_rn(f));
}

// Loads/stores one element of a tensor whose element type is a template argument:
// float, or uint16_t holding bf16 bits.
template <typename T>
__device__ __forceinline__ float LoadF32(const T* p, int64_t i);
template <>
__device__ __forceinline__ float LoadF32<float>(const float* p, int64_t i) {
  return p[i];
}
template <>
__device__ __forceinline__ float LoadF32<uint16_t>(const uint16_t* p, int64_t i) {
  return Bf16BitsToF32(p[i]);
}

template <typename T>
__device__ __forceinline__ void StoreF32(T* p, int64_t i, float v);
template <>
__device__ __forceinline__ void StoreF32<float>(float* p, int64_t i, float v) {
  p[i] = v;
}
template <>
__device__ __forceinline__ void StoreF32<uint16_t>(uint16_t* p, int64_t i, float v) {
  p[i] = F32ToBf16Bits(v);
}

// One warp's tensor-core D = A B + C for a 16 x 16 bf16 A (row-major fragments), a 16 x 8 bf16
// B (column-major fragments) and fp32 C/D: mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32,
// fragments as in the PTX ISA (kernels/emu/cuda_emu.h's Mma spells the layout out). Each D
// element depends only on its A row, its B column and its C element.
__device__ __forceinline__ void MmaBf16M16N8K16(float d[4], const uint32_t a[4],
                                                const uint32_t b[2], const float c[4]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%10, %11, %12, %13};\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]),
        "f"(c[2]), "f"(c[3]));
}

// An asynchronous 16-byte copy from global to shared memory (cp.async.cg, sm_80+: the data
// skips the registers and L1), and the wait for every copy this thread issued. Both pointers
// must be 16-byte aligned. The emulator's pair copies at once and waits for nothing.
__device__ __forceinline__ void CopyAsync16(void* smem_dst, const void* gmem_src) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem_dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(gmem_src) : "memory");
}
__device__ __forceinline__ void WaitAsyncCopies() {
  asm volatile("cp.async.wait_all;\n" ::: "memory");
}

}  // namespace morserve::kernels
#endif  // __CUDACC__
