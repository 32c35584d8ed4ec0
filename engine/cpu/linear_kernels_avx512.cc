// The AVX-512 linear kernel set (linear_kernels.h): the L8 order of the AVX2 and scalar sets,
// with two output columns per 16-lane register, so its bits equal theirs.
//
// A register holds the 8 lane accumulators of column j in lanes 0..7 and those of column j + 1
// in lanes 8..15; x's block of 8 is broadcast to both halves, the weights of the two columns'
// blocks are decoded side by side. Each lane still sums x[8b + l] * w[8b + l] over b in k order
// with one fused multiply-add, and each half is reduced by the same fixed tree at the end: an
// element's order is the L8 order whatever the tile. Twice the multiply-adds per instruction of
// the AVX2 set and 32 registers: tiles of MB rows x NP column pairs (1 x 8, 2 x 8, 3 x 6, 4 x 6).
// bf16-quads (linear_weights.h) have their own tiles of whole quads (QuadTile): one 64-byte
// load gives two such registers with a shift and a mask; every m runs them (no panels).
// int8-octets have tiles of whole octets (OctetTile): one 16-byte load widens to one such
// register, times the pair's scales; panels from 64 rows. Needs AVX-512 F, BW, DQ and VL (every
// AVX-512 CPU since Skylake-SP). Compiled with -ffp-contract=off (the FMAs are the written
// intrinsics).
#include <algorithm>
#include <vector>

#include "engine/cpu/linear_kernels.h"
#include "engine/cpu/simd_intrinsics.h"
#include "engine/cpu/simd_target.h"
#include "engine/cpu/weight_format_dispatch.h"

namespace morserve {

MORSERVE_BEGIN_TARGET("avx512f,avx512bw,avx512dq,avx512vl,fma,f16c")

namespace {

constexpr int kGroup = LinearWeights::kQ8Group;

// Lanes 0..count-1 of each half.
__mmask16 PairTailMask(int count) {
  const unsigned half = (1u << count) - 1u;
  return static_cast<__mmask16>(half | (half << 8));
}

__m512 Join(__m256 lo, __m256 hi) { return _mm512_insertf32x8(_mm512_castps256_ps512(lo), hi, 1); }

// Formats: Load(a, b, k0, scale) decodes w[k0 .. k0 + 8) of rows a and b to exact fp32 in the
// low and high halves; LoadTail the last, partial block (count < 8 values, the rest zero).
// Grouped formats get the pair's group scales from Scale(a, b, k0) at every group start.
struct F32Format {
  static constexpr bool kGrouped = false;
  static constexpr int kBytes = 4;
  static __m512 Load(const WeightRow& a, const WeightRow& b, int k0, __m512) {
    return Join(_mm256_loadu_ps(static_cast<const float*>(a.data) + k0),
                _mm256_loadu_ps(static_cast<const float*>(b.data) + k0));
  }
  static __m512 LoadTail(const WeightRow& a, const WeightRow& b, int k0, int count, __m512) {
    const __mmask8 m = static_cast<__mmask8>((1u << count) - 1u);
    return Join(_mm256_maskz_loadu_ps(m, static_cast<const float*>(a.data) + k0),
                _mm256_maskz_loadu_ps(m, static_cast<const float*>(b.data) + k0));
  }
};

// Decoded fp32 rows of a panel, interleaved by tile of 2 * NP columns: block b of the tile
// stores each column's 8 values one after another, so a pair is one 64-byte load and a tile
// reads one contiguous stream. Column 2p's WeightRow points at the pair's first block.
template <int NP>
struct PackedF32Format {
  static constexpr bool kGrouped = false;
  static constexpr int kBytes = 4;
  static constexpr int kStride = NP * 16;  // floats per block of the tile
  static __m512 Load(const WeightRow& a, const WeightRow&, int k0, __m512) {
    return _mm512_loadu_ps(static_cast<const float*>(a.data) + (k0 / 8) * kStride);
  }
  static __m512 LoadTail(const WeightRow& a, const WeightRow&, int k0, int count, __m512) {
    return _mm512_maskz_loadu_ps(PairTailMask(count),
                                 static_cast<const float*>(a.data) + (k0 / 8) * kStride);
  }
};

template <bool kBf16>
struct Half16Format {
  static constexpr bool kGrouped = false;
  static constexpr int kBytes = 2;
  static __m512 Decode(__m128i lo, __m128i hi) {
    const __m256i v = _mm256_inserti128_si256(_mm256_castsi128_si256(lo), hi, 1);
    if constexpr (kBf16) {
      return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(v), 16));
    } else {
      return _mm512_cvtph_ps(v);
    }
  }
  static const __m128i* At(const WeightRow& r, int k0) {
    return reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(r.data) + k0);
  }
  static __m512 Load(const WeightRow& a, const WeightRow& b, int k0, __m512) {
    return Decode(_mm_loadu_si128(At(a, k0)), _mm_loadu_si128(At(b, k0)));
  }
  static __m512 LoadTail(const WeightRow& a, const WeightRow& b, int k0, int count, __m512) {
    const __mmask8 m = static_cast<__mmask8>((1u << count) - 1u);
    return Decode(_mm_maskz_loadu_epi16(m, At(a, k0)), _mm_maskz_loadu_epi16(m, At(b, k0)));
  }
};

