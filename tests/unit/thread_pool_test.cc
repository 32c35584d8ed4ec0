// ThreadPool::ParallelFor: every index runs exactly once in contiguous pieces of the documented
// size, results equal the serial ones for any thread count, nested calls run serially, and
// the caller takes the pieces a stalled worker has not claimed instead of waiting for it.
#include "engine/cpu/thread_pool.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <mutex>
#include <thread>
#include <vector>

namespace morserve {
namespace {

struct Range {
  int64_t begin, end;
};

TEST(ThreadPoolTest, EveryIndexOnceInPiecesOfTheDocumentedSize) {
  for (int threads : {1, 2, 3, 4}) {
    ThreadPool pool(threads);
    for (int64_t n : {1, 2, 3, 7, 8, 9, 16, 31, 100, 1000}) {
      std::vector<int> hits(n, 0);
      std::vector<Range> ranges;
      std::mutex mu;
      pool.ParallelFor(n, [&](int64_t b, int64_t e) {
        std::lock_guard<std::mutex> lock(mu);
        ranges.push_back({b, e});
        for (int64_t i = b; i < e; ++i) ++hits[i];
      });
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i], 1) << "n " << n << " index " << i;
      if (threads == 1 || n == 1) {
        ASSERT_EQ(ranges.size(), 1u);  // serial: one call over everything
        continue;
      }
      const int64_t pieces = std::min<int64_t>(n, ThreadPool::kPiecesPerThread * threads);
      const int64_t piece = (n + pieces - 1) / pieces;
      EXPECT_EQ(static_cast<int64_t>(ranges.size()), (n + piece - 1) / piece) << "n " << n;
      for (const Range& r : ranges) {
        EXPECT_EQ(r.begin % piece, 0) << "n " << n;
        EXPECT_EQ(r.end, std::min(n, r.begin + piece)) << "n " << n;
      }
    }
  }
}

// A per-index computation with a fixed order inside the index gives bitwise the same
// numbers whatever the thread count and whoever ran which piece.
TEST(ThreadPoolTest, ResultsIndependentOfThreadCount) {
  const int64_t n = 517;
  auto run = [&](int threads) {
    ThreadPool pool(threads);
    std::vector<float> out(n);
    for (int rep = 0; rep < 20; ++rep) {
      pool.ParallelFor(n, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) {
          float acc = 0;
          for (int k = 1; k <= 200; ++k) acc += std::sin(static_cast<float>(i * k + rep)) / k;
          out[i] = acc;
        }
      });
    }
    return out;
  };
  const std::vector<float> serial = run(1);
  for (int threads : {2, 3, 5}) EXPECT_EQ(run(threads), serial) << threads << " threads";
}

TEST(ThreadPoolTest, NestedCallRunsSeriallyOnTheCallingThread) {
  ThreadPool pool(2);
  std::vector<int> inner_calls(8, 0);
  pool.ParallelFor(8, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const std::thread::id self = std::this_thread::get_id();
      pool.ParallelFor(5, [&](int64_t ib, int64_t ie) {
        EXPECT_EQ(std::this_thread::get_id(), self);
        EXPECT_EQ(ib, 0);
        EXPECT_EQ(ie, 5);
        ++inner_calls[i];
      });
    }
  });
  for (int c : inner_calls) EXPECT_EQ(c, 1);
}

// The worker that claims a piece is held for 300 ms (the caller's pieces take 5 ms, so the
// worker wakes and claims one). With one contiguous half per thread
// (the old static split) the caller would run exactly half of the 8 pieces; here it runs
// every piece the worker did not claim before stalling (at least 7 of 8).
TEST(ThreadPoolTest, CallerTakesThePiecesOfAStalledWorker) {
  ThreadPool pool(2);
  const std::thread::id caller = std::this_thread::get_id();
  const int64_t n = 2 * ThreadPool::kPiecesPerThread;  // pieces of one index
  for (int rep = 0; rep < 3; ++rep) {
    std::mutex mu;
    int by_caller = 0, by_worker = 0;
    pool.ParallelFor(n, [&](int64_t b, int64_t e) {
      ASSERT_EQ(e - b, 1);
      if (std::this_thread::get_id() != caller) {
        std::this_thread::sleep_for(std::chrono::milliseconds(300));
        std::lock_guard<std::mutex> lock(mu);
        ++by_worker;
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));  // time for the worker to wake
      std::lock_guard<std::mutex> lock(mu);
      ++by_caller;
    });
    EXPECT_EQ(by_caller + by_worker, n);
    EXPECT_LE(by_worker, 1) << "the caller waited for the stalled worker's pieces";
  }
}

}  // namespace
}  // namespace morserve
