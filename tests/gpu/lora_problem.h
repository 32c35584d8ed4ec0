// A segmented LoRA problem for the kernel tests (the CPU emulation test and the GPU test):
// random bf16 x, adapters stacked over loops (A [loops, rank, in], B [loops, out, rank]),
// fp32 t and y inputs for the expand, segments given as (length, loop) after `lead` rows no
// segment covers (and `trail` more at the end), and the references:
//   - the definition in double (with the sum of |products|, which bounds fp32 rounding),
//   - the kernels' fixed fp32 order (lora_shrink.cuh / lora_expand.cuh), which both kernels
//     must reproduce bit for bit: it is what makes a row's result independent of the batch.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "engine/model/dtype.h"
#include "kernels/lora_expand.cuh"
#include "kernels/lora_shrink.cuh"

namespace morserve::testing {

struct LoraProblem {
  int rows = 0, in = 0, out = 0, rank = 0, num_loops = 0;
  std::vector<int32_t> seg_indptr, seg_loop;
  std::vector<uint16_t> x, a, b;  // bf16 bits
  std::vector<float> t, y;        // expand inputs: t [rows, rank], y [rows, out]
  std::vector<int> row_loop;      // the row's segment's loop (may be out of range on purpose)
  std::vector<uint8_t> covered;   // 0: no segment covers the row (the kernels leave it alone)

  bool Faulty(int r) const { return row_loop[r] < 0 || row_loop[r] >= num_loops; }