// Q8 rows (int8 in place, or int8-octets read row by row for the panels: Layout,
// linear_weights.h): two rows' 8 int8 values widened, converted and times their scales.
template <class Layout>
struct Q8FormatOf {
  static constexpr bool kGrouped = true;
  static constexpr int kBytes = 1;
  static __m512 Scale(const WeightRow& a, const WeightRow& b, int k0) {
    return Join(_mm256_set1_ps(_cvtsh_ss(a.scales[Layout::Scale(k0)])),
                _mm256_set1_ps(_cvtsh_ss(b.scales[Layout::Scale(k0)])));
  }
  static __m512 Load(const WeightRow& a, const WeightRow& b, int k0, __m512 scale) {
    const __m128i lo = _mm_loadl_epi64(
        reinterpret_cast<const __m128i*>(static_cast<const int8_t*>(a.data) + Layout::Value(k0)));
    const __m128i hi = _mm_loadl_epi64(
        reinterpret_cast<const __m128i*>(static_cast<const int8_t*>(b.data) + Layout::Value(k0)));
    return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_unpacklo_epi64(lo, hi))),
                         scale);
  }
  // Rows and octets are zero-padded to whole groups: the full block is there to read.
  static __m512 LoadTail(const WeightRow& a, const WeightRow& b, int k0, int, __m512 scale) {
    return Load(a, b, k0, scale);
  }
};
using Q8Format = Q8FormatOf<Q8RowLayout>;
using OctetRowFormat = Q8FormatOf<OctetRowLayout>;

// ((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7)) of 8 lanes.
float HorizontalSum(__m256 acc) {
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  return _mm_cvtss_f32(_mm_add_ss(s2, _mm_movehdup_ps(s2)));
}

// x's block of 8 at k0 in both halves (count < 8: the first count values, the rest zero).
__m512 BroadcastX(const float* x, int k0, int count) {
  const __m256 v = count == 8
                       ? _mm256_loadu_ps(x + k0)
                       : _mm256_maskz_loadu_ps(static_cast<__mmask8>((1u << count) - 1u), x + k0);
  return _mm512_castpd_ps(_mm512_broadcast_f64x4(_mm256_castps_pd(v)));
}

// next: the first byte of the weights a later tile reads (rows stored one after another), or
// nullptr; while a tile runs it prefetches that tile's bytes into L2 at the pace it consumes its
// own (one sequential stream for the memory system, as in the AVX2 set).
constexpr int kPrefetchTiles = 2;

// MB rows of x times columns [0, ncols) of `rows` (ncols <= 2 * NP; a missing column of the last
// pair repeats the one before it and is not written).
template <class Format, int MB, int NP>
void Tile(const float* x, int64_t ldx, const WeightRow* rows, int ncols, int k, float* y,
          int64_t ldy, bool accumulate, const char* next = nullptr) {
  constexpr int kStep = NP * 16 * Format::kBytes;  // weight bytes one block of 8 reads
  const WeightRow* ra[NP];
  const WeightRow* rb[NP];
  __m512 acc[MB][NP];
  __m512 scale[NP];
  for (int p = 0; p < NP; ++p) {
    ra[p] = &rows[std::min(2 * p, ncols - 1)];
    rb[p] = &rows[std::min(2 * p + 1, ncols - 1)];
    scale[p] = _mm512_setzero_ps();
    for (int i = 0; i < MB; ++i) acc[i][p] = _mm512_setzero_ps();
  }
  const int kfull = k & ~7;
  for (int k0 = 0; k0 < kfull; k0 += 8) {
    if constexpr (Format::kGrouped) {
      if (k0 % kGroup == 0) {
        for (int p = 0; p < NP; ++p) scale[p] = Format::Scale(*ra[p], *rb[p], k0);
      }
    }
    if (next != nullptr) {
      for (int b = 0; b < kStep; b += 64) _mm_prefetch(next + (k0 / 8) * kStep + b, _MM_HINT_T1);
    }
    __m512 xv[MB];
    for (int i = 0; i < MB; ++i) xv[i] = BroadcastX(x + i * ldx, k0, 8);
    for (int p = 0; p < NP; ++p) {
      const __m512 wv = Format::Load(*ra[p], *rb[p], k0, scale[p]);
      for (int i = 0; i < MB; ++i) acc[i][p] = _mm512_fmadd_ps(xv[i], wv, acc[i][p]);
    }
  }
  if (kfull < k) {
    const int count = k - kfull;
    if constexpr (Format::kGrouped) {
      if (kfull % kGroup == 0) {
        for (int p = 0; p < NP; ++p) scale[p] = Format::Scale(*ra[p], *rb[p], kfull);
      }
    }
    __m512 xv[MB];
    for (int i = 0; i < MB; ++i) xv[i] = BroadcastX(x + i * ldx, kfull, count);
    for (int p = 0; p < NP; ++p) {
      const __m512 wv = Format::LoadTail(*ra[p], *rb[p], kfull, count, scale[p]);
      for (int i = 0; i < MB; ++i) acc[i][p] = _mm512_fmadd_ps(xv[i], wv, acc[i][p]);
    }
  }
  for (int i = 0; i < MB; ++i) {
    for (int p = 0; p < NP; ++p) {
      const float s[2] = {HorizontalSum(_mm512_castps512_ps256(acc[i][p])),
                          HorizontalSum(_mm512_extractf32x8_ps(acc[i][p], 1))};
      for (int h = 0; h < 2 && 2 * p + h < ncols; ++h) {
        float& out = y[i * ldy + 2 * p + h];
        out = accumulate ? out + s[h] : s[h];
      }
    }
  }
}

