// The AVX2 + FMA + F16C linear kernel set (linear_kernels.h): 8-lane accumulators, one per
// output element, in the L8 order, so its bits equal the scalar set's.
//
// Tiles: MB rows of x x NB rows of W, one __m256 accumulator each. The weights of a tile are
// loaded and decoded once per block of 8 and used by all MB rows. Tile shapes by row count
// (1 x 8, 2 x 6, 3 x 4, 4 x 3) keep the accumulators in registers; tile shape never changes
// an element's order. Compiled with -ffp-contract=off (the FMAs are the written intrinsics).
#include <cpuid.h>
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "engine/cpu/linear_kernels.h"
#include "engine/cpu/simd_target.h"
#include "engine/cpu/weight_format_dispatch.h"

namespace morserve {

MORSERVE_BEGIN_TARGET("avx2,fma,f16c")

namespace {

constexpr int kGroup = LinearWeights::kQ8Group;

__m256i TailMask(int count) {
  const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(count), lanes);
}

// Formats: Load(row, k0, scale) decodes w[k0 .. k0 + 8) to exact fp32; LoadTail the last,
// partial block (count < 8 values, the rest zero). Grouped formats get the block's group
// scale from Scale(row, k0) at every group start.
struct F32Format {
  static constexpr bool kGrouped = false;
  static constexpr int kBytes = 4;
  static __m256 Load(const WeightRow& r, int k0, __m256) {
    return _mm256_loadu_ps(static_cast<const float*>(r.data) + k0);
  }
  static __m256 LoadTail(const WeightRow& r, int k0, int count, __m256) {
    return _mm256_maskload_ps(static_cast<const float*>(r.data) + k0, TailMask(count));
  }
};

// Decoded fp32 rows of a panel, interleaved by tile: the NB rows of a tile store block b (8
// values) of each row one after another, so a tile reads one contiguous stream. A row's
// WeightRow points at its first block.
template <int NB>
struct PackedF32Format {
  static constexpr bool kGrouped = false;
  static constexpr int kBytes = 4;
  static __m256 Load(const WeightRow& r, int k0, __m256) {
    return _mm256_loadu_ps(static_cast<const float*>(r.data) + (k0 / 8) * NB * 8);
  }
  static __m256 LoadTail(const WeightRow& r, int k0, int count, __m256) {
    return _mm256_maskload_ps(static_cast<const float*>(r.data) + (k0 / 8) * NB * 8,
                              TailMask(count));
  }
};

template <bool kBf16>
struct Half16Format {
  static constexpr bool kGrouped = false;
  static constexpr int kBytes = 2;
  static __m256 Decode(__m128i v) {
    if constexpr (kBf16) {
      return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(v), 16));
    } else {
      return _mm256_cvtph_ps(v);
    }
  }
  static __m256 Load(const WeightRow& r, int k0, __m256) {
    return Decode(_mm_loadu_si128(
        reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(r.data) + k0)));
  }
  static __m256 LoadTail(const WeightRow& r, int k0, int count, __m256) {
    alignas(16) uint16_t tmp[8] = {};
    std::memcpy(tmp, static_cast<const uint16_t*>(r.data) + k0, sizeof(uint16_t) * count);
    return Decode(_mm_load_si128(reinterpret_cast<const __m128i*>(tmp)));
  }
};

// Q8 rows (int8 in place, or int8-octets: Layout, linear_weights.h): 8 int8 values widened,
// converted and times the group's scale, exact fp32.
template <class Layout>
struct Q8FormatOf {
  static constexpr bool kGrouped = true;
  static constexpr int kBytes = 1;
  static __m256 Scale(const WeightRow& r, int k0) {
    return _mm256_set1_ps(_cvtsh_ss(r.scales[Layout::Scale(k0)]));
  }
  static __m256 Load(const WeightRow& r, int k0, __m256 scale) {
    const __m128i q = _mm_loadl_epi64(
        reinterpret_cast<const __m128i*>(static_cast<const int8_t*>(r.data) + Layout::Value(k0)));
    return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)), scale);
  }
  // Rows and octets are zero-padded to whole groups: the full block is there to read.
  static __m256 LoadTail(const WeightRow& r, int k0, int, __m256 scale) {
    return Load(r, k0, scale);
  }
};
using Q8Format = Q8FormatOf<Q8RowLayout>;
// int8-octets row by row (the octets' own tiles are the AVX-512 set's).
using OctetFormat = Q8FormatOf<OctetRowLayout>;

