// A segmented LoRA problem for the kernel tests (the CPU emulation test and the GPU test):
// random bf16 x, adapters stacked over loops (A [loops, rank, in], B [loops, out, rank]),
// fp32 t and y inputs for the expand, segments given as (length, loop) after `lead` rows no
// segment covers (and `trail` more at the end), and the references:
//   - the definition in double (with the sum of |products|, which bounds fp32 rounding),
//   - the kernels' fixed fp32 order (lora_shrink.cuh / lora_expand.cuh), which both kernels
//     must reproduce bit for bit: it is what makes a row's result independent of the batch.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <utility>
#include <vector>

#include "engine/model/dtype.h"

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

// t[r, j] in the shrink kernel's order: lane l sums the 8-element vectors l, l + 32, ... with
// fmaf, then the lane partials are added over the tree (l, l + 16), then + 8, ... .
inline float ShrinkFixedOrder(const LoraProblem& p, int r, int j) {
  const int loop = p.row_loop[r];
  float lanes[32];
  for (int l = 0; l < 32; ++l) {
    float s = 0.0f;
    for (int v = l; v < p.in / 8; v += 32) {
      for (int e = 0; e < 8; ++e) s = std::fma(p.X(r, 8 * v + e), p.A(loop, j, 8 * v + e), s);
    }
    lanes[l] = s;
  }
  for (int off = 16; off >= 1; off /= 2) {
    for (int l = 0; l < off; ++l) lanes[l] = lanes[l] + lanes[l + off];
  }
  return lanes[0];
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

}  // namespace morserve::testing
