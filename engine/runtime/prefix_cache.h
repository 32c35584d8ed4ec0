// Automatic prefix caching (docs/design.md#prefix-cache): KV of full token blocks kept after
// their request ends, found again by a later request whose prompt starts with the same tokens.
//
// A node is one full block of tokens [end - B, end) (B = block size) under its parent node
// (the tokens before it); a node at depth 0 hangs from a namespace key (the request's
// cache_salt and whatever else changes the KV a prefix produces, such as an early-exit
// threshold override). Nodes are found by a hash chained over the key and the tokens, then
// checked token by token, so a hash collision can never hand out the wrong KV.
//
// What a node records is every cache slot's entries at positions < end, which is a function
// of the prefix alone (docs/models.md#kv-cache-modes): routing, recursion-wise slots that
// hold only the tokens that reached their loop, shared KV, recurrent persistent pairs,
// early-exit propagate/skip. Per slot it keeps the entry count, the positions of its entries
// in [end - B, end), and the block ids that hold entries [0, count) from the table index
// where its parent's blocks stop being full. A deep slot holds fewer entries than positions,
// so its last block is usually partial: a hit shares the full blocks and the scheduler copies
// the partial block's entries into a block the new request owns (a table only ever appends
// to blocks it alone holds).
//
// Each node holds the blocks it lists (KvBlockPool::Cache). Leaves are evicted least recently
// used first, only when the pool asks for room (KvBlockPool::SetEvictor); a block a running
// request holds stays with it. The loops each position ran are kept too, so usage reports the
// same recursion loops on a hit as on a miss.
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/types/span.h"
#include "engine/runtime/kv_block_pool.h"

namespace morserve {

// The cached prefix of a lookup: `tokens` positions (a multiple of the block size, 0 on a
// miss) and, per cache slot, the blocks holding its entries and their positions.
// Where a request's chain of inserted (or matched) nodes ends, so Insert continues from there
// instead of walking from the key each step. A cursor whose node was evicted restarts.
struct PrefixCursor {
  int end = 0;
  int64_t node = -1;
  uint64_t hash = 0;
};

struct PrefixHit {
  int tokens = 0;
  std::vector<std::vector<int>> blocks;     // [slot]: entries [0, positions[slot].size())
  std::vector<std::vector<int>> positions;  // [slot]
  std::vector<int> loops;                   // [tokens]: loops each position ran
};

class PrefixCache {
 public:
  // Registers itself as the pool's evictor; the pool must outlive it.
  PrefixCache(int num_slots, KvBlockPool* pool);
  ~PrefixCache();
  PrefixCache(const PrefixCache&) = delete;
  PrefixCache& operator=(const PrefixCache&) = delete;

  // The longest cached prefix of tokens[0, limit) under `key`, in whole blocks; the nodes it
  // covers become the most recently used.
  // `cursor` (optional) is left at the end of the hit.
  PrefixHit Lookup(const std::string& key, absl::Span<const int> tokens, int limit,
                   PrefixCursor* cursor = nullptr);

  // Records the full blocks of tokens[0, done) that are not cached yet, from the tables of a
  // request whose entries at positions < done are all written. `loops[p]` is position p's loop
  // count. Blocks already cached (another request computed the same prefix) are kept as they
  // are.
  void Insert(const std::string& key, absl::Span<const int> tokens, int done, const RequestKv& kv,
              absl::Span<const int> loops, PrefixCursor* cursor);

  // Evicts least recently used leaves until `missing` more blocks are free or nothing is left
  // to evict. Returns the blocks freed.
  int Evict(int missing);

  int num_nodes() const { return static_cast<int>(nodes_.size()); }
  int num_blocks() const { return pool_->num_cached(); }  // blocks held (some may be in use too)
  int64_t evicted_blocks() const { return evicted_blocks_; }

 private:
  struct Node {
    uint64_t hash = 0;
    int64_t parent = -1;  // -1: hangs from the key
    std::string key;      // depth 0 only
    std::vector<int> tokens;
    int end = 0;                              // positions [0, end) are covered
    std::vector<int> count;                   // [slot] entries at positions < end
    std::vector<int> first;                   // [slot] table index of blocks[slot][0]
    std::vector<std::vector<int>> blocks;     // [slot] blocks [first, ceil(count / B))
    std::vector<std::vector<int>> positions;  // [slot] entry positions in [end - B, end)
    std::vector<int> loops;                   // [B]
    int children = 0;
    uint64_t last_used = 0;
  };

  int64_t Find(uint64_t hash, int64_t parent, const std::string& key,
               absl::Span<const int> tokens) const;
  int64_t Add(uint64_t hash, int64_t parent, const std::string& key, absl::Span<const int> tokens,
              int end, const RequestKv& kv, absl::Span<const int> loops);
  void Touch(int64_t id);
  int Remove(int64_t id);  // returns the blocks it freed

  int num_slots_;
  int block_size_;
  KvBlockPool* pool_;
  std::unordered_map<int64_t, Node> nodes_;
  std::unordered_multimap<uint64_t, int64_t> by_hash_;
  std::set<std::pair<uint64_t, int64_t>> leaves_;  // (last_used, id) of nodes without children
  int64_t next_id_ = 0;
  uint64_t clock_ = 0;
  int64_t evicted_blocks_ = 0;
};

}  // namespace morserve
