// Fixed thread pool; pieces claimed by whichever thread is free (see thread_pool.h).
//
// The OpenMP entry points are looked up with dlsym instead of linking libgomp: oneDNN (built
// with the OpenMP runtime) already loads it, and the engine library does not link OpenMP.
#include "engine/cpu/thread_pool.h"

#include <dlfcn.h>

#include <algorithm>
#include <cstdlib>

namespace morserve {
namespace {

thread_local bool tls_in_task = false;

using OmpSetFn = void (*)(int);
using OmpGetFn = int (*)();

struct OmpApi {
  OmpSetFn set = nullptr;
  OmpGetFn get = nullptr;
};

const OmpApi& Omp() {
  static const OmpApi api = [] {
    OmpApi a;
    a.set = reinterpret_cast<OmpSetFn>(dlsym(RTLD_DEFAULT, "omp_set_num_threads"));
    a.get = reinterpret_cast<OmpGetFn>(dlsym(RTLD_DEFAULT, "omp_get_max_threads"));
    if (a.set == nullptr || a.get == nullptr) a = OmpApi{};
    return a;
  }();
  return api;
}

}  // namespace

ScopedOmpThreads::ScopedOmpThreads(int n) {
  if (Omp().set == nullptr) return;
  previous_ = Omp().get();
  if (previous_ != n) Omp().set(n);
}

ScopedOmpThreads::~ScopedOmpThreads() {
  if (Omp().set != nullptr && previous_ > 0 && Omp().get() != previous_) Omp().set(previous_);
}

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

void ThreadPool::RunPieces(const RangeFn& fn, int64_t n, int64_t piece) {
  for (;;) {
    const int64_t begin = next_piece_.fetch_add(1, std::memory_order_relaxed) * piece;
    if (begin >= n) return;
    fn(begin, std::min(n, begin + piece));
  }
}

// A worker joins a call only while it is open; one that wakes after the caller closed it
// (the caller ran every piece itself) goes back to sleep without touching it.
void ThreadPool::WorkerLoop() {
  if (Omp().set != nullptr) Omp().set(1);
  tls_in_task = true;
  uint64_t seen = 0;
  while (true) {
    const RangeFn* fn;
    int64_t n, piece;
    {
      std::unique_lock<std::mutex> lock(mu_);
      work_cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      if (!open_) continue;
      ++inside_;
      fn = fn_;
      n = n_;
      piece = piece_;
    }
    RunPieces(*fn, n, piece);
    std::lock_guard<std::mutex> lock(mu_);
    if (--inside_ == 0) done_cv_.notify_one();
  }
}

void ThreadPool::ParallelFor(int64_t n, const RangeFn& fn) {
  if (n <= 0) return;
  ScopedOmpThreads omp_guard(1);
  if (tls_in_task || num_threads_ == 1 || n == 1) {
    fn(0, n);
    return;
  }
  std::lock_guard<std::mutex> call_lock(call_mu_);
  const int64_t pieces = std::min<int64_t>(n, static_cast<int64_t>(kPiecesPerThread) * num_threads_);
  const int64_t piece = (n + pieces - 1) / pieces;
  {
    std::lock_guard<std::mutex> lock(mu_);
    fn_ = &fn;
    n_ = n;
    piece_ = piece;
    next_piece_.store(0, std::memory_order_relaxed);
    open_ = true;
    ++generation_;
  }
  work_cv_.notify_all();
  tls_in_task = true;
  RunPieces(fn, n, piece);
  tls_in_task = false;
  std::unique_lock<std::mutex> lock(mu_);
  open_ = false;  // every piece is claimed: late workers stay out
  done_cv_.wait(lock, [&] { return inside_ == 0; });
  fn_ = nullptr;
}

ThreadPool* DefaultThreadPool() {
  static ThreadPool* pool = new ThreadPool();
  return pool;
}

}  // namespace morserve
