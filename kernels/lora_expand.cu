// Segmented LoRA expand-and-add launcher (validation, dispatch on t's dtype and the rank's
// shared-memory pass width); the kernel is in lora_expand_kernels.cuh, the contract in
// lora_expand.cuh.
#include "kernels/launch.cuh"
#include "kernels/lora_expand.cuh"
#include "kernels/lora_expand_kernels.cuh"

namespace morserve::kernels {
namespace {

template <typename TT, int kChunk>
cudaError_t Launch(const LoraExpandParams& p, cudaStream_t stream) {
  MORSERVE_LAUNCH(LoraExpandGrid(p.rows, p.num_segments, p.out), kExpandThreads, 0, stream,
                  LoraExpandKernel<TT, kChunk>)
  (static_cast<const TT*>(p.t), p.b, p.y, p.seg_indptr, p.seg_loop, p.num_segments, p.rows, p.out,
   p.rank, p.num_loops);
  return cudaGetLastError();
}

template <typename TT>
cudaError_t LaunchChunk(const LoraExpandParams& p, cudaStream_t stream) {
  switch (LoraExpandChunk(p.rank)) {
    case 16:
      return Launch<TT, 16>(p, stream);
    case 32:
      return Launch<TT, 32>(p, stream);
    default:
      return Launch<TT, 64>(p, stream);
  }
}

}  // namespace

cudaError_t lora_expand_forward(const LoraExpandParams& p, cudaStream_t stream) {
  if (p.rows < 0 || p.num_segments < 0 || p.out <= 0 || p.rank < 1 || p.rank > kLoraMaxRank ||
      p.num_loops < 1 || (p.t_dtype != DType::kF32 && p.t_dtype != DType::kBF16) ||
      LoraTileCount(p.rows, p.num_segments, kExpandTileRows) > 0x7fffffff ||
      (p.out + kExpandThreads - 1) / kExpandThreads > 65535) {
    return cudaErrorInvalidValue;
  }
  if (p.rows == 0 || p.num_segments == 0) return cudaSuccess;
  if (p.t == nullptr || p.b == nullptr || p.y == nullptr || p.seg_indptr == nullptr ||
      p.seg_loop == nullptr) {
    return cudaErrorInvalidValue;
  }
  return p.t_dtype == DType::kF32 ? LaunchChunk<float>(p, stream)
                                  : LaunchChunk<uint16_t>(p, stream);
}

}  // namespace morserve::kernels
