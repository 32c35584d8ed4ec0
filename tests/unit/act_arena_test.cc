// ActArena (engine/cpu/act_arena.h): a buffer's block comes back when the buffer goes out of
// scope and the next request of its size class reuses it (no new allocation); live buffers
// never share memory; every block is 64-byte aligned; moves hand the block over once; a size
// class serves every request up to twice smaller, and only those.
#include "engine/cpu/act_arena.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <utility>
#include <vector>

namespace morserve {
namespace {

bool Aligned64(const float* p) { return reinterpret_cast<uintptr_t>(p) % 64 == 0; }

TEST(ActArenaTest, ABlockComesBackAndIsTakenAgain) {
  ActArena arena;
  const float* first = nullptr;
  {
    ActArena::Buffer b = arena.Take(1000);
    ASSERT_EQ(b.size(), 1000u);
    first = b.data();
    for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<float>(i);  // every float usable
  }
  EXPECT_EQ(arena.blocks_allocated(), 1);
  for (int step = 0; step < 5; ++step) {
    ActArena::Buffer b = arena.Take(1000);
    EXPECT_EQ(b.data(), first) << "step " << step;
  }
  EXPECT_EQ(arena.blocks_allocated(), 1);
  EXPECT_EQ(arena.bytes_held(), 1024 * 4);  // the size class of 1000 floats: 1024
}

TEST(ActArenaTest, LiveBuffersDoNotOverlapAndAreAligned) {
  ActArena arena;
  std::vector<ActArena::Buffer> live;
  for (size_t n : {1, 15, 16, 17, 1000, 1024, 1025, 1000, 1000, 3000}) {
    live.push_back(arena.Take(n));
    ASSERT_EQ(live.back().size(), n);
    EXPECT_TRUE(Aligned64(live.back().data())) << n;
  }
  for (size_t i = 0; i < live.size(); ++i) {
    for (size_t j = i + 1; j < live.size(); ++j) {
      const float *a = live[i].data(), *b = live[j].data();
      EXPECT_TRUE(a + live[i].size() <= b || b + live[j].size() <= a) << i << " and " << j;
    }
  }
  EXPECT_EQ(arena.blocks_allocated(), 10);
}

// A layer's buffers, taken and given back in the same order every step: after the first step
// the arena allocates nothing, whatever the order of destruction.
TEST(ActArenaTest, RepeatedStepsAllocateOnlyInTheFirst) {
  ActArena arena;
  const std::vector<size_t> sizes = {512 * 960, 512 * 1600, 512 * 960,  512 * 320, 512 * 320,
                                     512 * 960, 512 * 960,  512 * 5120, 512 * 2560};
  auto step = [&] {
    for (int layer = 0; layer < 4; ++layer) {
      std::vector<ActArena::Buffer> layer_buffers;
      for (size_t n : sizes) layer_buffers.push_back(arena.Take(n));
    }
  };
  step();
  const int64_t after_first = arena.blocks_allocated();
  EXPECT_EQ(after_first, static_cast<int64_t>(sizes.size()));
  for (int s = 0; s < 3; ++s) step();
  EXPECT_EQ(arena.blocks_allocated(), after_first);
}

TEST(ActArenaTest, AClassServesUpToTwiceSmallerAndNoMore) {
  ActArena arena;
  const float* block = nullptr;
  { block = arena.Take(1024).data(); }            // the temporary gives it back at once
  { EXPECT_EQ(arena.Take(513).data(), block); }   // same class (1024)
  { EXPECT_NE(arena.Take(512).data(), block); }   // class 512: a new block
  { EXPECT_NE(arena.Take(1025).data(), block); }  // class 2048: a new block
  EXPECT_EQ(arena.blocks_allocated(), 3);
}

TEST(ActArenaTest, MovesHandTheBlockOverOnce) {
  ActArena arena;
  ActArena::Buffer a = arena.Take(100);
  const float* p = a.data();
  ActArena::Buffer b = std::move(a);
  EXPECT_EQ(b.data(), p);
  EXPECT_EQ(a.data(), nullptr);  // NOLINT(bugprone-use-after-move): the moved-from state
  EXPECT_EQ(a.size(), 0u);       // NOLINT(bugprone-use-after-move)
  ActArena::Buffer c = arena.Take(100);
  EXPECT_NE(c.data(), p);  // b still holds it
  c = std::move(b);        // c's own block goes back, c takes p
  EXPECT_EQ(c.data(), p);
  ActArena::Buffer d = arena.Take(100);  // the block c gave back
  EXPECT_NE(d.data(), p);
  EXPECT_EQ(arena.blocks_allocated(), 2);
}

TEST(ActArenaTest, ZeroFloatsIsAnEmptyBuffer) {
  ActArena arena;
  ActArena::Buffer b = arena.Take(0);
  EXPECT_EQ(b.size(), 0u);
  EXPECT_EQ(b.begin(), b.end());
  EXPECT_EQ(arena.blocks_allocated(), 0);
}

}  // namespace
}  // namespace morserve
