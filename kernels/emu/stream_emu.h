// Stream order and CUDA graph capture of the CPU emulator of CUDA (kernels/emu): the state the
// emulated launches (cuda_emu.h's Launcher), cudart (cuda_runtime_emu.cc) and cuBLASLt
// (cublaslt_emu.cc) share. Needs only the CUDA runtime headers, not the fiber emulator.
//
// Work on a created stream (launches, async copies and memsets, cuBLASLt matmuls) waits in
// that stream's queue and runs, in order, at the next synchronisation that covers it
// (cudaStreamSynchronize, cudaDeviceSynchronize, cudaFree, a legacy-stream call for blocking
// streams). So host code that reads a result, or refills a pinned buffer an async copy still
// has to read, before synchronising gets the stale bytes a GPU may give it, instead of working
// by luck. Work on the legacy stream (nullptr) runs at once.
//
// While a stream captures (cudaStreamBeginCapture .. cudaStreamEndCapture), Submit records its
// work in the capture instead of queueing it; cudaGraphLaunch later queues the recorded work as
// one unit. Work queued before the capture stays queued.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

namespace cuda_emu {

using Op = std::function<void()>;

// One stream's capture.
struct Capture {
  cudaStreamCaptureMode mode = cudaStreamCaptureModeGlobal;
  std::thread::id thread;    // the thread that began it
  bool invalidated = false;  // by a call a GPU refuses during the capture
  std::vector<Op> ops;       // in stream order
};

struct StreamQueues {
  std::mutex mu;
  std::map<cudaStream_t, std::vector<Op>> pending;
  std::map<cudaStream_t, Capture> captures;
};

inline StreamQueues& Queues() {
  static StreamQueues* q = new StreamQueues;  // never destroyed: used by static destructors
  return *q;
}

// Process-wide counts: kernel launches accepted by MORSERVE_LAUNCH (queued, run or captured;
// not the replays of a graph) and graph launches accepted by cudaGraphLaunch.
struct Counters {
  std::atomic<uint64_t> kernel_launches{0};
  std::atomic<uint64_t> graph_launches{0};
};

inline Counters& Counts() {
  static Counters c;
  return c;
}

// Runs `op` at once on the legacy stream, records it when `stream` captures, else queues it.
// cudaErrorStreamCaptureInvalidated (and nothing recorded) when the capture was invalidated.
inline cudaError_t Submit(cudaStream_t stream, Op op) {
  if (stream == nullptr) {
    op();
    return cudaSuccess;
  }
  StreamQueues& q = Queues();
  std::lock_guard<std::mutex> lock(q.mu);
  auto c = q.captures.find(stream);
  if (c == q.captures.end()) {
    q.pending[stream].push_back(std::move(op));
    return cudaSuccess;
  }
  if (c->second.invalidated) return cudaErrorStreamCaptureInvalidated;
  c->second.ops.push_back(std::move(op));
  return cudaSuccess;
}

// Runs the work queued on `stream` (nothing for the legacy stream, which never queues).
inline void SyncStream(cudaStream_t stream) {
  StreamQueues& q = Queues();
  std::vector<Op> ops;
  {
    std::lock_guard<std::mutex> lock(q.mu);
    auto it = q.pending.find(stream);
    if (it == q.pending.end()) return;
    ops.swap(it->second);
    q.pending.erase(it);
  }
  for (auto& op : ops) op();
}

// Runs the work queued on every stream.
inline void SyncAll() {
  std::vector<cudaStream_t> streams;
  {
    StreamQueues& q = Queues();
    std::lock_guard<std::mutex> lock(q.mu);
    for (const auto& [s, ops] : q.pending) streams.push_back(s);
  }
  for (cudaStream_t s : streams) SyncStream(s);
}

}  // namespace cuda_emu
