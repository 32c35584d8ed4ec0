// The CPU emulation of CUDA that the emulated runner stands on (kernels/emu): the launch
// limits a GPU enforces reported as cudaGetLastError's cudaErrorInvalidConfiguration (and
// cleared by it), every thread of a 3-D block and grid run exactly once with its indices, and
// the emulated runtime's device memory (poisoned on allocation, copies and memsets checked
// against the allocation, cudaFree of a foreign pointer an error), streams and the H100-like
// device it reports, and CUDA graphs by stream capture (recorded, not run; replayed in order
// and in stream order, reading the buffers' current contents with the captured kernel
// parameters; the calls a GPU refuses during a capture invalidate it; the API's errors).
// Needs no GPU.
#include "kernels/emu/cuda_emu.h"
// cuda_emu.h first: it defines the CUDA keywords the kernels below use.
#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "kernels/launch.cuh"

namespace {

// Counts each (thread, block) visit in seen[linear block * threads + linear thread].
__global__ void CountKernel(int* seen) {
  const unsigned threads = blockDim.x * blockDim.y * blockDim.z;
  const unsigned t = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  const unsigned b = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  atomicAdd(&seen[b * threads + t], 1);
}

struct Config {
  dim3 grid, block;
  size_t smem;
  const char* what;
};

TEST(CudaEmuTest, RefusesWhatAGpuRefusesAndRunsNothing) {
  const Config bad[] = {
      {dim3(1), dim3(1025), 0, "1025 threads"},
      {dim3(1), dim3(32, 33), 0, "32 x 33 threads"},
      {dim3(1), dim3(1, 1, 65), 0, "block z 65"},
      {dim3(1, 65536), dim3(32), 0, "grid y 65536"},
      {dim3(1, 1, 65536), dim3(32), 0, "grid z 65536"},
      {dim3(0), dim3(32), 0, "no blocks"},
      {dim3(1), dim3(0), 0, "no threads"},
      {dim3(1), dim3(32), 48 * 1024 + 1, "dynamic shared memory over 48 KiB"},
  };
  std::vector<int> seen(64, 0);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  for (const Config& c : bad) {
    MORSERVE_LAUNCH(c.grid, c.block, c.smem, nullptr, CountKernel)(seen.data());
    EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration) << c.what;
    EXPECT_EQ(cudaGetLastError(), cudaSuccess) << c.what << ": the error is cleared once read";
  }
  for (int v : seen) EXPECT_EQ(v, 0) << "a refused launch ran";
}

TEST(CudaEmuTest, RunsEveryThreadOfEveryBlockOnce) {
  const Config good[] = {
      {dim3(3, 2, 2), dim3(8, 4, 2), 0, "3-D grid and block"},
      {dim3(2), dim3(1024), 48 * 1024, "1024 threads, 48 KiB dynamic shared memory"},
      {dim3(1, 65535), dim3(1), 0, "grid y 65535"},
  };
  for (const Config& c : good) {
    const size_t n =
        static_cast<size_t>(c.grid.x) * c.grid.y * c.grid.z * c.block.x * c.block.y * c.block.z;
    std::vector<int> seen(n, 0);
    MORSERVE_LAUNCH(c.grid, c.block, c.smem, nullptr, CountKernel)(seen.data());
    EXPECT_EQ(cudaGetLastError(), cudaSuccess) << c.what;
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(seen[i], 1) << c.what << " thread " << i;
  }
}

