// The sampler's pre-temperature stages on the device, launcher and kernel; the contract is in
// logit_process.cuh.
#include "kernels/common.cuh"
#include "kernels/launch.cuh"
#include "kernels/logit_process.cuh"

namespace morserve::kernels {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 4096;

// One op's value, in the CPU sampler's order (see the header).
__device__ __forceinline__ float OpValue(const LogitOp& op, const LogitRowProcess& row, float raw) {
  float x = row.masked != 0 && (op.flags & kLogitOpAllowed) == 0 ? -INFINITY : raw;
  if ((op.flags & kLogitOpBias) != 0) x = __fadd_rn(x, op.bias);
  if ((op.flags & kLogitOpBanned) != 0) x = -INFINITY;
  if ((op.flags & kLogitOpSeen) != 0) {
    if (row.repetition != 1.0f) {
      x = x > 0.0f ? __fdiv_rn(x, row.repetition) : __fmul_rn(x, row.repetition);
    }
    x = __fsub_rn(x, __fmul_rn(row.frequency, static_cast<float>(op.count)));
    if (op.count > 0) x = __fsub_rn(x, row.presence);
  }
  return x;
}

__global__ void __launch_bounds__(kThreads)
    LogitProcessKernel(const float* __restrict__ logits, int64_t stride, int vocab,
                       float* __restrict__ out, const LogitRowProcess* __restrict__ rows,
                       int n_rows, const LogitOp* __restrict__ ops) {
  for (int64_t i = blockIdx.x; i < n_rows; i += gridDim.x) {
    const LogitRowProcess row = rows[i];
    const float* raw = logits + static_cast<int64_t>(row.src_row) * stride;
    float* dst = out + i * vocab;
    for (int v = threadIdx.x; v < vocab; v += kThreads)
      dst[v] = row.masked != 0 ? -INFINITY : raw[v];
    __syncthreads();  // the ops overwrite entries another thread copied
    for (int j = row.op_begin + static_cast<int>(threadIdx.x); j < row.op_end; j += kThreads) {
      const LogitOp op = ops[j];
      if (op.id < 0 || op.id >= vocab) continue;
      dst[op.id] = OpValue(op, row, raw[op.id]);
    }
    __syncthreads();  // the next row's copy must not race this row's ops (same CTA, other rows)
  }
}

}  // namespace

cudaError_t logit_process_forward(const LogitProcessParams& p, cudaStream_t stream) {
  const int64_t stride = p.row_stride == 0 ? p.vocab : p.row_stride;
  if (p.n_rows < 0 || p.vocab <= 0 || stride < p.vocab) return cudaErrorInvalidValue;
  if (p.n_rows == 0) return cudaSuccess;
  if (p.logits == nullptr || p.out == nullptr || p.rows == nullptr) return cudaErrorInvalidValue;
  const unsigned grid = static_cast<unsigned>(std::min<int64_t>(p.n_rows, kMaxBlocks));
  MORSERVE_LAUNCH(grid, kThreads, 0, stream, LogitProcessKernel)
  (p.logits, stride, p.vocab, p.out, p.rows, p.n_rows, p.ops);
  return cudaGetLastError();
}

}  // namespace morserve::kernels