// Columns [n0, n1) of MB rows: tiles of 2 * NP columns, then pairs, then a single column.
template <class Format, int MB, int NP>
void Rows(const float* x, int64_t ldx, const WeightRow* rows, int k, float* y, int64_t ldy,
          bool accumulate, int n0, int n1, int prefetch_end) {
  constexpr int kCols = 2 * NP;
  int j = n0;
  for (; j + kCols <= n1; j += kCols) {
    const char* next = j + kPrefetchTiles * kCols < prefetch_end
                           ? static_cast<const char*>(rows[j + kPrefetchTiles * kCols].data)
                           : nullptr;
    Tile<Format, MB, NP>(x, ldx, rows + j, kCols, k, y + j, ldy, accumulate, next);
  }
  for (; j < n1; j += 2) {
    Tile<Format, MB, 1>(x, ldx, rows + j, std::min(2, n1 - j), k, y + j, ldy, accumulate);
  }
}

// 1..4 rows: the widest tile whose accumulators fit the 32 registers.
template <class Format>
void FewRows(const float* x, int64_t ldx, int m, const WeightRow* rows, int k, float* y,
             int64_t ldy, bool accumulate, int n0, int n1, int prefetch_end) {
  switch (m) {
    case 1:
      return Rows<Format, 1, 8>(x, ldx, rows, k, y, ldy, accumulate, n0, n1, prefetch_end);
    case 2:
      return Rows<Format, 2, 8>(x, ldx, rows, k, y, ldy, accumulate, n0, n1, prefetch_end);
    case 3:
      return Rows<Format, 3, 6>(x, ldx, rows, k, y, ldy, accumulate, n0, n1, prefetch_end);
    default:
      return Rows<Format, 4, 6>(x, ldx, rows, k, y, ldy, accumulate, n0, n1, prefetch_end);
  }
}

// Columns of one tile when m > 4 (6 pairs), and the columns a range is cut into for the pool.
constexpr int kWideCols = 12;
constexpr int kDirectChunk = 48;

// One 6-pair tile for mb = 1..4 rows (5..16 rows run it per block of 4).
template <class Format>
void Tile12(int mb, const float* x, int64_t ldx, const WeightRow* rows, int k, float* y,
            int64_t ldy, bool accumulate, const char* next) {
  switch (mb) {
    case 1:
      return Tile<Format, 1, 6>(x, ldx, rows, kWideCols, k, y, ldy, accumulate, next);
    case 2:
      return Tile<Format, 2, 6>(x, ldx, rows, kWideCols, k, y, ldy, accumulate, next);
    case 3:
      return Tile<Format, 3, 6>(x, ldx, rows, kWideCols, k, y, ldy, accumulate, next);
    default:
      return Tile<Format, 4, 6>(x, ldx, rows, kWideCols, k, y, ldy, accumulate, next);
  }
}

// One decoded pair (PackedF32Format<1>) for mb = 1..4 rows: ncols 1 or 2.
void TilePair(int mb, const float* x, int64_t ldx, const WeightRow* rows, int ncols, int k,
              float* y, int64_t ldy, bool accumulate) {
  switch (mb) {
    case 1:
      return Tile<PackedF32Format<1>, 1, 1>(x, ldx, rows, ncols, k, y, ldy, accumulate);
    case 2:
      return Tile<PackedF32Format<1>, 2, 1>(x, ldx, rows, ncols, k, y, ldy, accumulate);
    case 3:
      return Tile<PackedF32Format<1>, 3, 1>(x, ldx, rows, ncols, k, y, ldy, accumulate);
    default:
      return Tile<PackedF32Format<1>, 4, 1>(x, ldx, rows, ncols, k, y, ldy, accumulate);
  }
}

