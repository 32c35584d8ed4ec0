// The w8a8 linear kernel sets (linear_kernels.h): y = x · W^T for weights in the W8A8 format
// (linear_weights.h), with each row of x quantized to int8 as well, so the products are integer
// dot products (VNNI's VPDPBUSD: 64 multiply-adds per instruction) and decode reads one byte per
// weight without converting it. This is llama.cpp's Q8_0 x Q8_0 arithmetic.
//
// The numbers, for one row x of k values and one output column j (groups of 32 along k, the last
// zero-padded):
//   per group g: dx_g = max|x| / 127 (fp32, 0 for an all-zero group),
//                xq_i = nearbyint(x_i / dx_g) clamped to [-127, 127] (0 when dx_g = 0);
//   per group g: idot_g = sum_i (wq_ji + 128) * xq_i - 128 * sum_i xq_i, the exact integer
//                sum_i wq_ji * xq_i (|idot| <= 32 * 127 * 127, exact as an fp32 too);
//   acc = +0; for g in order: acc = fma(float(idot_g), dw_jg * dx_g, acc) (the product rounded
//   once, then one fused multiply-add);  y = acc, or y + acc when accumulating.
// The integer sums are exact in any order, and the fp32 steps run in the one order above for
// every element, so a row's bits depend on its own x only: batch invariance by construction,
// and the VNNI set gives the scalar set's bits (the tests check both).
//
// Kernel shape (VNNI set): one column group (16 columns, one zmm of int32 sums) at a time; rows
// of x in tiles of up to 8, each weight load serving every row of the tile; a group's weights
// are one contiguous 512-byte stream per k group, its scales a second stream.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "engine/core/check.h"
#include "engine/cpu/linear_kernels.h"
#include "engine/cpu/simd_intrinsics.h"
#include "engine/cpu/simd_target.h"
#include "engine/model/dtype.h"

namespace morserve {
namespace {

constexpr int kGroup = LinearWeights::kQ8Group;
constexpr int kCols = LinearWeights::kW8A8GroupCols;
constexpr int kQuads = kGroup / 4;
constexpr int kTileRows = 8;

// The rows of x as int8 groups: q[m][kp], d[m][kg] (fp32 steps), bias[m][kg] (-128 * sum q).
struct QuantizedRows {
  int kp = 0, kg = 0;
  std::vector<int8_t> q;
  std::vector<float> d;
  std::vector<int32_t> bias;

