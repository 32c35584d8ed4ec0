// SwiGLU's activation: the scalar build and the dispatch (see silu_mul.h).
#include "engine/cpu/silu_mul.h"

#include <cmath>

#include "engine/cpu/kernel_choice.h"

namespace morserve {

// Cloned for hosts with a hardware FMA (std::fma is a libm call otherwise, about 8x slower);
// the fused result is exact either way, so the clones give the same bits.
__attribute__((target_clones("fma", "default"))) void SiluMulScalar(const float* gate,
                                                                    const float* up, int64_t count,
                                                                    float* out) {
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
    const SiluMulFn avx512 = SiluMulAvx512(), avx2 = SiluMulAvx2();
    if (want == "scalar") return &SiluMulScalar;
    if (avx512 != nullptr && want != "avx2") return avx512;
    return avx2 != nullptr ? avx2 : &SiluMulScalar;
  }();
  fn(gate, up, static_cast<int64_t>(rows) * n, out);
}

}  // namespace morserve
