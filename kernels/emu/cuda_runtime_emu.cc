// The CUDA runtime functions the CUDA model runner, the kernels' launchers and the GPU tests
// call, emulated on the host for the emulated runner (morserve_cuda_runner_emu): the exact
// signatures of cuda_runtime_api.h, so the same runner source links against this instead of
// libcudart. Host memory stands in for device memory:
//   - cudaMalloc returns 256-byte aligned memory filled with 0xFF bytes (a NaN in fp32 and in
//     bf16), so a read of device memory nothing wrote shows up as NaN in a test's values;
//   - every copy and memset must lie inside one live allocation on its device side (an
//     out-of-bounds copy is cudaErrorInvalidValue, as on a GPU), and cudaFree of a pointer
//     cudaMalloc did not return is an error;
//   - stream order as on a GPU (stream_emu.h's Submit): launches and async copies on a
//     created stream wait until a synchronisation covers them (cudaStreamSynchronize,
//     cudaDeviceSynchronize, cudaFree and cudaFreeHost, which synchronise the device, and for
//     streams created without cudaStreamNonBlocking, the legacy-stream calls cudaMemcpy and
//     cudaMemset); the legacy stream (nullptr) runs at once. A missing synchronisation shows
//     up as stale bytes, not as luck;
//   - CUDA graphs by stream capture (stream_emu.h): cudaStreamBeginCapture on a created stream
//     records its launches, async copies and memsets and cuBLASLt matmuls (a copy reads its
//     source when the graph runs); cudaStreamEndCapture returns them as a graph;
//     cudaGraphInstantiate copies it; cudaGraphLaunch queues the copy on a stream as one unit.
//     What a GPU refuses during a capture is cudaErrorStreamCaptureUnsupported and invalidates
//     it (cudaStreamEndCapture: cudaErrorStreamCaptureInvalidated): synchronising the
//     capturing stream or the device, and, unless the capture is Relaxed, cudaMalloc, cudaFree,
//     cudaMallocHost, cudaFreeHost and the synchronous cudaMemcpy and cudaMemset;
//   - one device, reported as an H100 (compute capability 9.0, 80 GiB, 132 SMs).
// The launch error a bad configuration leaves (cuda_emu::LastError) is what cudaGetLastError
// returns and clears.
#include <cuda_runtime_api.h>

#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include "kernels/emu/cuda_emu.h"

// The handle types driver_types.h leaves incomplete.
struct CUgraph_st {
  std::vector<cuda_emu::Op> ops;  // in capture order
};
struct CUgraphExec_st {
  std::shared_ptr<const std::vector<cuda_emu::Op>> ops;  // shared with launches still queued
};

namespace {

constexpr size_t kDeviceBytes = size_t{80} << 30;
constexpr size_t kAlignment = 256;

struct Memory {
  std::mutex mu;
  std::map<uintptr_t, size_t> device;  // base -> bytes
  size_t device_bytes = 0;
  std::set<void*> pinned;
  std::map<cudaStream_t, unsigned> streams;  // handle -> creation flags
  std::set<cudaGraph_t> graphs;
  std::set<cudaGraphExec_t> execs;
};

Memory& Mem() {
  static Memory* m = new Memory;  // never destroyed: frees may come from static destructors
  return *m;
}

// True when [p, p + n) lies inside one live device allocation (caller holds the lock).
bool InDevice(const Memory& m, const void* p, size_t n) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  auto it = m.device.upper_bound(a);
  if (it == m.device.begin()) return false;
  --it;
  return a >= it->first && a - it->first <= it->second && n <= it->second - (a - it->first);
}

bool KnownStream(Memory& m, cudaStream_t s) {
  std::lock_guard<std::mutex> lock(m.mu);
  return s == nullptr || m.streams.count(s) > 0;
}

// What the legacy stream waits for: the work of the streams created blocking.
void SyncBlockingStreams() {
  Memory& m = Mem();
  std::vector<cudaStream_t> blocking;
  {
    std::lock_guard<std::mutex> lock(m.mu);
    for (const auto& [s, flags] : m.streams) {
      if (flags == cudaStreamDefault) blocking.push_back(s);
    }
  }
  for (cudaStream_t s : blocking) cuda_emu::SyncStream(s);
}

