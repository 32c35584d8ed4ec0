// KV block bookkeeping: exact accounting under a long randomized run (fixed seed), slot-local
// indices under recursion-wise caching, all-or-nothing allocation and reservation, and the
// aborts on double free and unknown ids.
#include "engine/runtime/kv_block_pool.h"

#include <map>
#include <memory>
#include <random>
#include <set>
#include <vector>

#include "gtest/gtest.h"

namespace morserve {
namespace {

TEST(KvBlockPoolTest, AllocateIsAllOrNothing) {
  KvBlockPool pool(10, 16);
  EXPECT_EQ(pool.num_blocks(), 10);
  EXPECT_EQ(pool.block_size(), 16);
  EXPECT_EQ(pool.num_free(), 10);
  std::optional<std::vector<int>> a = pool.Allocate(7);
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->size(), 7u);
  EXPECT_EQ(pool.num_free(), 3);
  EXPECT_FALSE(pool.Allocate(4).has_value());
  EXPECT_EQ(pool.num_free(), 3);  // nothing taken by the failed call
  std::optional<std::vector<int>> b = pool.Allocate(3);
  ASSERT_TRUE(b.has_value());
  EXPECT_EQ(pool.num_free(), 0);
  EXPECT_DOUBLE_EQ(pool.usage(), 1.0);
  std::set<int> ids(a->begin(), a->end());
  ids.insert(b->begin(), b->end());
  EXPECT_EQ(ids, (std::set<int>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}));
  EXPECT_TRUE(pool.Allocate(0).has_value());
  pool.Free(*a);
  pool.Free(*b);
  EXPECT_EQ(pool.num_free(), 10);
  for (int id = 0; id < 10; ++id) EXPECT_FALSE(pool.IsAllocated(id));
}

TEST(KvBlockPoolDeathTest, DoubleFreeAborts) {
  KvBlockPool pool(4, 8);
  std::vector<int> ids = *pool.Allocate(2);
  pool.Free(ids);
  EXPECT_DEATH(pool.Free(ids), "not allocated");
}

TEST(KvBlockPoolDeathTest, DuplicateIdInOneFreeAborts) {
  KvBlockPool pool(4, 8);
  std::vector<int> ids = *pool.Allocate(2);
  const std::vector<int> twice = {ids[0], ids[0]};
  EXPECT_DEATH(pool.Free(twice), "not allocated");
}

TEST(KvBlockPoolDeathTest, UnknownIdAborts) {
  KvBlockPool pool(4, 8);
  const std::vector<int> bad = {4};
  EXPECT_DEATH(pool.Free(bad), "unknown block id");
  const std::vector<int> negative = {-1};
  EXPECT_DEATH(pool.Free(negative), "unknown block id");
  const std::vector<int> never_allocated = {2};
  EXPECT_DEATH(pool.Free(never_allocated), "not allocated");
}

TEST(KvBlockTableTest, BlocksNeededAndPhysicalSlots) {
  KvBlockPool pool(8, 4);
  KvBlockTable table(4);
  EXPECT_EQ(table.BlocksNeeded(0), 0);
  EXPECT_EQ(table.BlocksNeeded(1), 1);
  EXPECT_EQ(table.BlocksNeeded(4), 1);
  EXPECT_EQ(table.BlocksNeeded(5), 2);
  EXPECT_EQ(table.Append(pool, std::vector<int>{0, 1, 2}), 0);
  EXPECT_EQ(table.num_tokens(), 3);
  EXPECT_EQ(table.num_blocks(), 1);
  EXPECT_EQ(table.BlocksNeeded(1), 0);
  EXPECT_EQ(table.BlocksNeeded(2), 1);
  EXPECT_EQ(table.Append(pool, std::vector<int>{3, 4}), 3);
  EXPECT_EQ(table.num_blocks(), 2);
  const int b0 = table.blocks()[0];
  const int b1 = table.blocks()[1];
  EXPECT_EQ(table.PhysicalSlot(0), b0 * 4);
  EXPECT_EQ(table.PhysicalSlot(3), b0 * 4 + 3);
  EXPECT_EQ(table.PhysicalSlot(4), b1 * 4);
  table.FreeAll(pool);
  EXPECT_EQ(table.num_tokens(), 0);
  EXPECT_EQ(pool.num_free(), 8);
}

