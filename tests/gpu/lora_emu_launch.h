// The segmented LoRA kernels run on the CPU emulator exactly as their launchers run them on a
// GPU (the same grids, CTA sizes and template choices), taking the launchers' own params, so
// emulation tests drive them like lora_shrink_forward / lora_expand_forward. Arguments are
// not validated here (the launchers' checks are tested on their own). Include after
// kernels/emu/cuda_emu.h.
#pragma once

#include <type_traits>

#include "kernels/lora_expand_kernels.cuh"
#include "kernels/lora_shrink_kernels.cuh"

namespace morserve::kernels {
namespace {

inline EmuDim3 ToEmu(dim3 d) { return {d.x, d.y, d.z}; }

template <typename TT>
void EmuLoraShrinkAs(const LoraShrinkParams& p) {
  cuda_emu::Run(ToEmu(LoraShrinkGrid(p.rows, p.num_segments, p.rank)), kShrinkThreads, [&] {
    LoraShrinkKernel<TT>(p.x, p.a, static_cast<TT*>(p.t), p.seg_indptr, p.seg_loop, p.num_segments,
                         p.rows, p.in, p.rank, p.num_loops);
  });
}

inline void EmuLoraShrink(const LoraShrinkParams& p) {
  if (p.t_dtype == DType::kF32) {
    EmuLoraShrinkAs<float>(p);
  } else {
    EmuLoraShrinkAs<uint16_t>(p);
  }
}

template <typename TT>
void EmuLoraExpandAs(const LoraExpandParams& p) {
  auto kernel = [&](auto chunk_tag) {
    constexpr int kChunk = decltype(chunk_tag)::value;
    LoraExpandKernel<TT, kChunk>(static_cast<const TT*>(p.t), p.b, p.y, p.seg_indptr, p.seg_loop,
                                 p.num_segments, p.rows, p.out, p.rank, p.num_loops);
  };
  const int chunk = LoraExpandChunk(p.rank);
  cuda_emu::Run(ToEmu(LoraExpandGrid(p.rows, p.num_segments, p.out)), kExpandThreads, [&] {
    if (chunk == 16) {
      kernel(std::integral_constant<int, 16>());
    } else if (chunk == 32) {
      kernel(std::integral_constant<int, 32>());
    } else {
      kernel(std::integral_constant<int, 64>());
    }
  });
}

inline void EmuLoraExpand(const LoraExpandParams& p) {
  if (p.t_dtype == DType::kF32) {
    EmuLoraExpandAs<float>(p);
  } else {
    EmuLoraExpandAs<uint16_t>(p);
  }
}

}  // namespace
}  // namespace morserve::kernels
