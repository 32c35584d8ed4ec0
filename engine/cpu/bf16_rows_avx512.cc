// PrepareBf16Rows (bf16_rows.h): 16 values per step, masked at the row's end.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "engine/cpu/bf16_rows.h"
#include "engine/cpu/simd_intrinsics.h"
#include "engine/cpu/simd_target.h"

namespace morserve {
namespace {

MORSERVE_BEGIN_TARGET("avx512f,avx512bw")

// x rows [m, k] (ldx floats apart) -> bf16 rows of kp >= k values, zeros past k.
void RoundRows(const float* x, int64_t ldx, int m, int k, int kp, uint16_t* out) {
  const __m512i one = _mm512_set1_epi32(1), bias = _mm512_set1_epi32(0x7fff);
  for (int i = 0; i < m; ++i) {
    const float* src = x + i * ldx;
    uint16_t* dst = out + static_cast<int64_t>(i) * kp;
    for (int p = 0; p < kp; p += 16) {
      const int count = std::clamp(k - p, 0, 16);
      const __mmask16 mask = static_cast<__mmask16>((1u << count) - 1u);
      const __m512i bits = _mm512_castps_si512(_mm512_maskz_loadu_ps(mask, src + p));
      const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), one);
      const __m512i rounded =
          _mm512_srli_epi32(_mm512_add_epi32(bits, _mm512_add_epi32(bias, lsb)), 16);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + p), _mm512_cvtepi32_epi16(rounded));
    }
  }
}

MORSERVE_END_TARGET

}  // namespace

void PrepareBf16Rows(LinearArgs& args, int rows) {
  const int k = args.w->k(), kp = Bf16RowStride(k);
  thread_local std::vector<uint16_t> xa;
  xa.resize(static_cast<size_t>(rows) * kp);
  RoundRows(args.x, args.ldx, args.m, k, kp, xa.data());
  std::fill(xa.begin() + static_cast<int64_t>(args.m) * kp, xa.end(), uint16_t{0});
  args.prepared = xa.data();
}

}  // namespace morserve
