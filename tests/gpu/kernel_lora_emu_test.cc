// The segmented LoRA kernels (kernels/lora_shrink_kernels.cuh, lora_expand_kernels.cuh) on
// the CPU emulator, with the launchers' own grids, against the double definition (within the
// fp32 rounding bound) and bit for bit against the kernels' stated fixed fp32 order: mixed
// segments (empty ones, single-row ones, segments over several row tiles, rows no segment
// covers), ranks 1, 8, 13, 64 and 100 (several shared-memory passes), fp32 and bf16 t,
// SmolLM-360M shapes, poisoned shrink output, expand accumulating into y, faulty loops,
// malformed segment bounds, and a row alone vs inside a batch. Needs no device.
#include "tests/gpu/cuda_emu.h"
// cuda_emu.h first: it defines the CUDA keywords the kernel headers use.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "kernels/lora_expand_kernels.cuh"
#include "kernels/lora_shrink_kernels.cuh"
#include "tests/gpu/lora_problem.h"

namespace morserve::kernels {
namespace {

using testing::Bits;
using testing::LoraProblem;
using testing::MakeLoraProblem;

constexpr uint16_t kPoisonBf16 = 0xFFFF;  // NaN, as DeviceBuffer::Poison leaves it
constexpr uint32_t kPoisonF32 = 0xFFFFFFFFu;

EmuDim3 Emu(dim3 d) { return {d.x, d.y, d.z}; }
int Segments(const LoraProblem& p) { return static_cast<int>(p.seg_loop.size()); }

std::vector<float> ShrinkF32(const LoraProblem& p) {
  std::vector<float> t(static_cast<size_t>(p.rows) * p.rank);
  for (float& v : t) std::memcpy(&v, &kPoisonF32, 4);
  cuda_emu::Run(Emu(LoraShrinkGrid(p.rows, Segments(p), p.rank)), kShrinkThreads, [&] {
    LoraShrinkKernel<float>(p.x.data(), p.a.data(), t.data(), p.seg_indptr.data(),
                            p.seg_loop.data(), Segments(p), p.rows, p.in, p.rank, p.num_loops);
  });
  return t;
}

std::vector<uint16_t> ShrinkBf16(const LoraProblem& p) {
  std::vector<uint16_t> t(static_cast<size_t>(p.rows) * p.rank, kPoisonBf16);
  cuda_emu::Run(Emu(LoraShrinkGrid(p.rows, Segments(p), p.rank)), kShrinkThreads, [&] {
    LoraShrinkKernel<uint16_t>(p.x.data(), p.a.data(), t.data(), p.seg_indptr.data(),
                               p.seg_loop.data(), Segments(p), p.rows, p.in, p.rank,
                               p.num_loops);
  });
  return t;
}

// y (starting from p.y) after the expand of t, with the launcher's pass width.
template <typename TT>
std::vector<float> Expand(const LoraProblem& p, const std::vector<TT>& t) {
  std::vector<float> y = p.y;
  auto kernel = [&](auto chunk_tag) {
    constexpr int kChunk = decltype(chunk_tag)::value;
    LoraExpandKernel<TT, kChunk>(t.data(), p.b.data(), y.data(), p.seg_indptr.data(),
                                 p.seg_loop.data(), Segments(p), p.rows, p.out, p.rank,
                                 p.num_loops);
  };
  const int chunk = LoraExpandChunk(p.rank);
  cuda_emu::Run(Emu(LoraExpandGrid(p.rows, Segments(p), p.out)), kExpandThreads, [&] {
    if (chunk == 16) {
      kernel(std::integral_constant<int, 16>());
    } else if (chunk == 32) {
      kernel(std::integral_constant<int, 32>());
    } else {
      kernel(std::integral_constant<int, 64>());
    }
  });
  return y;
}

void CheckShrinkF32(const LoraProblem& p, const std::vector<float>& t) {
  for (int r = 0; r < p.rows; ++r) {
    for (int j = 0; j < p.rank; ++j) {
      const float got = t[static_cast<size_t>(r) * p.rank + j];
      const std::string at = "row " + std::to_string(r) + " rank " + std::to_string(j);
      if (!p.covered[r]) {
        ASSERT_EQ(Bits(got), kPoisonF32) << at << ": written outside every segment";
      } else if (p.Faulty(r)) {
        ASSERT_TRUE(std::isnan(got)) << at << ": faulty loop";
      } else {
        const auto [want, abs] = testing::ShrinkReference(p, r, j);
        ASSERT_LE(std::abs(got - want), 1e-5 * abs + 1e-30) << at;
        ASSERT_EQ(Bits(got), Bits(testing::ShrinkFixedOrder(p, r, j))) << at << ": order";
      }
    }
  }
}

void CheckShrinkBf16(const LoraProblem& p, const std::vector<uint16_t>& t) {
  for (int r = 0; r < p.rows; ++r) {
    if (!p.covered[r] || p.Faulty(r)) continue;  // covered by the fp32 check
    for (int j = 0; j < p.rank; ++j) {
      const uint16_t got = t[static_cast<size_t>(r) * p.rank + j];
      const auto [want, abs] = testing::ShrinkReference(p, r, j);
      ASSERT_LE(std::abs(Bf16ToF32(got) - want), 4e-3 * std::abs(want) + 1e-5 * abs + 1e-30)
          << "row " << r << " rank " << j;
      ASSERT_EQ(got, F32ToBf16(testing::ShrinkFixedOrder(p, r, j))) << "row " << r;
    }
  }
}

template <typename TOf>
void CheckExpand(const LoraProblem& p, TOf t_of, const std::vector<float>& y) {
  for (int r = 0; r < p.rows; ++r) {
    for (int o = 0; o < p.out; ++o) {
      const size_t e = static_cast<size_t>(r) * p.out + o;
      const std::string at = "row " + std::to_string(r) + " out " + std::to_string(o);
      if (!p.covered[r]) {
        ASSERT_EQ(Bits(y[e]), Bits(p.y[e])) << at << ": changed outside every segment";
      } else if (p.Faulty(r)) {
        ASSERT_TRUE(std::isnan(y[e])) << at << ": faulty loop";
      } else {
        const auto [want, abs] = testing::ExpandReference(p, t_of, r, o);
        ASSERT_LE(std::abs(y[e] - want), 1e-5 * abs + 1e-30) << at;
        ASSERT_EQ(Bits(y[e]), Bits(testing::ExpandFixedOrder(p, t_of, r, o))) << at << ": order";
      }
    }
  }
}

// Shrink (fp32 and bf16 t) and expand (from fp32 and from bf16 t) on one problem.
void CheckAll(const LoraProblem& p) {
  SCOPED_TRACE("in=" + std::to_string(p.in) + " out=" + std::to_string(p.out) +
               " rank=" + std::to_string(p.rank) + " rows=" + std::to_string(p.rows));
  ASSERT_NO_FATAL_FAILURE(CheckShrinkF32(p, ShrinkF32(p)));
  ASSERT_NO_FATAL_FAILURE(CheckShrinkBf16(p, ShrinkBf16(p)));
  ASSERT_NO_FATAL_FAILURE(CheckExpand(p, [&](int r, int j) { return p.T(r, j); }, Expand(p, p.t)));
  std::vector<uint16_t> t16(p.t.size());
  for (size_t i = 0; i < t16.size(); ++i) t16[i] = F32ToBf16(p.t[i]);
  auto t16_of = [&](int r, int j) { return Bf16ToF32(t16[static_cast<size_t>(r) * p.rank + j]); };
  ASSERT_NO_FATAL_FAILURE(CheckExpand(p, t16_of, Expand(p, t16)));
}

// Empty segments, single-row segments, a segment over two 16-row tiles, uncovered rows
// before and after.
const std::vector<std::pair<int, int>> kMixed = {{5, 2}, {0, 1}, {1, 0}, {17, 1},
                                                 {0, 0}, {3, 2}, {1, 1}};

TEST(LoraEmuTest, MixedSegmentsEveryRank) {
  uint64_t seed = 1;
  for (int rank : {1, 8, 13, 64, 100}) {
    ASSERT_NO_FATAL_FAILURE(CheckAll(MakeLoraProblem(64, 48, rank, 3, kMixed, seed++, 2, 3)));
  }
  // in = 520: 65 vectors, so lane 0 sums three and the others two.
  ASSERT_NO_FATAL_FAILURE(CheckAll(MakeLoraProblem(520, 136, 13, 3, kMixed, seed++, 0, 1)));
}

TEST(LoraEmuTest, SmolLmShapes) {
  // qkv (960 -> 1600), down (2560 -> 960), gate_up (960 -> 5120); 3-4 loops.
  ASSERT_NO_FATAL_FAILURE(CheckAll(MakeLoraProblem(960, 1600, 64, 4, {{3, 0}, {1, 1}, {2, 3}}, 11)));
  ASSERT_NO_FATAL_FAILURE(CheckAll(MakeLoraProblem(2560, 960, 8, 3, {{2, 2}, {5, 0}}, 12)));
  ASSERT_NO_FATAL_FAILURE(CheckAll(MakeLoraProblem(960, 5120, 32, 4, {{1, 3}, {4, 1}}, 13)));
}

TEST(LoraEmuTest, FaultyLoopRowsBecomeNan) {
  const LoraProblem p = MakeLoraProblem(64, 40, 13, 2, {{3, 0}, {2, 5}, {2, -1}, {4, 1}}, 21);
  ASSERT_NO_FATAL_FAILURE(CheckAll(p));
}

TEST(LoraEmuTest, MalformedSegmentBoundsStayInRange) {
  // Segment 0 starts before row 0 and segment 1 ends after the last row: both are clamped
  // to [0, rows); segment 2 decreases, so it is empty.
  LoraProblem p = MakeLoraProblem(64, 40, 8, 2, {{4, 0}, {6, 1}, {0, 1}}, 31);
  p.seg_indptr = {-5, 4, 30, 7};
  ASSERT_NO_FATAL_FAILURE(CheckAll(p));
}

// One row of p as a problem of its own (the same weights and inputs).
LoraProblem SingleRow(const LoraProblem& p, int r) {
  LoraProblem q = p;
  q.rows = 1;
  q.seg_indptr = {0, 1};
  q.seg_loop = {p.row_loop[r]};
  q.row_loop = {p.row_loop[r]};
  q.covered = {1};
  q.x.assign(p.x.begin() + static_cast<size_t>(r) * p.in, p.x.begin() + (r + 1LL) * p.in);
  q.t.assign(p.t.begin() + static_cast<size_t>(r) * p.rank, p.t.begin() + (r + 1LL) * p.rank);
  q.y.assign(p.y.begin() + static_cast<size_t>(r) * p.out, p.y.begin() + (r + 1LL) * p.out);
  return q;
}

TEST(LoraEmuTest, RowAloneAndInBatchAreBitwiseEqual) {
  const LoraProblem p = MakeLoraProblem(200, 72, 13, 3, kMixed, 41, 2, 3);
  const std::vector<float> t = ShrinkF32(p);
  const std::vector<float> y = Expand(p, p.t);
  // Rows at several places of their tiles: 2 (first of a segment), 9 and 21 (inside the
  // 17-row segment), 24 (alone in its second tile), 26 (inside a 3-row segment).
  for (int r : {2, 9, 21, 24, 26}) {
    ASSERT_TRUE(p.covered[r]);
    const LoraProblem q = SingleRow(p, r);
    const std::vector<float> t1 = ShrinkF32(q);
    const std::vector<float> y1 = Expand(q, q.t);
    for (int j = 0; j < p.rank; ++j) {
      EXPECT_EQ(Bits(t1[j]), Bits(t[static_cast<size_t>(r) * p.rank + j])) << "row " << r;
    }
    for (int o = 0; o < p.out; ++o) {
      EXPECT_EQ(Bits(y1[o]), Bits(y[static_cast<size_t>(r) * p.out + o])) << "row " << r;
    }
  }
}

}  // namespace
}  // namespace morserve::kernels
