// The fixed-order GEMM's kernels and launcher; the contract (the summation order) is in
// fixed_gemm.cuh.
#include <algorithm>
#include <cstdint>

#include "kernels/device_helpers.cuh"
#include "kernels/fixed_gemm.cuh"
#include "kernels/launch.cuh"

namespace morserve::kernels {
namespace {

constexpr int kWarpsPerBlock = 4;
constexpr int kThreads = 32 * kWarpsPerBlock;
constexpr int kSpan = 32;  // k per pair of mma (each lane loads 8 values of a row)
constexpr int kSpansPerChunk = kFixedGemmChunk / kSpan;
static_assert(kFixedGemmChunk % kSpan == 0, "a chunk is whole spans");
// Fewer one-pass warps than this leave an H100's memory system idle (132 SMs); below it, small
// m splits k when the workspace allows.
constexpr int64_t kBusyWarps = 1024;
constexpr int kSplitMaxM = 64;
constexpr int kCombineThreads = 256;
constexpr int64_t kMaxCombineBlocks = 1 << 16;

struct Plan {
  int rows_per_warp = 8;  // 8, 16 or 32: sub-tiles of 8 rows sharing a warp's w fragments
  int64_t n_tiles = 0, row_tiles = 0;
  int chunks = 0;
  bool split = false;
  size_t split_bytes = 0;  // the workspace the split schedule needs
};

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The schedule of a call: kAuto takes the most rows per warp (w fragments reused) that still
// gives kBusyWarps warps, and splits k at small m where even 8 rows per warp give fewer.
Plan MakePlan(int m, int n, int k, size_t workspace_bytes, FixedGemmSchedule schedule) {
  Plan p;
  p.n_tiles = CeilDiv(n, 16);
  p.chunks = static_cast<int>(CeilDiv(k, kFixedGemmChunk));
  p.split_bytes = static_cast<size_t>(p.chunks) * m * n * sizeof(float);
  switch (schedule) {
    case FixedGemmSchedule::kAuto:
      p.rows_per_warp = 32;
      while (p.rows_per_warp > 8 && p.n_tiles * CeilDiv(m, p.rows_per_warp) < kBusyWarps) {
        p.rows_per_warp /= 2;
      }
      p.split = p.chunks > 1 && m <= kSplitMaxM && p.n_tiles * CeilDiv(m, 8) < kBusyWarps &&
                workspace_bytes >= p.split_bytes;
      if (p.split) p.rows_per_warp = 8;
      break;
    case FixedGemmSchedule::kOnePass8:
    case FixedGemmSchedule::kOnePass16:
    case FixedGemmSchedule::kOnePass32:
      p.rows_per_warp = schedule == FixedGemmSchedule::kOnePass8    ? 8
                        : schedule == FixedGemmSchedule::kOnePass16 ? 16
                                                                    : 32;
      break;
    case FixedGemmSchedule::kSplit:
      p.rows_per_warp = 8;
      p.split = true;
      break;
  }
  p.row_tiles = CeilDiv(m, p.rows_per_warp);
  return p;
}

// The 16 bytes (8 bf16) of row `row` at column `col` of a [rows, k] matrix, or zeros outside it
// (k % 8 == 0, so a lane's 8 values are all inside or all outside).
__device__ __forceinline__ uint4 Load8(const uint16_t* __restrict__ a, int row, int rows, int col,
                                       int k) {
  if (row >= rows || col >= k) return uint4{0, 0, 0, 0};
  return *reinterpret_cast<const uint4*>(a + static_cast<int64_t>(row) * k + col);
}

// One warp per item: a (16-column, 8 * S-row) tile over all chunks (one pass), or over chunk
// item / tiles (split: the partial goes to `partials[chunk][m][n]`). Items: column tile
// fastest, so neighbouring warps share x rows.
template <int S>
__global__ void __launch_bounds__(kThreads)
    FixedGemmKernel(const uint16_t* __restrict__ x, const uint16_t* __restrict__ w,
                    float* __restrict__ y, float* __restrict__ partials, int m, int n, int k,
                    int64_t n_tiles, int64_t row_tiles, int chunks, int split) {
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t item = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  const int64_t tiles = n_tiles * row_tiles;
  if (item >= (split ? tiles * chunks : tiles)) return;  // the whole warp together
  const int64_t tile = item % tiles;
  const int col0 = static_cast<int>(tile % n_tiles) * 16;
  const int row0 = static_cast<int>(tile / n_tiles) * 8 * S;
  const int c_begin = split ? static_cast<int>(item / tiles) : 0;
  const int c_end = split ? c_begin + 1 : chunks;
  const int g = lane / 4, t = lane % 4;
  float total[S][4];
  for (int c = c_begin; c < c_end; ++c) {
    const int k0 = c * kFixedGemmChunk;
    // Every load of the chunk first (memory parallelism), then the mma chain in span order.
    uint4 wl[kSpansPerChunk], wh[kSpansPerChunk], xv[kSpansPerChunk][S];
#pragma unroll
    for (int sp = 0; sp < kSpansPerChunk; ++sp) {
      const int kk = k0 + sp * kSpan + 8 * t;
      wl[sp] = Load8(w, col0 + g, n, kk, k);
      wh[sp] = Load8(w, col0 + g + 8, n, kk, k);
#pragma unroll
      for (int j = 0; j < S; ++j) xv[sp][j] = Load8(x, row0 + 8 * j + g, m, kk, k);
    }
    float acc[S][4];
#pragma unroll
    for (int j = 0; j < S; ++j) {
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[j][i] = 0.0f;
    }
#pragma unroll
    for (int sp = 0; sp < kSpansPerChunk; ++sp) {
      if (k0 + sp * kSpan >= k) break;  // the last chunk's tail (the same for every m)
      // Span values 8t..8t+3 are the first mma's k = 2t, 2t+1, 2t+8, 2t+9; 8t+4..8t+7 the
      // second's: the same permutation for w's rows (A) and x's rows (B).
      const uint32_t a0[4] = {wl[sp].x, wh[sp].x, wl[sp].y, wh[sp].y};
      const uint32_t a1[4] = {wl[sp].z, wh[sp].z, wl[sp].w, wh[sp].w};
#pragma unroll
      for (int j = 0; j < S; ++j) {
        const uint32_t b0[2] = {xv[sp][j].x, xv[sp][j].y};
        const uint32_t b1[2] = {xv[sp][j].z, xv[sp][j].w};
        MmaBf16M16N8K16(acc[j], a0, b0, acc[j]);
        MmaBf16M16N8K16(acc[j], a1, b1, acc[j]);
      }
    }
#pragma unroll
    for (int j = 0; j < S; ++j) {
#pragma unroll
      for (int i = 0; i < 4; ++i)
        total[j][i] = c == c_begin ? acc[j][i] : __fadd_rn(total[j][i], acc[j][i]);
    }
  }
  float* out = split ? partials + static_cast<int64_t>(c_begin) * m * n : y;
#pragma unroll
  for (int j = 0; j < S; ++j) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      // D's rows are w's rows (y's columns); D's columns are x's rows (y's rows).
      const int col = col0 + g + (i >= 2 ? 8 : 0), row = row0 + 8 * j + 2 * t + i % 2;
      if (row < m && col < n) out[static_cast<int64_t>(row) * n + col] = total[j][i];
    }
  }
}

