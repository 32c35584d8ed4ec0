// Greedy argmax launcher; the kernel is in argmax_kernels.cuh, the contract in argmax.cuh.
#include "kernels/argmax.cuh"
#include "kernels/argmax_kernels.cuh"
#include "kernels/launch.cuh"
#include "kernels/logit_rows.cuh"

namespace morserve::kernels {

cudaError_t argmax_forward(const ArgmaxParams& p, cudaStream_t stream) {
  int64_t stride = 0;
  if (const cudaError_t err = CheckLogitRows(p.rows, p.vocab, p.row_stride, p.dtype, &stride);
      err != cudaSuccess) {
    return err;
  }
  if (p.rows == 0) return cudaSuccess;
  if (p.logits == nullptr || p.token == nullptr) return cudaErrorInvalidValue;
  if (p.dtype == DType::kBF16) {
    MORSERVE_LAUNCH(p.rows, kThreads, 0, stream, ArgmaxKernel<uint16_t>)
    (static_cast<const uint16_t*>(p.logits), stride, p.vocab, p.token, p.max_logit);
  } else {
    MORSERVE_LAUNCH(p.rows, kThreads, 0, stream, ArgmaxKernel<float>)
    (static_cast<const float*>(p.logits), stride, p.vocab, p.token, p.max_logit);
  }
  return cudaGetLastError();
}

}  // namespace morserve::kernels
