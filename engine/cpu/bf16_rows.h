// fp32 rows rounded to bf16 for the bf16-compute kernel sets (the AMX set and the AVX-512 BF16
// set, linear_kernels.h): each projection's input is rounded once, and both sets round alike.
#pragma once

#include <cstdint>

namespace morserve {

// x rows [m, k] (ldx floats apart) -> bf16 rounded to nearest even, rows of kp >= k values with
// zeros past k, in `out` (m * kp values). Rounds on the integer bits, so every host gives the
// same values (denormals kept; NaN never reaches a projection). Needs AVX-512 F/BW.
void RoundRowsToBf16Avx512(const float* x, int64_t ldx, int m, int k, int kp, uint16_t* out);

}  // namespace morserve
