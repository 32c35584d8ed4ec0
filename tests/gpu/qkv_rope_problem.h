// A QKV epilogue problem for the kernel tests (kernel_qkv_rope_test on the GPU,
// kernel_qkv_rope_emu_test on the CPU emulator): random fused qkv rows in fp32 or bf16, random
// positions (row 0 at position 0: the identity rotation), distinct write slots in a cache with
// room to spare (every fourth row writes nothing, slot -1), optionally two faulty rows (a
// negative position, a slot beyond the cache), and the check of the outputs (all bf16, started
// from 0xFFFF poison) against a double reference in the RopeRows convention: rotated values
// within a relative 1e-2 (one bf16 rounding) plus a tiny absolute term for values that cancel,
// (the bias added in fp32 first), v copied bitwise, q_out and the optional k_out/v_out of faulty
// rows NaN, and every cache slot no good row wrote still poisoned. Params() fills everything but
// the pointers, which each variant sets to its own memory.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kernels/qkv_rope.cuh"
#include "tests/gpu/host_tensor.h"

namespace morserve::testing {

using kernels::QkvRopeParams;

inline constexpr uint16_t kQkvPoison = 0xFFFF;

struct QkvRopeShape {
  int n_heads, n_kv_heads, head_dim;
  float theta;
  DType in;
  bool side_outputs;   // k_out / v_out
  bool pairs = false;  // rope_pairs: rotate (2i, 2i + 1)
  bool bias = false;   // qk_bias in kBiasVariants variants, bias_index per row
};

inline constexpr int kQkvBiasVariants = 3;

// What a launch wrote (k_out and v_out empty without side outputs).
struct QkvRopeOutputs {
  std::vector<uint16_t> q, k_cache, v_cache, k_out, v_out;
};

struct QkvRopeProblem {
  QkvRopeShape s{};
  int rows = 0;
  int64_t num_slots = 0;
  HostTensor qkv;  // [rows, width]
  std::vector<int32_t> positions, slots;
  std::vector<float> bias;          // [kQkvBiasVariants, q_dim + kv_dim] with s.bias
  std::vector<int32_t> bias_index;  // [rows] with s.bias

  int q_dim() const { return s.n_heads * s.head_dim; }
  int kv_dim() const { return s.n_kv_heads * s.head_dim; }
  int width() const { return q_dim() + 2 * kv_dim(); }
  bool Faulty(int r) const { return positions[r] < 0 || slots[r] >= num_slots; }

  // faulty: row rows - 2 gets position -2 and row rows - 1 a slot beyond the cache.
  static QkvRopeProblem Make(uint64_t seed, const QkvRopeShape& s, int rows, bool faulty) {
    QkvRopeProblem p;
    p.s = s;
    p.rows = rows;
    p.num_slots = 3 * rows + 7;
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> dist(0.0f, 2.0f);
    std::vector<float> values(static_cast<size_t>(rows) * p.width());
    for (float& v : values) v = dist(rng);
    p.qkv = HostTensor::Of(s.in, std::move(values));
    std::uniform_int_distribution<int32_t> pos_dist(0, 40000);
    p.positions.resize(rows);
    p.slots.resize(rows);
    std::vector<int32_t> perm(p.num_slots);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    for (int r = 0; r < rows; ++r) {
      p.positions[r] = r == 0 ? 0 : pos_dist(rng);  // position 0: identity rotation
      p.slots[r] = r % 4 == 3 ? -1 : perm[r];       // distinct slots, some rows do not write
    }
    if (s.bias) {
      std::uniform_int_distribution<int32_t> variant(0, kQkvBiasVariants - 1);
      p.bias.resize(static_cast<size_t>(kQkvBiasVariants) * (p.q_dim() + p.kv_dim()));
      for (float& b : p.bias) b = dist(rng);
      p.bias_index.resize(rows);
      for (int32_t& v : p.bias_index) v = variant(rng);
    }
    if (faulty) {
      p.positions[rows - 2] = -2;
      p.slots[rows - 1] = static_cast<int32_t>(p.num_slots + 3);
    }
    return p;
  }

  std::string Describe(uint64_t seed) const {
    return "heads=" + std::to_string(s.n_heads) + "/" + std::to_string(s.n_kv_heads) +
           " head_dim=" + std::to_string(s.head_dim) + " in=" + KernelDTypeName(s.in) +
           " rows=" + std::to_string(rows) + (s.pairs ? " pairs" : "") + (s.bias ? " bias" : "") +
           " seed=" + std::to_string(seed);
  }

  QkvRopeParams Params() const {
    QkvRopeParams p;
    p.qkv_dtype = s.in;
    p.num_slots = num_slots;
    p.rows = rows;
    p.n_heads = s.n_heads;
    p.n_kv_heads = s.n_kv_heads;
    p.head_dim = s.head_dim;
    p.theta = s.theta;
    p.rope_pairs = s.pairs;
    p.bias_variants = s.bias ? kQkvBiasVariants : 0;
    return p;
  }