TEST(CudaRuntimeEmuTest, DeviceMemoryIsPoisonedAndChecked) {
  size_t free_before = 0, total = 0;
  ASSERT_EQ(cudaMemGetInfo(&free_before, &total), cudaSuccess);
  void* d = nullptr;
  ASSERT_EQ(cudaMalloc(&d, 100), cudaSuccess);
  ASSERT_NE(d, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(d) % 256, 0u);
  size_t free_after = 0;
  ASSERT_EQ(cudaMemGetInfo(&free_after, &total), cudaSuccess);
  EXPECT_LT(free_after, free_before);

  std::vector<uint8_t> host(100, 0);
  ASSERT_EQ(cudaMemcpy(host.data(), d, 100, cudaMemcpyDeviceToHost), cudaSuccess);
  for (uint8_t b : host) ASSERT_EQ(b, 0xFF) << "fresh device memory reads as NaN bytes";

  std::vector<uint8_t> src(101, 7);
  EXPECT_EQ(cudaMemcpy(d, src.data(), 101, cudaMemcpyHostToDevice), cudaErrorInvalidValue)
      << "one byte past the allocation";
  EXPECT_EQ(cudaMemcpy(static_cast<char*>(d) + 50, src.data(), 51, cudaMemcpyHostToDevice),
            cudaErrorInvalidValue);
  EXPECT_EQ(cudaMemcpy(d, src.data(), 100, cudaMemcpyHostToDevice), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(host.data(), src.data(), 1, cudaMemcpyDeviceToHost), cudaErrorInvalidValue)
      << "a host pointer as the device source";
  EXPECT_EQ(cudaMemset(static_cast<char*>(d) + 99, 0, 2), cudaErrorInvalidValue);
  EXPECT_EQ(cudaMemset(static_cast<char*>(d) + 99, 3, 1), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(host.data(), d, 100, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(host[0], 7);
  EXPECT_EQ(host[99], 3);

  int on_stack = 0;
  EXPECT_EQ(cudaFree(&on_stack), cudaErrorInvalidValue) << "not from cudaMalloc";
  EXPECT_EQ(cudaFree(static_cast<char*>(d) + 1), cudaErrorInvalidValue) << "inside, not base";
  EXPECT_EQ(cudaFree(d), cudaSuccess);
  EXPECT_EQ(cudaFree(d), cudaErrorInvalidValue) << "freed twice";
  EXPECT_EQ(cudaFree(nullptr), cudaSuccess);

  void* pinned = nullptr;
  ASSERT_EQ(cudaMallocHost(&pinned, 64), cudaSuccess);
  EXPECT_EQ(cudaFree(pinned), cudaErrorInvalidValue) << "pinned host memory is not device memory";
  EXPECT_EQ(cudaFreeHost(pinned), cudaSuccess);
  EXPECT_EQ(cudaFreeHost(pinned), cudaErrorInvalidValue);
}

TEST(CudaRuntimeEmuTest, StreamsAndDevice) {
  cudaStream_t s = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  EXPECT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  EXPECT_EQ(cudaStreamSynchronize(nullptr), cudaSuccess);
  EXPECT_EQ(cudaStreamDestroy(s), cudaSuccess);
  EXPECT_EQ(cudaStreamDestroy(s), cudaErrorInvalidResourceHandle);
  EXPECT_EQ(cudaStreamSynchronize(s), cudaErrorInvalidResourceHandle);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);

  int count = 0;
  ASSERT_EQ(cudaGetDeviceCount(&count), cudaSuccess);
  EXPECT_EQ(count, 1);
  cudaDeviceProp prop{};
  ASSERT_EQ(cudaGetDeviceProperties(&prop, 0), cudaSuccess);
  EXPECT_EQ(prop.major, 9);
  EXPECT_EQ(prop.minor, 0);
  EXPECT_EQ(prop.maxThreadsPerBlock, 1024);
  EXPECT_EQ(cudaGetDeviceProperties(&prop, 1), cudaErrorInvalidDevice);
  EXPECT_STREQ(cudaGetErrorString(cudaErrorInvalidConfiguration), "invalid configuration argument");
}

// ---- CUDA graphs by stream capture ----

constexpr int kN = 4;

// y[i] = y[i] * a + b for i < kN (one thread per element).
__global__ void AxpbKernel(float* y, float a, float b) {
  const unsigned i = threadIdx.x;
  if (i < kN) y[i] = y[i] * a + b;
}

void LaunchAxpb(float* y, float a, float b, cudaStream_t s) {
  MORSERVE_LAUNCH(dim3(1), dim3(kN), 0, s, AxpbKernel)(y, a, b);
}

// A created stream and a device buffer of kN floats, released at the end of a test.
class CudaGraphEmuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&dev_, kN * sizeof(float)), cudaSuccess);
    ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  }
  void TearDown() override {
    EXPECT_EQ(cudaFree(dev_), cudaSuccess);
    EXPECT_EQ(cudaStreamDestroy(stream_), cudaSuccess);
  }
  // Writes v to every element of the device buffer (a synchronous copy).
  void Fill(float v) {
    const std::vector<float> h(kN, v);
    ASSERT_EQ(cudaMemcpy(dev_, h.data(), sizeof(h[0]) * kN, cudaMemcpyHostToDevice), cudaSuccess);
  }
  std::vector<float> Read() const {
    std::vector<float> h(kN);
    EXPECT_EQ(cudaMemcpy(h.data(), dev_, sizeof(h[0]) * kN, cudaMemcpyDeviceToHost), cudaSuccess);
    return h;
  }
  // The graph of what record() submits to the stream, instantiated.
  cudaGraphExec_t Capture(const std::function<void()>& record) {
    EXPECT_EQ(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeGlobal), cudaSuccess);
    record();
    cudaGraph_t graph = nullptr;
    EXPECT_EQ(cudaStreamEndCapture(stream_, &graph), cudaSuccess);
    cudaGraphExec_t exec = nullptr;
    EXPECT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
    EXPECT_EQ(cudaGraphDestroy(graph), cudaSuccess);  // the exec holds its own copy
    return exec;
  }

  cudaStream_t stream_ = nullptr;
  float* dev_ = nullptr;
};

