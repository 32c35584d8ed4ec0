// CpuLinear: y[M, N] = x[M, K] · W^T for one linear layer, on the CPU linear kernels
// (linear_kernels.h) and the thread pool.
//
// Batch invariance (bit for bit): every output element is computed in the kernels' one fixed
// order by exactly one thread, so row i of y depends only on row i of x and on W, never on M,
// on the other rows, or on the thread count. The pool gets ranges of output columns (whole
// multiples of the kernel set's chunk), never a split of K.
//
// The weights (linear_weights.h) are read in their resident format: rows of a checkpoint
// tensor in place (bf16, f16, f32: no copy), or one packed copy (conversions, int8).
#pragma once

#include <cstdint>
#include <string_view>

#include "engine/cpu/linear_kernels.h"
#include "engine/cpu/linear_weights.h"
#include "engine/cpu/thread_pool.h"

namespace morserve {

class CpuLinear {
 public:
  // pool: where Forward runs its ranges (nullptr: DefaultThreadPool()); kernels: nullptr picks
  // BestLinearKernels(); bytes_read: when given, every call adds the bytes of W it read.
  explicit CpuLinear(LinearWeights w, ThreadPool* pool = nullptr,
                     const LinearKernelSet* kernels = nullptr, int64_t* bytes_read = nullptr);
  // w: [n, k] row-major fp32, copied into `format` (converted or quantized).
  CpuLinear(const float* w, int n, int k, WeightFormat format = WeightFormat::kF32,
            ThreadPool* pool = nullptr, const LinearKernelSet* kernels = nullptr);
  CpuLinear(const CpuLinear&) = delete;
  CpuLinear& operator=(const CpuLinear&) = delete;

  int n() const { return w_.n(); }
  int k() const { return w_.k(); }
  WeightFormat format() const { return w_.format(); }
  const LinearWeights& weights() const { return w_; }
  std::string_view kernel_name() const { return kernels_->name; }

  // y[m, n] = x[m, k] · W^T. x and y are row-major and must not overlap. m == 0 is a no-op.
  void Forward(const float* x, int m, float* y) const;
  // y[m, n] += x[m, k] · W^T (each element: y + the full dot product, rounded once more).
  void ForwardAccumulate(const float* x, int m, float* y) const;

  // Multiply-adds below which a call runs on the calling thread alone.
  static constexpr int64_t kSerialWork = 1 << 15;

 private:
  void Run(const float* x, int m, float* y, bool accumulate) const;

  LinearWeights w_;
  ThreadPool* pool_;
  const LinearKernelSet* kernels_;
  int64_t* bytes_read_;
};

}  // namespace morserve
