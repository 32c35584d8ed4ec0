// Slot ids of the runner's row states. A row's hidden state lives in the runner (host memory on
// the CPU, device memory on the GPU: ModelRunner's ops read and write rows by slot), so that it
// stays where it is computed from one runner call to the next. StateSlots hands out the ids,
// lowest free first, so the runner's storage grows only to the peak number of live states; a
// Slot gives its id back when it is destroyed. Single-threaded (the engine thread), and it must
// outlive every Slot it handed out.
#pragma once

#include <cstdint>
#include <functional>
#include <queue>
#include <vector>

namespace morserve {

class StateSlots {
 public:
  class Slot {
   public:
    Slot() = default;
    ~Slot() { Reset(); }
    Slot(Slot&& o) noexcept : owner_(o.owner_), id_(o.id_) { o.owner_ = nullptr, o.id_ = -1; }
    Slot& operator=(Slot&& o) noexcept {
      if (this != &o) {
        Reset();
        owner_ = o.owner_, id_ = o.id_;
        o.owner_ = nullptr, o.id_ = -1;
      }
      return *this;
    }
    Slot(const Slot&) = delete;
    Slot& operator=(const Slot&) = delete;

    int32_t id() const { return id_; }  // -1: no state
    void Reset() {
      if (owner_ != nullptr) owner_->Release(id_);
      owner_ = nullptr;
      id_ = -1;
    }

   private:
    friend class StateSlots;
    Slot(StateSlots* owner, int32_t id) : owner_(owner), id_(id) {}
    StateSlots* owner_ = nullptr;
    int32_t id_ = -1;
  };

  Slot Acquire() {
    if (!free_.empty()) {
      const int32_t id = free_.top();
      free_.pop();
      return Slot(this, id);
    }
    return Slot(this, next_++);
  }

 private:
  void Release(int32_t id) { free_.push(id); }
  std::priority_queue<int32_t, std::vector<int32_t>, std::greater<>> free_;
  int32_t next_ = 0;
};

using StateSlot = StateSlots::Slot;

}  // namespace morserve