TEST_F(CudaGraphEmuTest, CaptureRecordsWithoutRunning) {
  ASSERT_NO_FATAL_FAILURE(Fill(1.0f));
  std::vector<float> out(kN, -1.0f);
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusActive;
  ASSERT_EQ(cudaStreamIsCapturing(stream_, &status), cudaSuccess);
  EXPECT_EQ(status, cudaStreamCaptureStatusNone);
  ASSERT_EQ(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  ASSERT_EQ(cudaStreamIsCapturing(stream_, &status), cudaSuccess);
  EXPECT_EQ(status, cudaStreamCaptureStatusActive);
  LaunchAxpb(dev_, 2.0f, 1.0f, stream_);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  EXPECT_EQ(cudaMemsetAsync(dev_, 0, sizeof(float), stream_), cudaSuccess);
  EXPECT_EQ(cudaMemcpyAsync(out.data(), dev_, sizeof(float) * kN, cudaMemcpyDeviceToHost, stream_),
            cudaSuccess);
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamEndCapture(stream_, &graph), cudaSuccess);
  ASSERT_NE(graph, nullptr);
  ASSERT_EQ(cudaStreamIsCapturing(stream_, &status), cudaSuccess);
  EXPECT_EQ(status, cudaStreamCaptureStatusNone);
  ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(Read(), std::vector<float>(kN, 1.0f)) << "a captured kernel or memset ran";
  EXPECT_EQ(out, std::vector<float>(kN, -1.0f)) << "a captured copy ran";
  EXPECT_EQ(cudaGraphDestroy(graph), cudaSuccess);
}

TEST_F(CudaGraphEmuTest, LaunchRunsKernelsAndCopiesInOrder) {
  std::vector<float> in = {1, 2, 3, 4}, out(kN, -1.0f);
  cudaGraphExec_t exec = Capture([&] {
    cudaMemcpyAsync(dev_, in.data(), sizeof(float) * kN, cudaMemcpyHostToDevice, stream_);
    LaunchAxpb(dev_, 2.0f, 1.0f, stream_);
    LaunchAxpb(dev_, 3.0f, 0.0f, stream_);
    cudaMemsetAsync(dev_, 0, sizeof(float), stream_);  // element 0: +0.0f
    cudaMemcpyAsync(out.data(), dev_, sizeof(float) * kN, cudaMemcpyDeviceToHost, stream_);
  });
  ASSERT_NE(exec, nullptr);
  ASSERT_EQ(cudaGraphLaunch(exec, stream_), cudaSuccess);
  EXPECT_EQ(out, std::vector<float>(kN, -1.0f)) << "the launch ran before a synchronisation";
  ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
  EXPECT_EQ(out, (std::vector<float>{0, 15, 21, 27}));  // ((x * 2 + 1) * 3), then x[0] = 0
  EXPECT_EQ(cudaGraphExecDestroy(exec), cudaSuccess);
}

