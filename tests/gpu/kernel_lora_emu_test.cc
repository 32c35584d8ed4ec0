// The segmented LoRA kernels (kernels/lora_shrink_kernels.cuh, lora_expand_kernels.cuh) on
// the CPU emulator, with the launchers' own grids, against the double definition (within the
// fp32 rounding bound) and bit for bit against the kernels' stated fixed fp32 order: mixed
// segments (empty ones, single-row ones, segments over several row tiles, rows no segment
// covers), ranks 1, 8, 13, 64 and 100 (several shared-memory passes), fp32 and bf16 t,
// SmolLM-360M shapes, poisoned shrink output, expand accumulating into y, faulty loops,
// malformed segment bounds, and a row alone vs inside a batch. Needs no device.
#include "kernels/emu/cuda_emu.h"
// cuda_emu.h first: it defines the CUDA keywords the kernel headers use.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "tests/gpu/lora_emu_launch.h"
#include "tests/gpu/lora_problem.h"

namespace morserve::kernels {
namespace {

using testing::CheckAll;
using testing::CheckMixedSegmentsEveryRank;
using testing::kLoraMixedSegments;
using testing::kPoisonBf16;
using testing::kPoisonF32;
using testing::LoraExpandLaunch;
using testing::LoraInputs;
using testing::LoraProblem;
using testing::LoraShrinkLaunch;
using testing::MakeFaultyLoopLoraProblem;
using testing::MakeLoraProblem;
using testing::MakeMalformedBoundsLoraProblem;

// The problem in host memory.
LoraInputs HostInputs(const LoraProblem& p) {
  return {p.x.data(), p.a.data(), p.b.data(), p.seg_indptr.data(), p.seg_loop.data()};
}

// The interface of testing::CheckAll on the emulator.
struct EmuRunner {
  std::vector<float> ShrinkF32(const LoraProblem& p) const {
    std::vector<float> t(static_cast<size_t>(p.rows) * p.rank);
    for (float& v : t) std::memcpy(&v, &kPoisonF32, 4);
    EmuLoraShrink(LoraShrinkLaunch(p, HostInputs(p), t.data(), DType::kF32));
    return t;
  }
  std::vector<uint16_t> ShrinkBf16(const LoraProblem& p) const {
    std::vector<uint16_t> t(static_cast<size_t>(p.rows) * p.rank, kPoisonBf16);
    EmuLoraShrink(LoraShrinkLaunch(p, HostInputs(p), t.data(), DType::kBF16));
    return t;
  }
  // y (starting from p.y) after the expand of t.
  template <typename TT>
  std::vector<float> Expand(const LoraProblem& p, const std::vector<TT>& t) const {
    std::vector<float> y = p.y;
    EmuLoraExpand(LoraExpandLaunch(p, HostInputs(p), t.data(),
                                   sizeof(TT) == 4 ? DType::kF32 : DType::kBF16, y.data()));
    return y;
  }
};

TEST(LoraEmuTest, MixedSegmentsEveryRank) {
  ASSERT_NO_FATAL_FAILURE(CheckMixedSegmentsEveryRank(EmuRunner(), 1));
}

TEST(LoraEmuTest, SmolLmShapes) {
  // qkv (960 -> 1600), down (2560 -> 960), gate_up (960 -> 5120); 3-4 loops.
  ASSERT_NO_FATAL_FAILURE(
      CheckAll(EmuRunner(), MakeLoraProblem(960, 1600, 64, 4, {{3, 0}, {1, 1}, {2, 3}}, 11)));
  ASSERT_NO_FATAL_FAILURE(
      CheckAll(EmuRunner(), MakeLoraProblem(2560, 960, 8, 3, {{2, 2}, {5, 0}}, 12)));
  ASSERT_NO_FATAL_FAILURE(
      CheckAll(EmuRunner(), MakeLoraProblem(960, 5120, 32, 4, {{1, 3}, {4, 1}}, 13)));
}

TEST(LoraEmuTest, FaultyLoopRowsBecomeNan) {
  ASSERT_NO_FATAL_FAILURE(CheckAll(EmuRunner(), MakeFaultyLoopLoraProblem(21)));
}

TEST(LoraEmuTest, MalformedSegmentBoundsStayInRange) {
  ASSERT_NO_FATAL_FAILURE(CheckAll(EmuRunner(), MakeMalformedBoundsLoraProblem(31)));
}

TEST(LoraEmuTest, RowAloneAndInBatchAreBitwiseEqual) {
  // Rows at several places of their tiles: 2 (first of a segment), 9 and 21 (inside the
  // 17-row segment), 24 (alone in its second tile), 26 (inside a 3-row segment).
  ASSERT_NO_FATAL_FAILURE(testing::CheckRowsAloneMatchBatch(
      MakeLoraProblem(200, 72, 13, 3, kLoraMixedSegments, 41, 2, 3), {2, 9, 21, 24, 26},
      EmuRunner()));
}

}  // namespace
}  // namespace morserve::kernels
