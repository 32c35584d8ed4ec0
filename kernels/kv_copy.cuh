// KV cache entry copies: for each copy c of a launch, entries [src, src + count) of the paged
// K and V pools are copied to [dst, dst + count) (a slot is block * block_size + offset, an
// entry kv_dim bf16 values: the pool layout of engine/cpu/paged_attention). One launch takes
// every copy of a call (the engine's copy-on-exit rows of a layer, a prefix-cache hit's
// partial blocks), where a cudaMemcpyAsync per copy and pool cost two API calls each.
//
// Exact (a copy of bits). Copies of one launch run in no fixed order, so no destination range
// may overlap another copy's source or destination range (the caller checks: the CUDA
// runner's CopyKv). A copy whose ranges the device finds outside [0, slots) (the host
// validated them; this is a fault only the device could see) writes nothing when its
// destination is outside, else fills its destination with NaN instead of reading out of
// bounds.
//
// Grid: (copies, 2): blockIdx.y picks the K or the V pool. 16-byte vectors when kv_dim is a
// multiple of 8 and both pools are 16-byte aligned.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace morserve::kernels {

struct KvCopyParams {
  uint16_t* k_cache = nullptr;      // [slots, kv_dim] bf16 bits
  uint16_t* v_cache = nullptr;      // [slots, kv_dim] bf16 bits
  const int32_t* copies = nullptr;  // [n, 3] (src slot, dst slot, count), device memory
  int n = 0;                        // 0 is allowed (nothing is launched)
  int kv_dim = 0;
  int64_t slots = 0;
};

// Launches on `stream`. Returns cudaErrorInvalidValue for a null pointer, a negative n or a
// non-positive kv_dim / slots, else the launch's error.
cudaError_t kv_copy_forward(const KvCopyParams& p, cudaStream_t stream);

}  // namespace morserve::kernels
