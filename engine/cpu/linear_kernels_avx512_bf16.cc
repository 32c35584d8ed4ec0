// The AVX-512 BF16 linear kernel set (linear_kernels.h): y = bf16(x) · W^T with VDPBF16PS, for
// amx-bf16 weights on hosts that have AVX-512 BF16 but no AMX (AMD Zen 4 and Zen 5, Intel Cooper
// Lake). It takes the AMX set's inputs: each row of x rounded to bf16 (nearest even, bf16_rows.h)
// and the weights' tiles as linear_weights.h lays them out, whose rows are exactly VDPBF16PS's
// operands (16 columns, a pair of k values per 32-bit lane).
//
// Its order, by design, for every output element whatever M, the row's place in the batch or the
// column range: one fp32 accumulator from +0; for each pair (2r, 2r + 1) of k in order,
//   acc += x[2r + 1] w[2r + 1]; acc += x[2r] w[2r]
// (each an fp32 add of an exact product of two bf16 values, rounded to nearest even, input and
// output denormals flushed to zero: VDPBF16PS as the Intel SDM writes it); y = acc, or
// y = y + acc when accumulating. So batch invariance holds by construction, and the tests hold
// the set to a scalar emulation of that order bit for bit. (The AMX tile unit sums in an
// undocumented order: the two sets agree to the fp32 summation bound, not bitwise.)
//
// Register tile: up to 6 rows of x by one group of 64 columns (4 accumulators per row, 24 of the
// 32 registers); each 64-byte tile row (16 columns, one pair of k) is loaded once for every row
// of the block. x is rounded once per call (PrepareAvx512Bf16), not once per range. Rows run in
// chunks of 48 so a group's tiles (kp x 64 bf16 values, 120-320 KiB at the 360M shapes) come
// from memory once per chunk and from L2 for the chunk's later blocks.
#include <algorithm>
#include <cstring>

#include "engine/core/check.h"
#include "engine/cpu/bf16_rows.h"
#include "engine/cpu/linear_kernels.h"
#include "engine/cpu/simd_intrinsics.h"
#include "engine/cpu/simd_target.h"

