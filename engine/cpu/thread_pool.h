// A small persistent thread pool for the CPU backend's data-parallel kernels.
//
// Invariant: work is split by index only. ParallelFor hands out contiguous index ranges, and a
// kernel computes each output element inside exactly one index with a fixed order, so results
// never depend on the number of threads, nor on which thread ran which range.
//
// The ranges ("pieces", a few per thread) are claimed from a shared counter by whichever
// thread is free, and the caller never waits for a worker that has not started: on a machine
// where other processes (or the server's own gRPC threads) hold the cores, a descheduled
// worker does not stall a call; the caller takes its pieces.
//
// Cost per call: a decode step makes a few hundred calls of tens of microseconds each, so the
// hand-off must cost well under a microsecond. Workers spin (with pause) on the call counter for
// kSpinMicros after their last piece before they sleep on a condition variable, and a caller
// only takes the lock to wake sleepers when there are any (as OpenMP runtimes' spin-then-block
// wait policy does).
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
  // Calls from different outside threads are serialised.
  void ParallelFor(int64_t n, const RangeFn& fn);

  static constexpr int kPiecesPerThread = 16;
  // How long an idle worker spins before it sleeps.
  static constexpr int kSpinMicros = 200;

  // $MORSERVE_CPU_THREADS when set and positive, else std::thread::hardware_concurrency().
  static int DefaultThreadCount();

 private:
  void WorkerLoop();
  // Waits for a call newer than `seen`; false when the pool stops.
  bool WaitForCall(uint64_t seen);
  // Claims and runs pieces of the current call until none is left.
  void RunPieces();

  int num_threads_;
  std::vector<std::thread> workers_;
  std::mutex call_mu_;  // one ParallelFor at a time
  // The current call: written by the caller before it bumps generation_, stable while open.
  const RangeFn* fn_ = nullptr;
  int64_t n_ = 0;
  int64_t piece_ = 0;
  std::atomic<int64_t> next_piece_{0};
  std::atomic<uint64_t> generation_{0};
  std::atomic<bool> open_{false};  // workers may still join the current call
  std::atomic<int> inside_{0};     // workers inside the current call
  // Sleeping workers.
  std::mutex mu_;
  std::condition_variable work_cv_;
  std::atomic<int> sleepers_{0};
  std::atomic<bool> stop_{false};
};

// A process-wide pool of DefaultThreadCount() threads, created on first use.
ThreadPool* DefaultThreadPool();

}  // namespace morserve