// y = ((p_0 + p_1) + p_2) + ... per element, in chunk order.
__global__ void __launch_bounds__(kCombineThreads)
    FixedGemmCombineKernel(const float* __restrict__ partials, float* __restrict__ y, int64_t mn,
                           int chunks) {
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * kCombineThreads + threadIdx.x; e < mn;
       e += static_cast<int64_t>(gridDim.x) * kCombineThreads) {
    float s = partials[e];
    for (int c = 1; c < chunks; ++c) s = __fadd_rn(s, partials[c * mn + e]);
    y[e] = s;
  }
}

template <int S>
cudaError_t LaunchTiles(const FixedGemmParams& p, const Plan& plan, cudaStream_t stream) {
  const int64_t items = plan.n_tiles * plan.row_tiles * (plan.split ? plan.chunks : 1);
  const unsigned blocks = static_cast<unsigned>(CeilDiv(items, kWarpsPerBlock));
  MORSERVE_LAUNCH(blocks, kThreads, 0, stream, FixedGemmKernel<S>)
  (p.x, p.w, p.y, p.workspace, p.m, p.n, p.k, plan.n_tiles, plan.row_tiles, plan.chunks,
   plan.split ? 1 : 0);
  return cudaGetLastError();
}

bool Aligned16(const void* q) { return reinterpret_cast<uintptr_t>(q) % 16 == 0; }

}  // namespace

size_t FixedGemmWorkspaceBytes(int m, int n, int k, FixedGemmSchedule schedule) {
  if (m <= 0 || n <= 0 || k <= 0) return 0;
  const Plan plan = MakePlan(m, n, k, SIZE_MAX, schedule);
  return plan.split ? plan.split_bytes : 0;
}

bool FixedGemmSplits(int m, int n, int k, size_t workspace_bytes, FixedGemmSchedule schedule) {
  return m > 0 && n > 0 && k > 0 && MakePlan(m, n, k, workspace_bytes, schedule).split;
}

cudaError_t fixed_gemm_forward(const FixedGemmParams& p, cudaStream_t stream) {
  if (p.m <= 0 || p.n <= 0 || p.k <= 0 || p.k % 8 != 0 || p.x == nullptr || p.w == nullptr ||
      p.y == nullptr || !Aligned16(p.x) || !Aligned16(p.w) ||
      (p.workspace == nullptr && p.workspace_bytes > 0)) {
    return cudaErrorInvalidValue;
  }
  const Plan plan = MakePlan(p.m, p.n, p.k, p.workspace_bytes, p.schedule);
  if (plan.split &&
      (plan.chunks < 2 || p.workspace == nullptr || p.workspace_bytes < plan.split_bytes)) {
    return cudaErrorInvalidValue;  // kSplit forced without a second chunk or the workspace
  }
  cudaError_t e = cudaSuccess;
  switch (plan.rows_per_warp) {
    case 8:
      e = LaunchTiles<1>(p, plan, stream);
      break;
    case 16:
      e = LaunchTiles<2>(p, plan, stream);
      break;
    default:
      e = LaunchTiles<4>(p, plan, stream);
      break;
  }
  if (e != cudaSuccess || !plan.split) return e;
  const int64_t mn = static_cast<int64_t>(p.m) * p.n;
  MORSERVE_LAUNCH(GridStrideBlocks(mn, kCombineThreads, kMaxCombineBlocks), kCombineThreads, 0,
                  stream, FixedGemmCombineKernel)
  (p.workspace, p.y, mn, plan.chunks);
  return cudaGetLastError();
}

}  // namespace morserve::kernels