// 1..4 rows: register-blocked tiles over the range. 5..16 rows: for every 12 columns, every
// block of 4 rows in turn, so the columns' weights come from memory once (the first block, which
// also prefetches two tiles ahead) and from L1 for the other blocks.
template <class Format>
void DirectAs(const LinearArgs& a, int n0, int n1) {
  const WeightRow* rows = a.w->rows();
  const int k = a.w->k();
  if (a.m <= 4)
    return FewRows<Format>(a.x, a.ldx, a.m, rows, k, a.y, a.ldy, a.accumulate, n0, n1, n1);
  int j = n0;
  for (; j + kWideCols <= n1; j += kWideCols) {
    const char* next = j + kWideCols * kPrefetchTiles < n1
                           ? static_cast<const char*>(rows[j + kWideCols * kPrefetchTiles].data)
                           : nullptr;
    for (int i = 0; i < a.m; i += 4) {
      Tile12<Format>(std::min(4, a.m - i), a.x + i * a.ldx, a.ldx, rows + j, k, a.y + i * a.ldy + j,
                     a.ldy, a.accumulate, i == 0 ? next : nullptr);
    }
  }
  for (int i = 0; i < a.m && j < n1; i += 4) {
    FewRows<Format>(a.x + i * a.ldx, a.ldx, std::min(4, a.m - i), rows, k, a.y + i * a.ldy, a.ldy,
                    a.accumulate, j, n1, 0);
  }
}

// bf16-quads (linear_weights.h): one 64-byte load holds a block of 8 of four columns; a shift
// left by 16 gives the quad's columns 0 and 2 in the halves of one register, a mask of the high
// halves columns 1 and 3: exact fp32 values in the L8 lanes, no shuffle.
__m512 QuadCols02(__m512i v) { return _mm512_castsi512_ps(_mm512_slli_epi32(v, 16)); }
__m512 QuadCols13(__m512i v) {
  return _mm512_castsi512_ps(_mm512_and_si512(v, _mm512_set1_epi32(static_cast<int>(0xFFFF0000u))));
}

// MB rows of x times the NQ quads from `quad` on (quad q at quad + q * stride), columns
// [0, ncols) written (ncols <= 4 * NQ). next: the first byte of a later tile's quads (stored
// one after another), prefetched at the pace this tile reads its own, or nullptr.
template <int MB, int NQ>
void QuadTile(const float* x, int64_t ldx, const uint16_t* quad, int64_t stride, int ncols, int k,
              float* y, int64_t ldy, bool accumulate, const char* next) {
  constexpr int kStep = NQ * 64;  // bytes of the next tile per block of 8
  __m512 acc[MB][2 * NQ];
  for (int i = 0; i < MB; ++i) {
    for (int c = 0; c < 2 * NQ; ++c) acc[i][c] = _mm512_setzero_ps();
  }
  auto block = [&](int b, int count) {
    if (next != nullptr) {
      for (int o = 0; o < kStep; o += 64) _mm_prefetch(next + b * kStep + o, _MM_HINT_T1);
    }
    __m512 xv[MB];
    for (int i = 0; i < MB; ++i) xv[i] = BroadcastX(x + i * ldx, 8 * b, count);
    for (int q = 0; q < NQ; ++q) {
      const __m512i v = _mm512_loadu_si512(quad + q * stride + b * 32);
      const __m512 w02 = QuadCols02(v), w13 = QuadCols13(v);
      for (int i = 0; i < MB; ++i) {
        acc[i][2 * q] = _mm512_fmadd_ps(xv[i], w02, acc[i][2 * q]);
        acc[i][2 * q + 1] = _mm512_fmadd_ps(xv[i], w13, acc[i][2 * q + 1]);
      }
    }
  };
  const int kfull = k / 8;
  for (int b = 0; b < kfull; ++b) block(b, 8);
  if (k % 8 != 0) block(kfull, k % 8);  // the quads hold zeros past k; x is masked there
  for (int i = 0; i < MB; ++i) {
    for (int q = 0; q < NQ; ++q) {
      // Register 2q holds columns 4q and 4q + 2, register 2q + 1 columns 4q + 1 and 4q + 3.
      const float s[4] = {HorizontalSum(_mm512_castps512_ps256(acc[i][2 * q])),
                          HorizontalSum(_mm512_castps512_ps256(acc[i][2 * q + 1])),
                          HorizontalSum(_mm512_extractf32x8_ps(acc[i][2 * q], 1)),
                          HorizontalSum(_mm512_extractf32x8_ps(acc[i][2 * q + 1], 1))};
      for (int c = 0; c < 4 && 4 * q + c < ncols; ++c) {
        float& out = y[i * ldy + 4 * q + c];
        out = accumulate ? out + s[c] : s[c];
      }
    }
  }
}

