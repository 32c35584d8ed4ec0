// Host-side packing for the CUDA backend (plain C++, built with or without CUDA so its unit
// test runs everywhere): a layer's projections fused along the output dimension (q|k|v,
// gate|up) as bf16 [out, in] matrices, one per loop when the copies are untied; Relaxed
// models' LoRA deltas over the fused output, every loop's adapter stacked into one tensor
// pair for the segmented LoRA kernels (kernels/lora_shrink, lora_expand):
//   delta_loop = (x A_loop^T) B_loop^T,  A [loops, rank, in] = per loop [A_q; A_v; ...],
//   B [loops, out, rank] = per loop block-diagonal, scale * B_part at (part offset, part
//   rank offset), zero rows for parts without LoRA (zeros add exact zeros),
// rank being the sum of the parts' ranks (no padding: the kernels take any rank); and linear
// routers of every loop stacked into one fp32 [loops, hidden] matrix, the layout of the
// router kernels.
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
  int lora_rank = 0;                            // sum of the parts' ranks; 0: no LoRA
  int lora_loops = 0;                           // adapters stacked below (the segment's loop count)
  std::vector<uint16_t> lora_a;                 // bf16 [lora_loops, lora_rank, in]
  std::vector<uint16_t> lora_b;  // bf16 [lora_loops, out, lora_rank], scale folded in
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
