// Recycled activation buffers for the CPU runner's steps.
//
// A layer of a 512-token prefill of the 360M shape takes about 32 MB of activation buffers
// (normed input, q/k/v, attention output, gate_up, SwiGLU output), and every layer takes them
// again. As fresh std::vectors they were zero-filled and, being larger than malloc's mmap
// threshold, page-faulted in by the kernel on every layer: 12% of the prefill's time (perf).
// Here a buffer returns its block to the arena when it goes out of scope, and the next request
// of the same size class takes that block back: after the first step of a given size, a step
// neither allocates, zero-fills nor faults.
//
// Contents are uninitialised: every user writes what it later reads (as the kernels do: a
// projection without accumulate writes all of its output, and so on).
// Size classes are powers of two (at least 16 floats), so a block serves any request up to
// twice smaller and the memory held is at most twice the largest step's live buffers.
// Not thread-safe: one step at a time takes and returns buffers (the runner's thread); the
// pool's workers only read and write the buffers' contents.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace morserve {

class ActArena {
 public:
  // A block taken from the arena, given back when destroyed. Move-only.
  class Buffer {
   public:
    Buffer() = default;
    Buffer(Buffer&& other) noexcept { *this = static_cast<Buffer&&>(other); }
    Buffer& operator=(Buffer&& other) noexcept;
    Buffer(const Buffer&) = delete;
    Buffer& operator=(const Buffer&) = delete;
    ~Buffer() { Release(); }

    float* data() { return data_; }
    const float* data() const { return data_; }
    size_t size() const { return size_; }
    float& operator[](size_t i) { return data_[i]; }
    const float& operator[](size_t i) const { return data_[i]; }
    float* begin() { return data_; }
    float* end() { return data_ + size_; }

   private:
    friend class ActArena;
    void Release();
    ActArena* arena_ = nullptr;
    float* data_ = nullptr;
    size_t size_ = 0;
    int size_class_ = 0;
  };

  ActArena() = default;
  ActArena(const ActArena&) = delete;
  ActArena& operator=(const ActArena&) = delete;
  ~ActArena();  // every Buffer must be gone by then

  // n floats, 64-byte aligned, contents unspecified (n = 0 gives an empty buffer).
  Buffer Take(size_t n);

  // Blocks allocated so far (each once; reuse does not count) and their total bytes.
  int64_t blocks_allocated() const { return blocks_allocated_; }
  int64_t bytes_held() const { return bytes_held_; }

 private:
  static int SizeClass(size_t n);  // the smallest c with 2^c >= max(n, 16)
  void GiveBack(int size_class, float* block);

  std::vector<std::vector<float*>> free_;  // by size class
  int64_t blocks_allocated_ = 0;
  int64_t bytes_held_ = 0;
  int64_t live_ = 0;  // buffers taken and not yet given back
};

}  // namespace morserve
