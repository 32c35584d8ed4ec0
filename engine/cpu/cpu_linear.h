// CpuLinear: y[M, N] = x[M, K] · W^T with oneDNN matmul, for one PyTorch-layout weight W [N, K].
//
// Batch invariance (bit for bit): row i of y depends only on row i of x and on W, never on M,
// on the other rows, or on the thread count. oneDNN may pick a different kernel (and a
// different K blocking) for each M, so Forward never shows oneDNN the caller's M: rows are cut
// into tiles of a fixed tile_m() rows (the last tile zero-padded) and every tile runs
// through the same primitive. The N dimension is cut into fixed column slices (chosen from N alone)
// so the pool can spread the work; each (tile, slice) is one single-threaded primitive execution,
// so each output element is computed by exactly one thread in one fixed order.
//
// The weight is reordered once at construction into the layout oneDNN prefers for that fixed
// tile shape (format_tag::any), converted to bf16 for CpuCompute::kBF16. For kBF16 the
// activations are rounded to bf16 (nearest even) row by row; accumulation and output stay fp32.
#pragma once

#include <memory>
#include <vector>

#include "engine/cpu/thread_pool.h"

namespace morserve {

enum class CpuCompute { kF32, kBF16 };

// True when the host has native bf16 arithmetic (AVX512_BF16 or AMX-BF16), as oneDNN needs
// for a fast bf16 matmul.
bool CpuSupportsBf16();

class CpuLinear {
 public:
  // Rows per primitive call, tried in this order; the first tile size whose primitives pass a
  // self-check at construction (distinct random rows give the same bits at every position of a
  // tile: oneDNN's AVX2 sgemm handles the last rows of an 8-row call on a different code path,
  // so this is not automatic; see TilePositionInvariant) is used. Tile 1 always passes. F32 prefers 8 rows because padding
  // is paid in full by fp32 kernels at decode (M = 1); BF16 prefers 16, one AMX tile. Numbers
  // in tests/bench/cpu_linear_bench.cc.
  static constexpr int kTileCandidatesF32[] = {8, 16, 32, 4, 1};
  static constexpr int kTileCandidatesBF16[] = {16, 32, 8, 1};
  // Target column-slice width; the actual width is derived from N only.
  static constexpr int kSliceN = 256;

  // w: [n, k] row-major fp32, copied (reordered) here; the caller may free it afterwards.
  // pool: where Forward runs its tasks; nullptr means DefaultThreadPool().
  CpuLinear(const float* w, int n, int k, CpuCompute compute = CpuCompute::kF32,
            ThreadPool* pool = nullptr);
  ~CpuLinear();
  CpuLinear(const CpuLinear&) = delete;
  CpuLinear& operator=(const CpuLinear&) = delete;

  int n() const { return n_; }
  // Rows per primitive call chosen at construction (see kTileCandidatesF32).
  int tile_m() const { return tile_m_; }
  int k() const { return k_; }
  CpuCompute compute() const { return compute_; }

  // y[m, n] = x[m, k] · W^T. x and y are row-major and must not overlap. m == 0 is a no-op.
  void Forward(const float* x, int m, float* y) const;
  // y[m, n] += x[m, k] · W^T (oneDNN sum post-op: y = y + acc, with acc in fp32).
  void ForwardAccumulate(const float* x, int m, float* y) const;

  // The oneDNN implementation name, e.g. "brg:avx512_core_amx" (for logs and benchmarks).
  const char* impl_name() const;

 private:
  struct Kernel;  // primitives for one slice width
  struct Slice;   // one column block of W: its offset, width, kernel and reordered weights

  void BuildSlices(const float* w);
  bool TilePositionInvariant() const;
  void Execute(const Slice& s, void* src, float* dst, bool accumulate) const;
  void Run(const float* x, int m, float* y, bool accumulate) const;

  int n_;
  int k_;
  CpuCompute compute_;
  int tile_m_ = 0;
  ThreadPool* pool_;
  std::vector<std::unique_ptr<Kernel>> kernels_;
  std::vector<Slice> slices_;
};

}  // namespace morserve
