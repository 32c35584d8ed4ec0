// Paged KV cache bookkeeping (docs/design.md#kv-cache, vLLM v1 KVCacheManager style): pure CPU
// state, opaque int32 block ids, no device memory. The device holds the pool; each step the
// runner copies block tables out of these objects.
//
// KvBlockPool owns the ids 0..num_blocks-1. A block is held by tables (its reference count:
// one per KvBlockTable that lists it; tables share the full blocks of a cached prefix) and by
// prefix-cache nodes (engine/runtime/prefix_cache.h). It is free when neither holds it, and
// "cached idle" when only the cache does: such blocks count as available, and the pool asks
// its evictor (the prefix cache) to let some go when an allocation needs them, so cached
// blocks never make a running request wait. Invariant:
// num_empty() + num_cached_idle() + blocks held by tables == num_blocks().
// Allocate is all or nothing. Freeing an id no table holds (double free, unknown id, or a
// duplicate within one call) is a bookkeeping bug that would let two requests share a block,
// so it aborts with file and line in every build type (the data-plane check of
// docs/design.md#conventions) rather than returning an error nobody could recover from.
//
// KvBlockTable is one (request, cache slot): its block ids and the entries it holds.
// Entries are appended in sequence-position order; an entry's slot-local index is the
// count of entries before it, so under recursion-wise caching a deep slot holds only the
// tokens that reached its loop and its indices are dense even though positions skip.
// Capacity (blocks) may run ahead of entries: Reserve() takes blocks for tokens that may
// arrive (the scheduler's worst case), Append() records the ones that did.
//
// RequestKv is one request: a table per cache slot (LayerPlan::num_cache_slots), with
// all-or-nothing reservation across slots and FreeAll for finish and preemption.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "absl/types/span.h"

namespace morserve {

class KvBlockPool {
 public:
  KvBlockPool(int num_blocks, int block_size);  // both > 0, else abort

  int num_blocks() const { return static_cast<int>(refs_.size()); }
  int block_size() const { return block_size_; }
  // Blocks an allocation can take: empty ones and those only the prefix cache holds (evicted
  // on demand), as vLLM counts its free queue.
  int num_free() const { return num_empty() + num_cached_idle(); }
  int num_empty() const { return static_cast<int>(free_.size()); }  // held by nobody
  int num_cached_idle() const { return num_cached_idle_; }
  int num_cached() const { return num_cached_; }  // blocks the prefix cache holds
  // Blocks tables hold (running requests).
  int num_used() const { return num_blocks() - num_free(); }
  double usage() const { return static_cast<double>(num_used()) / num_blocks(); }
  bool IsAllocated(int id) const;  // held by at least one table
  int refs(int id) const;          // tables holding it

  // n >= 0 ids, or nullopt (and no change) when fewer than n are free.
  std::optional<std::vector<int>> Allocate(int n);
  // Appends n ids to *out, each held once; asks the evictor for room when fewer than n are
  // empty. False (and no change) when fewer than n are free.
  bool AllocateInto(int n, std::vector<int>* out);
  // One more table holds `id`, which a table or the cache holds now (a cached prefix reused).
  void Share(int id);
  // Each id loses one table holder; with none left and no cache hold it is free. Aborts on an
  // id no table holds.
  void Free(absl::Span<const int> ids);

  // The prefix cache's holds (any number of nodes may hold a block; `id` must be held by a
  // table or the cache when one is added). Uncache returns true when the block became free.
  void Cache(int id);
  bool Uncache(int id);
  bool IsCached(int id) const { return cache_refs_[id] > 0; }

  // Called with the number of blocks still missing when an allocation finds too few free;
  // it frees cached idle blocks (Uncache). Unset: no eviction.
  void SetEvictor(std::function<void(int missing)> evictor) { evictor_ = std::move(evictor); }

 private:
  void Release(int id);  // neither tables nor the cache hold it any more

  int block_size_;
  std::vector<int> free_;            // a stack: the back is handed out next
  std::vector<int32_t> refs_;        // table holders, by id
  std::vector<int32_t> cache_refs_;  // prefix-cache holders, by id
  int num_cached_idle_ = 0;
  int num_cached_ = 0;
  std::function<void(int)> evictor_;
};

class KvBlockTable {
 public:
  explicit KvBlockTable(int block_size);

  int num_tokens() const { return static_cast<int>(positions_.size()); }
  int num_blocks() const { return static_cast<int>(blocks_.size()); }
  int capacity() const { return num_blocks() * block_size_; }
  absl::Span<const int> blocks() const { return blocks_; }
  // Sequence position of each entry, strictly increasing; index = slot-local index.
  absl::Span<const int> positions() const { return positions_; }

  // Blocks that must be added to hold new_tokens more entries (0 when capacity suffices).
  int BlocksNeeded(int new_tokens) const;
  // Makes room for new_tokens more entries; false (and no change) when the pool is short.
  bool Reserve(KvBlockPool& pool, int new_tokens);
  // Records entries at the given sequence positions (strictly increasing, after the last entry's;
  // aborts otherwise), taking blocks as needed. Returns the slot-local index of the first new
  // entry, or -1 (and no change) when the pool is short.
  int Append(KvBlockPool& pool, absl::Span<const int> positions);

  // Flat cache index of entry `index`: block * block_size + offset in block.
  int PhysicalSlot(int index) const;
  // Entries a query at `position` sees: those with position <= it (docs/models.md#kv-cache-modes).
  int NumVisible(int position) const;
  // Slot-local index of the entry at `position`, or -1 when the table has none.
  int IndexOf(int position) const;

  // Starts an empty table from a cached prefix: the table holds `shared` (full blocks,
  // Share()d) and then `own` (blocks it already holds, e.g. a fresh copy target); `positions`
  // are the entries those blocks hold. Aborts unless the table is empty and the blocks fit.
  void Adopt(KvBlockPool& pool, absl::Span<const int> shared, absl::Span<const int> own,
             std::vector<int> positions);

  // Returns the blocks beyond what the entries need (reservations that were not used).
  void ReleaseUnused(KvBlockPool& pool);
  // Returns every block and forgets every entry.
  void FreeAll(KvBlockPool& pool);

 private:
  int block_size_;
  std::vector<int> blocks_;
  std::vector<int> positions_;
};

class RequestKv {
 public:
  RequestKv(int num_cache_slots, int block_size);

  int num_slots() const { return static_cast<int>(slots_.size()); }
  KvBlockTable& slot(int s);
  const KvBlockTable& slot(int s) const;
  int num_blocks() const;  // over all slots

  // new_tokens_per_slot has num_slots() entries.
  int BlocksNeeded(absl::Span<const int> new_tokens_per_slot) const;
  // All or nothing across slots: false (and no change) when the pool is short.
  bool Reserve(KvBlockPool& pool, absl::Span<const int> new_tokens_per_slot);
  void ReleaseUnused(KvBlockPool& pool);
  // Finish or preemption: every block back to the pool, every slot empty.
  void FreeAll(KvBlockPool& pool);

 private:
  std::vector<KvBlockTable> slots_;
};

}  // namespace morserve