TEST(KvBlockTableTest, DeepSlotHoldsOnlyTokensThatReachedIt) {
  // Loop 0 sees every token; loop 1 only tokens 1, 4, 5, 9 (the router's choice). Each token's
  // slot-local index is the count of entries before it in that slot.
  KvBlockPool pool(16, 2);
  RequestKv kv(/*num_cache_slots=*/2, /*block_size=*/2);
  const std::vector<int> deep = {1, 4, 5, 9};
  int next_deep = 0;
  for (int pos = 0; pos < 10; ++pos) {
    EXPECT_EQ(kv.slot(0).Append(pool, std::vector<int>{pos}), pos);
    if (next_deep < 4 && deep[next_deep] == pos) {
      EXPECT_EQ(kv.slot(1).Append(pool, std::vector<int>{pos}), next_deep);
      ++next_deep;
    }
  }
  EXPECT_EQ(kv.slot(0).num_tokens(), 10);
  EXPECT_EQ(kv.slot(0).num_blocks(), 5);
  EXPECT_EQ(kv.slot(1).num_tokens(), 4);
  EXPECT_EQ(kv.slot(1).num_blocks(), 2);
  EXPECT_EQ(kv.num_blocks(), 7);
  EXPECT_EQ(pool.num_free(), 9);
  // Visible entries for a query in the deep slot: positions <= its own.
  EXPECT_EQ(kv.slot(1).NumVisible(0), 0);
  EXPECT_EQ(kv.slot(1).NumVisible(4), 2);
  EXPECT_EQ(kv.slot(1).NumVisible(8), 3);
  EXPECT_EQ(kv.slot(1).NumVisible(9), 4);
  kv.FreeAll(pool);
  EXPECT_EQ(pool.num_free(), 16);
  EXPECT_EQ(kv.num_blocks(), 0);
}

TEST(KvBlockTableDeathTest, PositionsMustIncrease) {
  KvBlockPool pool(4, 2);
  KvBlockTable table(2);
  table.Append(pool, std::vector<int>{3});
  EXPECT_DEATH(table.Append(pool, std::vector<int>{3}), "strictly increasing");
  table.FreeAll(pool);
}

TEST(RequestKvTest, ReserveIsAllOrNothingAcrossSlots) {
  KvBlockPool pool(5, 4);
  RequestKv kv(3, 4);
  // Needs 2 + 2 + 1 = 5 blocks: fits exactly.
  EXPECT_EQ(kv.BlocksNeeded(std::vector<int>{8, 5, 1}), 5);
  RequestKv other(3, 4);
  ASSERT_TRUE(other.Reserve(pool, std::vector<int>{1, 0, 0}));
  EXPECT_FALSE(kv.Reserve(pool, std::vector<int>{8, 5, 1}));
  EXPECT_EQ(kv.num_blocks(), 0);
  EXPECT_EQ(pool.num_free(), 4);
  ASSERT_TRUE(kv.Reserve(pool, std::vector<int>{8, 4, 4}));
  EXPECT_EQ(pool.num_free(), 0);
  // Reserved capacity is used by appends without touching the pool.
  EXPECT_EQ(kv.slot(1).Append(pool, std::vector<int>{0, 1}), 0);
  EXPECT_EQ(kv.slot(1).num_blocks(), 1);
  // The pool is empty, so a slot cannot grow past its reservation; nothing changes.
  EXPECT_EQ(kv.slot(2).Append(pool, std::vector<int>{0, 1, 2, 3, 4}), -1);
  EXPECT_EQ(kv.slot(2).num_tokens(), 0);
  // Unused reservations go back: slot 0 holds no entries, slot 1 needs its one block.
  kv.ReleaseUnused(pool);
  EXPECT_EQ(kv.num_blocks(), 1);
  EXPECT_EQ(pool.num_free(), 3);
  kv.FreeAll(pool);
  other.FreeAll(pool);
  EXPECT_EQ(pool.num_free(), 5);
}

