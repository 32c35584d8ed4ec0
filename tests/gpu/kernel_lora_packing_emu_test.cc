// The CUDA runner's LoRA path without a device: a tiny Relaxed model (rank 13 on all seven
// projections, so fused ranks 39 and 26) packed by the engine's weight packing, a layer batch
// staged by StageLayerBatch (its loop groups as the kernels' segments, read from the staged
// array at the offsets the runner passes), and the segmented shrink + expand on the CPU
// emulator with the params CudaModelRunner::LoraDelta builds. Each row's output must equal the
// packed linear of its own loop (PackedLinearForwardHost, which the unit test
// cuda_packing_test checks against the checkpoint's tensors) within fp32 rounding.
#include "kernels/emu/cuda_emu.h"
// cuda_emu.h first: it defines the CUDA keywords the kernel headers use.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "engine/cuda/step_staging.h"
#include "engine/cuda/weight_packing.h"
#include "tests/engine_harness.h"
#include "tests/gpu/lora_emu_launch.h"

namespace morserve::kernels {
namespace {

// y = x W^T + delta for every row of a staged batch, as the runner computes it: the base
// product (here from the host reference, rounded to fp32 like the GEMM's output), then the
// two LoRA launches over all the rows. Returns the largest |delta| seen, so the caller can
// tell that the adapters were not zeros.
double CheckLinear(const PackedLinear& p, const std::vector<int>& loops, const StagedRows& st,
                   uint64_t seed) {
  const int n = static_cast<int>(loops.size());
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<uint16_t> x(static_cast<size_t>(n) * p.in);
  std::vector<float> xf(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    x[i] = F32ToBf16(dist(rng));
    xf[i] = Bf16ToF32(x[i]);
  }
  PackedLinear base = p;
  base.lora_rank = 0;
  std::vector<float> y(static_cast<size_t>(n) * p.out);
  std::vector<std::vector<double>> want(n), base_y(n);
  for (int r = 0; r < n; ++r) {
    const std::vector<float> xr(xf.begin() + static_cast<size_t>(r) * p.in,
                                xf.begin() + static_cast<size_t>(r + 1) * p.in);
    base_y[r] = PackedLinearForwardHost(base, loops[r], xr, 1);
    want[r] = PackedLinearForwardHost(p, loops[r], xr, 1);
    for (int o = 0; o < p.out; ++o) y[static_cast<size_t>(r) * p.out + o] = base_y[r][o];
  }
  std::vector<float> t(static_cast<size_t>(n) * p.lora_rank, std::nanf(""));
  LoraShrinkParams sp;  // as CudaModelRunner::LoraDelta fills it
  sp.x = x.data();
  sp.a = p.lora_a.data();
  sp.t = t.data();
  sp.seg_indptr = st.data.data() + st.seg_indptr;
  sp.seg_loop = st.data.data() + st.seg_loop;
  sp.num_segments = static_cast<int>(st.groups.size());
  sp.rows = n;
  sp.in = p.in;
  sp.rank = p.lora_rank;
  sp.num_loops = p.lora_loops;
  sp.t_dtype = DType::kF32;
  EmuLoraShrink(sp);
  LoraExpandParams ep;
  ep.t = t.data();
  ep.b = p.lora_b.data();
  ep.y = y.data();
  ep.seg_indptr = sp.seg_indptr;
  ep.seg_loop = sp.seg_loop;
  ep.num_segments = sp.num_segments;
  ep.rows = n;
  ep.out = p.out;
  ep.rank = p.lora_rank;
  ep.num_loops = p.lora_loops;
  ep.t_dtype = DType::kF32;
  EmuLoraExpand(ep);
  double max_delta = 0;
  for (int r = 0; r < n; ++r) {
    for (int o = 0; o < p.out; ++o) {
      const double got = y[static_cast<size_t>(r) * p.out + o];
      max_delta = std::max(max_delta, std::abs(want[r][o] - base_y[r][o]));
      EXPECT_NEAR(got, want[r][o], 1e-5 * std::max(1.0, std::abs(want[r][o])))
          << "row " << r << " (loop " << loops[r] << ") out " << o;
    }
  }
  return max_delta;
}

TEST(LoraPackingEmuTest, EveryRowGetsItsOwnLoopsDelta) {
  testing::TempDir dir;
  TinyModelSpec s;
  s.family = "relaxed-lora";  // bf16 weights, as the device holds them
  s.lora_rank = 13;
  s.lora_targets = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
  auto w = testing::MakeModel(s, &dir);
  ASSERT_NE(w, nullptr);
  ASSERT_GE(w->plan.looped_segment, 0);
  const Segment& seg = w->plan.segments[w->plan.looped_segment];
  ASSERT_EQ(seg.loops, 3);
  // Rows grouped by loop as the executor sorts them, with loop 0 split into two runs, and a
  // run longer than one 16-row tile: 5 segments.
  std::vector<int> loops = {0, 0, 1, 2, 2, 2, 1, 0};
  loops.insert(loops.begin() + 3, 17, 1);
  const int n = static_cast<int>(loops.size());
  LayerKvPlan kv;
  kv.write_slot.assign(n, -1);
  kv.kv_len.assign(n, 0);
  kv.table_indptr.assign(n + 1, 0);
  std::vector<int> positions(n);
  std::iota(positions.begin(), positions.end(), 0);
  LayerBatch b;
  b.segment = w->plan.looped_segment;
  b.n = n;
  b.loops = loops.data();
  b.positions = positions.data();
  b.kv = &kv;
  auto st = StageLayerBatch(b, seg.loops, /*block_size=*/4);
  ASSERT_TRUE(st.ok()) << st.status();
  ASSERT_EQ(st->groups.size(), 5u);
  uint64_t seed = 7;
  for (int k = 0; k < seg.num_layers; ++k) {
    const LayerWeights& lw = w->layers[seg.first_layer_slot + k];
    for (auto parts : {std::vector<Proj>{Proj::kQ, Proj::kK, Proj::kV},
                       {Proj::kO},
                       {Proj::kGate, Proj::kUp},
                       {Proj::kDown}}) {
      PackedLinear p;
      if (parts.size() == 3) {
        p = PackFusedLinear(lw, {Proj::kQ, Proj::kK, Proj::kV}, seg.loops);
      } else if (parts.size() == 2) {
        p = PackFusedLinear(lw, {Proj::kGate, Proj::kUp}, seg.loops);
      } else {
        p = PackFusedLinear(lw, {parts[0]}, seg.loops);
      }
      ASSERT_EQ(p.lora_rank, 13 * static_cast<int>(parts.size()));
      SCOPED_TRACE("layer " + std::to_string(k) + " parts " + std::to_string(parts.size()) +
                   " out " + std::to_string(p.out));
      EXPECT_GT(CheckLinear(p, loops, *st, seed++), 1e-3) << "the adapters add nothing";
    }
  }
}

}  // namespace
}  // namespace morserve::kernels
