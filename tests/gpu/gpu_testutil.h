// Helpers for kernel tests: a device buffer owned by the test, checked CUDA calls, and the
// skip used on machines without a GPU (CI has nvcc but no device, so kernel tests compile
// there and skip with a visible message).
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#define MORSERVE_CUDA_OK(expr)                                                                   \
  do {                                                                                           \
    const cudaError_t morserve_err_ = (expr);                                                    \
    ASSERT_EQ(morserve_err_, cudaSuccess) << #expr << ": " << cudaGetErrorString(morserve_err_); \
  } while (0)

// Skips the current test (call from SetUp or the test body) when no device can run the
// kernels: none at all, or one that is not sm_90 (they are built for sm_90a only).
#define MORSERVE_SKIP_WITHOUT_GPU()                                          \
  do {                                                                       \
    const std::string morserve_skip_ = ::morserve::testing::GpuSkipReason(); \
    if (!morserve_skip_.empty()) GTEST_SKIP() << morserve_skip_;             \
  } while (0)

namespace morserve::testing {

// Empty when device 0 can run sm_90a code; otherwise the message ctest's
// SKIP_REGULAR_EXPRESSION ("kernel test skipped") recognises.
inline std::string GpuSkipReason() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) return "no CUDA device: kernel test skipped";
  cudaDeviceProp prop;
  if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess)
    return "no CUDA device: kernel test skipped";
  if (prop.major != 9 || prop.minor != 0) {
    return "CUDA device is sm_" + std::to_string(prop.major * 10 + prop.minor) +
           ", kernels are built for sm_90a: kernel test skipped";
  }
  return "";
}

// Device memory for `count` elements of T; freed with the object. Poison() fills it with
// 0xFF bytes, a NaN in fp32 and in bf16, so an element the kernel forgot to write fails.
template <typename T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t count) : count_(count) {
    if (count_ > 0 && cudaMalloc(&ptr_, count_ * sizeof(T)) != cudaSuccess) ptr_ = nullptr;
  }
  ~DeviceBuffer() { cudaFree(ptr_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  T* get() const { return static_cast<T*>(ptr_); }
  bool ok() const { return count_ == 0 || ptr_ != nullptr; }
  cudaError_t Upload(const std::vector<T>& host) {
    return cudaMemcpy(ptr_, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice);
  }
  cudaError_t Download(std::vector<T>* host) const {
    host->resize(count_);
    return cudaMemcpy(host->data(), ptr_, count_ * sizeof(T), cudaMemcpyDeviceToHost);
  }
  cudaError_t Poison() { return cudaMemset(ptr_, 0xFF, count_ * sizeof(T)); }

 private:
  size_t count_;
  void* ptr_ = nullptr;
};

// A fresh seed per run (printed by the caller) so repeated runs cover new inputs.
inline uint64_t FreshSeed() {
  std::random_device rd;
  return (static_cast<uint64_t>(rd()) << 32) ^ rd();
}

inline uint32_t FloatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

}  // namespace morserve::testing