// Random requests, slots, reservations, appends, releases and frees against a
// shadow model; after every operation each id is held by at most one table,
// held + free == total, and every table holds exactly the blocks its entries
// and reservations need.
TEST(KvBlockPoolTest, RandomizedAccountingIsExact) {
  constexpr int kBlocks = 64;
  constexpr int kBlockSize = 4;
  constexpr int kSlots = 3;
  KvBlockPool pool(kBlocks, kBlockSize);
  std::mt19937 gen(12345);
  std::map<int, std::unique_ptr<RequestKv>> requests;
  std::map<int, std::vector<int>> next_position;  // per request, per slot
  int next_request = 0;
  int failed_allocations = 0;

  auto check_invariants = [&] {
    std::set<int> held;
    int held_count = 0;
    for (const auto& [id, kv] : requests) {
      for (int s = 0; s < kSlots; ++s) {
        const KvBlockTable& t = kv->slot(s);
        EXPECT_GE(t.capacity(), t.num_tokens());
        for (int b : t.blocks()) {
          EXPECT_TRUE(pool.IsAllocated(b));
          EXPECT_TRUE(held.insert(b).second) << "block " << b << " handed out twice";
          ++held_count;
        }
      }
    }
    EXPECT_EQ(held_count + pool.num_free(), kBlocks);
    int allocated = 0;
    for (int b = 0; b < kBlocks; ++b) allocated += pool.IsAllocated(b);
    EXPECT_EQ(allocated, held_count);
  };

  for (int op = 0; op < 20000; ++op) {
    const int kind = static_cast<int>(gen() % 10);
    if (requests.empty() || kind == 0) {
      requests[next_request] = std::make_unique<RequestKv>(kSlots, kBlockSize);
      next_position[next_request] = std::vector<int>(kSlots, 0);
      ++next_request;
    } else {
      auto it = requests.begin();
      std::advance(it, gen() % requests.size());
      RequestKv& kv = *it->second;
      std::vector<int>& pos = next_position[it->first];
      const int s = static_cast<int>(gen() % kSlots);
      if (kind <= 6) {  // append a few tokens at increasing, possibly skipping,
                        // positions
        std::vector<int> positions;
        const int n = 1 + static_cast<int>(gen() % 6);
        for (int i = 0; i < n; ++i) positions.push_back(pos[s] += 1 + gen() % 3);
        const int before_tokens = kv.slot(s).num_tokens();
        const int needed = kv.slot(s).BlocksNeeded(n);
        const int free_before = pool.num_free();
        const int first = kv.slot(s).Append(pool, positions);
        if (needed > free_before) {
          EXPECT_EQ(first, -1);
          EXPECT_EQ(pool.num_free(), free_before);
          EXPECT_EQ(kv.slot(s).num_tokens(), before_tokens);
          ++failed_allocations;
          // Out of blocks: preempt the newest request, as the scheduler does.
          auto newest = std::prev(requests.end());
          newest->second->FreeAll(pool);
          requests.erase(newest);
        } else {
          EXPECT_EQ(first, before_tokens);
          EXPECT_EQ(pool.num_free(), free_before - needed);
        }
      } else if (kind == 7) {  // reserve across all slots
        std::vector<int> extra(kSlots);
        for (int& e : extra) e = static_cast<int>(gen() % 9);
        const int needed = kv.BlocksNeeded(extra);
        const int free_before = pool.num_free();
        const bool ok = kv.Reserve(pool, extra);
        EXPECT_EQ(ok, needed <= free_before);
        EXPECT_EQ(pool.num_free(), ok ? free_before - needed : free_before);
      } else if (kind == 8) {
        kv.ReleaseUnused(pool);
        for (int t = 0; t < kSlots; ++t) {
          EXPECT_EQ(kv.slot(t).num_blocks(),
                    (kv.slot(t).num_tokens() + kBlockSize - 1) / kBlockSize);
        }
      } else {  // finish or preempt
        kv.FreeAll(pool);
        EXPECT_EQ(kv.num_blocks(), 0);
        requests.erase(it);
      }
    }
    check_invariants();
    if (::testing::Test::HasFailure()) break;
  }
  EXPECT_GT(failed_allocations, 0) << "the run never exhausted the pool";
  for (auto& [id, kv] : requests) kv->FreeAll(pool);
  EXPECT_EQ(pool.num_free(), kBlocks);
}

}  // namespace
}  // namespace morserve