// True when capture `c` refuses a potentially unsafe call (cudaMalloc, a synchronous copy, ...)
// from this thread: a Global capture always, a ThreadLocal one begun on this thread.
bool Prohibits(const cuda_emu::Capture& c) {
  return c.mode == cudaStreamCaptureModeGlobal ||
         (c.mode == cudaStreamCaptureModeThreadLocal && c.thread == std::this_thread::get_id());
}

// Invalidates the captures refuses(stream, capture) selects; true when there was one (the call
// is then cudaErrorStreamCaptureUnsupported).
template <typename Refuses>
bool RefusedByCapture(Refuses refuses) {
  cuda_emu::StreamQueues& q = cuda_emu::Queues();
  std::lock_guard<std::mutex> lock(q.mu);
  bool refused = false;
  for (auto& [s, c] : q.captures) {
    if (refuses(s, c)) {
      c.invalidated = true;
      refused = true;
    }
  }
  return refused;
}

// A potentially unsafe call during a capture that prohibits it.
bool UnsafeDuringCapture() {
  return RefusedByCapture([](cudaStream_t, const cuda_emu::Capture& c) { return Prohibits(c); });
}

// The capture of `stream`, taken out of the queues; `error` says why there is none.
bool TakeCapture(cudaStream_t stream, cuda_emu::Capture* out, cudaError_t* error) {
  cuda_emu::StreamQueues& q = cuda_emu::Queues();
  std::lock_guard<std::mutex> lock(q.mu);
  auto it = q.captures.find(stream);
  if (it == q.captures.end()) {
    *error = cudaErrorIllegalState;  // not capturing
    return false;
  }
  if (it->second.mode != cudaStreamCaptureModeRelaxed &&
      it->second.thread != std::this_thread::get_id()) {
    *error = cudaErrorStreamCaptureWrongThread;
    return false;
  }
  *out = std::move(it->second);
  q.captures.erase(it);
  return true;
}

// Instantiation flags that change nothing here (no memory nodes, no priorities).
constexpr unsigned long long kInstantiateFlags =
    cudaGraphInstantiateFlagAutoFreeOnLaunch | cudaGraphInstantiateFlagUseNodePriority;

// The device sides a copy of `kind` must have inside allocations.
cudaError_t CheckCopy(void* dst, const void* src, size_t count, cudaMemcpyKind kind) {
  if (count == 0) return cudaSuccess;
  if (dst == nullptr || src == nullptr) return cudaErrorInvalidValue;
  Memory& m = Mem();
  std::lock_guard<std::mutex> lock(m.mu);
  const bool dst_device = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
  const bool src_device = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
  if (kind != cudaMemcpyHostToHost && kind != cudaMemcpyDefault && !dst_device && !src_device) {
    return cudaErrorInvalidMemcpyDirection;
  }
  if ((dst_device && !InDevice(m, dst, count)) || (src_device && !InDevice(m, src, count))) {
    return cudaErrorInvalidValue;
  }
  return cudaSuccess;
}

}  // namespace

cudaError_t cudaMalloc(void** devPtr, size_t size) {
  if (devPtr == nullptr) return cudaErrorInvalidValue;
  *devPtr = nullptr;
  if (UnsafeDuringCapture()) return cudaErrorStreamCaptureUnsupported;
  if (size == 0) return cudaSuccess;
  Memory& m = Mem();
  const size_t rounded = (size + kAlignment - 1) / kAlignment * kAlignment;
  {
    std::lock_guard<std::mutex> lock(m.mu);
    if (m.device_bytes + rounded > kDeviceBytes) return cudaErrorMemoryAllocation;
  }
  // Exactly `size` bytes (not the rounded size), so AddressSanitizer builds catch a kernel or
  // copy that runs even one byte past an allocation.
  void* p = nullptr;
  if (posix_memalign(&p, kAlignment, size) != 0) return cudaErrorMemoryAllocation;
  std::memset(p, 0xFF, size);  // poison: NaN in fp32 and bf16
  std::lock_guard<std::mutex> lock(m.mu);
  m.device[reinterpret_cast<uintptr_t>(p)] = size;
  m.device_bytes += rounded;
  *devPtr = p;
  return cudaSuccess;
}

