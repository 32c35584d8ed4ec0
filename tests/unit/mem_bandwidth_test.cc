// The read-bandwidth measurement of `morserve bench`: the buffer is whole 1 MiB chunks, every
// word is read (the checksum is the sum of the words written), the rate is positive and
// finite with any thread count, and bad sizes are errors naming the flag.
#include "engine/cpu/mem_bandwidth.h"

#include <cmath>

#include "engine/cpu/thread_pool.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace morserve {
namespace {

TEST(MemBandwidth, BufferIsWholeChunks) {
  EXPECT_EQ(BandwidthBufferBytes(1), kBandwidthChunkBytes);
  EXPECT_EQ(BandwidthBufferBytes(1024), int64_t{1} << 30);
  EXPECT_EQ(BandwidthBufferBytes(0), kBandwidthChunkBytes);  // at least one chunk
  EXPECT_EQ(BandwidthBufferBytes(3) % kBandwidthChunkBytes, 0);
}

TEST(MemBandwidth, ReadsEveryWordAtAPositiveFiniteRate) {
  for (int threads : {1, 2, 3}) {
    SCOPED_TRACE(threads);
    ThreadPool pool(threads);
    auto bw = MeasureReadBandwidth(48, 3, &pool);
    ASSERT_TRUE(bw.ok()) << bw.status();
    EXPECT_EQ(bw->bytes, 48 * kBandwidthChunkBytes);
    EXPECT_EQ(bw->threads, threads);
    EXPECT_EQ(bw->passes, 3);
    EXPECT_GT(bw->gbs, 0.0);
    EXPECT_TRUE(std::isfinite(bw->gbs));
    EXPECT_LT(bw->gbs, 10000.0) << "faster than any memory: the reads were skipped";
    const uint64_t n = static_cast<uint64_t>(bw->bytes / 8);
    EXPECT_EQ(bw->checksum, n * (n - 1) / 2) << "word i holds i";
  }
}

TEST(MemBandwidth, BadSizesAreErrors) {
  ThreadPool pool(1);
  auto bw = MeasureReadBandwidth(0, 3, &pool);
  ASSERT_FALSE(bw.ok());
  EXPECT_THAT(std::string(bw.status().message()), ::testing::HasSubstr("--membw-mb"));
  EXPECT_FALSE(MeasureReadBandwidth(1, 0, &pool).ok());
}

}  // namespace
}  // namespace morserve