  float X(int r, int c) const { return Bf16ToF32(x[static_cast<size_t>(r) * in + c]); }
  float A(int loop, int j, int c) const {
    return Bf16ToF32(a[(static_cast<size_t>(loop) * rank + j) * in + c]);
  }
  float B(int loop, int o, int j) const {
    return Bf16ToF32(b[(static_cast<size_t>(loop) * out + o) * rank + j]);
  }
  float T(int r, int j) const { return t[static_cast<size_t>(r) * rank + j]; }
};

// segments: (rows, loop) in order; a loop may be out of range on purpose (fault rows).
inline LoraProblem MakeLoraProblem(int in, int out, int rank, int num_loops,
                                   const std::vector<std::pair<int, int>>& segments, uint64_t seed,
                                   int lead = 0, int trail = 0) {
  LoraProblem p;
  p.in = in;
  p.out = out;
  p.rank = rank;
  p.num_loops = num_loops;
  p.seg_indptr.push_back(lead);
  p.row_loop.assign(lead, 0);
  p.covered.assign(lead, 0);
  for (const auto& [len, loop] : segments) {
    p.seg_indptr.push_back(p.seg_indptr.back() + len);
    p.seg_loop.push_back(loop);
    p.row_loop.insert(p.row_loop.end(), len, loop);
    p.covered.insert(p.covered.end(), len, 1);
  }
  p.rows = p.seg_indptr.back() + trail;
  p.row_loop.resize(p.rows, 0);
  p.covered.resize(p.rows, 0);
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  auto bf16 = [&](size_t n, float scale) {
    std::vector<uint16_t> v(n);
    for (uint16_t& e : v) e = F32ToBf16(scale * dist(rng));
    return v;
  };
  p.x = bf16(static_cast<size_t>(p.rows) * in, 1.0f);
  p.a = bf16(static_cast<size_t>(num_loops) * rank * in, 1.0f / std::sqrt(static_cast<float>(in)));
  p.b = bf16(static_cast<size_t>(num_loops) * out * rank, 0.5f);
  p.t.resize(static_cast<size_t>(p.rows) * rank);
  for (float& v : p.t) v = dist(rng);
  p.y.resize(static_cast<size_t>(p.rows) * out);
  for (float& v : p.y) v = 4.0f * dist(rng);
  return p;
}

// t[r, j] in double and the sum of |products|.
inline std::pair<double, double> ShrinkReference(const LoraProblem& p, int r, int j) {
  const int loop = p.row_loop[r];
  double s = 0, abs = 0;
  for (int c = 0; c < p.in; ++c) {
    const double v = static_cast<double>(p.X(r, c)) * p.A(loop, j, c);
    s += v;
    abs += std::abs(v);
  }
  return {s, abs};
}

// t[r, j] in the shrink kernel's order: thread g (of 128) sums the 8-element vectors g,
// g + 128, ... with fmaf; in each warp of 32 threads the partials are added over the tree
// (l, l + 16), then + 8, ...; the 4 warp sums are added in warp order.
inline float ShrinkFixedOrder(const LoraProblem& p, int r, int j) {
  const int loop = p.row_loop[r];
  float warps[4];
  for (int w = 0; w < 4; ++w) {
    float lanes[32];
    for (int l = 0; l < 32; ++l) {
      float s = 0.0f;
      for (int v = 32 * w + l; v < p.in / 8; v += 128) {
        for (int e = 0; e < 8; ++e) s = std::fma(p.X(r, 8 * v + e), p.A(loop, j, 8 * v + e), s);
      }
      lanes[l] = s;
    }
    for (int off = 16; off >= 1; off /= 2) {
      for (int l = 0; l < off; ++l) lanes[l] = lanes[l] + lanes[l + off];
    }
    warps[w] = lanes[0];
  }
  return ((warps[0] + warps[1]) + warps[2]) + warps[3];
}

// y[r, o] after the expand, in double: y_in + sum_j t b, and the sum of |terms|. t_of(r, j)
// gives the t the kernel read (fp32, or bf16 widened).
template <typename TOf>
std::pair<double, double> ExpandReference(const LoraProblem& p, TOf t_of, int r, int o) {
  const int loop = p.row_loop[r];
  const double y0 = p.y[static_cast<size_t>(r) * p.out + o];
  double s = y0, abs = std::abs(y0);
  for (int j = 0; j < p.rank; ++j) {
    const double v = static_cast<double>(t_of(r, j)) * p.B(loop, o, j);
    s += v;
    abs += std::abs(v);
  }
  return {s, abs};
}

// y[r, o] in the expand kernel's order: acc = fmaf over j ascending from 0, then y + acc.
template <typename TOf>
float ExpandFixedOrder(const LoraProblem& p, TOf t_of, int r, int o) {
  const int loop = p.row_loop[r];
  float acc = 0.0f;
  for (int j = 0; j < p.rank; ++j) acc = std::fma(t_of(r, j), p.B(loop, o, j), acc);
  return p.y[static_cast<size_t>(r) * p.out + o] + acc;
}

inline uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// Output poison: all-ones bytes, a NaN in fp32 and bf16 (as DeviceBuffer::Poison leaves it).
constexpr uint16_t kPoisonBf16 = 0xFFFF;
constexpr uint32_t kPoisonF32 = 0xFFFFFFFFu;

// The checks shared by the emulator and GPU tests. Shrink output: poison outside every
// segment, NaN for faulty loops, else within the fp32 bound of the double definition and
// bit-equal to the fixed order. Expand output: y unchanged bit for bit outside every
// segment, NaN for faulty loops, else y_in + delta within the bound and bit-equal to the
// fixed order.
inline void CheckShrinkF32(const LoraProblem& p, const std::vector<float>& t) {
  for (int r = 0; r < p.rows; ++r) {
    for (int j = 0; j < p.rank; ++j) {
      const float got = t[static_cast<size_t>(r) * p.rank + j];
      const std::string at = "row " + std::to_string(r) + " rank " + std::to_string(j);
      if (!p.covered[r]) {
        ASSERT_EQ(Bits(got), kPoisonF32) << at << ": written outside every segment";
      } else if (p.Faulty(r)) {
        ASSERT_TRUE(std::isnan(got)) << at << ": faulty loop";
      } else {
        const auto [want, abs] = ShrinkReference(p, r, j);
        ASSERT_LE(std::abs(got - want), 1e-5 * abs + 1e-30) << at;
        ASSERT_EQ(Bits(got), Bits(ShrinkFixedOrder(p, r, j))) << at << ": order";
      }
    }
  }
}

inline void CheckShrinkBf16(const LoraProblem& p, const std::vector<uint16_t>& t) {
  for (int r = 0; r < p.rows; ++r) {
    if (!p.covered[r] || p.Faulty(r)) continue;  // covered by the fp32 check
    for (int j = 0; j < p.rank; ++j) {
      const uint16_t got = t[static_cast<size_t>(r) * p.rank + j];
      const auto [want, abs] = ShrinkReference(p, r, j);
      ASSERT_LE(std::abs(Bf16ToF32(got) - want), 4e-3 * std::abs(want) + 1e-5 * abs + 1e-30)
          << "row " << r << " rank " << j;
      ASSERT_EQ(got, F32ToBf16(ShrinkFixedOrder(p, r, j))) << "row " << r;
    }
  }
}

template <typename TOf>
void CheckExpand(const LoraProblem& p, TOf t_of, const std::vector<float>& y) {
  for (int r = 0; r < p.rows; ++r) {
    for (int o = 0; o < p.out; ++o) {
      const size_t e = static_cast<size_t>(r) * p.out + o;
      const std::string at = "row " + std::to_string(r) + " out " + std::to_string(o);
      if (!p.covered[r]) {
        ASSERT_EQ(Bits(y[e]), Bits(p.y[e])) << at << ": changed outside every segment";
      } else if (p.Faulty(r)) {
        ASSERT_TRUE(std::isnan(y[e])) << at << ": faulty loop";
      } else {
        const auto [want, abs] = ExpandReference(p, t_of, r, o);
        ASSERT_LE(std::abs(y[e] - want), 1e-5 * abs + 1e-30) << at;
        ASSERT_EQ(Bits(y[e]), Bits(ExpandFixedOrder(p, t_of, r, o))) << at << ": order";
      }
    }
  }
}

// One row of p as a problem of its own (the same weights and inputs).
inline LoraProblem SingleRow(const LoraProblem& p, int r) {
  LoraProblem q = p;
  q.rows = 1;
  q.seg_indptr = {0, 1};
  q.seg_loop = {p.row_loop[r]};
  q.row_loop = {p.row_loop[r]};
  q.covered = {1};
  q.x.assign(p.x.begin() + static_cast<size_t>(r) * p.in, p.x.begin() + (r + 1LL) * p.in);
  q.t.assign(p.t.begin() + static_cast<size_t>(r) * p.rank, p.t.begin() + (r + 1LL) * p.rank);
  q.y.assign(p.y.begin() + static_cast<size_t>(r) * p.out, p.y.begin() + (r + 1LL) * p.out);
  return q;
}

// Every check on one problem through a runner (the emulator's or the GPU's), which offers
//   std::vector<float> ShrinkF32(p), std::vector<uint16_t> ShrinkBf16(p) (poisoned t first),
//   std::vector<float> Expand(p, t) for fp32 or bf16 t (y starting from p.y):
// shrink to fp32 and to bf16 t, expand from fp32 and from bf16 t.
template <typename Runner>
void CheckAll(const Runner& run, const LoraProblem& p) {
  SCOPED_TRACE("in=" + std::to_string(p.in) + " out=" + std::to_string(p.out) +
               " rank=" + std::to_string(p.rank) + " rows=" + std::to_string(p.rows));
  ASSERT_NO_FATAL_FAILURE(CheckShrinkF32(p, run.ShrinkF32(p)));
  ASSERT_NO_FATAL_FAILURE(CheckShrinkBf16(p, run.ShrinkBf16(p)));
  auto t32_of = [&](int r, int j) { return p.T(r, j); };
  ASSERT_NO_FATAL_FAILURE(CheckExpand(p, t32_of, run.Expand(p, p.t)));
  std::vector<uint16_t> t16(p.t.size());
  for (size_t i = 0; i < t16.size(); ++i) t16[i] = F32ToBf16(p.t[i]);
  auto t16_of = [&](int r, int j) { return Bf16ToF32(t16[static_cast<size_t>(r) * p.rank + j]); };
  ASSERT_NO_FATAL_FAILURE(CheckExpand(p, t16_of, run.Expand(p, t16)));
}

// Batch invariance: each of `rows` computed alone (a one-row problem) equals, bit for bit,
// the same row computed inside p's batch, for the shrink and the expand.
template <typename Runner>
void CheckRowsAloneMatchBatch(const LoraProblem& p, const std::vector<int>& rows,
                              const Runner& run) {
  const std::vector<float> t = run.ShrinkF32(p);
  const std::vector<float> y = run.Expand(p, p.t);
  for (int r : rows) {
    ASSERT_TRUE(p.covered[r] && !p.Faulty(r)) << "row " << r;
    const LoraProblem q = SingleRow(p, r);
    const std::vector<float> t1 = run.ShrinkF32(q);
    const std::vector<float> y1 = run.Expand(q, q.t);
    for (int j = 0; j < p.rank; ++j) {
      ASSERT_EQ(Bits(t1[j]), Bits(t[static_cast<size_t>(r) * p.rank + j])) << "row " << r;
    }
    for (int o = 0; o < p.out; ++o) {
      ASSERT_EQ(Bits(y1[o]), Bits(y[static_cast<size_t>(r) * p.out + o])) << "row " << r;
    }
  }
}

// Empty segments, single-row segments, a segment over two 16-row tiles (the kernels' tests
// add uncovered rows before and after).
inline const std::vector<std::pair<int, int>> kLoraMixedSegments = {{5, 2}, {0, 1}, {1, 0}, {17, 1},
                                                                    {0, 0}, {3, 2}, {1, 1}};

// The suite both kernel tests run through their runner: kLoraMixedSegments at every rank
// (1, 8, 13, 64, 100; uncovered rows around them), an input of 137 16-byte vectors (in = 1096:
// threads 0-8 sum two and the others one), and unsorted rows (every row its own segment, 37
// segments, loops alternating). The problems' seeds are seed, seed + 1, ... and seed + 99.
template <typename Runner>
void CheckMixedSegmentsEveryRank(const Runner& run, uint64_t seed) {
  uint64_t s = seed;
  for (int rank : {1, 8, 13, 64, 100}) {
    ASSERT_NO_FATAL_FAILURE(
        CheckAll(run, MakeLoraProblem(64, 48, rank, 3, kLoraMixedSegments, s++, 2, 3)));
  }
  ASSERT_NO_FATAL_FAILURE(
      CheckAll(run, MakeLoraProblem(1096, 136, 13, 3, kLoraMixedSegments, s++, 0, 1)));
  std::vector<std::pair<int, int>> singles;
  for (int r = 0; r < 37; ++r) singles.push_back({1, (r * 7) % 3});
  ASSERT_NO_FATAL_FAILURE(CheckAll(run, MakeLoraProblem(64, 40, 13, 3, singles, seed + 99)));
}

// Segments of loops 5 and -1 (out of range for 2 loops) among good ones: their rows must come
// out NaN.
inline LoraProblem MakeFaultyLoopLoraProblem(uint64_t seed) {
  return MakeLoraProblem(64, 40, 13, 2, {{3, 0}, {2, 5}, {2, -1}, {4, 1}}, seed);
}

// Segment 0 starts before row 0 and segment 1 ends after the last row: both are clamped to
// [0, rows); segment 2 decreases, so it is empty.
inline LoraProblem MakeMalformedBoundsLoraProblem(uint64_t seed) {
  LoraProblem p = MakeLoraProblem(64, 40, 8, 2, {{4, 0}, {6, 1}, {0, 1}}, seed);
  p.seg_indptr = {-5, 4, 30, 7};
  return p;
}

// Where a launch reads the problem: host memory (the emulator) or device memory (the GPU test).
struct LoraInputs {
  const uint16_t *x, *a, *b;
  const int32_t *seg_indptr, *seg_loop;
};

// The shrink's launch parameters for p over `in`, writing t (t_dtype).
inline kernels::LoraShrinkParams LoraShrinkLaunch(const LoraProblem& p, const LoraInputs& in,
                                                  void* t, DType t_dtype) {
  kernels::LoraShrinkParams s;
  s.x = in.x;
  s.a = in.a;
  s.t = t;
  s.seg_indptr = in.seg_indptr;
  s.seg_loop = in.seg_loop;
  s.num_segments = static_cast<int>(p.seg_loop.size());
  s.rows = p.rows;
  s.in = p.in;
  s.rank = p.rank;
  s.num_loops = p.num_loops;
  s.t_dtype = t_dtype;
  return s;
}

// The expand's launch parameters for p over `in`, reading t (t_dtype) and adding into y.
inline kernels::LoraExpandParams LoraExpandLaunch(const LoraProblem& p, const LoraInputs& in,
                                                  const void* t, DType t_dtype, float* y) {
  kernels::LoraExpandParams e;
  e.t = t;
  e.b = in.b;
  e.y = y;
  e.seg_indptr = in.seg_indptr;
  e.seg_loop = in.seg_loop;
  e.num_segments = static_cast<int>(p.seg_loop.size());
  e.rows = p.rows;
  e.out = p.out;
  e.rank = p.rank;
  e.num_loops = p.num_loops;
  e.t_dtype = t_dtype;
  return e;
}

}  // namespace morserve::testing
