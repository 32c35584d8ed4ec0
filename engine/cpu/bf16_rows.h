// fp32 rows rounded to bf16 for the bf16-compute kernel sets (the AMX set and the AVX-512 BF16
// set, linear_kernels.h): each projection's input is rounded once per call, and both sets round
// alike.
#pragma once

#include "engine/cpu/linear_kernels.h"
#include "engine/cpu/linear_weights.h"

namespace morserve {

// Values per bf16 row: k rounded up to the amx-bf16 tiles' k block (the rows are zero past k).
inline int Bf16RowStride(int k) {
  return (k + LinearWeights::kAmxKBlock - 1) / LinearWeights::kAmxKBlock *
         LinearWeights::kAmxKBlock;
}

// A bf16-compute set's prepare: args.x's m rows rounded to bf16 (nearest even, on the integer
// bits, so every host gives the same values; denormals kept, NaN never reaches a projection)
// into the calling thread's buffer, Bf16RowStride(k) values per row, followed by zero rows up to
// `rows` >= m; args.prepared points at it until this thread's next call. Needs AVX-512 F/BW.
void PrepareBf16Rows(LinearArgs& args, int rows);

}  // namespace morserve
