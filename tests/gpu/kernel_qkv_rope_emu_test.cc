// The QKV epilogue kernel (kernels/qkv_rope_kernels.cuh, the GPU build's source) on the CPU
// emulator (kernels/emu/cuda_emu.h), on the GPU test's problem and check
// (tests/gpu/qkv_rope_problem.h: a double RoPE reference; q out, k/v in the paged cache at the
// write slots, the optional k/v outputs, slot -1, untouched slots poisoned), plus faulty rows
// (a negative position, a slot beyond the cache) that must come out NaN. Needs no device.
#include "kernels/emu/cuda_emu.h"
// cuda_emu.h first: it defines the CUDA keywords the kernel header uses.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/qkv_rope_kernels.cuh"
#include "tests/gpu/gpu_testutil.h"
#include "tests/gpu/qkv_rope_problem.h"

namespace morserve::kernels {
namespace {

using ::morserve::testing::FreshSeed;
using ::morserve::testing::kQkvPoison;
using ::morserve::testing::QkvRopeOutputs;
using ::morserve::testing::QkvRopeProblem;

// Runs the kernel on the problem's inputs into poisoned host outputs and cache.
QkvRopeOutputs RunEmulated(const QkvRopeProblem& pr) {
  QkvRopeOutputs o;
  const size_t cache = static_cast<size_t>(pr.num_slots) * pr.kv_dim();
  const size_t side = pr.s.side_outputs ? static_cast<size_t>(pr.rows) * pr.kv_dim() : 0;
  o.q.assign(static_cast<size_t>(pr.rows) * pr.q_dim(), kQkvPoison);
  o.k_cache.assign(cache, kQkvPoison);
  o.v_cache.assign(cache, kQkvPoison);
  o.k_out.assign(side, kQkvPoison);
  o.v_out.assign(side, kQkvPoison);
  QkvRopeParams p = pr.Params();
  p.qkv = pr.qkv.data();
  p.positions = pr.positions.data();
  p.write_slot = pr.slots.data();
  p.q_out = o.q.data();
  p.k_cache = o.k_cache.data();
  p.v_cache = o.v_cache.data();
  p.k_out = pr.s.side_outputs ? o.k_out.data() : nullptr;
  p.v_out = pr.s.side_outputs ? o.v_out.data() : nullptr;
  p.qk_bias = pr.s.bias ? pr.bias.data() : nullptr;
  p.bias_index = pr.s.bias ? pr.bias_index.data() : nullptr;
  cuda_emu::Run({static_cast<unsigned>(pr.rows), 1, 1}, kThreads, [&] {
    if (pr.s.in == DType::kBF16) {
      QkvRopeKernel<uint16_t>(p);
    } else {
      QkvRopeKernel<float>(p);
    }
  });
  return o;
}

TEST(QkvRopeEmuTest, MatchesReference) {
  for (int hd : {64, 10}) {
    for (DType in : {DType::kF32, DType::kBF16}) {
      for (bool side : {true, false}) {
        const uint64_t seed = FreshSeed();
        const QkvRopeProblem pr =
            QkvRopeProblem::Make(seed, {3, 1, hd, 10000.0f, in, side}, 6, /*faulty=*/true);
        SCOPED_TRACE(pr.Describe(seed));
        ASSERT_NO_FATAL_FAILURE(pr.Check(RunEmulated(pr)));
      }
    }
  }
}

// Huginn's options: adjacent-pair RoPE, and q/k biases in three variants picked per row.
TEST(QkvRopeEmuTest, PairsAndBiasMatchReference) {
  for (int hd : {64, 96, 10}) {
    for (bool pairs : {true, false}) {
      for (bool bias : {true, false}) {
        if (!pairs && !bias) continue;
        const uint64_t seed = FreshSeed();
        const QkvRopeProblem pr = QkvRopeProblem::Make(
            seed, {4, 2, hd, 10000.0f, DType::kF32, /*side=*/true, pairs, bias}, 7,
            /*faulty=*/true);
        SCOPED_TRACE(pr.Describe(seed));
        ASSERT_NO_FATAL_FAILURE(pr.Check(RunEmulated(pr)));
      }
    }
  }
}

// A row whose bias index is outside [0, bias_variants) comes out NaN and writes nothing.
TEST(QkvRopeEmuTest, BadBiasIndexBecomesNan) {
  const uint64_t seed = FreshSeed();
  QkvRopeProblem pr = QkvRopeProblem::Make(
      seed, {2, 1, 64, 10000.0f, DType::kF32, /*side=*/true, /*pairs=*/true, /*bias=*/true}, 4,
      /*faulty=*/false);
  pr.bias_index[1] = morserve::testing::kQkvBiasVariants;
  int32_t free_slot = 0;  // a slot no other row writes
  while (std::find(pr.slots.begin(), pr.slots.end(), free_slot) != pr.slots.end()) ++free_slot;
  pr.slots[1] = free_slot;
  const QkvRopeOutputs o = RunEmulated(pr);
  for (int i = 0; i < pr.q_dim(); ++i) EXPECT_TRUE(std::isnan(Bf16ToF32(o.q[pr.q_dim() + i])));
  const size_t at = static_cast<size_t>(free_slot) * pr.kv_dim();
  for (int i = 0; i < pr.kv_dim(); ++i) EXPECT_EQ(o.k_cache[at + i], kQkvPoison);
}

}  // namespace
}  // namespace morserve::kernels