// A replay reads the buffers (and a copy's host source) as they are when it runs, with the
// kernel parameters of the capture.
TEST_F(CudaGraphEmuTest, ReplayReadsCurrentBuffersWithCapturedParameters) {
  std::vector<float> in(kN, 1.0f), out(kN, -1.0f);
  float a = 2.0f;
  cudaGraphExec_t exec = Capture([&] {
    cudaMemcpyAsync(dev_, in.data(), sizeof(float) * kN, cudaMemcpyHostToDevice, stream_);
    MORSERVE_LAUNCH(dim3(1), dim3(kN), 0, stream_, AxpbKernel)(dev_, a, 1.0f);
    cudaMemcpyAsync(out.data(), dev_, sizeof(float) * kN, cudaMemcpyDeviceToHost, stream_);
  });
  a = 100.0f;  // not the captured value
  for (float x : {1.0f, 5.0f, -3.0f}) {
    in.assign(kN, x);
    ASSERT_EQ(cudaGraphLaunch(exec, stream_), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
    EXPECT_EQ(out, std::vector<float>(kN, x * 2.0f + 1.0f)) << "input " << x;
  }
  EXPECT_EQ(cudaGraphExecDestroy(exec), cudaSuccess);
}

// Two launches of one exec run twice, in order; an exec destroyed while its launches are
// queued still runs them; replays count as graph launches, not kernel launches.
TEST_F(CudaGraphEmuTest, TwoLaunchesOfOneExec) {
  ASSERT_NO_FATAL_FAILURE(Fill(0.0f));
  cudaGraphExec_t exec = Capture([&] { LaunchAxpb(dev_, 2.0f, 1.0f, stream_); });
  const uint64_t kernels = cuda_emu::Counts().kernel_launches.load();
  const uint64_t graphs = cuda_emu::Counts().graph_launches.load();
  ASSERT_EQ(cudaGraphLaunch(exec, stream_), cudaSuccess);
  ASSERT_EQ(cudaGraphLaunch(exec, stream_), cudaSuccess);
  EXPECT_EQ(cudaGraphExecDestroy(exec), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
  EXPECT_EQ(Read(), std::vector<float>(kN, 3.0f));  // (0 * 2 + 1) * 2 + 1
  EXPECT_EQ(cuda_emu::Counts().graph_launches.load(), graphs + 2);
  EXPECT_EQ(cuda_emu::Counts().kernel_launches.load(), kernels);
}

// What was queued on the stream before the capture stays queued (the capture does not run
// it) and runs before the graph launched after it; on the legacy stream a launch runs at once.
TEST_F(CudaGraphEmuTest, WorkQueuedBeforeCaptureRunsFirst) {
  ASSERT_NO_FATAL_FAILURE(Fill(1.0f));
  LaunchAxpb(dev_, 2.0f, 1.0f, stream_);  // queued: 3
  cudaGraphExec_t exec = Capture([&] { LaunchAxpb(dev_, 10.0f, 0.0f, stream_); });
  EXPECT_EQ(Read(), std::vector<float>(kN, 1.0f)) << "the capture ran the queued work";
  ASSERT_EQ(cudaGraphLaunch(exec, stream_), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
  EXPECT_EQ(Read(), std::vector<float>(kN, 30.0f));  // not 1 * 10 * 2 + 1
  ASSERT_EQ(cudaGraphLaunch(exec, nullptr), cudaSuccess);
  EXPECT_EQ(Read(), std::vector<float>(kN, 300.0f));
  EXPECT_EQ(cudaGraphExecDestroy(exec), cudaSuccess);
}

// Each call a GPU refuses during a Global capture: cudaErrorStreamCaptureUnsupported, the
// capture invalidated (later work into it refused), EndCapture cudaErrorStreamCaptureInvalidated
// with no graph; nothing captured or queued ran.
TEST_F(CudaGraphEmuTest, IllegalCallsInvalidateTheCapture) {
  ASSERT_NO_FATAL_FAILURE(Fill(1.0f));
  float* other = nullptr;
  void* pinned = nullptr;
  ASSERT_EQ(cudaMalloc(&other, sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMallocHost(&pinned, 16), cudaSuccess);
  float h = 0;
  void* p = nullptr;
  const std::pair<const char*, std::function<cudaError_t()>> calls[] = {
      {"cudaStreamSynchronize", [&] { return cudaStreamSynchronize(stream_); }},
      {"cudaDeviceSynchronize", [] { return cudaDeviceSynchronize(); }},
      {"cudaMemcpy", [&] { return cudaMemcpy(other, &h, 4, cudaMemcpyHostToDevice); }},
      {"cudaMemset", [&] { return cudaMemset(other, 0, 4); }},
      {"cudaMalloc", [&] { return cudaMalloc(&p, 64); }},
      {"cudaFree", [&] { return cudaFree(other); }},
      {"cudaMallocHost", [&] { return cudaMallocHost(&p, 64); }},
      {"cudaFreeHost", [&] { return cudaFreeHost(pinned); }},
  };
  for (const auto& [name, call] : calls) {
    SCOPED_TRACE(name);
    ASSERT_EQ(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeGlobal), cudaSuccess);
    LaunchAxpb(dev_, 2.0f, 0.0f, stream_);
    EXPECT_EQ(call(), cudaErrorStreamCaptureUnsupported);
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    ASSERT_EQ(cudaStreamIsCapturing(stream_, &status), cudaSuccess);
    EXPECT_EQ(status, cudaStreamCaptureStatusInvalidated);
    LaunchAxpb(dev_, 2.0f, 0.0f, stream_);
    EXPECT_EQ(cudaGetLastError(), cudaErrorStreamCaptureInvalidated);
    EXPECT_EQ(cudaMemsetAsync(dev_, 0, 4, stream_), cudaErrorStreamCaptureInvalidated);
    cudaGraph_t graph = reinterpret_cast<cudaGraph_t>(&h);
    EXPECT_EQ(cudaStreamEndCapture(stream_, &graph), cudaErrorStreamCaptureInvalidated);
    EXPECT_EQ(graph, nullptr);
    EXPECT_EQ(cudaStreamSynchronize(stream_), cudaSuccess) << "the stream is usable again";
    EXPECT_EQ(Read(), std::vector<float>(kN, 1.0f));
  }
  EXPECT_EQ(p, nullptr) << "a refused allocation returned memory";
  EXPECT_EQ(cudaFree(other), cudaSuccess) << "a refused cudaFree freed";
  EXPECT_EQ(cudaFreeHost(pinned), cudaSuccess) << "a refused cudaFreeHost freed";
}

// Relaxed captures allow allocation but never a synchronisation of the capturing stream;
// ThreadLocal captures refuse only the capturing thread's unsafe calls, Global ones every
// thread's.
TEST_F(CudaGraphEmuTest, CaptureModes) {
  ASSERT_EQ(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeRelaxed), cudaSuccess);
  void* p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, 64), cudaSuccess);
  EXPECT_EQ(cudaFree(p), cudaSuccess);
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  ASSERT_EQ(cudaStreamIsCapturing(stream_, &status), cudaSuccess);
  EXPECT_EQ(status, cudaStreamCaptureStatusActive);
  EXPECT_EQ(cudaStreamSynchronize(stream_), cudaErrorStreamCaptureUnsupported);
  cudaGraph_t graph = nullptr;
  EXPECT_EQ(cudaStreamEndCapture(stream_, &graph), cudaErrorStreamCaptureInvalidated);

  for (auto mode : {cudaStreamCaptureModeThreadLocal, cudaStreamCaptureModeGlobal}) {
    SCOPED_TRACE(mode == cudaStreamCaptureModeGlobal ? "Global" : "ThreadLocal");
    ASSERT_EQ(cudaStreamBeginCapture(stream_, mode), cudaSuccess);
    cudaError_t from_other = cudaSuccess;
    std::thread([&] {
      void* q = nullptr;
      from_other = cudaMalloc(&q, 64);
      if (q != nullptr) cudaFree(q);
    }).join();
    const bool global = mode == cudaStreamCaptureModeGlobal;
    EXPECT_EQ(from_other, global ? cudaErrorStreamCaptureUnsupported : cudaSuccess);
    EXPECT_EQ(cudaStreamEndCapture(stream_, &graph),
              global ? cudaErrorStreamCaptureInvalidated : cudaSuccess);
    if (graph != nullptr) EXPECT_EQ(cudaGraphDestroy(graph), cudaSuccess);
  }
}

