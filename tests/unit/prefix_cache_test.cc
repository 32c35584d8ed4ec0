// The prefix cache's bookkeeping on its own (engine/runtime/prefix_cache.h): the pool's
// table and cache holds, what a lookup returns per cache slot (shared full blocks, a partial
// last block, positions of a deep slot that holds only some tokens), namespaces, duplicates,
// least-recently-used eviction of leaves, and every block accounted for.
#include "engine/runtime/prefix_cache.h"

#include <gtest/gtest.h>

#include <numeric>

namespace morserve {
namespace {

constexpr int kBlock = 4;

// A request with two cache slots: slot 0 holds every position, slot 1 every third one (a deep
// recursion-wise slot).
RequestKv Filled(KvBlockPool& pool, int positions) {
  RequestKv kv(2, kBlock);
  for (int p = 0; p < positions; ++p) {
    EXPECT_GE(kv.slot(0).Append(pool, {p}), 0);
    if (p % 3 == 0) EXPECT_GE(kv.slot(1).Append(pool, {p}), 0);
  }
  return kv;
}

std::vector<int> Tokens(int n, int salt = 0) {
  std::vector<int> t(n);
  std::iota(t.begin(), t.end(), 100 + salt);
  return t;
}

std::vector<int> Loops(int n) { return std::vector<int>(n, 2); }

TEST(KvBlockPoolHoldsTest, TablesAndCacheHoldBlocks) {
  KvBlockPool pool(4, kBlock);
  std::vector<int> ids;
  ASSERT_TRUE(pool.AllocateInto(2, &ids));
  pool.Share(ids[0]);
  EXPECT_EQ(pool.refs(ids[0]), 2);
  pool.Cache(ids[0]);
  pool.Free({ids[0]});
  pool.Free({ids[0]});  // no table holds it: cached idle
  EXPECT_EQ(pool.num_cached_idle(), 1);
  EXPECT_EQ(pool.num_free(), 3);
  EXPECT_EQ(pool.num_empty(), 2);
  EXPECT_EQ(pool.num_used(), 1);
  pool.Share(ids[0]);  // a hit takes it back from the cache
  EXPECT_EQ(pool.num_cached_idle(), 0);
  EXPECT_FALSE(pool.Uncache(ids[0]));  // still held by a table
  EXPECT_EQ(pool.num_cached(), 0);
  pool.Free({ids[0], ids[1]});
  EXPECT_EQ(pool.num_empty(), 4);
}

TEST(KvBlockPoolHoldsTest, AllocationAsksTheEvictorForWhatIsMissing) {
  KvBlockPool pool(3, kBlock);
  std::vector<int> ids;
  ASSERT_TRUE(pool.AllocateInto(3, &ids));
  for (int id : ids) pool.Cache(id);
  pool.Free(ids);
  std::vector<int> asked;
  pool.SetEvictor([&](int missing) {
    asked.push_back(missing);
    for (int i = 0; i < missing; ++i) EXPECT_TRUE(pool.Uncache(ids[i]));
  });
  std::vector<int> got;
  ASSERT_TRUE(pool.AllocateInto(2, &got));
  EXPECT_EQ(asked, std::vector<int>{2});
  EXPECT_FALSE(pool.AllocateInto(2, &got));  // one free (cached idle) only: no change
  EXPECT_EQ(got.size(), 2u);
  EXPECT_EQ(asked.size(), 1u);
}

TEST(KvBlockPoolHoldsDeathTest, FreeingAnUnheldCachedBlockAborts) {
  KvBlockPool pool(2, kBlock);
  std::vector<int> ids;
  ASSERT_TRUE(pool.AllocateInto(1, &ids));
  pool.Cache(ids[0]);
  pool.Free(ids);
  EXPECT_DEATH(pool.Free(ids), "not allocated");
}

TEST(PrefixCacheTest, LookupReturnsEachSlotsEntriesBeforeTheHit) {
  KvBlockPool pool(64, kBlock);
  PrefixCache cache(2, &pool);
  RequestKv kv = Filled(pool, 10);
  PrefixCursor cursor;
  cache.Insert("k", Tokens(10), 10, kv, Loops(10), &cursor);
  EXPECT_EQ(cache.num_nodes(), 2);  // positions [0, 4) and [4, 8)
  EXPECT_EQ(cursor.end, 8);

  const PrefixHit hit = cache.Lookup("k", Tokens(12), 11);
  EXPECT_EQ(hit.tokens, 8);
  EXPECT_EQ(hit.positions[0], (std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(hit.blocks[0],
            (std::vector<int>(kv.slot(0).blocks().begin(), kv.slot(0).blocks().begin() + 2)));
  EXPECT_EQ(hit.positions[1], (std::vector<int>{0, 3, 6}));  // a partial block
  EXPECT_EQ(hit.blocks[1], std::vector<int>{kv.slot(1).blocks()[0]});
  EXPECT_EQ(hit.loops, Loops(8));

  EXPECT_EQ(cache.Lookup("other", Tokens(12), 11).tokens, 0);
  std::vector<int> differ = Tokens(12);
  differ[5] = 1;
  EXPECT_EQ(cache.Lookup("k", differ, 11).tokens, 4);
  EXPECT_EQ(cache.Lookup("k", Tokens(12), 7).tokens, 4);  // limited
}

// A second request that computed the same prefix adds nothing; one that goes further hangs
// its blocks under the cached ones, its copy of a partial block replacing the cached one.
TEST(PrefixCacheTest, DuplicatesAreKeptOnceAndLongerPrefixesExtendThem) {
  KvBlockPool pool(64, kBlock);
  PrefixCache cache(2, &pool);
  RequestKv a = Filled(pool, 8);
  PrefixCursor ca;
  cache.Insert("k", Tokens(8), 8, a, Loops(8), &ca);
  RequestKv b = Filled(pool, 14);
  PrefixCursor cb;
  cache.Insert("k", Tokens(14), 14, b, Loops(14), &cb);
  EXPECT_EQ(cache.num_nodes(), 3);
  const PrefixHit hit = cache.Lookup("k", Tokens(14), 13);
  EXPECT_EQ(hit.tokens, 12);
  EXPECT_EQ(hit.blocks[0][0], a.slot(0).blocks()[0]);
  EXPECT_EQ(hit.blocks[0][1], a.slot(0).blocks()[1]);
  EXPECT_EQ(hit.blocks[0][2], b.slot(0).blocks()[2]);
  // Slot 1 holds positions 0, 3, 6, 9: a's partial block gave way to b's full one.
  EXPECT_EQ(hit.positions[1], (std::vector<int>{0, 3, 6, 9}));
  EXPECT_EQ(hit.blocks[1], std::vector<int>{b.slot(1).blocks()[0]});
}

TEST(PrefixCacheTest, EvictsLeastRecentlyUsedLeavesOnlyWhenThePoolNeedsRoom) {
  KvBlockPool pool(16, kBlock);
  auto cache = std::make_unique<PrefixCache>(2, &pool);
  RequestKv a = Filled(pool, 8), b = Filled(pool, 8);
  PrefixCursor ca, cb;
  cache->Insert("a", Tokens(8), 8, a, Loops(8), &ca);
  cache->Insert("b", Tokens(8, 50), 8, b, Loops(8), &cb);
  a.FreeAll(pool);
  b.FreeAll(pool);
  EXPECT_EQ(pool.num_used(), 0);
  EXPECT_EQ(pool.num_free(), 16);
  const int cached = pool.num_cached_idle();
  EXPECT_EQ(cached, 6);  // per request: slot 0's two blocks, slot 1's one (listed by both nodes)
  EXPECT_EQ(cache->Lookup("a", Tokens(9), 8).tokens, 8);  // "a" is now the most recent

  // Two blocks more than the empty ones: b's leaf goes first (one block of its own), then b's
  // first node (which became a leaf); a's chain, used since, stays.
  std::vector<int> taken;
  ASSERT_TRUE(pool.AllocateInto(pool.num_empty() + 2, &taken));
  EXPECT_EQ(cache->Lookup("b", Tokens(9, 50), 8).tokens, 0);
  EXPECT_EQ(cache->Lookup("a", Tokens(9), 8).tokens, 8);
  EXPECT_EQ(cache->evicted_blocks(), 3);
  const int before = pool.num_empty();
  pool.Free(taken);
  EXPECT_EQ(pool.num_empty(), before + static_cast<int>(taken.size()));
  cache.reset();  // every cached block back
  EXPECT_EQ(pool.num_empty(), 16);
  EXPECT_EQ(pool.num_cached(), 0);
}

TEST(PrefixCacheTest, CursorRestartsWhenItsNodeWasEvicted) {
  KvBlockPool pool(12, kBlock);
  PrefixCache cache(2, &pool);
  RequestKv a = Filled(pool, 4);
  PrefixCursor cursor;
  cache.Insert("k", Tokens(12), 4, a, Loops(4), &cursor);
  a.FreeAll(pool);
  EXPECT_EQ(cache.Evict(100), 2);
  EXPECT_EQ(cache.num_nodes(), 0);
  RequestKv b = Filled(pool, 12);
  cache.Insert("k", Tokens(12), 12, b, Loops(12), &cursor);
  EXPECT_EQ(cache.num_nodes(), 3);
  EXPECT_EQ(cache.Lookup("k", Tokens(13), 12).tokens, 12);
}

}  // namespace
}  // namespace morserve
