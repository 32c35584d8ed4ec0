// Segmented LoRA shrink launcher (validation, dtype dispatch); the kernel is in
// lora_shrink_kernels.cuh, the contract in lora_shrink.cuh.
#include "kernels/launch.cuh"
#include "kernels/lora_shrink.cuh"
#include "kernels/lora_shrink_kernels.cuh"

namespace morserve::kernels {
namespace {

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

template <typename TT>
cudaError_t Launch(const LoraShrinkParams& p, cudaStream_t stream) {
  MORSERVE_LAUNCH(LoraShrinkGrid(p.rows, p.num_segments, p.rank), kShrinkThreads, 0, stream,
                  LoraShrinkKernel<TT>)
  (p.x, p.a, static_cast<TT*>(p.t), p.seg_indptr, p.seg_loop, p.num_segments, p.rows, p.in, p.rank,
   p.num_loops);
  return cudaGetLastError();
}

}  // namespace

cudaError_t lora_shrink_forward(const LoraShrinkParams& p, cudaStream_t stream) {
  if (p.rows < 0 || p.num_segments < 0 || p.in <= 0 || p.in % 8 != 0 || p.rank < 1 ||
      p.rank > kLoraMaxRank || p.num_loops < 1 ||
      (p.t_dtype != DType::kF32 && p.t_dtype != DType::kBF16) ||
      LoraTileCount(p.rows, p.num_segments, kShrinkRowsPerCta) > 0x7fffffff) {
    return cudaErrorInvalidValue;
  }
  if (p.rows == 0 || p.num_segments == 0) return cudaSuccess;
  if (p.x == nullptr || p.a == nullptr || p.t == nullptr || p.seg_indptr == nullptr ||
      p.seg_loop == nullptr || !Aligned16(p.x) || !Aligned16(p.a)) {
    return cudaErrorInvalidValue;
  }
  return p.t_dtype == DType::kF32 ? Launch<float>(p, stream) : Launch<uint16_t>(p, stream);
}

}  // namespace morserve::kernels
