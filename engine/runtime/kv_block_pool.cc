// See kv_block_pool.h for the invariants. Every mutation either completes or leaves the
// state untouched: capacity checks come before any id moves.
#include "engine/runtime/kv_block_pool.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "engine/core/check.h"

namespace morserve {
namespace {

int CeilDiv(int a, int b) { return (a + b - 1) / b; }

}  // namespace

KvBlockPool::KvBlockPool(int num_blocks, int block_size) : block_size_(block_size) {
  MORSERVE_CHECK(num_blocks > 0 && block_size > 0, "num_blocks and block_size must be > 0");
  refs_.assign(num_blocks, 0);
  cache_refs_.assign(num_blocks, 0);
  free_.resize(num_blocks);
  // Hand out low ids first: the stack's back is id 0.
  for (int i = 0; i < num_blocks; ++i) free_[i] = num_blocks - 1 - i;
}

bool KvBlockPool::IsAllocated(int id) const {
  return id >= 0 && id < num_blocks() && refs_[id] > 0;
}

int KvBlockPool::refs(int id) const {
  MORSERVE_CHECK(id >= 0 && id < num_blocks(), "unknown block id");
  return refs_[id];
}

std::optional<std::vector<int>> KvBlockPool::Allocate(int n) {
  std::vector<int> ids;
  if (!AllocateInto(n, &ids)) return std::nullopt;
  return ids;
}

bool KvBlockPool::AllocateInto(int n, std::vector<int>* out) {
  MORSERVE_CHECK(n >= 0, "negative block count");
  if (n > num_free()) return false;
  if (n > num_empty() && evictor_) evictor_(n - num_empty());
  MORSERVE_CHECK(n <= num_empty(), "the evictor left cached idle blocks that were needed");
  out->reserve(out->size() + n);
  for (int i = 0; i < n; ++i) {
    const int id = free_.back();
    free_.pop_back();
    refs_[id] = 1;
    out->push_back(id);
  }
  return true;
}

void KvBlockPool::Share(int id) {
  MORSERVE_CHECK(id >= 0 && id < num_blocks(), "sharing an unknown block id");
  MORSERVE_CHECK(refs_[id] > 0 || cache_refs_[id] > 0, "sharing a free block");
  if (refs_[id] == 0) --num_cached_idle_;
  ++refs_[id];
}

void KvBlockPool::Free(absl::Span<const int> ids) {
  for (int id : ids) {
    MORSERVE_CHECK(id >= 0 && id < num_blocks(), "freeing an unknown block id");
    MORSERVE_CHECK(refs_[id] > 0, "freeing a block that is not allocated");
    if (--refs_[id] > 0) continue;
    if (cache_refs_[id] > 0) {
      ++num_cached_idle_;
    } else {
      Release(id);
    }
  }
}

void KvBlockPool::Cache(int id) {
  MORSERVE_CHECK(id >= 0 && id < num_blocks(), "caching an unknown block id");
  MORSERVE_CHECK(refs_[id] > 0 || cache_refs_[id] > 0, "caching a free block");
  if (cache_refs_[id]++ == 0) ++num_cached_;
}

bool KvBlockPool::Uncache(int id) {
  MORSERVE_CHECK(id >= 0 && id < num_blocks(), "uncaching an unknown block id");
  MORSERVE_CHECK(cache_refs_[id] > 0, "uncaching a block the cache does not hold");
  if (--cache_refs_[id] > 0) return false;
  --num_cached_;
  if (refs_[id] > 0) return false;
  --num_cached_idle_;
  Release(id);
  return true;
}

void KvBlockPool::Release(int id) { free_.push_back(id); }

KvBlockTable::KvBlockTable(int block_size) : block_size_(block_size) {
  MORSERVE_CHECK(block_size > 0, "block_size must be > 0");
}

int KvBlockTable::BlocksNeeded(int new_tokens) const {
  MORSERVE_CHECK(new_tokens >= 0, "negative token count");
  return std::max(0, CeilDiv(num_tokens() + new_tokens, block_size_) - num_blocks());
}

bool KvBlockTable::Reserve(KvBlockPool& pool, int new_tokens) {
  MORSERVE_CHECK(pool.block_size() == block_size_, "pool and table block sizes differ");
  return pool.AllocateInto(BlocksNeeded(new_tokens), &blocks_);
}

int KvBlockTable::Append(KvBlockPool& pool, absl::Span<const int> positions) {
  int last = positions_.empty() ? -1 : positions_.back();
  for (int p : positions) {
    MORSERVE_CHECK(p > last, "positions must be strictly increasing within a slot");
    last = p;
  }
  if (!Reserve(pool, static_cast<int>(positions.size()))) return -1;
  const int first = num_tokens();
  positions_.insert(positions_.end(), positions.begin(), positions.end());
  return first;
}

int KvBlockTable::PhysicalSlot(int index) const {
  MORSERVE_CHECK(index >= 0 && index < capacity(), "entry index outside the table");
  return blocks_[index / block_size_] * block_size_ + index % block_size_;
}

int KvBlockTable::NumVisible(int position) const {
  return static_cast<int>(std::upper_bound(positions_.begin(), positions_.end(), position) -
                          positions_.begin());
}

int KvBlockTable::IndexOf(int position) const {
  auto it = std::lower_bound(positions_.begin(), positions_.end(), position);
  return it != positions_.end() && *it == position ? static_cast<int>(it - positions_.begin()) : -1;
}

void KvBlockTable::Adopt(KvBlockPool& pool, absl::Span<const int> shared, absl::Span<const int> own,
                         std::vector<int> positions) {
  MORSERVE_CHECK(blocks_.empty() && positions_.empty(), "adopting into a table in use");
  const int n = static_cast<int>(shared.size() + own.size());
  MORSERVE_CHECK(static_cast<int>(positions.size()) <= n * block_size_ &&
                     static_cast<int>(positions.size()) > (n - 1) * block_size_,
                 "adopted blocks do not match their entries");
  for (int id : shared) pool.Share(id);
  blocks_.assign(shared.begin(), shared.end());
  blocks_.insert(blocks_.end(), own.begin(), own.end());
  positions_ = std::move(positions);
}

void KvBlockTable::ReleaseUnused(KvBlockPool& pool) {
  const int keep = CeilDiv(num_tokens(), block_size_);
  pool.Free(absl::MakeConstSpan(blocks_).subspan(keep));
  blocks_.resize(keep);
}

void KvBlockTable::FreeAll(KvBlockPool& pool) {
  pool.Free(blocks_);
  blocks_.clear();
  positions_.clear();
}

RequestKv::RequestKv(int num_cache_slots, int block_size) {
  MORSERVE_CHECK(num_cache_slots > 0, "a request needs at least one cache slot");
  slots_.assign(num_cache_slots, KvBlockTable(block_size));
}

KvBlockTable& RequestKv::slot(int s) {
  MORSERVE_CHECK(s >= 0 && s < num_slots(), "cache slot out of range");
  return slots_[s];
}

const KvBlockTable& RequestKv::slot(int s) const {
  MORSERVE_CHECK(s >= 0 && s < num_slots(), "cache slot out of range");
  return slots_[s];
}

int RequestKv::num_blocks() const {
  int n = 0;
  for (const KvBlockTable& t : slots_) n += t.num_blocks();
  return n;
}

int RequestKv::BlocksNeeded(absl::Span<const int> new_tokens_per_slot) const {
  MORSERVE_CHECK(static_cast<int>(new_tokens_per_slot.size()) == num_slots(),
                 "one token count per cache slot");
  int n = 0;
  for (int s = 0; s < num_slots(); ++s) n += slots_[s].BlocksNeeded(new_tokens_per_slot[s]);
  return n;
}

bool RequestKv::Reserve(KvBlockPool& pool, absl::Span<const int> new_tokens_per_slot) {
  if (BlocksNeeded(new_tokens_per_slot) > pool.num_free()) return false;
  for (int s = 0; s < num_slots(); ++s) {
    MORSERVE_CHECK(slots_[s].Reserve(pool, new_tokens_per_slot[s]),
                   "reservation failed after the capacity check");
  }
  return true;
}

void RequestKv::ReleaseUnused(KvBlockPool& pool) {
  for (KvBlockTable& t : slots_) t.ReleaseUnused(pool);
}

void RequestKv::FreeAll(KvBlockPool& pool) {
  for (KvBlockTable& t : slots_) t.FreeAll(pool);
}

}  // namespace morserve
