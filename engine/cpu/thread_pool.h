// A small fixed thread pool for the CPU backend's data-parallel kernels.
//
// Invariant: work is split by index only. ParallelFor hands out contiguous index ranges, and a
// kernel computes each output element inside exactly one index with a fixed order, so results
// never depend on the number of threads, nor on which thread ran which range.
//
// The ranges ("pieces", a few per thread) are claimed from a shared counter by whichever
// thread is free, and the caller never waits for a worker that has not started: on a machine
// where other processes (or the server's own gRPC threads) hold the cores, a descheduled or
// slow-to-wake worker no longer stalls every call until it runs; the caller takes its pieces. Worker threads (and the caller while it runs its own
// share) run with the OpenMP thread count set to 1, so oneDNN primitives called from a task
// run single-threaded inside that task instead of forking their own teams.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace morserve {

class ThreadPool {
 public:
  // fn(begin, end) processes indices [begin, end).
  using RangeFn = std::function<void(int64_t begin, int64_t end)>;

  // num_threads <= 0 picks DefaultThreadCount(). The caller counts as one of the threads.
  explicit ThreadPool(int num_threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return num_threads_; }

  // Runs fn over [0, n) split into at most kPiecesPerThread * num_threads() contiguous pieces
  // of equal size (the last may be shorter), each run once by the caller or a worker; blocks
  // until all are done. A call made from inside a task runs serially on the calling thread.
  // Not reentrant from several outside threads at once: calls from different threads are
  // serialised.
  void ParallelFor(int64_t n, const RangeFn& fn);

  static constexpr int kPiecesPerThread = 4;

  // $MORSERVE_CPU_THREADS when set and positive, else std::thread::hardware_concurrency().
  static int DefaultThreadCount();

 private:
  void WorkerLoop();
  // Claims and runs pieces of the current call until none is left.
  void RunPieces(const RangeFn& fn, int64_t n, int64_t piece);

  int num_threads_;
  std::vector<std::thread> workers_;
  std::mutex call_mu_;  // one ParallelFor at a time
  std::mutex mu_;
  std::condition_variable work_cv_;
  std::condition_variable done_cv_;
  // The current call, guarded by mu_; next_piece_ is claimed without it.
  const RangeFn* fn_ = nullptr;
  int64_t n_ = 0;
  int64_t piece_ = 0;
  std::atomic<int64_t> next_piece_{0};
  uint64_t generation_ = 0;
  bool open_ = false;  // workers may still join the current call
  int inside_ = 0;     // workers running pieces of the current call
  bool stop_ = false;
};

// A process-wide pool of DefaultThreadCount() threads, created on first use.
ThreadPool* DefaultThreadPool();

// Sets the calling thread's OpenMP thread count (the ICV oneDNN reads) for the guard's lifetime
// and restores it after. No-op when OpenMP is not loaded in the process.
class ScopedOmpThreads {
 public:
  explicit ScopedOmpThreads(int n);
  ~ScopedOmpThreads();
  ScopedOmpThreads(const ScopedOmpThreads&) = delete;
  ScopedOmpThreads& operator=(const ScopedOmpThreads&) = delete;

 private:
  int previous_ = 0;
};

}  // namespace morserve