// bf16-quads (linear_weights.h): a row's block of 8 is its 32-byte half of the quad's block,
// shifted left by 16 (the low 16 bits of each word) or masked to the high 16 bits: exact fp32
// with no shuffle. The row's two neighbours in a tile share the load from L1.
struct QuadFormat {
  static constexpr bool kGrouped = false;
  static constexpr int kBytes = 2;
  static __m256 Load(const WeightRow& r, int k0, __m256) {
    const __m256i v = _mm256_loadu_si256(
        reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(r.data) + (k0 / 8) * 32));
    return _mm256_castsi256_ps(
        r.high ? _mm256_and_si256(v, _mm256_set1_epi32(static_cast<int>(0xFFFF0000u)))
               : _mm256_slli_epi32(v, 16));
  }
  // The quads hold zeros past k, so the whole block is there to read.
  static __m256 LoadTail(const WeightRow& r, int k0, int, __m256 s) { return Load(r, k0, s); }
};

// ((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7)).
float HorizontalSum(__m256 acc) {
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  return _mm_cvtss_f32(_mm_add_ss(s2, _mm_movehdup_ps(s2)));
}

// next: the first byte of the weights a later tile reads (rows stored one after another), or
// nullptr. While a tile runs, it prefetches that tile's bytes into L2 at the pace it consumes
// its own: one sequential stream for the memory system instead of NB short row streams (bf16
// rows of 1-2 KiB are too short for the hardware prefetchers to ramp up; measured on an AVX2
// EPYC: batch-1 bf16 weight bandwidth from ~55% to ~80% of a plain streaming read).
constexpr int kPrefetchTiles = 2;  // how many tiles ahead the prefetched tile is

template <class Format, int MB, int NB>
void Tile(const float* x, int64_t ldx, const WeightRow* rows, int k, float* y, int64_t ldy,
          bool accumulate, const char* next = nullptr) {
  constexpr int kStep = NB * 8 * Format::kBytes;  // weight bytes one block of 8 reads
  __m256 acc[MB][NB];
  __m256 scale[NB];
  for (int j = 0; j < NB; ++j) {
    scale[j] = _mm256_setzero_ps();
    for (int i = 0; i < MB; ++i) acc[i][j] = _mm256_setzero_ps();
  }
  const int kfull = k & ~7;
  for (int k0 = 0; k0 < kfull; k0 += 8) {
    if constexpr (Format::kGrouped) {
      if (k0 % kGroup == 0) {
        for (int j = 0; j < NB; ++j) scale[j] = Format::Scale(rows[j], k0);
      }
    }
    if (next != nullptr) {
      for (int b = 0; b < kStep; b += 64) _mm_prefetch(next + (k0 / 8) * kStep + b, _MM_HINT_T1);
    }
    __m256 xv[MB];
    for (int i = 0; i < MB; ++i) xv[i] = _mm256_loadu_ps(x + i * ldx + k0);
    for (int j = 0; j < NB; ++j) {
      const __m256 wv = Format::Load(rows[j], k0, scale[j]);
      for (int i = 0; i < MB; ++i) acc[i][j] = _mm256_fmadd_ps(xv[i], wv, acc[i][j]);
    }
  }
  if (kfull < k) {
    const int count = k - kfull;
    if constexpr (Format::kGrouped) {
      if (kfull % kGroup == 0) {
        for (int j = 0; j < NB; ++j) scale[j] = Format::Scale(rows[j], kfull);
      }
    }
    const __m256i mask = TailMask(count);
    __m256 xv[MB];
    for (int i = 0; i < MB; ++i) xv[i] = _mm256_maskload_ps(x + i * ldx + kfull, mask);
    for (int j = 0; j < NB; ++j) {
      const __m256 wv = Format::LoadTail(rows[j], kfull, count, scale[j]);
      for (int i = 0; i < MB; ++i) acc[i][j] = _mm256_fmadd_ps(xv[i], wv, acc[i][j]);
    }
  }
  for (int i = 0; i < MB; ++i) {
    for (int j = 0; j < NB; ++j) {
      const float s = HorizontalSum(acc[i][j]);
      float& out = y[i * ldy + j];
      out = accumulate ? out + s : s;
    }
  }
}

