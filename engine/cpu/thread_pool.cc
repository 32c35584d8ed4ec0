// Persistent thread pool with spin-then-sleep workers (see thread_pool.h).
//
// Joining a call without a lock: a worker first counts itself in (inside_), then checks that
// the call it saw is still open; the caller closes the call, then waits for inside_ to reach
// zero. With sequentially consistent atomics either the worker sees the call closed and backs
// out without touching it, or the caller sees the worker and waits for it.
#include "engine/cpu/thread_pool.h"

#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>

namespace morserve {
namespace {

thread_local bool tls_in_task = false;

}  // namespace

int ThreadPool::DefaultThreadCount() {
  if (const char* env = std::getenv("MORSERVE_CPU_THREADS")) {
    const int n = std::atoi(env);
    if (n > 0) return n;
  }
  return std::max(1u, std::thread::hardware_concurrency());
}

ThreadPool::ThreadPool(int num_threads)
    : num_threads_(num_threads > 0 ? num_threads : DefaultThreadCount()) {
  workers_.reserve(num_threads_ - 1);
  for (int i = 1; i < num_threads_; ++i) workers_.emplace_back([this] { WorkerLoop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  for (std::thread& t : workers_) t.join();
}

void ThreadPool::RunPieces() {
  for (;;) {
    const int64_t begin = next_piece_.fetch_add(1, std::memory_order_relaxed) * piece_;
    if (begin >= n_) return;
    (*fn_)(begin, std::min(n_, begin + piece_));
  }
}

bool ThreadPool::WaitForCall(uint64_t seen) {
  using Clock = std::chrono::steady_clock;
  const Clock::time_point until = Clock::now() + std::chrono::microseconds(kSpinMicros);
  for (int i = 0;; ++i) {
    if (generation_.load() != seen || stop_.load()) return !stop_.load();
    _mm_pause();
    if ((i & 63) == 63 && Clock::now() > until) break;
  }
  std::unique_lock<std::mutex> lock(mu_);
  ++sleepers_;
  work_cv_.wait(lock, [&] { return stop_.load() || generation_.load() != seen; });
  --sleepers_;
  return !stop_.load();
}

void ThreadPool::WorkerLoop() {
  tls_in_task = true;
  uint64_t seen = 0;
  while (WaitForCall(seen)) {
    const uint64_t call = generation_.load();
    seen = call;
    ++inside_;
    if (open_.load() && generation_.load() == call) RunPieces();
    --inside_;
  }
}

void ThreadPool::ParallelFor(int64_t n, const RangeFn& fn) {
  if (n <= 0) return;
  if (tls_in_task || num_threads_ == 1 || n == 1) {
    fn(0, n);
    return;
  }
  std::lock_guard<std::mutex> call_lock(call_mu_);
  const int64_t pieces = std::min<int64_t>(n, static_cast<int64_t>(kPiecesPerThread) * num_threads_);
  fn_ = &fn;
  n_ = n;
  piece_ = (n + pieces - 1) / pieces;
  next_piece_.store(0);
  open_.store(true);
  ++generation_;
  if (sleepers_.load() > 0) {
    std::lock_guard<std::mutex> lock(mu_);
    work_cv_.notify_all();
  }
  tls_in_task = true;
  RunPieces();
  tls_in_task = false;
  open_.store(false);  // every piece is claimed: late workers stay out
  for (int i = 0; inside_.load() != 0; ++i) {  // a worker finishing its piece, or backing out
    if (i < 4096) {
      _mm_pause();
    } else {
      std::this_thread::yield();  // it was descheduled: let it run
    }
  }
  fn_ = nullptr;
}

ThreadPool* DefaultThreadPool() {
  static ThreadPool* pool = new ThreadPool();
  return pool;
}

}  // namespace morserve