// Columns [n0, n1) of MB rows (n0 a multiple of 4): tiles of NQ quads, then single quads.
template <int MB, int NQ>
void QuadRows(const float* x, int64_t ldx, const LinearWeights& w, float* y, int64_t ldy,
              bool accumulate, int n0, int n1, int prefetch_end) {
  const int64_t stride = QuadStride(w.k());
  const uint16_t* quads = w.quads();
  constexpr int kCols = 4 * NQ;
  int j = n0;
  for (; j + kCols <= n1; j += kCols) {
    const int ahead = j + kPrefetchTiles * kCols;
    const char* next = ahead < prefetch_end
                           ? reinterpret_cast<const char*>(quads + (ahead / 4) * stride)
                           : nullptr;
    QuadTile<MB, NQ>(x, ldx, quads + (j / 4) * stride, stride, kCols, w.k(), y + j, ldy, accumulate,
                     next);
  }
  for (; j < n1; j += 4) {
    QuadTile<MB, 1>(x, ldx, quads + (j / 4) * stride, stride, std::min(4, n1 - j), w.k(), y + j,
                    ldy, accumulate, nullptr);
  }
}

// 1..4 rows: 4 quads (16 columns) for 1 and 2 rows, 3 quads for 3 and 4 (24 accumulators).
void QuadFewRows(const float* x, int64_t ldx, int m, const LinearWeights& w, float* y, int64_t ldy,
                 bool accumulate, int n0, int n1, int prefetch_end) {
  switch (m) {
    case 1:
      return QuadRows<1, 4>(x, ldx, w, y, ldy, accumulate, n0, n1, prefetch_end);
    case 2:
      return QuadRows<2, 4>(x, ldx, w, y, ldy, accumulate, n0, n1, prefetch_end);
    case 3:
      return QuadRows<3, 3>(x, ldx, w, y, ldy, accumulate, n0, n1, prefetch_end);
    default:
      return QuadRows<4, 3>(x, ldx, w, y, ldy, accumulate, n0, n1, prefetch_end);
  }
}

// mb = 1..8 rows of x times one quad (4 columns; ncols of them written).
void QuadColumnTile(int mb, const float* x, int64_t ldx, const uint16_t* quad, int64_t stride,
                    int ncols, int k, float* y, int64_t ldy, bool accumulate, const char* next) {
  static constexpr decltype(&QuadTile<1, 1>) kTiles[] = {
      &QuadTile<1, 1>, &QuadTile<2, 1>, &QuadTile<3, 1>, &QuadTile<4, 1>,
      &QuadTile<5, 1>, &QuadTile<6, 1>, &QuadTile<7, 1>, &QuadTile<8, 1>};
  kTiles[mb - 1](x, ldx, quad, stride, ncols, k, y, ldy, accumulate, next);
}

// Rows of x per pass over a range's quads when m >= 5: with the range's weights (a few hundred
// KiB) they stay in L2 while every block of 8 rows runs over them.
constexpr int kQuadRowChunk = 64;

// m >= 5: for each chunk of up to 64 rows, for each quad of the range, every block of 8 rows in
// turn (the quad's 4 columns decoded once per block of 8 rows, from L1 after the first).
void QuadRowBlocks(const LinearArgs& a, int n0, int n1) {
  const int k = a.w->k();
  const int64_t stride = QuadStride(k);
  const uint16_t* quads = a.w->quads();
  for (int i0 = 0; i0 < a.m; i0 += kQuadRowChunk) {
    const int i1 = std::min(a.m, i0 + kQuadRowChunk);
    for (int j = n0; j < n1; j += LinearWeights::kQuadCols) {
      const int ahead = j + LinearWeights::kQuadCols * kPrefetchTiles;
      const char* next = i0 == 0 && ahead < n1
                             ? reinterpret_cast<const char*>(quads + (ahead / 4) * stride)
                             : nullptr;
      for (int i = i0; i < i1; i += 8) {
        QuadColumnTile(std::min(8, i1 - i), a.x + i * a.ldx, a.ldx, quads + (j / 4) * stride,
                       stride, std::min(4, n1 - j), k, a.y + i * a.ldy + j, a.ldy, a.accumulate,
                       i == i0 ? next : nullptr);
      }
    }
  }
}

