// The AMX linear kernel set (linear_kernels.h): y = bf16(x) · W^T on Intel AMX tiles, for
// weights in the AmxBf16 format (linear_weights.h). It is the "bf16 compute" path: each row of
// x is rounded to bf16 (nearest even) before the product, products of bf16 values are exact in
// fp32 and the tile unit sums them in fp32, 32 values of k per instruction, k blocks in order.
//
// Its order differs from the L8 order (the tests hold it to a stated tolerance of the exact
// product instead of the scalar set's bits), but it is one order for every M: a tile row is
// computed from its own row of x only, every M (1 included) runs the same instruction sequence
// per element, so a row's bits do not depend on M, its place in the batch or the thread count.
//
// Tiles: C 0..3 (mb rows x 16 fp32 columns each: a group of 64 output columns), A 4 (mb rows x 32
// bf16 values of k), B 5..7 in turn (16 k pairs x 16 columns x 2). Rows of x run in blocks of up
// to 16 inside each group of 64 columns; a block sums over every k block, then stores. x is
// rounded once per call (PrepareAmx), not once per range of the pool.
#include <asm/prctl.h>
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "engine/core/check.h"
#include "engine/cpu/bf16_rows.h"
#include "engine/cpu/linear_kernels.h"
#include "engine/cpu/simd_intrinsics.h"
#include "engine/cpu/simd_target.h"

namespace morserve {
namespace {

constexpr int kGroupCols = LinearWeights::kAmxGroupCols;
constexpr int kKBlock = LinearWeights::kAmxKBlock;
constexpr int kTileBytes = 1024;
constexpr int kXFeatureTileData = 18;  // XFEATURE_XTILEDATA: Linux asks processes to request it

// The 64-byte tile configuration LDTILECFG reads (palette 1).
struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

}  // namespace

MORSERVE_BEGIN_TARGET("amx-tile,amx-bf16,avx512f,avx512bw")

namespace {

void Configure(int mb) {
  TileConfig cfg;
  for (int t = 0; t < 4; ++t) {
    cfg.rows[t] = static_cast<uint8_t>(mb);
    cfg.colsb[t] = 64;
  }
  cfg.rows[4] = static_cast<uint8_t>(mb);
  cfg.colsb[4] = 64;
  for (int t = 5; t < 8; ++t) {
    cfg.rows[t] = 16;
    cfg.colsb[t] = 64;
  }
  _tile_loadconfig(&cfg);
}

// One block of mb rows (a: bf16 rows of kp values) times one group of 64 columns (b: the group's
// tiles, kblocks x 4 x 1 KiB): out[mb][64] fp32, rows `ldo` floats apart.
void GroupBlock(const uint16_t* a, int kp, const uint8_t* b, float* out, int64_t ldo) {
  const int kblocks = kp / kKBlock;
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (int kb = 0; kb < kblocks; ++kb) {
    const uint8_t* bt = b + static_cast<int64_t>(kb) * 4 * kTileBytes;
    _tile_loadd(4, a + kb * kKBlock, kp * 2);
    _tile_loadd(5, bt, 64);
    _tile_dpbf16ps(0, 4, 5);
    _tile_loadd(6, bt + kTileBytes, 64);
    _tile_dpbf16ps(1, 4, 6);
    _tile_loadd(7, bt + 2 * kTileBytes, 64);
    _tile_dpbf16ps(2, 4, 7);
    _tile_loadd(5, bt + 3 * kTileBytes, 64);
    _tile_dpbf16ps(3, 4, 5);
  }
  _tile_stored(0, out, ldo * 4);
  _tile_stored(1, out + 16, ldo * 4);
  _tile_stored(2, out + 32, ldo * 4);
  _tile_stored(3, out + 48, ldo * 4);
}

// m <= 16 rows run as one block of m rows; more run in blocks of 16, x zero-padded to whole
// blocks.
int PaddedRows(int m) { return m <= 16 ? m : (m + 15) / 16 * 16; }

// x's rows rounded to bf16 once per call (padded rows zero), for every range of the call.
void PrepareAmx(LinearArgs& a) { PrepareBf16Rows(a, PaddedRows(a.m)); }

void RunAmx(const LinearArgs& a, int n0, int n1) {
  const LinearWeights& w = *a.w;
  MORSERVE_CHECK(w.format() == WeightFormat::kAmxBf16,
                 "the AMX kernel set reads amx-bf16 weights only");
  MORSERVE_CHECK(n0 % kGroupCols == 0, "AMX column ranges start on a group of 64");
  MORSERVE_CHECK(a.prepared != nullptr, "the AMX kernel set runs after its prepare");
  const int kp = Bf16RowStride(w.k());
  const int64_t group_bytes = static_cast<int64_t>(kp / kKBlock) * 4 * kTileBytes;
  // Blocks of rows inside each group of columns, so the group's tiles come from memory once and
  // from L2 for later blocks.
  const int mb = std::min(16, a.m), mrows = PaddedRows(a.m);
  const auto* xa = static_cast<const uint16_t*>(a.prepared);
  thread_local std::vector<float> out;
  out.resize(16 * kGroupCols);
  const auto* tiles = reinterpret_cast<const uint8_t*>(w.amx_tiles());
  Configure(mb);
  for (int j0 = n0; j0 < n1; j0 += kGroupCols) {
    const int cols = std::min(kGroupCols, n1 - j0);
    for (int i0 = 0; i0 < mrows; i0 += mb) {
      const uint16_t* xb = xa + static_cast<int64_t>(i0) * kp;
      const uint8_t* group = tiles + (j0 / kGroupCols) * group_bytes;
      if (!a.accumulate && cols == kGroupCols && a.m - i0 >= mb) {
        // Whole block, nothing to add: the tiles store straight into y's rows.
        GroupBlock(xb, kp, group, a.y + i0 * a.ldy + j0, a.ldy);
        continue;
      }
      GroupBlock(xb, kp, group, out.data(), kGroupCols);
      for (int i = 0; i < std::min(mb, a.m - i0); ++i) {
        float* y = a.y + (i0 + i) * a.ldy + j0;
        const float* s = out.data() + i * kGroupCols;
        for (int j = 0; j < cols; ++j) y[j] = a.accumulate ? y[j] + s[j] : s[j];
      }
    }
  }
  _tile_release();
}

}  // namespace

MORSERVE_END_TARGET

namespace {

int AmxChunkRows(int, int) { return kGroupCols; }

// The kernel's own AMX use needs the CPU's tile unit and Linux's permission for the tile state.
// AMX-TILE and AMX-BF16 from cpuid leaf 7 (EDX bits 24 and 22): not every compiler's
// __builtin_cpu_supports knows them.
bool AmxUsable() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  const bool amx = __get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) != 0 &&
                   (edx & (1u << 24)) != 0 && (edx & (1u << 22)) != 0;
  if (!amx || !__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx512bw"))
    return false;
  return syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, kXFeatureTileData) == 0;
}

}  // namespace

const LinearKernelSet* AmxLinearKernels() {
  static const bool ok = AmxUsable();
  static const LinearKernelSet set{"amx", &RunAmx, &AmxChunkRows, &PrepareAmx};
  return ok ? &set : nullptr;
}

}  // namespace morserve
