// Row tiles over loop segments, shared by the segmented LoRA kernels (lora_shrink_kernels.cuh,
// lora_expand_kernels.cuh) and their CPU emulation test. Not a public header.
//
// Segment s covers rows [seg_indptr[s], seg_indptr[s + 1]) and uses loop seg_loop[s]'s
// adapter. Both arrays live in device memory, so the host knows only the row count and the
// segment count, never the sizes: a launch needs no host sync and can be captured in a CUDA
// graph. The grid's tile dimension is therefore the upper bound
//   sum_s ceil(len_s / tile_rows) <= ceil(rows / tile_rows) + segments,
// and each CTA finds its tile by walking the segments in order (the engine sorts a batch's
// rows by loop, so there are about as many segments as loops); CTAs past the last tile exit.
// A malformed indptr cannot make a kernel touch rows outside [0, rows): every segment is
// clamped to it, and a decreasing one is empty. Overlapping segments are the caller's bug
// (rows computed twice), never an out-of-bounds access.
#pragma once

#include <cstdint>

#ifndef MORSERVE_CUDA_EMU
#include "kernels/common.cuh"
#endif

namespace morserve::kernels {
namespace {

struct LoraTile {
  int begin = 0;  // first row
  int end = 0;    // one past the last row; end <= begin: no tile (the CTA exits)
  int loop = 0;
};

// The grid's tile dimension for `rows` rows in `segments` segments (see above).
inline int64_t LoraTileCount(int rows, int segments, int tile_rows) {
  return (static_cast<int64_t>(rows) + tile_rows - 1) / tile_rows + segments;
}

// Tile number `index` of the segments' tiles, in segment order.
__device__ __forceinline__ LoraTile FindLoraTile(const int32_t* seg_indptr, const int32_t* seg_loop,
                                                 int segments, int rows, int tile_rows,
                                                 int64_t index) {
  LoraTile tile;
  for (int s = 0; s < segments; ++s) {
    const int begin = max(static_cast<int>(seg_indptr[s]), 0);
    const int end = min(static_cast<int>(seg_indptr[s + 1]), rows);
    const int64_t tiles = end > begin ? (end - begin + tile_rows - 1) / tile_rows : 0;
    if (index < tiles) {
      tile.begin = begin + static_cast<int>(index) * tile_rows;
      tile.end = min(tile.begin + tile_rows, end);
      tile.loop = seg_loop[s];
      return tile;
    }
    index -= tiles;
  }
  return tile;
}

// The value a row gets when its segment names a loop the weights do not have.
__device__ __forceinline__ float LoraFaultValue() { return __int_as_float(0x7fc00000); }

}  // namespace
}  // namespace morserve::kernels
