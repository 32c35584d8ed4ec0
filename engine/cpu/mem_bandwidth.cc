// Streaming read bandwidth (see mem_bandwidth.h).
#include "engine/cpu/mem_bandwidth.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <new>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/cpu/simd_target.h"
#include "engine/cpu/thread_pool.h"

namespace morserve {
namespace {

constexpr int64_t kWordsPerChunk = kBandwidthChunkBytes / sizeof(uint64_t);

struct FreeDeleter {
  void operator()(uint64_t* p) const { std::free(p); }
};

// The words of one chunk summed (vectorized: independent lanes, exact integer adds), compiled
// twice: for AVX2 and for the baseline; MeasureReadBandwidth picks at run time. Not
// target_clones: its ifunc resolver runs during relocation, before a sanitizer runtime is up,
// and crashes a ThreadSanitizer build at load (scripts/tsan.sh).
MORSERVE_BEGIN_TARGET("avx2")
uint64_t SumChunkAvx2(const uint64_t* __restrict words) {
  uint64_t sum = 0;
  for (int64_t i = 0; i < kWordsPerChunk; ++i) sum += words[i];
  return sum;
}
MORSERVE_END_TARGET

uint64_t SumChunkBaseline(const uint64_t* __restrict words) {
  uint64_t sum = 0;
  for (int64_t i = 0; i < kWordsPerChunk; ++i) sum += words[i];
  return sum;
}

using SumChunkFn = uint64_t (*)(const uint64_t*);

SumChunkFn ChooseSumChunk() {
  return __builtin_cpu_supports("avx2") ? &SumChunkAvx2 : &SumChunkBaseline;
}

}  // namespace

int64_t BandwidthBufferBytes(int64_t megabytes) {
  return std::max<int64_t>(1, megabytes) * (int64_t{1} << 20) / kBandwidthChunkBytes * kBandwidthChunkBytes;
}

absl::StatusOr<ReadBandwidth> MeasureReadBandwidth(int64_t megabytes, int passes, ThreadPool* pool) {
  if (megabytes < 1) return absl::InvalidArgumentError("--membw-mb: must be >= 1");
  if (passes < 1) return absl::InvalidArgumentError("read bandwidth: passes must be >= 1");
  ReadBandwidth r;
  r.bytes = BandwidthBufferBytes(megabytes);
  r.threads = pool->num_threads();
  r.passes = passes;
  const int64_t chunks = r.bytes / kBandwidthChunkBytes;
  std::unique_ptr<uint64_t, FreeDeleter> buffer(
      static_cast<uint64_t*>(std::aligned_alloc(4096, static_cast<size_t>(r.bytes))));
  if (!buffer) {
    return absl::ResourceExhaustedError(
        absl::StrCat("--membw-mb: cannot allocate ", r.bytes >> 20, " MiB"));
  }
  uint64_t* words = buffer.get();
  pool->ParallelFor(chunks, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin * kWordsPerChunk; i < end * kWordsPerChunk; ++i) words[i] = static_cast<uint64_t>(i);
  });
  std::vector<uint64_t> partial(chunks);
  static const SumChunkFn sum_chunk = ChooseSumChunk();
  double best = 0;
  for (int pass = 0; pass < passes; ++pass) {
    const auto t0 = std::chrono::steady_clock::now();
    pool->ParallelFor(chunks, [&](int64_t begin, int64_t end) {
      for (int64_t c = begin; c < end; ++c) partial[c] = sum_chunk(words + c * kWordsPerChunk);
    });
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (seconds > 0) best = std::max(best, r.bytes / seconds / 1e9);
    r.checksum = 0;
    for (uint64_t p : partial) r.checksum += p;
  }
  r.gbs = best;
  return r;
}

}  // namespace morserve
