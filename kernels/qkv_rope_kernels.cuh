// QKV epilogue kernel, shared by the CUDA launcher (qkv_rope.cu) and the CPU emulation test
// (tests/gpu/kernel_qkv_rope_emu_test.cc). Not a public header: the contract is in qkv_rope.cuh.
// Everything is in an anonymous namespace of morserve::kernels.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/device_helpers.cuh"
#include "kernels/qkv_rope.cuh"

namespace morserve::kernels {
namespace {

constexpr int kThreads = 128;
constexpr int kMaxHalf = 256;  // head_dim <= 512

__device__ __forceinline__ uint16_t Bf16NanBits() { return 0x7fc0; }

// Rounds a double to fp32 (as the CPU's RopeRows stores it) and then to bf16.
__device__ __forceinline__ uint16_t DoubleToBf16Bits(double v) {
  return F32ToBf16Bits(__double2float_rn(v));
}

// Rotates heads [0, n_heads) of `src` (element i of head h at h * head_dim + i) into `dst`,
// `bias` (fp32, the same layout; may be null) added to the inputs first.
template <typename TI>
__device__ void RotateHeads(const TI* src, const float* bias, uint16_t* dst, uint16_t* dst2,
                            int n_heads, int head_dim, bool pairs, const double* cos_v,
                            const double* sin_v) {
  const int half = head_dim / 2;
  for (int idx = threadIdx.x; idx < n_heads * half; idx += kThreads) {
    const int h = idx / half;
    const int i = idx % half;
    const int lo = h * head_dim + (pairs ? 2 * i : i);
    const int hi = h * head_dim + (pairs ? 2 * i + 1 : i + half);
    float fa = LoadF32(src, lo), fb = LoadF32(src, hi);
    if (bias != nullptr) {
      fa = fa + bias[lo];
      fb = fb + bias[hi];
    }
    const double a = fa, b = fb;
    const uint16_t out_lo =
        DoubleToBf16Bits(__dsub_rn(__dmul_rn(a, cos_v[i]), __dmul_rn(b, sin_v[i])));
    const uint16_t out_hi =
        DoubleToBf16Bits(__dadd_rn(__dmul_rn(b, cos_v[i]), __dmul_rn(a, sin_v[i])));
    dst[lo] = out_lo;
    dst[hi] = out_hi;
    if (dst2 != nullptr) {
      dst2[lo] = out_lo;
      dst2[hi] = out_hi;
    }
  }
}

// One CTA per row.
template <typename TI>
__global__ void __launch_bounds__(kThreads) QkvRopeKernel(QkvRopeParams p) {
  const int row = blockIdx.x;
  const int hd = p.head_dim;
  const int q_dim = p.n_heads * hd;
  const int kv_dim = p.n_kv_heads * hd;
  const TI* in = static_cast<const TI*>(p.qkv) + static_cast<int64_t>(row) * (q_dim + 2 * kv_dim);
  uint16_t* q_out = p.q_out + static_cast<int64_t>(row) * q_dim;
  uint16_t* k_out = p.k_out == nullptr ? nullptr : p.k_out + static_cast<int64_t>(row) * kv_dim;
  uint16_t* v_out = p.v_out == nullptr ? nullptr : p.v_out + static_cast<int64_t>(row) * kv_dim;

  const int pos = p.positions[row];
  const int64_t slot = p.write_slot == nullptr ? -1 : p.write_slot[row];
  const int bias_at = p.bias_index == nullptr ? 0 : p.bias_index[row];
  if (pos < 0 || slot < -1 || slot >= p.num_slots ||
      (p.qk_bias != nullptr && (bias_at < 0 || bias_at >= p.bias_variants))) {
    for (int i = threadIdx.x; i < q_dim; i += kThreads) q_out[i] = Bf16NanBits();
    for (int i = threadIdx.x; k_out != nullptr && i < kv_dim; i += kThreads) {
      k_out[i] = Bf16NanBits();
      v_out[i] = Bf16NanBits();
    }
    return;
  }

  __shared__ double s_cos[kMaxHalf], s_sin[kMaxHalf];
  const int half = hd / 2;
  for (int i = threadIdx.x; i < half; i += kThreads) {
    const double inv_freq = pow(static_cast<double>(p.theta), -2.0 * i / hd);
    const double angle = static_cast<double>(pos) * inv_freq;
    sincos(angle, &s_sin[i], &s_cos[i]);
  }
  __syncthreads();

  const float* q_bias =
      p.qk_bias == nullptr ? nullptr : p.qk_bias + static_cast<int64_t>(bias_at) * (q_dim + kv_dim);
  const float* k_bias = q_bias == nullptr ? nullptr : q_bias + q_dim;
  const bool pairs = p.rope_pairs;
  RotateHeads(in, q_bias, q_out, nullptr, p.n_heads, hd, pairs, s_cos, s_sin);
  uint16_t* k_dst = slot >= 0 ? p.k_cache + slot * kv_dim : nullptr;
  uint16_t* v_dst = slot >= 0 ? p.v_cache + slot * kv_dim : nullptr;
  if (k_dst != nullptr) {
    RotateHeads(in + q_dim, k_bias, k_dst, k_out, p.n_kv_heads, hd, pairs, s_cos, s_sin);
  } else if (k_out != nullptr) {
    RotateHeads(in + q_dim, k_bias, k_out, nullptr, p.n_kv_heads, hd, pairs, s_cos, s_sin);
  }
  const TI* v_in = in + q_dim + kv_dim;
  for (int i = threadIdx.x; i < kv_dim; i += kThreads) {
    const uint16_t v = F32ToBf16Bits(LoadF32(v_in, i));
    if (v_dst != nullptr) v_dst[i] = v;
    if (v_out != nullptr) v_out[i] = v;
  }
}

}  // namespace
}  // namespace morserve::kernels
