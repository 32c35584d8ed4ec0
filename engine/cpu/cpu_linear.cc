// CpuLinear: column ranges of one linear call spread over the thread pool (see cpu_linear.h).
#include "engine/cpu/cpu_linear.h"

#include <algorithm>

#include "engine/core/check.h"

namespace morserve {

CpuLinear::CpuLinear(LinearWeights w, ThreadPool* pool, const LinearKernelSet* kernels,
                     int64_t* bytes_read)
    : w_(std::move(w)),
      pool_(pool ? pool : DefaultThreadPool()),
      kernels_(kernels ? kernels : &BestLinearKernels()),
      bytes_read_(bytes_read) {
  MORSERVE_CHECK(w_.n() > 0 && w_.k() > 0, "CpuLinear needs n > 0 and k > 0");
  if (w_.format() == WeightFormat::kAmxBf16 && kernels == nullptr) {
    MORSERVE_CHECK(AmxBf16BestLinearKernels() != nullptr,
                   "amx-bf16 weights: this CPU has neither a usable AMX-BF16 nor AVX-512 BF16");
    kernels_ = AmxBf16BestLinearKernels();
  }
  const bool bf16_dot_set = kernels_ == AmxLinearKernels() || kernels_ == Avx512Bf16LinearKernels();
  MORSERVE_CHECK(bf16_dot_set == (w_.format() == WeightFormat::kAmxBf16),
                 "the AMX and AVX-512 BF16 kernel sets run amx-bf16 weights, and only they do");
  if (w_.format() == WeightFormat::kW8A8 && kernels == nullptr) {
    MORSERVE_CHECK(W8A8BestLinearKernels() != nullptr, "w8a8 weights: this CPU has no AVX2");
    kernels_ = W8A8BestLinearKernels();
  }
  const bool w8a8_set = kernels_ == W8A8VnniLinearKernels() ||
                        kernels_ == W8A8Avx2LinearKernels() ||
                        kernels_ == &W8A8ScalarLinearKernels();
  MORSERVE_CHECK(w8a8_set == (w_.format() == WeightFormat::kW8A8),
                 "the w8a8 kernel sets run w8a8 weights, and only they do");
}

CpuLinear::CpuLinear(const float* w, int n, int k, WeightFormat format, ThreadPool* pool,
                     const LinearKernelSet* kernels)
    : CpuLinear(LinearWeights::FromF32(w, n, k, format), pool, kernels) {}

void CpuLinear::Forward(const float* x, int m, float* y) const { Run(x, m, y, false); }

void CpuLinear::ForwardAccumulate(const float* x, int m, float* y) const { Run(x, m, y, true); }

void CpuLinear::Run(const float* x, int m, float* y, bool accumulate) const {
  if (m <= 0) return;
  LinearArgs args;
  args.x = x;
  args.ldx = w_.k();
  args.m = m;
  args.w = &w_;
  args.y = y;
  args.ldy = w_.n();
  args.accumulate = accumulate;
  if (bytes_read_ != nullptr) *bytes_read_ += w_.bytes();
  if (kernels_->prepare != nullptr) kernels_->prepare(args);
  const int n = w_.n();
  const int unit = ColumnGranularity(w_.format());  // ranges start at whole quads or octets
  const int chunk = (std::max(1, kernels_->chunk_rows(m, w_.k())) + unit - 1) / unit * unit;
  const int64_t chunks = (n + chunk - 1) / chunk;
  if (chunks == 1 || static_cast<int64_t>(m) * n * w_.k() < kSerialWork) {
    kernels_->run(args, 0, n);
    return;
  }
  pool_->ParallelFor(chunks, [&](int64_t begin, int64_t end) {
    kernels_->run(args, static_cast<int>(begin * chunk),
                  static_cast<int>(std::min<int64_t>(n, end * chunk)));
  });
}

}  // namespace morserve
