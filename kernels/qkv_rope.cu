// QKV epilogue launcher; the kernel is in qkv_rope_kernels.cuh, the contract in qkv_rope.cuh.
#include "kernels/launch.cuh"
#include "kernels/qkv_rope.cuh"
#include "kernels/qkv_rope_kernels.cuh"

namespace morserve::kernels {

cudaError_t qkv_rope_forward(const QkvRopeParams& p, cudaStream_t stream) {
  if (p.rows < 0 || p.n_heads <= 0 || p.n_kv_heads <= 0 || p.head_dim <= 0 || p.head_dim % 2 != 0 ||
      p.head_dim / 2 > kMaxHalf || !(p.theta > 0.0f) || !std::isfinite(p.theta) ||
      (p.qkv_dtype != DType::kBF16 && p.qkv_dtype != DType::kF32) ||
      (p.k_out == nullptr) != (p.v_out == nullptr) || p.num_slots < 0 ||
      (p.qk_bias != nullptr) != (p.bias_variants > 0) ||
      (p.bias_index != nullptr && p.qk_bias == nullptr)) {
    return cudaErrorInvalidValue;
  }
  if (p.rows == 0) return cudaSuccess;
  if (p.qkv == nullptr || p.positions == nullptr || p.q_out == nullptr ||
      (p.write_slot != nullptr && (p.k_cache == nullptr || p.v_cache == nullptr))) {
    return cudaErrorInvalidValue;
  }
  if (p.qkv_dtype == DType::kBF16) {
    MORSERVE_LAUNCH(p.rows, kThreads, 0, stream, QkvRopeKernel<uint16_t>)(p);
  } else {
    MORSERVE_LAUNCH(p.rows, kThreads, 0, stream, QkvRopeKernel<float>)(p);
  }
  return cudaGetLastError();
}

}  // namespace morserve::kernels