  void Resize(int m, int k) {
    kp = (k + kGroup - 1) / kGroup * kGroup;
    kg = kp / kGroup;
    q.assign(static_cast<size_t>(m) * kp, 0);
    d.assign(static_cast<size_t>(m) * kg, 0.0f);
    bias.assign(static_cast<size_t>(m) * kg, 0);
  }
};

void QuantizeRowsScalar(const LinearArgs& a, QuantizedRows* out) {
  const int k = a.w->k();
  out->Resize(a.m, k);
  for (int i = 0; i < a.m; ++i) {
    const float* x = a.x + i * a.ldx;
    for (int g = 0; g < out->kg; ++g) {
      const int begin = g * kGroup, end = std::min(k, begin + kGroup);
      float amax = 0.0f;
      for (int p = begin; p < end; ++p) amax = std::max(amax, std::fabs(x[p]));
      const float d = amax / 127.0f;
      int32_t sum = 0;
      for (int p = begin; p < end; ++p) {
        const float v = d > 0.0f ? std::clamp(std::nearbyint(x[p] / d), -127.0f, 127.0f) : 0.0f;
        out->q[static_cast<size_t>(i) * out->kp + p] = static_cast<int8_t>(v);
        sum += static_cast<int32_t>(v);
      }
      out->d[static_cast<size_t>(i) * out->kg + g] = d;
      out->bias[static_cast<size_t>(i) * out->kg + g] = -128 * sum;
    }
  }
}

void Store(const LinearArgs& a, int i, int j0, int cols, const float* s) {
  float* y = a.y + i * a.ldy + j0;
  for (int c = 0; c < cols; ++c) y[c] = a.accumulate ? y[c] + s[c] : s[c];
}

// x quantized once per call by the set's prepare (PrepareW8A8), for every range of the call.
const QuantizedRows& Prepared(const LinearArgs& a) {
  MORSERVE_CHECK(a.prepared != nullptr, "the w8a8 kernel sets run after their prepare");
  return *static_cast<const QuantizedRows*>(a.prepared);
}

void RunW8A8Scalar(const LinearArgs& a, int n0, int n1) {
  const LinearWeights& w = *a.w;
  MORSERVE_CHECK(w.format() == WeightFormat::kW8A8, "the w8a8 kernel sets read w8a8 weights only");
  const QuantizedRows& xq = Prepared(a);
  const uint8_t* values = w.w8a8_values();
  const uint16_t* scales = w.w8a8_scales();
  for (int j = n0; j < n1; ++j) {
    for (int i = 0; i < a.m; ++i) {
      float acc = 0.0f;
      for (int g = 0; g < xq.kg; ++g) {
        int32_t idot = xq.bias[static_cast<size_t>(i) * xq.kg + g];
        for (int p = g * kGroup; p < (g + 1) * kGroup; ++p) {
          idot += static_cast<int32_t>(values[W8A8ValueIndex(w.k(), j, p)]) *
                  xq.q[static_cast<size_t>(i) * xq.kp + p];
        }
        const float t = F16ToF32(scales[W8A8ScaleIndex(w.k(), j, g * kGroup)]) *
                        xq.d[static_cast<size_t>(i) * xq.kg + g];
        acc = std::fma(static_cast<float>(idot), t, acc);
      }
      Store(a, i, j, 1, &acc);
    }
  }
}

// One vector path: its tiles of 1..tile_rows rows x one column group.
using QuantizeFn = void (*)(const LinearArgs&, QuantizedRows*);
using TileFn = void (*)(const QuantizedRows&, int, const uint8_t*, const uint16_t*, float*);
struct VectorPath {
  const TileFn* tiles;  // tiles[r] for r rows
  int tile_rows;
};

// A set's prepare: x quantized by `kQuantize` into the calling thread's buffer.
template <QuantizeFn kQuantize>
void PrepareW8A8(LinearArgs& a) {
  thread_local QuantizedRows xq;
  kQuantize(a, &xq);
  a.prepared = &xq;
}

void RunVectorPath(const VectorPath& path, const LinearArgs& a, int n0, int n1) {
  const LinearWeights& w = *a.w;
  MORSERVE_CHECK(w.format() == WeightFormat::kW8A8, "the w8a8 kernel sets read w8a8 weights only");
  MORSERVE_CHECK(n0 % kCols == 0, "w8a8 column ranges start on a group of 16");
  const QuantizedRows& xq = Prepared(a);
  const int64_t group_values = static_cast<int64_t>(xq.kg) * kQuads * 64;
  alignas(64) float out[kTileRows * kCols];
  for (int j0 = n0; j0 < n1; j0 += kCols) {
    const int cols = std::min(kCols, n1 - j0);
    const uint8_t* values = w.w8a8_values() + (j0 / kCols) * group_values;
    const uint16_t* scales = w.w8a8_scales() + static_cast<int64_t>(j0 / kCols) * xq.kg * kCols;
    for (int i0 = 0; i0 < a.m; i0 += path.tile_rows) {
      const int rows = std::min(path.tile_rows, a.m - i0);
      path.tiles[rows](xq, i0, values, scales, out);
      for (int r = 0; r < rows; ++r) Store(a, i0 + r, j0, cols, out + r * kCols);
    }
  }
}

}  // namespace

MORSERVE_BEGIN_TARGET("avx512f,avx512bw,avx512vnni")

namespace {

// The scalar quantization, 16 values at a time: the same divisions and the same rounding
// (nearest even, the default MXCSR mode), so the same int8 values.
void QuantizeRowsVnni(const LinearArgs& a, QuantizedRows* out) {
  const int k = a.w->k();
  out->Resize(a.m, k);
  const __m512i lo = _mm512_set1_epi32(-127), hi = _mm512_set1_epi32(127);
  for (int i = 0; i < a.m; ++i) {
    const float* x = a.x + i * a.ldx;
    for (int g = 0; g < out->kg; ++g) {
      const int begin = g * kGroup;
      const int n = std::min(kGroup, k - begin);
      const auto m0 = static_cast<__mmask16>((1u << std::clamp(n, 0, 16)) - 1u);
      const auto m1 = static_cast<__mmask16>((1u << std::clamp(n - 16, 0, 16)) - 1u);
      const __m512 v0 = _mm512_maskz_loadu_ps(m0, x + begin);
      const __m512 v1 = _mm512_maskz_loadu_ps(m1, x + begin + 16);
      const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
      const float d = amax / 127.0f;
      __m512i q0 = _mm512_setzero_si512(), q1 = _mm512_setzero_si512();
      if (d > 0.0f) {
        const __m512 dv = _mm512_set1_ps(d);
        q0 = _mm512_min_epi32(hi, _mm512_max_epi32(lo, _mm512_cvtps_epi32(_mm512_div_ps(v0, dv))));
        q1 = _mm512_min_epi32(hi, _mm512_max_epi32(lo, _mm512_cvtps_epi32(_mm512_div_ps(v1, dv))));
      }
      int8_t* q = out->q.data() + static_cast<size_t>(i) * out->kp + begin;
      _mm_storeu_si128(reinterpret_cast<__m128i*>(q), _mm512_cvtepi32_epi8(q0));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(q + 16), _mm512_cvtepi32_epi8(q1));
      out->d[static_cast<size_t>(i) * out->kg + g] = d;
      out->bias[static_cast<size_t>(i) * out->kg + g] =
          -128 * _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
    }
  }
}

// Rows i0..i0+R-1 of x times one column group: out[R][16].
template <int R>
void Tile(const QuantizedRows& xq, int i0, const uint8_t* values, const uint16_t* scales,
          float* out) {
  __m512 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  const int8_t* xrow = xq.q.data() + static_cast<size_t>(i0) * xq.kp;
  for (int g = 0; g < xq.kg; ++g) {
    __m512i dot[R];
    for (int r = 0; r < R; ++r)
      dot[r] = _mm512_set1_epi32(xq.bias[static_cast<size_t>(i0 + r) * xq.kg + g]);
    const uint8_t* wg = values + static_cast<size_t>(g) * kQuads * 64;
    for (int q = 0; q < kQuads; ++q) {
      const __m512i wv = _mm512_load_si512(wg + q * 64);
      for (int r = 0; r < R; ++r) {
        int32_t quad;
        std::memcpy(&quad, xrow + static_cast<size_t>(r) * xq.kp + g * kGroup + q * 4, 4);
        dot[r] = _mm512_dpbusd_epi32(dot[r], wv, _mm512_set1_epi32(quad));
      }
    }
    const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256(
        reinterpret_cast<const __m256i*>(scales + static_cast<size_t>(g) * kCols)));
    for (int r = 0; r < R; ++r) {
      const __m512 t =
          _mm512_mul_ps(dw, _mm512_set1_ps(xq.d[static_cast<size_t>(i0 + r) * xq.kg + g]));
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot[r]), t, acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) _mm512_storeu_ps(out + r * kCols, acc[r]);
}

