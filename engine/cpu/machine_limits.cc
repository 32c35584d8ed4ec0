// Read bandwidth and FMA peak of this machine (see machine_limits.h).
#include "engine/cpu/machine_limits.h"

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>

namespace morserve {
namespace {

constexpr int64_t kChunk = 1 << 20;

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

#pragma GCC push_options
#pragma GCC target("avx2,fma")

uint64_t ReadChunkAvx2(const uint8_t* p, int64_t bytes) {
  __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
  for (int64_t i = 0; i < bytes; i += 128) {
    a0 = _mm256_or_si256(a0, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i)));
    a1 = _mm256_or_si256(a1, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 32)));
    a2 = _mm256_or_si256(a2, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 64)));
    a3 = _mm256_or_si256(a3, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 96)));
  }
  const __m256i a = _mm256_or_si256(_mm256_or_si256(a0, a1), _mm256_or_si256(a2, a3));
  return static_cast<uint64_t>(_mm256_extract_epi64(a, 0) | _mm256_extract_epi64(a, 3));
}

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

#pragma GCC pop_options

uint64_t ReadChunkScalar(const uint8_t* p, int64_t bytes) {
  uint64_t a0 = 0, a1 = 0, a2 = 0, a3 = 0;
  for (int64_t i = 0; i < bytes; i += 32) {
    uint64_t v[4];
    std::memcpy(v, p + i, 32);
    a0 |= v[0];
    a1 |= v[1];
    a2 |= v[2];
    a3 |= v[3];
  }
  return a0 | a1 | a2 | a3;
}

bool HasAvx2Fma() { return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"); }

}  // namespace

double MeasureReadBandwidth(ThreadPool* pool, int64_t buffer_bytes, int passes) {
  const int64_t chunks = std::max<int64_t>(1, (buffer_bytes + kChunk - 1) / kChunk);
  const int64_t bytes = chunks * kChunk;
  std::unique_ptr<uint8_t, decltype(&std::free)> buf(
      static_cast<uint8_t*>(std::aligned_alloc(64, static_cast<size_t>(bytes))), &std::free);
  pool->ParallelFor(chunks, [&](int64_t b, int64_t e) {  // touch: pages exist before timing
    std::memset(buf.get() + b * kChunk, 1, static_cast<size_t>((e - b) * kChunk));
  });
  const bool avx2 = HasAvx2Fma();
  std::atomic<uint64_t> sink{0};
  double best = 0;
  for (int p = 0; p < passes; ++p) {
    const double t0 = Now();
    pool->ParallelFor(chunks, [&](int64_t b, int64_t e) {
      uint64_t s = 0;
      for (int64_t c = b; c < e; ++c) {
        const uint8_t* q = buf.get() + c * kChunk;
        s |= avx2 ? ReadChunkAvx2(q, kChunk) : ReadChunkScalar(q, kChunk);
      }
      sink.fetch_or(s, std::memory_order_relaxed);
    });
    best = std::max(best, static_cast<double>(bytes) / (Now() - t0) / 1e9);
  }
  return sink.load() == 0 ? 0.0 : best;  // the buffer holds ones: the sink is never 0
}

double MeasureFmaPeak(ThreadPool* pool, int tries) {
  if (!HasAvx2Fma()) return 0.0;
  const int threads = pool->num_threads();
  const int64_t iterations = 4'000'000;  // ~40 ms per thread at ~3 GHz
  std::atomic<int> sink{0};
  double best = 0;
  for (int t = 0; t < tries; ++t) {
    const double t0 = Now();
    pool->ParallelFor(threads, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) sink += FmaChains(iterations) > 1e30f;
    });
    const double flops = 2.0 * 8 * 10 * static_cast<double>(iterations) * threads;
    best = std::max(best, flops / (Now() - t0) / 1e9);
  }
  return best + 0.0 * sink.load();
}

MachineLimits MeasureMachineLimits(ThreadPool* pool, int64_t buffer_bytes) {
  MachineLimits m;
  m.threads = pool->num_threads();
  m.buffer_bytes = (buffer_bytes + kChunk - 1) / kChunk * kChunk;
  m.read_gbs = MeasureReadBandwidth(pool, buffer_bytes);
  m.fma_gflops = MeasureFmaPeak(pool);
  return m;
}

}  // namespace morserve
