// Device sampling launcher; the kernel is in sampling_kernels.cuh, the contract in
// sampling.cuh.
#include "kernels/launch.cuh"
#include "kernels/sampling.cuh"
#include "kernels/sampling_kernels.cuh"

namespace morserve::kernels {

double SamplingUniform(uint64_t seed, uint64_t step) { return Uniform(seed, step); }

cudaError_t sampling_forward(const DeviceSamplingParams& p, cudaStream_t stream) {
  const int64_t stride = p.row_stride == 0 ? p.vocab : p.row_stride;
  if (p.rows < 0 || p.vocab <= 0 || stride < p.vocab) return cudaErrorInvalidValue;
  if (p.rows == 0) return cudaSuccess;
  if (p.logits == nullptr || p.temperature == nullptr || p.top_k == nullptr || p.top_p == nullptr ||
      p.min_p == nullptr || p.seed == nullptr || p.step == nullptr || p.token == nullptr) {
    return cudaErrorInvalidValue;
  }
  if ((p.processed == nullptr) != (p.processed_row == nullptr)) return cudaErrorInvalidValue;
  Args a{p.logits, stride, p.vocab, p.temperature,  p.top_k,     p.top_p,        p.min_p,
         p.seed,   p.step, p.token, p.chosen_logit, p.processed, p.processed_row};
  MORSERVE_LAUNCH(p.rows, kThreads, 0, stream, SampleKernel)(a);
  return cudaGetLastError();
}

}  // namespace morserve::kernels