cudaError_t cudaFree(void* devPtr) {
  if (devPtr == nullptr) return cudaSuccess;
  if (UnsafeDuringCapture()) return cudaErrorStreamCaptureUnsupported;
  cuda_emu::SyncAll();  // cudaFree synchronises the device
  Memory& m = Mem();
  std::lock_guard<std::mutex> lock(m.mu);
  auto it = m.device.find(reinterpret_cast<uintptr_t>(devPtr));
  if (it == m.device.end()) return cudaErrorInvalidValue;
  m.device_bytes -= (it->second + kAlignment - 1) / kAlignment * kAlignment;
  m.device.erase(it);
  std::free(devPtr);
  return cudaSuccess;
}

cudaError_t cudaMallocHost(void** ptr, size_t size) {
  if (ptr == nullptr) return cudaErrorInvalidValue;
  if (UnsafeDuringCapture()) return cudaErrorStreamCaptureUnsupported;
  *ptr = std::malloc(size == 0 ? 1 : size);
  if (*ptr == nullptr) return cudaErrorMemoryAllocation;
  Memory& m = Mem();
  std::lock_guard<std::mutex> lock(m.mu);
  m.pinned.insert(*ptr);
  return cudaSuccess;
}

cudaError_t cudaFreeHost(void* ptr) {
  if (ptr == nullptr) return cudaSuccess;
  if (UnsafeDuringCapture()) return cudaErrorStreamCaptureUnsupported;
  cuda_emu::SyncAll();  // as cudaFree
  Memory& m = Mem();
  std::lock_guard<std::mutex> lock(m.mu);
  if (m.pinned.erase(ptr) == 0) return cudaErrorInvalidValue;
  std::free(ptr);
  return cudaSuccess;
}

cudaError_t cudaMemcpy(void* dst, const void* src, size_t count, cudaMemcpyKind kind) {
  if (cudaError_t e = CheckCopy(dst, src, count, kind); e != cudaSuccess) return e;
  if (UnsafeDuringCapture()) return cudaErrorStreamCaptureUnsupported;
  SyncBlockingStreams();
  if (count > 0) std::memmove(dst, src, count);
  return cudaSuccess;
}

// Checked now; the bytes move when the stream's work runs (a pinned source is read then).
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t count, cudaMemcpyKind kind,
                            cudaStream_t stream) {
  if (!KnownStream(Mem(), stream)) return cudaErrorInvalidResourceHandle;
  if (cudaError_t e = CheckCopy(dst, src, count, kind); e != cudaSuccess) return e;
  if (count == 0) return cudaSuccess;
  return cuda_emu::Submit(stream, [=] { std::memmove(dst, src, count); });
}

cudaError_t cudaMemset(void* devPtr, int value, size_t count) {
  if (count == 0) return cudaSuccess;
  Memory& m = Mem();
  {
    std::lock_guard<std::mutex> lock(m.mu);
    if (!InDevice(m, devPtr, count)) return cudaErrorInvalidValue;
  }
  if (UnsafeDuringCapture()) return cudaErrorStreamCaptureUnsupported;
  SyncBlockingStreams();
  std::memset(devPtr, value, count);
  return cudaSuccess;
}

// Checked now; the bytes are set when the stream's work runs.
cudaError_t cudaMemsetAsync(void* devPtr, int value, size_t count, cudaStream_t stream) {
  if (!KnownStream(Mem(), stream)) return cudaErrorInvalidResourceHandle;
  if (count == 0) return cudaSuccess;
  Memory& m = Mem();
  {
    std::lock_guard<std::mutex> lock(m.mu);
    if (!InDevice(m, devPtr, count)) return cudaErrorInvalidValue;
  }
  return cuda_emu::Submit(stream, [=] { std::memset(devPtr, value, count); });
}

cudaError_t cudaMemGetInfo(size_t* free, size_t* total) {
  if (free == nullptr || total == nullptr) return cudaErrorInvalidValue;
  Memory& m = Mem();
  std::lock_guard<std::mutex> lock(m.mu);
  *total = kDeviceBytes;
  *free = kDeviceBytes - m.device_bytes;
  return cudaSuccess;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* pStream, unsigned int flags) {
  if (pStream == nullptr || (flags != cudaStreamDefault && flags != cudaStreamNonBlocking)) {
    return cudaErrorInvalidValue;
  }
  *pStream = reinterpret_cast<cudaStream_t>(new char);  // a unique handle
  Memory& m = Mem();
  std::lock_guard<std::mutex> lock(m.mu);
  m.streams[*pStream] = flags;
  return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t* pStream) {
  return cudaStreamCreateWithFlags(pStream, cudaStreamDefault);
}

cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  if (stream == nullptr || !KnownStream(Mem(), stream)) return cudaErrorInvalidResourceHandle;
  {
    cuda_emu::StreamQueues& q = cuda_emu::Queues();
    std::lock_guard<std::mutex> lock(q.mu);
    q.captures.erase(stream);  // a capture in progress is dropped
  }
  cuda_emu::SyncStream(stream);  // its queued work still completes
  Memory& m = Mem();
  std::lock_guard<std::mutex> lock(m.mu);
  if (m.streams.erase(stream) == 0) return cudaErrorInvalidResourceHandle;
  delete reinterpret_cast<char*>(stream);
  return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  if (!KnownStream(Mem(), stream)) return cudaErrorInvalidResourceHandle;
  if (stream == nullptr) {
    SyncBlockingStreams();
    return cudaSuccess;
  }
  if (RefusedByCapture([&](cudaStream_t s, const cuda_emu::Capture&) { return s == stream; })) {
    return cudaErrorStreamCaptureUnsupported;
  }
  cuda_emu::SyncStream(stream);
  return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void) {
  if (RefusedByCapture([](cudaStream_t, const cuda_emu::Capture&) { return true; })) {
    return cudaErrorStreamCaptureUnsupported;
  }
  cuda_emu::SyncAll();
  return cudaSuccess;
}

// ---- Stream capture and graphs ----

cudaError_t cudaStreamBeginCapture(cudaStream_t stream, enum cudaStreamCaptureMode mode) {
  if (stream == nullptr) return cudaErrorStreamCaptureUnsupported;  // the legacy stream
  if (!KnownStream(Mem(), stream)) return cudaErrorInvalidResourceHandle;
  if (mode != cudaStreamCaptureModeGlobal && mode != cudaStreamCaptureModeThreadLocal &&
      mode != cudaStreamCaptureModeRelaxed) {
    return cudaErrorInvalidValue;
  }
  cuda_emu::StreamQueues& q = cuda_emu::Queues();
  std::lock_guard<std::mutex> lock(q.mu);
  if (q.captures.count(stream) > 0) return cudaErrorIllegalState;
  cuda_emu::Capture& c = q.captures[stream];
  c.mode = mode;
  c.thread = std::this_thread::get_id();
  return cudaSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* pGraph) {
  if (pGraph == nullptr) return cudaErrorInvalidValue;
  if (!KnownStream(Mem(), stream)) return cudaErrorInvalidResourceHandle;
  cuda_emu::Capture c;
  cudaError_t error = cudaSuccess;
  if (!TakeCapture(stream, &c, &error)) return error;
  if (c.invalidated) {
    *pGraph = nullptr;
    return cudaErrorStreamCaptureInvalidated;
  }
  *pGraph = new CUgraph_st{std::move(c.ops)};
  Memory& m = Mem();
  std::lock_guard<std::mutex> lock(m.mu);
  m.graphs.insert(*pGraph);
  return cudaSuccess;
}

cudaError_t cudaStreamIsCapturing(cudaStream_t stream,
                                  enum cudaStreamCaptureStatus* pCaptureStatus) {
  if (pCaptureStatus == nullptr) return cudaErrorInvalidValue;
  if (!KnownStream(Mem(), stream)) return cudaErrorInvalidResourceHandle;
  cuda_emu::StreamQueues& q = cuda_emu::Queues();
  std::lock_guard<std::mutex> lock(q.mu);
  auto it = q.captures.find(stream);
  *pCaptureStatus = it == q.captures.end()   ? cudaStreamCaptureStatusNone
                    : it->second.invalidated ? cudaStreamCaptureStatusInvalidated
                                             : cudaStreamCaptureStatusActive;
  return cudaSuccess;
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t* pGraphExec, cudaGraph_t graph,
                                 unsigned long long flags) {
  if (pGraphExec == nullptr || (flags & ~kInstantiateFlags) != 0) return cudaErrorInvalidValue;
  Memory& m = Mem();
  std::lock_guard<std::mutex> lock(m.mu);
  if (m.graphs.count(graph) == 0) return cudaErrorInvalidValue;
  *pGraphExec = new CUgraphExec_st{std::make_shared<const std::vector<cuda_emu::Op>>(graph->ops)};
  m.execs.insert(*pGraphExec);
  return cudaSuccess;
}