  // The reference rotation in double of `heads` heads of x at position pos.
  std::vector<double> Rotate(const float* x, int heads, int pos) const {
    const int hd = s.head_dim, half = hd / 2;
    std::vector<double> out(static_cast<size_t>(heads) * hd, 0.0);
    for (int i = 0; i < half; ++i) {
      const double inv_freq = std::pow(static_cast<double>(s.theta), -2.0 * i / hd);
      const double c = std::cos(pos * inv_freq), sn = std::sin(pos * inv_freq);
      for (int h = 0; h < heads; ++h) {
        const int lo = h * hd + (s.pairs ? 2 * i : i),
                  hi = h * hd + (s.pairs ? 2 * i + 1 : i + half);
        const double a = x[lo], b = x[hi];
        out[lo] = a * c - b * sn;
        out[hi] = b * c + a * sn;
      }
    }
    return out;
  }

  void Check(const QkvRopeOutputs& o) const {
    const int qd = q_dim(), kvd = kv_dim();
    std::vector<bool> written(num_slots, false);
    for (int r = 0; r < rows; ++r) {
      std::vector<float> biased(&qkv.values[static_cast<size_t>(r) * width()],
                                &qkv.values[static_cast<size_t>(r + 1) * width()]);
      for (int i = 0; s.bias && i < qd + kvd; ++i)
        biased[i] += bias[static_cast<size_t>(bias_index[r]) * (qd + kvd) + i];
      const float* x = biased.data();
      if (Faulty(r)) {
        ASSERT_NO_FATAL_FAILURE(CheckFaultyRow(o, r));
        continue;
      }
      const std::vector<double> qr = Rotate(x, s.n_heads, positions[r]);
      const std::vector<double> kr = Rotate(x + qd, s.n_kv_heads, positions[r]);
      for (int i = 0; i < qd; ++i) {
        ASSERT_NO_FATAL_FAILURE(
            ExpectClose(o.q[static_cast<size_t>(r) * qd + i], qr[i],
                        "row " + std::to_string(r) + " q " + std::to_string(i)));
      }
      for (int i = 0; i < kvd; ++i) {
        const uint16_t want_v = F32ToBf16(x[qd + kvd + i]);
        const std::string where = "row " + std::to_string(r) + " kv element " + std::to_string(i);
        const size_t c = static_cast<size_t>(slots[r]) * kvd + i,
                     e = static_cast<size_t>(r) * kvd + i;
        if (slots[r] >= 0) {
          ASSERT_NO_FATAL_FAILURE(ExpectClose(o.k_cache[c], kr[i], "cache k " + where));
          ASSERT_EQ(o.v_cache[c], want_v) << "cache v " << where;
        }
        if (s.side_outputs) {
          ASSERT_NO_FATAL_FAILURE(ExpectClose(o.k_out[e], kr[i], "k_out " + where));
          ASSERT_EQ(o.v_out[e], want_v) << "v_out " << where;
          if (slots[r] >= 0) ASSERT_EQ(o.k_out[e], o.k_cache[c]) << where;
        }
      }
      if (slots[r] >= 0) written[slots[r]] = true;
    }
    for (int64_t sl = 0; sl < num_slots; ++sl) {
      if (written[sl]) continue;
      for (int i = 0; i < kvd; ++i) {
        ASSERT_EQ(o.k_cache[sl * kvd + i], kQkvPoison) << "slot " << sl << " was written";
        ASSERT_EQ(o.v_cache[sl * kvd + i], kQkvPoison) << "slot " << sl << " was written";
      }
    }
  }

 private:
  static void ExpectClose(uint16_t got_bits, double want, const std::string& what) {
    const double got = Bf16ToF32(got_bits);
    ASSERT_TRUE(std::abs(got - want) <= 1e-2 * std::abs(want) + 1e-5)
        << what << ": got " << got << " want " << want;
  }

  // A faulty row: q_out (and k_out/v_out) NaN; it writes no cache slot (checked by Check).
  void CheckFaultyRow(const QkvRopeOutputs& o, int r) const {
    for (int i = 0; i < q_dim(); ++i) {
      ASSERT_TRUE(std::isnan(Bf16ToF32(o.q[static_cast<size_t>(r) * q_dim() + i]))) << "row " << r;
    }
    if (!s.side_outputs) return;
    for (int i = 0; i < kv_dim(); ++i) {
      const size_t e = static_cast<size_t>(r) * kv_dim() + i;
      ASSERT_TRUE(std::isnan(Bf16ToF32(o.k_out[e])) && std::isnan(Bf16ToF32(o.v_out[e])))
          << "row " << r;
    }
  }
};

}  // namespace morserve::testing
