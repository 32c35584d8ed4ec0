// The machine's streaming read bandwidth, measured the way the engine reads its weights:
// a buffer far larger than the caches is filled once by the pool (so its pages exist before
// any timed pass), then summed as 64-bit words (a loop the compiler
// vectorizes; integer adds keep any order exact) by a ThreadPool's ParallelFor over 1 MiB
// chunks, several passes, keeping the fastest. `morserve bench` divides each run's weight
// bytes per second by it (weight_bw_fraction).
#pragma once

#include <cstdint>

#include "absl/status/statusor.h"

namespace morserve {

class ThreadPool;

struct ReadBandwidth {
  double gbs = 0;        // fastest pass: bytes / seconds / 1e9
  int64_t bytes = 0;     // buffer size read per pass
  int threads = 0;       // the pool's threads (the caller included)
  int passes = 0;
  uint64_t checksum = 0;  // sum of the buffer's words (the reads are kept, and tests check it)
};

inline constexpr int64_t kBandwidthChunkBytes = int64_t{1} << 20;

// `megabytes` MiB as a whole number of chunks (>= 1 chunk).
int64_t BandwidthBufferBytes(int64_t megabytes);

// Measures with `passes` timed passes over a BandwidthBufferBytes(megabytes) buffer.
// Errors name --membw-mb (megabytes < 1) or the passes (< 1), or say the buffer could not be
// allocated.
absl::StatusOr<ReadBandwidth> MeasureReadBandwidth(int64_t megabytes, int passes, ThreadPool* pool);

}  // namespace morserve
