// SwiGLU's activation: the scalar build and the dispatch (see silu_mul.h).
#include "engine/cpu/silu_mul.h"

#include <cmath>

#include "engine/cpu/kernel_choice.h"

namespace morserve {

void SiluMulScalar(const float* gate, const float* up, int64_t count, float* out) {
  for (int64_t i = 0; i < count; ++i) {
    const double g = gate[i];
    // -inf: libm's e^inf makes the reference's -inf / inf a NaN; the clamp would not.
    const double s = g == -INFINITY ? std::nan("") : g / (1.0 + ExpDouble(-g));
    out[i] = static_cast<float>(s * static_cast<double>(up[i]));
  }
}

void SiluMulRows(const float* gate, const float* up, int rows, int n, float* out) {
  static const SiluMulFn fn = [] {
    const std::string_view want = RequestedCpuKernels();
    const SiluMulFn avx512 = SiluMulAvx512();
    return want == "scalar" || want == "avx2" || avx512 == nullptr ? &SiluMulScalar : avx512;
  }();
  fn(gate, up, static_cast<int64_t>(rows) * n, out);
}

}  // namespace morserve
