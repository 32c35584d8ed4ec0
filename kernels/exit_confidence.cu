// Early-exit confidence launcher; the kernel is in exit_confidence_kernels.cuh, the contract in
// exit_confidence.cuh.
#include "kernels/exit_confidence.cuh"
#include "kernels/exit_confidence_kernels.cuh"
#include "kernels/launch.cuh"
#include "kernels/logit_rows.cuh"

namespace morserve::kernels {

cudaError_t exit_confidence_forward(const ExitConfidenceParams& p, cudaStream_t stream) {
  int64_t stride = 0;
  if (const cudaError_t err = CheckLogitRows(p.rows, p.vocab, p.row_stride, p.dtype, &stride);
      err != cudaSuccess) {
    return err;
  }
  if (p.rows == 0) return cudaSuccess;
  if (p.logits == nullptr || p.threshold == nullptr || p.exit == nullptr) {
    return cudaErrorInvalidValue;
  }
  if (p.dtype == DType::kBF16) {
    MORSERVE_LAUNCH(p.rows, kThreads, 0, stream, ExitConfidenceKernel<uint16_t>)
    (static_cast<const uint16_t*>(p.logits), stride, p.vocab, p.threshold, p.exit, p.max_prob);
  } else {
    MORSERVE_LAUNCH(p.rows, kThreads, 0, stream, ExitConfidenceKernel<float>)
    (static_cast<const float*>(p.logits), stride, p.vocab, p.threshold, p.exit, p.max_prob);
  }
  return cudaGetLastError();
}

}  // namespace morserve::kernels
