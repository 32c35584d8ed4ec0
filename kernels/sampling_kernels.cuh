// Device sampling kernel and its helpers, shared by the CUDA launcher (sampling.cu) and the
// CPU emulation test (tests/gpu/kernel_sampling_emu_test.cc). Not a public header: the
// contract is in sampling.cuh. Everything is in an anonymous namespace of morserve::kernels.
//
// Layout inside a row's CTA: thread t owns the contiguous ids [t * per, (t + 1) * per), so
// "ids in ascending order" is "threads in order, then each thread's range in order", and
// tie ranks and the inverse CDF come from per-thread counts plus a block exclusive scan.
// Reductions that go through shared-memory atomics are over integers (counts, fixed-point
// top_p masses), the others are fixed-order trees, so no result depends on timing.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/block_reduce.cuh"
#include "kernels/sampling.cuh"

namespace morserve::kernels {
namespace {

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;
constexpr double kFixedScale = 17592186044416.0;  // 2^44

__host__ __device__ uint64_t Mix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

__host__ __device__ double Uniform(uint64_t seed, uint64_t step) {
  const uint64_t bits = Mix64(Mix64(seed) ^ Mix64(step ^ 0x5bd1e9955bd1e995ULL));
  return static_cast<double>(bits >> 11) * 0x1.0p-53;
}

// Order-preserving key of a float (larger value, larger key); -0 and +0 share a key.
__device__ __forceinline__ uint32_t Key(float x) {
  const uint32_t u = __float_as_uint(__fadd_rn(x, 0.0f));
  return (u & 0x80000000u) != 0 ? ~u : (u | 0x80000000u);
}

__device__ __forceinline__ float Prob(float x, float m) {
  return __double2float_rn(exp(static_cast<double>(__fsub_rn(x, m))));
}

__device__ __forceinline__ uint64_t Fixed(float p) {
  return static_cast<uint64_t>(static_cast<double>(p) * kFixedScale);
}

struct Shared {
  uint32_t hist[256];
  unsigned long long mass[256];
  uint64_t scratch[kWarps];
  float scratch_f[kWarps];
  double scratch_d[kWarps];
  int scratch_i[kWarps];
  double incl[kThreads];  // inclusive block scan of per-thread masses
  uint32_t bin;
  double need;
  int found;
  int token;
};

__device__ uint64_t BlockExclusiveScan(uint64_t v, Shared& s) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const uint64_t incl = WarpInclusiveScan(v);
  if (lane == 31) s.scratch[warp] = incl;
  __syncthreads();
  uint64_t before = 0;
  for (int w = 0; w < warp; ++w) before += s.scratch[w];
  __syncthreads();
  return before + incl - v;
}

// Inclusive scan of one double per thread in a fixed order (lane shuffles, then the warps'
// totals in warp order); the result for thread t lands in s.incl[t].
__device__ void BlockInclusiveScan(double v, Shared& s) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const double incl = WarpInclusiveScan(v);
  if (lane == 31) s.scratch_d[warp] = incl;
  __syncthreads();
  double before = 0.0;
  for (int w = 0; w < warp; ++w) before += s.scratch_d[w];
  s.incl[threadIdx.x] = before + incl;
  __syncthreads();
}

