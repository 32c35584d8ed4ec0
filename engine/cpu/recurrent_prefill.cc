// The tiled recurrent prefill schedule (see recurrent_prefill.h).
#include "engine/cpu/recurrent_prefill.h"

#include <vector>

namespace morserve {
namespace {

class TiledSchedule {
 public:
  TiledSchedule(ChunkAttention& att, ThreadPool* threads, const FinishPosition& finish,
                int attn_width)
      : att_(att), threads_(threads), finish_(finish), out_(attn_width) {
    // Leaves split the chunk where a new KV block (key group) starts.
    for (int i = 0; i < att_.n(); ++i) {
      if (i == 0 || (att_.first() + i) % att_.group() == 0) leaf_begin_.push_back(i);
    }
    leaf_begin_.push_back(att_.n());
  }

  void Run() {
    if (att_.n() == 0) return;
    att_.FoldKeys(0, att_.GroupStart(att_.first()), 0, att_.n(), threads_);
    Solve(0, static_cast<int>(leaf_begin_.size()) - 1);
  }

 private:
  void Solve(int a, int b) {
    if (b - a == 1) {
      for (int i = leaf_begin_[a]; i < leaf_begin_[b]; ++i) {
        att_.Finish(i, out_.data());
        finish_(i, out_.data());
      }
      return;
    }
    const int mid = (a + b) / 2;
    Solve(a, mid);
    // The left half's group-aligned keys (the first leaf's group may start in the cache).
    const int key_begin = att_.GroupStart(att_.first() + leaf_begin_[a]);
    const int key_end = att_.first() + leaf_begin_[mid];
    att_.FoldKeys(key_begin, key_end, leaf_begin_[mid], leaf_begin_[b], threads_);
    Solve(mid, b);
  }

  ChunkAttention& att_;
  ThreadPool* threads_;
  const FinishPosition& finish_;
  std::vector<int> leaf_begin_;  // query index where each leaf starts, then n
  std::vector<float> out_;
};

}  // namespace

void RunTiledPrefill(ChunkAttention& attention, ThreadPool* threads, const FinishPosition& finish) {
  TiledSchedule(attention, threads, finish, attention.attn_width()).Run();
}

}  // namespace morserve
