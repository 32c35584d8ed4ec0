// QKV epilogue: splits the fused QKV GEMM output, applies RoPE to q and k, writes k and v
// into the paged KV cache at each row's write slot, and emits q as bf16 for attention.
//
//   qkv[r] = [ q (n_heads * head_dim) | k (n_kv_heads * head_dim) | v (n_kv_heads * head_dim) ]
//   q_out[r]             = bf16(RoPE(q, positions[r]))
//   cache[write_slot[r]] = bf16(RoPE(k, positions[r])), bf16(v)     (write_slot -1: no write)
//   k_out[r], v_out[r]   = the same k and v, when the optional outputs are set (the
//                          recurrent layers' temporary pair, attended but not cached)
//
// RoPE is the CPU backend's RopeRows convention (engine/cpu/cpu_ops.h): rotate_half, pairs
// (i, i + head_dim/2), or with rope_pairs RopePairsRows' adjacent pairs (2i, 2i + 1) (Huginn);
// inv_freq_i = theta^(-2i/head_dim), angle = position * inv_freq_i, with inv_freq, cos, sin
// and the rotation in double, rounded to fp32 once (as the CPU does) and then to bf16 (round
// to nearest even). With qk_bias (Huginn's attn.qk_bias), q and k get the row's bias variant
// added in fp32 before RoPE, as the CPU's PositionQk does. The cache layout is the attention
// kernel's: [num_slots][n_kv_heads][head_dim] with slot = block * block_size + offset.
//
// Batch invariance: one CTA per row, every element computed from that row alone.
//
// Faults a device cannot report per row: a negative position, a write slot outside
// [-1, num_slots), or a bias index outside [0, bias_variants), turn the row's q_out (and
// k_out/v_out) into NaN and write nothing to the cache.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "engine/model/dtype.h"

namespace morserve::kernels {

struct QkvRopeParams {
  const void* qkv = nullptr;            // [rows, (n_heads + 2 * n_kv_heads) * head_dim], qkv_dtype
  DType qkv_dtype = DType::kBF16;       // kBF16 or kF32
  const int32_t* positions = nullptr;   // [rows], absolute, 0-based
  const int32_t* write_slot = nullptr;  // [rows]; may be null: no cache write at all
  uint16_t* q_out = nullptr;            // [rows, n_heads * head_dim] bf16
  uint16_t* k_cache = nullptr;          // [num_slots, n_kv_heads, head_dim] bf16
  uint16_t* v_cache = nullptr;
  int64_t num_slots = 0;
  uint16_t* k_out = nullptr;  // optional [rows, n_kv_heads * head_dim] bf16; both or neither
  uint16_t* v_out = nullptr;
  int rows = 0;  // 0 is allowed (nothing is launched)
  int n_heads = 0;
  int n_kv_heads = 0;
  int head_dim = 0;  // even, <= 512
  float theta = 10000.0f;
  bool rope_pairs = false;  // rotate adjacent pairs (2i, 2i + 1) instead of halves
  // Optional [bias_variants, q_dim + kv_dim] fp32: q's bias then k's, added before RoPE;
  // bias_index [rows] picks each row's variant (null: variant 0).
  const float* qk_bias = nullptr;
  const int32_t* bias_index = nullptr;
  int bias_variants = 0;
};

// Launches on `stream`. Returns cudaErrorInvalidValue for a bad size or dtype, an odd
// head_dim, a null required pointer (caches are required when write_slot is set), a
// non-positive theta, or qk_bias without variants (bias_index without qk_bias); otherwise the
// launch's error.
cudaError_t qkv_rope_forward(const QkvRopeParams& p, cudaStream_t stream);

}  // namespace morserve::kernels
