// Host-side packing for the CUDA backend (plain C++, built with or without CUDA so its unit
// test runs everywhere): a layer's projections fused along the output dimension (q|k|v,
// gate|up) as bf16 [out, in] matrices, one per loop when the copies are untied; Relaxed
// models' LoRA deltas of one loop as ONE pair of GEMMs over the fused output:
//   delta = (x A^T) B^T,  A = [A_q; A_v; ...] [rank_pad, in],
//   B = block-diagonal [out, rank_pad] with scale * B_part at (part offset, part rank offset)
// (zero rows for parts without LoRA, zero columns padding the rank to a multiple of 8, the
// alignment cuBLASLt needs; zeros add exact zeros); and linear routers of every loop stacked
// into one fp32 [loops, hidden] matrix, the layout of the router kernels.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <vector>

#include "engine/model/weights.h"

namespace morserve {

struct PackedLinear {
  int out = 0;
  int in = 0;
  std::vector<std::vector<uint16_t>> variants;  // bf16 [out, in]: one (tied) or one per loop
  int lora_rank = 0;                            // padded rank (multiple of 8); 0: no LoRA
  std::vector<std::vector<uint16_t>> lora_a;    // per loop, bf16 [lora_rank, in]
  std::vector<std::vector<uint16_t>> lora_b;    // per loop, bf16 [out, lora_rank], scale folded in
  const std::vector<uint16_t>& At(int loop) const {
    return variants[variants.size() == 1 ? 0 : loop];
  }
};

// Fuses `parts` of one layer (all with the same input width) for a segment of `loops` loops.
PackedLinear PackFusedLinear(const LayerWeights& lw, std::initializer_list<Proj> parts, int loops);

// bf16 bits of a tensor (exact for bf16 checkpoints, rounded to nearest even otherwise).
std::vector<uint16_t> ToBf16Bits(const TensorView& t);

// Rows of `routers[i].w1` ([1, hidden] each, linear routers) stacked: [routers.size(), hidden].
std::vector<float> StackLinearRouters(const std::vector<LoopRouter>& routers, int hidden);

// y[rows, out] = x W_loop^T + delta_loop for every row at `loop`, computed on the host in
// double from the packed bf16 data (what the device computes, without its bf16 rounding of
// activations): the unit test's check of the packing against the checkpoint's own tensors.
std::vector<double> PackedLinearForwardHost(const PackedLinear& p, int loop,
                                            const std::vector<float>& x, int rows);

}  // namespace morserve
