// The CPU emulation of CUDA that the emulated runner stands on (kernels/emu): the launch
// limits a GPU enforces reported as cudaGetLastError's cudaErrorInvalidConfiguration (and
// cleared by it), every thread of a 3-D block and grid run exactly once with its indices, and
// the emulated runtime's device memory (poisoned on allocation, copies and memsets checked
// against the allocation, cudaFree of a foreign pointer an error), streams and the H100-like
// device it reports. Needs no GPU.
#include "kernels/emu/cuda_emu.h"
// cuda_emu.h first: it defines the CUDA keywords the kernels below use.
#include <gtest/gtest.h>

#include <cstdint>
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

}  // namespace
