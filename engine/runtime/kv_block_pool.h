// Paged KV cache bookkeeping (docs/design.md#kv-cache, vLLM v1 KVCacheManager style): pure CPU
// state, opaque int32 block ids, no device memory. The device holds the pool; each step the
// runner copies block tables out of these objects.
//
// KvBlockPool owns the ids 0..num_blocks-1. Invariants: every id is either free or held by
// exactly one owner; num_free() + held ids == num_blocks(). Allocate is all or nothing.
// Freeing an id that is not allocated (double free, unknown id, or a duplicate within one
// call) is a bookkeeping bug that would let two requests share a block, so it aborts with
// file and line in every build type (the data-plane check of docs/design.md#conventions) rather
// than returning an error nobody could recover from.
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
#include <optional>
#include <vector>

#include "absl/types/span.h"

namespace morserve {

class KvBlockPool {
 public:
  KvBlockPool(int num_blocks, int block_size);  // both > 0, else abort

  int num_blocks() const { return static_cast<int>(allocated_.size()); }
  int block_size() const { return block_size_; }
  int num_free() const { return static_cast<int>(free_.size()); }
  int num_used() const { return num_blocks() - num_free(); }
  double usage() const { return static_cast<double>(num_used()) / num_blocks(); }
  bool IsAllocated(int id) const;

  // n >= 0 ids, or nullopt (and no change) when fewer than n are free.
  std::optional<std::vector<int>> Allocate(int n);
  // Appends n ids to *out; false (and no change) when fewer than n are free.
  bool AllocateInto(int n, std::vector<int>* out);
  // Returns ids to the pool; aborts on an id that is not currently allocated.
  void Free(absl::Span<const int> ids);

 private:
  int block_size_;
  std::vector<int> free_;           // a stack: the back is handed out next
  std::vector<uint8_t> allocated_;  // by id
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