__device__ float BlockMax(float v, Shared& s) {
  for (int off = 16; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
  if (threadIdx.x % 32 == 0) s.scratch_f[threadIdx.x / 32] = v;
  __syncthreads();
  float m = -INFINITY;
  for (int w = 0; w < kWarps; ++w) m = fmaxf(m, s.scratch_f[w]);
  __syncthreads();
  return m;
}

// A row, its temperature-scaled logits, and this thread's id range.
struct Row {
  const float* logits;
  float temperature;
  int lo, hi;
  __device__ float X(int i) const {
    const float v = logits[i];
    return temperature != 1.0f ? __fdiv_rn(v, temperature) : v;
  }
};

// The filters found so far. Stage 0: every id; 1: top_k survivors; 2: top_p survivors;
// 3: min_p survivors.
struct Filter {
  bool use_k = false;
  uint32_t kstar = 0;  // key of the k-th best
  int k_keep = 0;      // ties at kstar kept (lowest ids first)
  int k_before = 0;    // ties at kstar in ids before this thread's range
  float m = 0.0f;      // max x over the top_k survivors
  bool use_p = false;
  uint32_t pstar = 0;  // bits of the last kept probability
  int p_keep = 0;
  int p_before = 0;
  bool use_min = false;
  double min_threshold = 0.0;
};

// Calls fn(i, x, p) for this thread's ids that survive `stage`, in ascending id order
// (p is computed for stages >= 2 only).
template <typename Fn>
__device__ void Walk(const Row& r, const Filter& f, int stage, Fn fn) {
  int seen_k = 0, seen_p = 0;
  for (int i = r.lo; i < r.hi; ++i) {
    const float x = r.X(i);
    if (stage >= 1 && f.use_k) {
      const uint32_t key = Key(x);
      if (key < f.kstar) continue;
      if (key == f.kstar && f.k_before + seen_k++ >= f.k_keep) continue;
    }
    if (stage < 2) {
      fn(i, x, 0.0f);
      continue;
    }
    const float p = Prob(x, f.m);
    if (f.use_p) {
      const uint32_t pb = __float_as_uint(p);
      if (pb < f.pstar) continue;
      if (pb == f.pstar && f.p_before + seen_p++ >= f.p_keep) continue;
    }
    if (stage >= 3 && f.use_min && static_cast<double>(p) < f.min_threshold) continue;
    fn(i, x, p);
  }
}

// k-th largest key among stage-0 ids (radix select, 8 bits per pass); sets kstar, k_keep.
__device__ void SelectTopK(const Row& r, Filter& f, int k, Shared& s) {
  uint32_t prefix = 0;
  int remaining = k;
  for (int shift = 24; shift >= 0; shift -= 8) {
    if (threadIdx.x < 256) s.hist[threadIdx.x] = 0;
    __syncthreads();
    const uint32_t high = shift == 24 ? 0u : (0xffffffffu << (shift + 8));
    for (int i = r.lo; i < r.hi; ++i) {
      const uint32_t key = Key(r.X(i));
      if ((key & high) == prefix) atomicAdd(&s.hist[(key >> shift) & 255u], 1u);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      int cum = 0;
      for (int b = 255; b >= 0; --b) {
        if (cum + static_cast<int>(s.hist[b]) >= remaining) {
          s.bin = static_cast<uint32_t>(b);
          s.found = remaining - cum;
          break;
        }
        cum += static_cast<int>(s.hist[b]);
      }
    }
    __syncthreads();
    prefix |= s.bin << shift;
    remaining = s.found;
    __syncthreads();
  }
  f.kstar = prefix;
  f.k_keep = remaining;
  int mine = 0;
  for (int i = r.lo; i < r.hi; ++i) mine += Key(r.X(i)) == prefix ? 1 : 0;
  f.k_before = static_cast<int>(BlockExclusiveScan(static_cast<uint64_t>(mine), s));
}

// The smallest prefix (p descending, id ascending) of the top_k survivors whose fixed-point
// mass reaches `target`; sets pstar, p_keep (everything kept when rounding leaves the
// target above the total).
__device__ void SelectTopP(const Row& r, Filter& f, double target, Shared& s) {
  uint32_t prefix = 0;
  double need = target;
  for (int shift = 24; shift >= 0; shift -= 8) {
    if (threadIdx.x < 256) s.mass[threadIdx.x] = 0;
    __syncthreads();
    const uint32_t high = shift == 24 ? 0u : (0xffffffffu << (shift + 8));
    Walk(r, f, 1, [&](int, float x, float) {
      const float p = Prob(x, f.m);
      const uint32_t pb = __float_as_uint(p);
      if ((pb & high) == prefix) atomicAdd(&s.mass[(pb >> shift) & 255u], Fixed(p));
    });
    __syncthreads();
    if (threadIdx.x == 0) {
      uint64_t cum = 0;
      s.found = 0;
      for (int b = 255; b >= 0; --b) {
        if (static_cast<double>(cum + s.mass[b]) >= need) {
          s.bin = static_cast<uint32_t>(b);
          s.need = need - static_cast<double>(cum);
          s.found = 1;
          break;
        }
        cum += s.mass[b];
      }
    }
    __syncthreads();
    const bool found = s.found != 0;
    prefix |= s.bin << shift;
    need = s.need;
    __syncthreads();
    if (!found) {  // the target exceeds the whole mass (rounding): keep every survivor
      f.use_p = false;
      return;
    }
  }
  f.pstar = prefix;
  const uint64_t unit = Fixed(__uint_as_float(prefix));
  // Ties at pstar have equal mass `unit`: keep the fewest (lowest ids) that reach `need`.
  if (unit == 0) {
    f.p_keep = 0x7fffffff;
  } else {
    int keep = static_cast<int>(ceil(need / static_cast<double>(unit)));
    if (keep < 1) keep = 1;
    f.p_keep = keep;
  }
  int mine = 0;
  Walk(r, f, 1,
       [&](int, float x, float) { mine += __float_as_uint(Prob(x, f.m)) == prefix ? 1 : 0; });
  f.p_before = static_cast<int>(BlockExclusiveScan(static_cast<uint64_t>(mine), s));
}

struct Args {
  const float* logits;
  int64_t stride;
  int vocab;
  const float* temperature;
  const int32_t* top_k;
  const float* top_p;
  const float* min_p;
  const uint64_t* seed;
  const uint64_t* step;
  int32_t* token;
  float* chosen_logit;               // optional
  const float* processed = nullptr;  // optional [*, vocab]: rows chosen from (processed_row)
  const int32_t* processed_row = nullptr;
};

// Thread 0 writes the row's token and, when asked, its raw logit (NaN for token -1).
__device__ __forceinline__ void WriteToken(const Args& a, const float* logits, int row_index,
                                           int token) {
  if (threadIdx.x != 0) return;
  a.token[row_index] = token;
  if (a.chosen_logit != nullptr) a.chosen_logit[row_index] = token >= 0 ? logits[token] : NAN;
}

__global__ void __launch_bounds__(kThreads) SampleKernel(const Args a) {
  __shared__ Shared s;
  const int row_index = blockIdx.x;
  const int per = (a.vocab + kThreads - 1) / kThreads;
  Row r;
  const float* raw = a.logits + static_cast<int64_t>(row_index) * a.stride;
  const int32_t processed =
      a.processed_row != nullptr ? a.processed_row[row_index] : static_cast<int32_t>(-1);
  r.logits = processed >= 0 ? a.processed + static_cast<int64_t>(processed) * a.vocab : raw;
  r.temperature = a.temperature[row_index];
  r.lo = min(a.vocab, static_cast<int>(threadIdx.x) * per);
  r.hi = min(a.vocab, r.lo + per);
  const float top_p = a.top_p[row_index];
  const float min_p = a.min_p[row_index];
  if (isnan(r.temperature) || isnan(top_p) || isnan(min_p)) {
    WriteToken(a, raw, row_index, -1);
    return;
  }

  if (r.temperature < kSamplingGreedyTemperature) {  // greedy: argmax, lowest id on ties
    float best = -INFINITY;
    int best_i = -1;
    for (int i = r.lo; i < r.hi; ++i) {
      const float v = r.logits[i];
      if (best_i < 0 ? !isnan(v) : v > best) {
        best = v;
        best_i = i;
      }
    }
    const float m = BlockMax(best_i < 0 ? -INFINITY : best, s);
    // The lowest id holding the max: threads are in id order, so the first thread that has it.
    int candidate = (best_i >= 0 && best == m) ? best_i : 0x7fffffff;
    for (int off = 16; off > 0; off >>= 1)
      candidate = min(candidate, __shfl_xor_sync(0xffffffffu, candidate, off));
    if (threadIdx.x % 32 == 0) s.scratch_i[threadIdx.x / 32] = candidate;
    __syncthreads();
    int c = 0x7fffffff;
    for (int w = 0; w < kWarps; ++w) c = min(c, s.scratch_i[w]);
    WriteToken(a, raw, row_index, c == 0x7fffffff ? 0 : c);
    return;
  }

  Filter f;
  const int k = a.top_k[row_index];
  f.use_k = k > 0 && k < a.vocab;
  if (f.use_k) SelectTopK(r, f, k, s);

  float local_max = -INFINITY;
  Walk(r, f, 1, [&](int, float x, float) { local_max = fmaxf(local_max, x); });
  f.m = BlockMax(local_max, s);
  if (!(f.m > -INFINITY)) {  // every surviving logit is -inf (or NaN)
    WriteToken(a, raw, row_index, -1);
    return;
  }

  if (top_p < 1.0f) {
    // The total in double (fixed order), so the target carries no fixed-point truncation of
    // the tail; the selection compares it with fixed-point masses, exact for p >= 2^-20.
    double mine = 0.0;
    Walk(r, f, 1, [&](int, float x, float) { mine += static_cast<double>(Prob(x, f.m)); });
    BlockInclusiveScan(mine, s);
    const double total = s.incl[kThreads - 1];
    f.use_p = true;
    SelectTopP(r, f, static_cast<double>(top_p) * total * kFixedScale, s);
  }
  f.use_min = min_p > 0.0f;
  f.min_threshold = static_cast<double>(min_p) * 1.0;  // max probability: p of the max is exp(0)

  // Inverse CDF in double, ids ascending: each thread sums its range in order, a fixed-order
  // block scan gives every thread the mass before it (thread t's start is exactly thread
  // t-1's end), and the thread whose range crosses the target walks it.
  double mine = 0.0;
  Walk(r, f, 3, [&](int, float, float p) { mine += static_cast<double>(p); });
  BlockInclusiveScan(mine, s);
  const double total = s.incl[kThreads - 1];
  const double before = threadIdx.x == 0 ? 0.0 : s.incl[threadIdx.x - 1];
  const double end = s.incl[threadIdx.x];
  const double target = Uniform(a.seed[row_index], a.step[row_index]) * total;
  if (threadIdx.x == 0) s.token = -1;
  __syncthreads();
  if (!(before > target) && end > target && mine > 0.0) {
    double acc = before;
    int chosen = -1, last_positive = -1;
    Walk(r, f, 3, [&](int i, float, float p) {
      if (chosen >= 0 || !(p > 0.0f)) return;
      acc += static_cast<double>(p);
      last_positive = i;
      if (acc > target) chosen = i;
    });
    s.token = chosen >= 0 ? chosen : last_positive;  // rounding can end the walk at the target
  }
  __syncthreads();
  WriteToken(a, raw, row_index, s.token);
}

}  // namespace
}  // namespace morserve::kernels