// Columns [n0, n1) of MB rows: tiles of NB columns, single columns for the rest.
template <class Format, int MB, int NB>
void Rows(const float* x, int64_t ldx, const WeightRow* rows, int k, float* y, int64_t ldy,
          bool accumulate, int n0, int n1, int prefetch_end) {
  int j = n0;
  for (; j + NB <= n1; j += NB) {
    const char* next = j + kPrefetchTiles * NB < prefetch_end
                           ? static_cast<const char*>(rows[j + kPrefetchTiles * NB].data)
                           : nullptr;
    Tile<Format, MB, NB>(x, ldx, rows + j, k, y + j, ldy, accumulate, next);
  }
  for (; j < n1; ++j) Tile<Format, MB, 1>(x, ldx, rows + j, k, y + j, ldy, accumulate);
}

// 1..4 rows: the widest tile whose accumulators fit the 16 registers.
template <class Format>
void FewRows(const float* x, int64_t ldx, int m, const WeightRow* rows, int k, float* y,
             int64_t ldy, bool accumulate, int n0, int n1, int prefetch_end) {
  switch (m) {
    case 1:
      return Rows<Format, 1, 8>(x, ldx, rows, k, y, ldy, accumulate, n0, n1, prefetch_end);
    case 2:
      return Rows<Format, 2, 6>(x, ldx, rows, k, y, ldy, accumulate, n0, n1, prefetch_end);
    case 3:
      return Rows<Format, 3, 4>(x, ldx, rows, k, y, ldy, accumulate, n0, n1, prefetch_end);
    default:
      return Rows<Format, 4, 3>(x, ldx, rows, k, y, ldy, accumulate, n0, n1, prefetch_end);
  }
}

// Columns a range is cut into for the thread pool when m is small.
constexpr int kDirectChunk = 24;

// One 3-column tile for mb = 1..4 rows (5..16 rows run it per block of 4).
template <class Format>
void Tile3(int mb, const float* x, int64_t ldx, const WeightRow* rows, int k, float* y, int64_t ldy,
           bool accumulate, const char* next) {
  switch (mb) {
    case 1:
      return Tile<Format, 1, 3>(x, ldx, rows, k, y, ldy, accumulate, next);
    case 2:
      return Tile<Format, 2, 3>(x, ldx, rows, k, y, ldy, accumulate, next);
    case 3:
      return Tile<Format, 3, 3>(x, ldx, rows, k, y, ldy, accumulate, next);
    default:
      return Tile<Format, 4, 3>(x, ldx, rows, k, y, ldy, accumulate, next);
  }
}

// 1..4 rows: register-blocked tiles over the range. 5..16 rows: for every 3 columns, every
// block of 4 rows in turn, so the columns' weights come from memory once (the first block,
// which also prefetches the weights two tiles ahead: the memory stream never pauses) and from
// L1 for the other blocks.
template <class Format>
void DirectAs(const LinearArgs& a, int n0, int n1) {
  const WeightRow* rows = a.w->rows();
  const int k = a.w->k();
  if (a.m <= 4)
    return FewRows<Format>(a.x, a.ldx, a.m, rows, k, a.y, a.ldy, a.accumulate, n0, n1, n1);
  int j = n0;
  for (; j + 3 <= n1; j += 3) {
    const char* next = j + 3 * kPrefetchTiles < n1
                           ? static_cast<const char*>(rows[j + 3 * kPrefetchTiles].data)
                           : nullptr;
    for (int i = 0; i < a.m; i += 4) {
      Tile3<Format>(std::min(4, a.m - i), a.x + i * a.ldx, a.ldx, rows + j, k, a.y + i * a.ldy + j,
                    a.ldy, a.accumulate, i == 0 ? next : nullptr);
    }
  }
  for (int i = 0; i < a.m && j < n1; i += 4) {
    FewRows<Format>(a.x + i * a.ldx, a.ldx, std::min(4, a.m - i), rows, k, a.y + i * a.ldy, a.ldy,
                    a.accumulate, j, n1, 0);
  }
}

void Direct(const LinearArgs& a, int n0, int n1) {
  if (a.w->format() == WeightFormat::kBF16Quads) return DirectAs<QuadFormat>(a, n0, n1);
  if (a.w->format() == WeightFormat::kQ8Octets) return DirectAs<OctetFormat>(a, n0, n1);
  VisitWeightFormat<F32Format, Half16Format<true>, Half16Format<false>, Q8Format>(
      a.w->format(), [&](auto tag) { DirectAs<typename decltype(tag)::type>(a, n0, n1); });
}