constexpr TileFn kVnniTiles[kTileRows + 1] = {nullptr,  &Tile<1>, &Tile<2>, &Tile<3>, &Tile<4>,
                                              &Tile<5>, &Tile<6>, &Tile<7>, &Tile<8>};

}  // namespace

MORSERVE_END_TARGET

MORSERVE_BEGIN_TARGET("avx2,fma,f16c")

namespace {

// Rows i0..i0+R-1 of x times one column group on AVX2, which has no VNNI: the weights back to
// signed (q = byte ^ 0x80), x's sign moved onto them (VPSIGNB), |x| times the signed weights in
// pairs (VPMADDUBSW: |pair| <= 2 * 127 * 127, no saturation), pairs summed to int32 (VPMADDWD).
// That is the exact sum of q * xq, so the bias term is not added; the fp32 steps are the VNNI
// set's, so the bits are the scalar set's.
template <int R>
void TileAvx2(const QuantizedRows& xq, int i0, const uint8_t* values, const uint16_t* scales,
              float* out) {
  const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80));
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc[R][2];
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
  const int8_t* xrow = xq.q.data() + static_cast<size_t>(i0) * xq.kp;
  for (int g = 0; g < xq.kg; ++g) {
    __m256i dot[R][2];
    for (int r = 0; r < R; ++r) dot[r][0] = dot[r][1] = _mm256_setzero_si256();
    const uint8_t* wg = values + static_cast<size_t>(g) * kQuads * 64;
    for (int q = 0; q < kQuads; ++q) {
      __m256i wv[2];
      for (int h = 0; h < 2; ++h) {
        wv[h] = _mm256_xor_si256(
            flip, _mm256_load_si256(reinterpret_cast<const __m256i*>(wg + q * 64 + h * 32)));
      }
      for (int r = 0; r < R; ++r) {
        int32_t quad;
        std::memcpy(&quad, xrow + static_cast<size_t>(r) * xq.kp + g * kGroup + q * 4, 4);
        const __m256i xb = _mm256_set1_epi32(quad);
        const __m256i xa = _mm256_abs_epi8(xb);
        for (int h = 0; h < 2; ++h) {
          const __m256i pairs = _mm256_maddubs_epi16(xa, _mm256_sign_epi8(wv[h], xb));
          dot[r][h] = _mm256_add_epi32(dot[r][h], _mm256_madd_epi16(pairs, ones));
        }
      }
    }
    for (int h = 0; h < 2; ++h) {
      const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128(
          reinterpret_cast<const __m128i*>(scales + static_cast<size_t>(g) * kCols + h * 8)));
      for (int r = 0; r < R; ++r) {
        const __m256 t =
            _mm256_mul_ps(dw, _mm256_set1_ps(xq.d[static_cast<size_t>(i0 + r) * xq.kg + g]));
        acc[r][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot[r][h]), t, acc[r][h]);
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    _mm256_storeu_ps(out + r * kCols, acc[r][0]);
    _mm256_storeu_ps(out + r * kCols + 8, acc[r][1]);
  }
}

}  // namespace