// The graph's work in order, as one unit of the stream's work.
cudaError_t cudaGraphLaunch(cudaGraphExec_t graphExec, cudaStream_t stream) {
  std::shared_ptr<const std::vector<cuda_emu::Op>> ops;
  {
    Memory& m = Mem();
    std::lock_guard<std::mutex> lock(m.mu);
    if (m.execs.count(graphExec) == 0) return cudaErrorInvalidValue;
    ops = graphExec->ops;
  }
  if (!KnownStream(Mem(), stream)) return cudaErrorInvalidResourceHandle;
  const cudaError_t e = cuda_emu::Submit(stream, [ops] {
    for (const cuda_emu::Op& op : *ops) op();
  });
  if (e == cudaSuccess) cuda_emu::Counts().graph_launches.fetch_add(1, std::memory_order_relaxed);
  return e;
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t graphExec) {
  Memory& m = Mem();
  std::lock_guard<std::mutex> lock(m.mu);
  if (m.execs.erase(graphExec) == 0) return cudaErrorInvalidValue;
  delete graphExec;  // a launch still queued keeps the work alive
  return cudaSuccess;
}

cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
  Memory& m = Mem();
  std::lock_guard<std::mutex> lock(m.mu);
  if (m.graphs.erase(graph) == 0) return cudaErrorInvalidValue;
  delete graph;
  return cudaSuccess;
}

cudaError_t cudaGetDeviceCount(int* count) {
  if (count == nullptr) return cudaErrorInvalidValue;
  *count = 1;
  return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  if (prop == nullptr || device != 0) return cudaErrorInvalidDevice;
  *prop = cudaDeviceProp{};
  std::strncpy(prop->name, "NVIDIA H100 (morserve CPU emulator)", sizeof(prop->name) - 1);
  prop->major = 9;
  prop->minor = 0;
  prop->totalGlobalMem = kDeviceBytes;
  prop->multiProcessorCount = 132;
  prop->warpSize = 32;
  prop->maxThreadsPerBlock = 1024;
  prop->maxThreadsDim[0] = prop->maxThreadsDim[1] = 1024;
  prop->maxThreadsDim[2] = 64;
  prop->maxGridSize[0] = 0x7fffffff;
  prop->maxGridSize[1] = prop->maxGridSize[2] = 65535;
  prop->sharedMemPerBlock = 48 * 1024;
  prop->sharedMemPerBlockOptin = 227 * 1024;
  prop->regsPerBlock = 65536;
  prop->l2CacheSize = 50 * 1024 * 1024;
  return cudaSuccess;
}

cudaError_t cudaGetLastError(void) { return std::exchange(cuda_emu::LastError(), cudaSuccess); }

const char* cudaGetErrorString(cudaError_t error) {
  switch (error) {
    case cudaSuccess:
      return "no error";
    case cudaErrorInvalidValue:
      return "invalid argument";
    case cudaErrorMemoryAllocation:
      return "out of memory";
    case cudaErrorInvalidConfiguration:
      return "invalid configuration argument";
    case cudaErrorInvalidDevice:
      return "invalid device ordinal";
    case cudaErrorInvalidMemcpyDirection:
      return "invalid copy direction for memcpy";
    case cudaErrorInvalidResourceHandle:
      return "invalid resource handle";
    case cudaErrorIllegalState:
      return "the operation cannot be performed in the present state";
    case cudaErrorStreamCaptureUnsupported:
      return "operation not permitted when stream is capturing";
    case cudaErrorStreamCaptureInvalidated:
      return "operation failed due to a previous error during capture";
    case cudaErrorStreamCaptureWrongThread:
      return "attempt to terminate a thread-local capture sequence from another thread";
    default:
      return "unrecognized error code (CUDA emulator)";
  }
}