TEST_F(CudaGraphEmuTest, CaptureErrors) {
  EXPECT_EQ(cudaStreamBeginCapture(nullptr, cudaStreamCaptureModeGlobal),
            cudaErrorStreamCaptureUnsupported);
  EXPECT_EQ(cudaStreamBeginCapture(stream_, static_cast<cudaStreamCaptureMode>(7)),
            cudaErrorInvalidValue);
  cudaGraph_t graph = nullptr;
  EXPECT_EQ(cudaStreamEndCapture(stream_, &graph), cudaErrorIllegalState) << "not capturing";
  EXPECT_EQ(cudaStreamEndCapture(nullptr, &graph), cudaErrorIllegalState);
  cudaStream_t gone = nullptr;
  ASSERT_EQ(cudaStreamCreate(&gone), cudaSuccess);
  ASSERT_EQ(cudaStreamDestroy(gone), cudaSuccess);
  cudaStreamCaptureStatus status;
  EXPECT_EQ(cudaStreamBeginCapture(gone, cudaStreamCaptureModeGlobal),
            cudaErrorInvalidResourceHandle);
  EXPECT_EQ(cudaStreamEndCapture(gone, &graph), cudaErrorInvalidResourceHandle);
  EXPECT_EQ(cudaStreamIsCapturing(gone, &status), cudaErrorInvalidResourceHandle);
  EXPECT_EQ(cudaStreamIsCapturing(stream_, nullptr), cudaErrorInvalidValue);

  ASSERT_EQ(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  EXPECT_EQ(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal),
            cudaErrorIllegalState);
  EXPECT_EQ(cudaStreamEndCapture(stream_, nullptr), cudaErrorInvalidValue);
  cudaError_t from_other = cudaSuccess;
  std::thread([&] { from_other = cudaStreamEndCapture(stream_, &graph); }).join();
  EXPECT_EQ(from_other, cudaErrorStreamCaptureWrongThread);
  ASSERT_EQ(cudaStreamEndCapture(stream_, &graph), cudaSuccess) << "an empty capture";
  ASSERT_NE(graph, nullptr);
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  EXPECT_EQ(cudaGraphLaunch(exec, stream_), cudaSuccess);
  EXPECT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
  EXPECT_EQ(cudaGraphExecDestroy(exec), cudaSuccess);
  EXPECT_EQ(cudaGraphDestroy(graph), cudaSuccess);
}

