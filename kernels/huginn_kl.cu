// Huginn's exit statistic, launcher and kernel; the contract and the reduction order are in
// huginn_kl.cuh.
#include <cmath>

#include "kernels/block_reduce.cuh"
#include "kernels/common.cuh"
#include "kernels/huginn_kl.cuh"
#include "kernels/launch.cuh"

namespace morserve::kernels {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

// Every thread's v summed over the CTA in the fixed order of huginn_kl.cuh (block_reduce.cuh's
// BlockSum in fp64); every thread gets the sum.
__device__ double CtaSum(double v, double* scratch) { return BlockSum<kWarps>(v, scratch); }

__device__ float CtaMax(float m, float* scratch) {
  for (int off = 16; off > 0; off >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
  if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = m;
  __syncthreads();
  m = -INFINITY;
  for (int w = 0; w < kWarps; ++w) m = fmaxf(m, scratch[w]);
  __syncthreads();
  return m;
}

// log_z of one row: its max, then sum exp(x - max) in fp64.
__device__ double LogPartition(const float* __restrict__ x, int vocab, float* fscratch,
                               double* dscratch) {
  float m = -INFINITY;
  for (int j = threadIdx.x; j < vocab; j += kThreads) m = fmaxf(m, x[j]);
  const double md = CtaMax(m, fscratch);
  double sum = 0.0;
  for (int j = threadIdx.x; j < vocab; j += kThreads) sum += exp(static_cast<double>(x[j]) - md);
  return md + log(CtaSum(sum, dscratch));
}

__global__ void __launch_bounds__(kThreads)
    HuginnKlKernel(const float* __restrict__ logits, float* __restrict__ prev_logits,
                   double* __restrict__ prev_log_z, int64_t capacity,
                   const int32_t* __restrict__ prev_rows, const int32_t* __restrict__ has_prev,
                   double* __restrict__ kl, int vocab) {
  __shared__ float fscratch[kWarps];
  __shared__ double dscratch[kWarps];
  const int64_t i = blockIdx.x;
  const int64_t r = prev_rows[i];
  if (r < 0 || r >= capacity) {
    if (threadIdx.x == 0) kl[i] = NAN;
    return;  // the whole CTA leaves: no barrier is left waiting
  }
  const float* x = logits + i * vocab;
  float* q = prev_logits + r * vocab;
  const double log_z = LogPartition(x, vocab, fscratch, dscratch);
  double sum = 0.0;
  if (has_prev[i] != 0) {
    const double q_log_z = prev_log_z[r];
    for (int j = threadIdx.x; j < vocab; j += kThreads) {
      const double lq = static_cast<double>(q[j]) - q_log_z;
      const double lp = static_cast<double>(x[j]) - log_z;
      sum += exp(lq) * (lq - lp);
    }
  } else {
    const double v = static_cast<double>(vocab);
    for (int j = threadIdx.x; j < vocab; j += kThreads) {
      sum += (-log(v) - (static_cast<double>(x[j]) - log_z)) / v;
    }
  }
  const double total = CtaSum(sum, dscratch);  // its barrier: every read of q is done
  for (int j = threadIdx.x; j < vocab; j += kThreads) q[j] = x[j];
  if (threadIdx.x == 0) {
    kl[i] = total;
    prev_log_z[r] = log_z;
  }
}

}  // namespace

cudaError_t huginn_kl_forward(const HuginnKlParams& p, cudaStream_t stream) {
  if (p.n < 0 || p.vocab <= 0) return cudaErrorInvalidValue;
  if (p.n == 0) return cudaSuccess;
  if (p.logits == nullptr || p.prev_logits == nullptr || p.prev_log_z == nullptr ||
      p.prev_rows == nullptr || p.has_prev == nullptr || p.kl == nullptr || p.capacity < 1) {
    return cudaErrorInvalidValue;
  }
  MORSERVE_LAUNCH(static_cast<unsigned>(p.n), kThreads, 0, stream, HuginnKlKernel)
  (p.logits, p.prev_logits, p.prev_log_z, p.capacity, p.prev_rows, p.has_prev, p.kl, p.vocab);
  return cudaGetLastError();
}

}  // namespace morserve::kernels