// The quads' DirectAs: 1..4 rows in register tiles of 3-4 quads over the range, more rows in
// blocks of 8 per quad (QuadRowBlocks: in the same process, 1.05-1.6x faster than the tiles
// of 4 rows over 12 columns at m = 5-128 and than fp32 panels at m = 512; docs/benchmarks.md).
void DirectQuads(const LinearArgs& a, int n0, int n1) {
  MORSERVE_CHECK(n0 % LinearWeights::kQuadCols == 0, "bf16-quads: a column range starts mid-quad");
  if (a.m <= 4) return QuadFewRows(a.x, a.ldx, a.m, *a.w, a.y, a.ldy, a.accumulate, n0, n1, n1);
  QuadRowBlocks(a, n0, n1);
}

// int8-octets (linear_weights.h): one 16-byte load widens to a pair of columns' block of 8 in
// the two halves of a register (the L8 lanes), times the pair's scales: the exact fp32 values
// Q8Format decodes, so the bits are the same.
constexpr int kOctetGroupBytes = LinearWeights::kOctetGroupBytes;

// The 4 pair registers' scales of one octet's group: pair c holds column 2c's scale in lanes
// 0..7 and column 2c + 1's in lanes 8..15.
void OctetScales(const uint8_t* group, __m512 (&scale)[4]) {
  const __m512 d = _mm512_castps256_ps512(
      _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(group))));
  for (int c = 0; c < 4; ++c) {
    const __m512i pick =
        _mm512_inserti64x4(_mm512_set1_epi32(2 * c), _mm256_set1_epi32(2 * c + 1), 1);
    scale[c] = _mm512_permutexvar_ps(pick, d);
  }
}

__m512 OctetPair(const uint8_t* at, __m512 scale) {
  const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(at));
  return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q)), scale);
}

// MB rows of x times the NO octets from `octet` on (octet o at octet + o * stride), columns
// [0, ncols) written (ncols <= 8 * NO). next: the first byte of a later tile's octets (stored
// one after another), prefetched at the pace this tile reads its own, or nullptr.
template <int MB, int NO>
void OctetTile(const float* x, int64_t ldx, const uint8_t* octet, int64_t stride, int ncols, int k,
               float* y, int64_t ldy, bool accumulate, const char* next) {
  __m512 acc[MB][4 * NO];
  for (int i = 0; i < MB; ++i) {
    for (int c = 0; c < 4 * NO; ++c) acc[i][c] = _mm512_setzero_ps();
  }
  __m512 scale[NO][4];
  // Block b of 8 along k (count values of x, the rest masked): group b / 4's scales first.
  auto block = [&](int b, int count) {
    const int64_t at = (b / 4) * kOctetGroupBytes + 16 + (b % 4) * 64;
    if (b % 4 == 0) {
      for (int o = 0; o < NO; ++o) OctetScales(octet + o * stride + at - 16, scale[o]);
    }
    if (next != nullptr) {
      for (int o = 0; o < NO; ++o) _mm_prefetch(next + o * stride + at, _MM_HINT_T1);
    }
    __m512 xv[MB];
    for (int i = 0; i < MB; ++i) xv[i] = BroadcastX(x + i * ldx, 8 * b, count);
    for (int o = 0; o < NO; ++o) {
      for (int c = 0; c < 4; ++c) {
        const __m512 wv = OctetPair(octet + o * stride + at + 16 * c, scale[o][c]);
        for (int i = 0; i < MB; ++i)
          acc[i][4 * o + c] = _mm512_fmadd_ps(xv[i], wv, acc[i][4 * o + c]);
      }
    }
  };
  const int kfull = k / 8;
  for (int b = 0; b < kfull; ++b) block(b, 8);
  if (k % 8 != 0) block(kfull, k % 8);  // the octets hold zeros past k; x is masked there
  for (int i = 0; i < MB; ++i) {
    for (int c = 0; c < 4 * NO; ++c) {
      const float s[2] = {HorizontalSum(_mm512_castps512_ps256(acc[i][c])),
                          HorizontalSum(_mm512_extractf32x8_ps(acc[i][c], 1))};
      for (int h = 0; h < 2 && 2 * c + h < ncols; ++h) {
        float& out = y[i * ldy + 2 * c + h];
        out = accumulate ? out + s[h] : s[h];
      }
    }
  }
}