// Row j of W as exact fp32, block b of 8 values stored at out + b * stride.
template <class Format>
void DecodeRowAs(const WeightRow& r, int k, float* out, int stride) {
  __m256 scale = _mm256_setzero_ps();
  const int kfull = k & ~7;
  for (int k0 = 0; k0 < kfull; k0 += 8) {
    if constexpr (Format::kGrouped) {
      if (k0 % kGroup == 0) scale = Format::Scale(r, k0);
    }
    _mm256_storeu_ps(out + (k0 / 8) * stride, Format::Load(r, k0, scale));
  }
  if (kfull < k) {
    if constexpr (Format::kGrouped) {
      if (kfull % kGroup == 0) scale = Format::Scale(r, kfull);
    }
    _mm256_maskstore_ps(out + (kfull / 8) * stride, TailMask(k - kfull),
                        Format::LoadTail(r, kfull, k - kfull, scale));
  }
}

void DecodeRow(const LinearWeights& w, int j, float* out, int stride) {
  if (w.format() == WeightFormat::kBF16Quads)
    return DecodeRowAs<QuadFormat>(w.row(j), w.k(), out, stride);
  if (w.format() == WeightFormat::kQ8Octets)
    return DecodeRowAs<OctetFormat>(w.row(j), w.k(), out, stride);
  VisitWeightFormat<F32Format, Half16Format<true>, Half16Format<false>, Q8Format>(
      w.format(),
      [&](auto tag) { DecodeRowAs<typename decltype(tag)::type>(w.row(j), w.k(), out, stride); });
}

// From this many rows on, decoding a panel once beats decoding the weights in every tile.
constexpr int kPanelMinRows = 17;

// Panel rows for k: a panel of decoded fp32 rows stays within ~256 KiB (L2), in multiples of
// 12 (tiles of 3 and 4 columns), at least 12.
int PanelRows(int k) {
  const int rows = (256 * 1024) / (4 * ((k + 7) & ~7)) / 12 * 12;
  return std::clamp(rows, 12, 96);
}

// m >= kPanelMinRows: decode PanelRows(k) rows at a time to fp32, interleaved by 3-row tile
// (PackedF32Format<3>; the last 1..2 rows alone), then every block of 4 rows of x runs over the
// panel (the last block 1..3 rows).
void Panelled(const LinearArgs& a, int n0, int n1) {
  const int k = a.w->k(), kp = (k + 7) & ~7, panel = PanelRows(k);
  thread_local std::vector<float> decoded;
  thread_local std::vector<WeightRow> panel_rows;
  decoded.resize(static_cast<size_t>(panel) * kp);  // values past k are never read (masked tails)
  panel_rows.resize(panel);
  for (int p0 = n0; p0 < n1; p0 += panel) {
    const int count = std::min(panel, n1 - p0), tiled = count / 3 * 3;
    for (int j = 0; j < count; ++j) {
      const bool in_tile = j < tiled;
      float* dst =
          &decoded[static_cast<size_t>(in_tile ? j / 3 * 3 : j) * kp] + (in_tile ? (j % 3) * 8 : 0);
      DecodeRow(*a.w, p0 + j, dst, in_tile ? 24 : 8);
      panel_rows[j].data = dst;
    }
    for (int i = 0; i < a.m; i += 4) {
      const int mb = std::min(4, a.m - i);
      const float* xb = a.x + i * a.ldx;
      float* yb = a.y + i * a.ldy + p0;
      for (int j = 0; j < tiled; j += 3) {
        Tile3<PackedF32Format<3>>(mb, xb, a.ldx, panel_rows.data() + j, k, yb + j, a.ldy,
                                  a.accumulate, nullptr);
      }
      FewRows<F32Format>(xb, a.ldx, mb, panel_rows.data(), k, yb, a.ldy, a.accumulate, tiled, count,
                         0);
    }
  }
}

void RunAvx2(const LinearArgs& a, int n0, int n1) {
  if (a.m < kPanelMinRows) {
    Direct(a, n0, n1);
  } else {
    Panelled(a, n0, n1);
  }
}

int Avx2ChunkRows(int m, int k) { return m < kPanelMinRows ? kDirectChunk : PanelRows(k); }

}  // namespace

MORSERVE_END_TARGET

namespace {

bool HasF16c() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  return __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & bit_F16C) != 0;
}

}  // namespace

const LinearKernelSet* Avx2LinearKernels() {
  // f16c through cpuid leaf 1 (ECX bit 29): clang's __builtin_cpu_supports does not know it.
  static const bool ok =
      __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && HasF16c();
  static const LinearKernelSet set{"avx2", &RunAvx2, &Avx2ChunkRows};
  return ok ? &set : nullptr;
}

}  // namespace morserve
