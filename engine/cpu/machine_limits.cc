// Read bandwidth and FMA peak of this machine (see machine_limits.h).
#include "engine/cpu/machine_limits.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>

#include "engine/core/check.h"
#include "engine/cpu/mem_bandwidth.h"
#include "engine/cpu/simd_intrinsics.h"
#include "engine/cpu/simd_target.h"

namespace morserve {
namespace {

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

MORSERVE_BEGIN_TARGET("avx2,fma")

// 10 independent chains of 8-lane FMAs; returns a value that depends on all of them.
float FmaChains(int64_t iterations) {
  __m256 acc[10];
  for (int i = 0; i < 10; ++i) acc[i] = _mm256_set1_ps(0.001f * i);
  const __m256 a = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(1e-7f);
  for (int64_t it = 0; it < iterations; ++it) {
    for (int i = 0; i < 10; ++i) acc[i] = _mm256_fmadd_ps(acc[i], a, b);
  }
  __m256 s = acc[0];
  for (int i = 1; i < 10; ++i) s = _mm256_add_ps(s, acc[i]);
  return _mm256_cvtss_f32(s);
}

MORSERVE_END_TARGET

MORSERVE_BEGIN_TARGET("avx512f")

// The same with 16-lane FMAs (the AVX-512 linear kernels' width).
float FmaChains512(int64_t iterations) {
  __m512 acc[10];
  for (int i = 0; i < 10; ++i) acc[i] = _mm512_set1_ps(0.001f * i);
  const __m512 a = _mm512_set1_ps(0.999999f), b = _mm512_set1_ps(1e-7f);
  for (int64_t it = 0; it < iterations; ++it) {
    for (int i = 0; i < 10; ++i) acc[i] = _mm512_fmadd_ps(acc[i], a, b);
  }
  __m512 s = acc[0];
  for (int i = 1; i < 10; ++i) s = _mm512_add_ps(s, acc[i]);
  return _mm512_reduce_add_ps(s);
}

MORSERVE_END_TARGET

MORSERVE_BEGIN_TARGET("avx512f,avx512bf16")

// 10 independent chains of VDPBF16PS (16 lanes, each two bf16 products and two adds).
float Bf16DotChains(int64_t iterations) {
  __m512 acc[10];
  for (int i = 0; i < 10; ++i) acc[i] = _mm512_set1_ps(0.001f * i);
  const __m512bh a = reinterpret_cast<__m512bh>(_mm512_set1_epi32(0x3f7f3f7f));  // 0.996, 0.996
  const __m512bh b = reinterpret_cast<__m512bh>(_mm512_set1_epi32(0x33d633d6));  // 1e-7, 1e-7
  for (int64_t it = 0; it < iterations; ++it) {
    for (int i = 0; i < 10; ++i) acc[i] = _mm512_dpbf16_ps(acc[i], a, b);
  }
  __m512 s = acc[0];
  for (int i = 1; i < 10; ++i) s = _mm512_add_ps(s, acc[i]);
  return _mm512_reduce_add_ps(s);
}

MORSERVE_END_TARGET

bool HasAvx2Fma() { return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"); }

// GFLOP/s of `chains` run on every thread at once, best of `tries`; flops_per_iteration: what
// one iteration of one thread's chains computes.
double BestChainRate(ThreadPool* pool, int tries, float (*chains)(int64_t),
                     double flops_per_iteration) {
  const int threads = pool->num_threads();
  const int64_t iterations = 4'000'000;  // ~40 ms per thread at ~3 GHz
  std::atomic<int> sink{0};
  double best = 0;
  for (int t = 0; t < tries; ++t) {
    const double t0 = Now();
    pool->ParallelFor(threads, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) sink += chains(iterations) > 1e30f;
    });
    const double flops = flops_per_iteration * static_cast<double>(iterations) * threads;
    best = std::max(best, flops / (Now() - t0) / 1e9);
  }
  return best + 0.0 * sink.load();
}

}  // namespace

double MeasureFmaPeak(ThreadPool* pool, int tries) {
  if (!HasAvx2Fma()) return 0.0;
  const bool wide = __builtin_cpu_supports("avx512f");
  const int lanes = wide ? 16 : 8;
  return BestChainRate(pool, tries, wide ? &FmaChains512 : &FmaChains, 2.0 * lanes * 10);
}

double MeasureBf16DotPeak(ThreadPool* pool, int tries) {
  if (!__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx512bf16")) return 0.0;
  return BestChainRate(pool, tries, &Bf16DotChains, 4.0 * 16 * 10);
}

MachineLimits MeasureMachineLimits(ThreadPool* pool, int64_t buffer_mb) {
  MachineLimits m;
  m.threads = pool->num_threads();
  const auto read = MeasureReadBandwidth(buffer_mb, 3, pool);
  MORSERVE_CHECK(read.ok(), std::string(read.status().message()).c_str());
  m.buffer_bytes = read->bytes;
  m.read_gbs = read->gbs;
  m.fma_gflops = MeasureFmaPeak(pool);
  m.bf16_dot_gflops = MeasureBf16DotPeak(pool);
  return m;
}

}  // namespace morserve
