// Owning buffers for the CUDA backend: device memory (cudaMalloc) and pinned host memory
// (cudaMallocHost) that grow on demand, and a CUDA error check that aborts with the call's
// name. A failure inside a step is a broken invariant or a lost device, never user input
// (inputs are validated before the step), so it aborts like MORSERVE_CHECK.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace morserve {

inline void CudaCheck(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "CUDA backend: %s failed: %s\n", what, cudaGetErrorString(e));
    std::abort();
  }
}

template <bool kPinned>
class CudaBuffer {
 public:
  CudaBuffer() = default;
  ~CudaBuffer() { Free(); }
  CudaBuffer(const CudaBuffer&) = delete;
  CudaBuffer& operator=(const CudaBuffer&) = delete;
  CudaBuffer(CudaBuffer&& o) noexcept : p_(o.p_), bytes_(o.bytes_) { o.p_ = nullptr, o.bytes_ = 0; }
  CudaBuffer& operator=(CudaBuffer&& o) noexcept {
    if (this != &o) {
      Free();
      p_ = o.p_, bytes_ = o.bytes_;
      o.p_ = nullptr, o.bytes_ = 0;
    }
    return *this;
  }

  // At least `bytes` (contents are lost when it grows); returns the buffer.
  void* Reserve(size_t bytes) {
    if (bytes <= bytes_ && p_ != nullptr) return p_;
    Free();
    const size_t n = bytes == 0 ? 16 : bytes;
    CudaCheck(kPinned ? cudaMallocHost(&p_, n) : cudaMalloc(&p_, n),
              kPinned ? "cudaMallocHost" : "cudaMalloc");
    bytes_ = n;
    ++allocations_;
    return p_;
  }
  // How many times Reserve allocated (grew) this buffer.
  int64_t allocations() const { return allocations_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(p_);
  }
  size_t bytes() const { return bytes_; }

 private:
  void Free() {
    if (p_ != nullptr) kPinned ? cudaFreeHost(p_) : cudaFree(p_);
    p_ = nullptr;
    bytes_ = 0;
  }
  void* p_ = nullptr;
  size_t bytes_ = 0;
  int64_t allocations_ = 0;
};

using DeviceBuffer = CudaBuffer<false>;
using PinnedBuffer = CudaBuffer<true>;

// A device buffer holding a copy of `v` (synchronous: used at load time only).
template <typename T>
DeviceBuffer UploadVector(const std::vector<T>& v) {
  DeviceBuffer b;
  b.Reserve(v.size() * sizeof(T));
  if (!v.empty())
    CudaCheck(cudaMemcpy(b.as<void>(), v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice),
              "weight upload");
  return b;
}

}  // namespace morserve
