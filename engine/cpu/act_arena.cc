// ActArena: power-of-two size classes with a free list each (see act_arena.h).
#include "engine/cpu/act_arena.h"

#include <bit>
#include <new>

#include "engine/core/check.h"

namespace morserve {
namespace {

constexpr std::align_val_t kAlign{64};
constexpr int kMinClass = 4;  // 16 floats: one cache line

}  // namespace

ActArena::Buffer& ActArena::Buffer::operator=(Buffer&& other) noexcept {
  if (this != &other) {
    Release();
    arena_ = other.arena_;
    data_ = other.data_;
    size_ = other.size_;
    size_class_ = other.size_class_;
    other.arena_ = nullptr;
    other.data_ = nullptr;
    other.size_ = 0;
  }
  return *this;
}

void ActArena::Buffer::Release() {
  if (arena_ != nullptr) arena_->GiveBack(size_class_, data_);
  arena_ = nullptr;
  data_ = nullptr;
  size_ = 0;
}

int ActArena::SizeClass(size_t n) {
  return std::max(kMinClass, static_cast<int>(std::bit_width(n - 1)));
}

ActArena::Buffer ActArena::Take(size_t n) {
  Buffer b;
  if (n == 0) return b;
  const int c = SizeClass(n);
  if (free_.size() <= static_cast<size_t>(c)) free_.resize(c + 1);
  if (free_[c].empty()) {
    const size_t bytes = (size_t{1} << c) * sizeof(float);
    free_[c].push_back(static_cast<float*>(::operator new(bytes, kAlign)));
    ++blocks_allocated_;
    bytes_held_ += static_cast<int64_t>(bytes);
  }
  b.arena_ = this;
  b.data_ = free_[c].back();
  b.size_ = n;
  b.size_class_ = c;
  free_[c].pop_back();
  ++live_;
  return b;
}

void ActArena::GiveBack(int size_class, float* block) {
  free_[size_class].push_back(block);
  --live_;
}

ActArena::~ActArena() {
  MORSERVE_CHECK(live_ == 0, "ActArena destroyed while a buffer it gave out is alive");
  for (std::vector<float*>& blocks : free_) {
    for (float* p : blocks) ::operator delete(p, kAlign);
  }
}

}  // namespace morserve
