// KvCopiesDisjoint (engine/runtime/model_runner.h): the condition under which CopyKv's copies
// give the same cache in any order, checked on hand-made cases and against a brute-force
// pairwise check on random copy lists.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "engine/runtime/model_runner.h"

namespace morserve {
namespace {

bool Disjoint(const std::vector<KvCopy>& c) {
  return KvCopiesDisjoint(c.data(), static_cast<int>(c.size()));
}

TEST(KvCopiesDisjointTest, HandMadeCases) {
  EXPECT_TRUE(Disjoint({}));
  EXPECT_TRUE(Disjoint({{0, 16, 4}, {4, 20, 4}}));    // sources before destinations
  EXPECT_TRUE(Disjoint({{5, 5, 3}}));                 // a copy onto itself
  EXPECT_TRUE(Disjoint({{0, 10, 0}, {10, 0, 0}}));    // empty copies touch nothing
  EXPECT_TRUE(Disjoint({{0, 8, 2}, {0, 12, 2}}));     // one source read twice
  EXPECT_FALSE(Disjoint({{0, 8, 4}, {20, 10, 4}}));   // destinations 8..11 and 10..13
  EXPECT_FALSE(Disjoint({{0, 8, 2}, {8, 30, 1}}));    // 8 written, then read
  EXPECT_FALSE(Disjoint({{30, 8, 2}, {0, 20, 16}}));  // a long source spans a destination
  EXPECT_FALSE(Disjoint({{4, 6, 4}}));                // its own source and destination overlap
}

TEST(KvCopiesDisjointTest, AgreesWithPairwiseCheck) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> slot(0, 60), count(0, 6), size(1, 6);
  auto overlap = [](int a, int na, int b, int nb) {
    return na > 0 && nb > 0 && a < b + nb && b < a + na;
  };
  int disjoint = 0;
  for (int trial = 0; trial < 4000; ++trial) {
    std::vector<KvCopy> c(size(rng));
    for (KvCopy& x : c) x = {slot(rng), slot(rng), count(rng)};
    bool want = true;
    for (size_t i = 0; i < c.size(); ++i) {
      if (c[i].src != c[i].dst && overlap(c[i].src, c[i].count, c[i].dst, c[i].count)) want = false;
      for (size_t j = 0; j < c.size(); ++j) {
        if (i == j) continue;
        if (overlap(c[i].dst, c[i].count, c[j].dst, c[j].count) ||
            overlap(c[i].dst, c[i].count, c[j].src, c[j].count)) {
          want = false;
        }
      }
    }
    disjoint += want;
    ASSERT_EQ(Disjoint(c), want) << "trial " << trial;
  }
  EXPECT_GT(disjoint, 400);  // both answers are exercised
  EXPECT_LT(disjoint, 3600);
}

}  // namespace
}  // namespace morserve
