// An allocator for activation buffers: every block starts on a 64-byte boundary (a cache
// line), so SIMD kernels reading rows of it never split a load across two lines because of
// where the heap happened to place the buffer (std::allocator gives 16 bytes).
#pragma once

#include <cstddef>
#include <new>
#include <vector>

namespace morserve {

template <typename T, std::size_t kAlign = 64>
struct AlignedAllocator {
  using value_type = T;
  template <typename U>
  struct rebind {
    using other = AlignedAllocator<U, kAlign>;
  };
  AlignedAllocator() = default;
  template <typename U>
  explicit AlignedAllocator(const AlignedAllocator<U, kAlign>& /*other*/) {}
  T* allocate(std::size_t n) {
    return static_cast<T*>(::operator new(n * sizeof(T), std::align_val_t(kAlign)));
  }
  void deallocate(T* p, std::size_t /*n*/) { ::operator delete(p, std::align_val_t(kAlign)); }
  template <typename U>
  bool operator==(const AlignedAllocator<U, kAlign>& /*other*/) const {
    return true;
  }
};

// A float buffer aligned to a cache line.
using AlignedFloats = std::vector<float, AlignedAllocator<float>>;

}  // namespace morserve