MORSERVE_END_TARGET

namespace {

constexpr int kAvx2TileRows = 2;
constexpr TileFn kAvx2Tiles[kAvx2TileRows + 1] = {nullptr, &TileAvx2<1>, &TileAvx2<2>};

void RunW8A8Vnni(const LinearArgs& a, int n0, int n1) {
  RunVectorPath(VectorPath{kVnniTiles, kTileRows}, a, n0, n1);
}

void RunW8A8Avx2(const LinearArgs& a, int n0, int n1) {
  RunVectorPath(VectorPath{kAvx2Tiles, kAvx2TileRows}, a, n0, n1);
}

// Ranges of 64 columns (4 groups): enough pieces for the pool at the model's widths.
int W8A8ChunkRows(int, int) { return 4 * kCols; }

}  // namespace

const LinearKernelSet& W8A8ScalarLinearKernels() {
  static const LinearKernelSet set{"w8a8-scalar", &RunW8A8Scalar, &W8A8ChunkRows,
                                   &PrepareW8A8<&QuantizeRowsScalar>};
  return set;
}

const LinearKernelSet* W8A8VnniLinearKernels() {
  static const bool ok = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                         __builtin_cpu_supports("avx512vnni");
  static const LinearKernelSet set{"avx512-vnni", &RunW8A8Vnni, &W8A8ChunkRows,
                                   &PrepareW8A8<&QuantizeRowsVnni>};
  return ok ? &set : nullptr;
}

const LinearKernelSet* W8A8Avx2LinearKernels() {
  static const bool ok = Avx2LinearKernels() != nullptr;  // AVX2, FMA and F16C
  static const LinearKernelSet set{"w8a8-avx2", &RunW8A8Avx2, &W8A8ChunkRows,
                                   &PrepareW8A8<&QuantizeRowsScalar>};
  return ok ? &set : nullptr;
}

const LinearKernelSet* W8A8BestLinearKernels() {
  return W8A8VnniLinearKernels() != nullptr ? W8A8VnniLinearKernels() : W8A8Avx2LinearKernels();
}

}  // namespace morserve