// Columns [n0, n1) of MB rows (n0 a multiple of 8): tiles of NO octets, then single octets.
template <int MB, int NO>
void OctetRows(const float* x, int64_t ldx, const LinearWeights& w, float* y, int64_t ldy,
               bool accumulate, int n0, int n1) {
  const int64_t stride = OctetStride(w.k());
  const uint8_t* octets = w.octets();
  constexpr int kCols = 8 * NO;
  int j = n0;
  for (; j + kCols <= n1; j += kCols) {
    const int ahead = j + kCols;  // the next tile: its stream follows this one's
    const char* next =
        ahead < n1 ? reinterpret_cast<const char*>(octets + (ahead / 8) * stride) : nullptr;
    OctetTile<MB, NO>(x, ldx, octets + (j / 8) * stride, stride, kCols, w.k(), y + j, ldy,
                      accumulate, next);
  }
  for (; j < n1; j += 8) {
    OctetTile<MB, 1>(x, ldx, octets + (j / 8) * stride, stride, std::min(8, n1 - j), w.k(), y + j,
                     ldy, accumulate, nullptr);
  }
}

// mb = 1..4 rows of x times one octet (8 columns; ncols of them written).
void OctetColumnTile(int mb, const float* x, int64_t ldx, const uint8_t* octet, int64_t stride,
                     int ncols, int k, float* y, int64_t ldy, bool accumulate, const char* next) {
  static constexpr decltype(&OctetTile<1, 1>) kTiles[] = {&OctetTile<1, 1>, &OctetTile<2, 1>,
                                                          &OctetTile<3, 1>, &OctetTile<4, 1>};
  kTiles[mb - 1](x, ldx, octet, stride, ncols, k, y, ldy, accumulate, next);
}

// The octets' DirectAs: 1 and 2 rows in tiles of 2 octets (16 columns), 3 and 4 rows of 1
// octet; from 5 rows on, for each chunk of 64 rows and each octet of the range, every block
// of 4 rows in turn (the octet from L1 after the first block, which prefetches the next one).
void DirectOctets(const LinearArgs& a, int n0, int n1) {
  MORSERVE_CHECK(n0 % LinearWeights::kOctetCols == 0,
                 "int8-octets: a column range starts mid-octet");
  const LinearWeights& w = *a.w;
  switch (a.m) {
    case 1:
      return OctetRows<1, 2>(a.x, a.ldx, w, a.y, a.ldy, a.accumulate, n0, n1);
    case 2:
      return OctetRows<2, 2>(a.x, a.ldx, w, a.y, a.ldy, a.accumulate, n0, n1);
    case 3:
      return OctetRows<3, 1>(a.x, a.ldx, w, a.y, a.ldy, a.accumulate, n0, n1);
    case 4:
      return OctetRows<4, 1>(a.x, a.ldx, w, a.y, a.ldy, a.accumulate, n0, n1);
    default:
      break;
  }
  const int64_t stride = OctetStride(w.k());
  const uint8_t* octets = w.octets();
  for (int i0 = 0; i0 < a.m; i0 += kQuadRowChunk) {
    const int i1 = std::min(a.m, i0 + kQuadRowChunk);
    for (int j = n0; j < n1; j += LinearWeights::kOctetCols) {
      const int ahead = j + LinearWeights::kOctetCols;
      const char* next = i0 == 0 && ahead < n1
                             ? reinterpret_cast<const char*>(octets + (ahead / 8) * stride)
                             : nullptr;
      for (int i = i0; i < i1; i += 4) {
        OctetColumnTile(std::min(4, i1 - i), a.x + i * a.ldx, a.ldx, octets + (j / 8) * stride,
                        stride, std::min(8, n1 - j), w.k(), a.y + i * a.ldy + j, a.ldy,
                        a.accumulate, i == i0 ? next : nullptr);
      }
    }
  }
}

void Direct(const LinearArgs& a, int n0, int n1) {
  if (a.w->format() == WeightFormat::kBF16Quads) return DirectQuads(a, n0, n1);
  if (a.w->format() == WeightFormat::kQ8Octets) return DirectOctets(a, n0, n1);
  VisitWeightFormat<F32Format, Half16Format<true>, Half16Format<false>, Q8Format>(
      a.w->format(), [&](auto tag) { DirectAs<typename decltype(tag)::type>(a, n0, n1); });
}

// From this many rows on, decoding a panel once beats decoding the weights in every tile.
constexpr int kPanelMinRows = 17;
// The same for int8-octets, whose blocks of 4 rows stream faster than the panels up to here.
constexpr int kOctetPanelMinRows = 64;

// Panel rows for k: a panel of decoded fp32 rows stays within ~512 KiB (half of an AVX-512
// server core's L2), in multiples of 12, at least 12.
int PanelRows(int k) {
  const int rows = (512 * 1024) / (4 * ((k + 7) & ~7)) / kWideCols * kWideCols;
  return std::clamp(rows, kWideCols, 192);
}