namespace morserve {
namespace {

constexpr int kGroupCols = LinearWeights::kAmxGroupCols;
constexpr int kKBlock = LinearWeights::kAmxKBlock;
constexpr int kTileBytes = 1024;  // 16 pairs of k x 16 columns x 2 bf16
constexpr int kPairBytes = 64;    // one tile row
constexpr int kMaxBlockRows = 6;
constexpr int kChunkRows = 48;
// Tiles are read in one stream (a thread's groups lie one after the other): each line is asked
// for this far ahead of its load. Past the range's end it only touches lines nobody reads.
constexpr int kPrefetchBytes = 4096;

// One row block of the register tile: MB rows of bf16 x (kp values each, `ldx` apart), one group
// of tiles, the first `cols` of its 64 columns written to y (rows `ldy` floats apart).
struct BlockArgs {
  const uint16_t* x;
  int kp;
  const uint8_t* group;
  float* y;
  int64_t ldy;
  int cols;
  bool accumulate;
};

}  // namespace

MORSERVE_BEGIN_TARGET("avx512f,avx512bw,avx512vl,avx512bf16")

namespace {

inline __m512i BroadcastPair(const uint16_t* p) {
  int32_t v;
  std::memcpy(&v, p, sizeof(v));
  return _mm512_set1_epi32(v);
}

template <int MB>
void DotBlock(const BlockArgs& b) {
  __m512 acc[MB][4];
  for (int i = 0; i < MB; ++i)
    for (int v = 0; v < 4; ++v) acc[i][v] = _mm512_setzero_ps();
  const int kblocks = b.kp / kKBlock;
  for (int kb = 0; kb < kblocks; ++kb) {
    const uint8_t* tiles = b.group + static_cast<int64_t>(kb) * 4 * kTileBytes;
    const uint16_t* xk = b.x + kb * kKBlock;
    for (int r = 0; r < kKBlock / 2; ++r) {
      __m512i w[4];
      for (int v = 0; v < 4; ++v) {
        const uint8_t* line = tiles + v * kTileBytes + r * kPairBytes;
        _mm_prefetch(reinterpret_cast<const char*>(line + kPrefetchBytes), _MM_HINT_T0);
        w[v] = _mm512_load_si512(line);
      }
      for (int i = 0; i < MB; ++i) {
        const __m512bh xp = reinterpret_cast<__m512bh>(BroadcastPair(xk + i * b.kp + 2 * r));
        for (int v = 0; v < 4; ++v)
          acc[i][v] = _mm512_dpbf16_ps(acc[i][v], reinterpret_cast<__m512bh>(w[v]), xp);
      }
    }
  }
  for (int v = 0; v < 4; ++v) {
    const int valid = std::clamp(b.cols - 16 * v, 0, 16);
    if (valid == 0) break;
    const auto mask = static_cast<__mmask16>((1u << valid) - 1u);
    for (int i = 0; i < MB; ++i) {
      float* y = b.y + i * b.ldy + 16 * v;
      const __m512 s =
          b.accumulate ? _mm512_add_ps(_mm512_maskz_loadu_ps(mask, y), acc[i][v]) : acc[i][v];
      _mm512_mask_storeu_ps(y, mask, s);
    }
  }
}

using BlockFn = void (*)(const BlockArgs&);
constexpr BlockFn kBlocks[kMaxBlockRows] = {&DotBlock<1>, &DotBlock<2>, &DotBlock<3>,
                                            &DotBlock<4>, &DotBlock<5>, &DotBlock<6>};

// x's rows rounded to bf16 once per call, for every range of the call.
void PrepareAvx512Bf16(LinearArgs& a) { PrepareBf16Rows(a, a.m); }

void RunAvx512Bf16(const LinearArgs& a, int n0, int n1) {
  const LinearWeights& w = *a.w;
  MORSERVE_CHECK(w.format() == WeightFormat::kAmxBf16,
                 "the AVX-512 BF16 kernel set reads amx-bf16 weights only");
  MORSERVE_CHECK(n0 % kGroupCols == 0, "AVX-512 BF16 column ranges start on a group of 64");
  MORSERVE_CHECK(a.prepared != nullptr, "the AVX-512 BF16 kernel set runs after its prepare");
  const int kp = Bf16RowStride(w.k());
  const int64_t group_bytes = static_cast<int64_t>(kp / kKBlock) * 4 * kTileBytes;
  const auto* xa = static_cast<const uint16_t*>(a.prepared);
  const auto* tiles = reinterpret_cast<const uint8_t*>(w.amx_tiles());
  for (int c0 = 0; c0 < a.m; c0 += kChunkRows) {
    const int c1 = std::min(a.m, c0 + kChunkRows);
    for (int j0 = n0; j0 < n1; j0 += kGroupCols) {
      BlockArgs b{nullptr,     kp,    tiles + (j0 / kGroupCols) * group_bytes,
                  nullptr,     a.ldy, std::min(kGroupCols, n1 - j0),
                  a.accumulate};
      // The chunk's rows in blocks of at most 6, as even as they come (8 rows: 4 + 4).
      for (int i0 = c0; i0 < c1;) {
        const int left = c1 - i0, blocks = (left + kMaxBlockRows - 1) / kMaxBlockRows;
        const int rows = (left + blocks - 1) / blocks;
        b.x = xa + static_cast<int64_t>(i0) * kp;
        b.y = a.y + i0 * a.ldy + j0;
        kBlocks[rows - 1](b);
        i0 += rows;
      }
    }
  }
}

}  // namespace

MORSERVE_END_TARGET

namespace {

int Avx512Bf16ChunkRows(int, int) { return kGroupCols; }

}  // namespace

const LinearKernelSet* Avx512Bf16LinearKernels() {
  static const bool ok = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bf16");
  static const LinearKernelSet set{"avx512-bf16", &RunAvx512Bf16, &Avx512Bf16ChunkRows,
                                   &PrepareAvx512Bf16};
  return ok ? &set : nullptr;
}

const LinearKernelSet* AmxBf16BestLinearKernels() {
  return AmxLinearKernels() != nullptr ? AmxLinearKernels() : Avx512Bf16LinearKernels();
}

}  // namespace morserve
