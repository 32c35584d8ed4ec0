// fp32 row copies: dst[dst_rows[i]] = src[src_rows[i]] for i < n, each row `dim` contiguous
// fp32 values (row r at base + r * dim); a null index array means row i. One launch gathers
// rows of a state pool into a contiguous batch (src_rows set, dst_rows null) or scatters a
// batch back into the pool (src_rows null, dst_rows set), or permutes (both set).
//
// Exact (a copy of bits). The copies of one launch run in no fixed order, so they must not
// overlap: destination rows are distinct and no source row is a destination row (src and dst
// may be the same buffer under that rule). The caller ensures it; the kernel does not check.
// An index outside [0, src_capacity) or [0, dst_capacity) (a fault only the device could
// see) makes that row's copy a no-op: nothing is read or written for it, so its destination
// keeps its old contents (unlike kv_copy and embedding, which write NaN).
//
// Grid: a grid-stride loop over the rows, one CTA per row at a time (at most 4096 CTAs, so
// any n is covered), 16-byte (float4) loads and stores when dim is a multiple of 4 and both
// buffers are 16-byte aligned (states, most vocabularies), 4-byte ones otherwise.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace morserve::kernels {

struct RowCopyParams {
  const float* src = nullptr;         // [src_capacity, dim] fp32
  float* dst = nullptr;               // [dst_capacity, dim] fp32
  const int32_t* src_rows = nullptr;  // [n] device, or null: row i
  const int32_t* dst_rows = nullptr;  // [n] device, or null: row i
  int64_t src_capacity = 0;  // rows src holds: an index outside [0, capacity) copies nothing
  int64_t dst_capacity = 0;  // rows dst holds: likewise
  int n = 0;                 // 0 is allowed (nothing is launched)
  int dim = 0;               // > 0
};

// Launches on `stream`. Returns cudaErrorInvalidValue for a negative n, dim <= 0, and (when
// n > 0) a null src / dst or a capacity < 1; otherwise the launch's error.
cudaError_t row_copy_forward(const RowCopyParams& p, cudaStream_t stream);

}  // namespace morserve::kernels