// Columns [j0, j0 + ncols) of W as exact fp32, in pairs: block b of pair p (16 values) stored
// at out + b * stride + p * 16. A missing second column of the last pair repeats the first.
template <class Format>
void DecodePairsAs(const LinearWeights& w, int j0, int ncols, float* out, int stride) {
  const int k = w.k(), kfull = k & ~7;
  for (int p = 0; 2 * p < ncols; ++p) {
    const WeightRow& a = w.row(j0 + 2 * p);
    const WeightRow& b = w.row(j0 + std::min(2 * p + 1, ncols - 1));
    __m512 scale = _mm512_setzero_ps();
    float* dst = out + p * 16;
    for (int k0 = 0; k0 < kfull; k0 += 8) {
      if constexpr (Format::kGrouped) {
        if (k0 % kGroup == 0) scale = Format::Scale(a, b, k0);
      }
      _mm512_storeu_ps(dst + (k0 / 8) * stride, Format::Load(a, b, k0, scale));
    }
    if (kfull < k) {
      if constexpr (Format::kGrouped) {
        if (kfull % kGroup == 0) scale = Format::Scale(a, b, kfull);
      }
      _mm512_storeu_ps(dst + (kfull / 8) * stride, Format::LoadTail(a, b, kfull, k - kfull, scale));
    }
  }
}

void DecodePairs(const LinearWeights& w, int j0, int ncols, float* out, int stride) {
  if (w.format() == WeightFormat::kQ8Octets)
    return DecodePairsAs<OctetRowFormat>(w, j0, ncols, out, stride);
  VisitWeightFormat<F32Format, Half16Format<true>, Half16Format<false>, Q8Format>(
      w.format(),
      [&](auto tag) { DecodePairsAs<typename decltype(tag)::type>(w, j0, ncols, out, stride); });
}

// m >= kPanelMinRows: decode PanelRows(k) rows at a time to fp32, interleaved by 12-column tile
// (PackedF32Format<6>), the last 1..11 columns as pairs of their own (PackedF32Format<1>), then
// every block of 4 rows of x runs over the panel.
void Panelled(const LinearArgs& a, int n0, int n1) {
  const int k = a.w->k(), kp = (k + 7) & ~7, panel = PanelRows(k);
  thread_local std::vector<float> decoded;
  thread_local std::vector<WeightRow> panel_rows;
  decoded.resize(static_cast<size_t>(panel + 1) * kp);  // + 1: the last odd column's twin
  panel_rows.resize(panel + 1);
  for (int p0 = n0; p0 < n1; p0 += panel) {
    const int count = std::min(panel, n1 - p0), tiled = count / kWideCols * kWideCols;
    for (int j = 0; j < tiled; j += kWideCols) {
      float* base = &decoded[static_cast<size_t>(j) * kp];
      DecodePairs(*a.w, p0 + j, kWideCols, base, kWideCols * 8);
      for (int c = 0; c < kWideCols; c += 2) panel_rows[j + c].data = base + c * 8;
    }
    for (int j = tiled; j < count; j += 2) {
      float* base = &decoded[static_cast<size_t>(j) * kp];
      DecodePairs(*a.w, p0 + j, std::min(2, count - j), base, 16);
      panel_rows[j].data = base;
      panel_rows[j + 1].data = base;
    }
    for (int i = 0; i < a.m; i += 4) {
      const int mb = std::min(4, a.m - i);
      const float* xb = a.x + i * a.ldx;
      float* yb = a.y + i * a.ldy + p0;
      for (int j = 0; j < tiled; j += kWideCols) {
        Tile12<PackedF32Format<6>>(mb, xb, a.ldx, panel_rows.data() + j, k, yb + j, a.ldy,
                                   a.accumulate, nullptr);
      }
      for (int j = tiled; j < count; j += 2) {
        TilePair(mb, xb, a.ldx, panel_rows.data() + j, std::min(2, count - j), k, yb + j, a.ldy,
                 a.accumulate);
      }
    }
  }
}

// bf16-quads never take the panels (QuadRowBlocks is faster at every m measured); int8-octets
// from kOctetPanelMinRows on (their blocks of 4 rows decode every weight once per block).
void RunAvx512(const LinearArgs& a, int n0, int n1) {
  const int panel_min =
      a.w->format() == WeightFormat::kQ8Octets ? kOctetPanelMinRows : kPanelMinRows;
  if (a.m < panel_min || a.w->format() == WeightFormat::kBF16Quads) {
    Direct(a, n0, n1);
  } else {
    Panelled(a, n0, n1);
  }
}

int Avx512ChunkRows(int m, int k) { return m < kPanelMinRows ? kDirectChunk : PanelRows(k); }

}  // namespace

MORSERVE_END_TARGET

const LinearKernelSet* Avx512LinearKernels() {
  static const bool ok = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                         __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") &&
                         Avx2LinearKernels() != nullptr;
  static const LinearKernelSet set{"avx512", &RunAvx512, &Avx512ChunkRows};
  return ok ? &set : nullptr;
}

}  // namespace morserve