TEST_F(CudaGraphEmuTest, GraphHandleErrors) {
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeGlobal), cudaSuccess);
  LaunchAxpb(dev_, 2.0f, 0.0f, stream_);
  ASSERT_EQ(cudaStreamEndCapture(stream_, &graph), cudaSuccess);
  cudaGraphExec_t exec = nullptr;
  EXPECT_EQ(cudaGraphInstantiate(nullptr, graph, 0), cudaErrorInvalidValue);
  EXPECT_EQ(cudaGraphInstantiate(&exec, nullptr, 0), cudaErrorInvalidValue);
  EXPECT_EQ(cudaGraphInstantiate(&exec, graph, 1ull << 40), cudaErrorInvalidValue);
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, cudaGraphInstantiateFlagAutoFreeOnLaunch),
            cudaSuccess);
  EXPECT_EQ(cudaGraphLaunch(nullptr, stream_), cudaErrorInvalidValue);
  cudaStream_t gone = nullptr;
  ASSERT_EQ(cudaStreamCreate(&gone), cudaSuccess);
  ASSERT_EQ(cudaStreamDestroy(gone), cudaSuccess);
  EXPECT_EQ(cudaGraphLaunch(exec, gone), cudaErrorInvalidResourceHandle);
  EXPECT_EQ(cudaGraphExecDestroy(nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(cudaGraphExecDestroy(exec), cudaSuccess);
  EXPECT_EQ(cudaGraphExecDestroy(exec), cudaErrorInvalidValue) << "destroyed twice";
  EXPECT_EQ(cudaGraphLaunch(exec, stream_), cudaErrorInvalidValue) << "a destroyed exec";
  EXPECT_EQ(cudaGraphDestroy(nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(cudaGraphDestroy(graph), cudaSuccess);
  EXPECT_EQ(cudaGraphDestroy(graph), cudaErrorInvalidValue) << "destroyed twice";
  EXPECT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaErrorInvalidValue) << "a destroyed graph";
  EXPECT_STREQ(cudaGetErrorString(cudaErrorStreamCaptureInvalidated),
               "operation failed due to a previous error during capture");
}

}  // namespace
