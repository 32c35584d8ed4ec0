// The prefix cache's node tree, chain hashing and LRU eviction (see prefix_cache.h).
#include "engine/runtime/prefix_cache.h"

#include <algorithm>
#include <functional>

#include "engine/core/check.h"
#include "engine/core/mix64.h"

namespace morserve {
namespace {

uint64_t KeyHash(const std::string& key) { return Mix64(std::hash<std::string>()(key)); }

uint64_t ChainHash(uint64_t parent, absl::Span<const int> tokens) {
  uint64_t h = parent;
  for (int t : tokens) h = Mix64(h ^ static_cast<uint32_t>(t));
  return h;
}

int CeilDiv(int a, int b) { return (a + b - 1) / b; }

}  // namespace

PrefixCache::PrefixCache(int num_slots, KvBlockPool* pool)
    : num_slots_(num_slots), block_size_(pool->block_size()), pool_(pool) {
  MORSERVE_CHECK(num_slots > 0, "a prefix cache needs at least one cache slot");
  pool_->SetEvictor([this](int missing) { Evict(missing); });
}

PrefixCache::~PrefixCache() {
  pool_->SetEvictor(nullptr);
  while (!leaves_.empty()) Remove(leaves_.begin()->second);
}

int64_t PrefixCache::Find(uint64_t hash, int64_t parent, const std::string& key,
                          absl::Span<const int> tokens) const {
  auto [lo, hi] = by_hash_.equal_range(hash);
  for (auto it = lo; it != hi; ++it) {
    const Node& n = nodes_.at(it->second);
    if (n.parent != parent) continue;
    if (parent < 0 && n.key != key) continue;
    if (std::equal(n.tokens.begin(), n.tokens.end(), tokens.begin(), tokens.end())) {
      return it->second;
    }
  }
  return -1;
}

void PrefixCache::Touch(int64_t id) {
  Node& n = nodes_.at(id);
  const bool leaf = n.children == 0;
  if (leaf) leaves_.erase({n.last_used, id});
  n.last_used = ++clock_;
  if (leaf) leaves_.insert({n.last_used, id});
}

PrefixHit PrefixCache::Lookup(const std::string& key, absl::Span<const int> tokens, int limit,
                              PrefixCursor* cursor) {
  PrefixHit hit;
  hit.blocks.resize(num_slots_);
  hit.positions.resize(num_slots_);
  uint64_t h = KeyHash(key);
  int64_t parent = -1;
  limit = std::min<int>(limit, static_cast<int>(tokens.size()));
  for (int end = block_size_; end <= limit; end += block_size_) {
    const absl::Span<const int> block = tokens.subspan(end - block_size_, block_size_);
    const uint64_t next = ChainHash(h, block);
    const int64_t id = Find(next, parent, key, block);
    if (id < 0) break;
    const Node& n = nodes_.at(id);
    for (int s = 0; s < num_slots_; ++s) {
      hit.blocks[s].resize(n.first[s]);
      hit.blocks[s].insert(hit.blocks[s].end(), n.blocks[s].begin(), n.blocks[s].end());
      hit.positions[s].insert(hit.positions[s].end(), n.positions[s].begin(), n.positions[s].end());
    }
    hit.loops.insert(hit.loops.end(), n.loops.begin(), n.loops.end());
    Touch(id);
    h = next;
    parent = id;
    hit.tokens = end;
  }
  if (cursor != nullptr) *cursor = PrefixCursor{hit.tokens, parent, h};
  return hit;
}

int64_t PrefixCache::Add(uint64_t hash, int64_t parent, const std::string& key,
                         absl::Span<const int> tokens, int end, const RequestKv& kv,
                         absl::Span<const int> loops) {
  MORSERVE_CHECK(kv.num_slots() == num_slots_, "a request's cache slots differ from the cache's");
  const int64_t id = next_id_++;
  Node n;
  n.hash = hash;
  n.parent = parent;
  if (parent < 0) n.key = key;
  n.tokens.assign(tokens.begin(), tokens.end());
  n.end = end;
  n.count.resize(num_slots_);
  n.first.resize(num_slots_);
  n.blocks.resize(num_slots_);
  n.positions.resize(num_slots_);
  const Node* p = parent >= 0 ? &nodes_.at(parent) : nullptr;
  for (int s = 0; s < num_slots_; ++s) {
    const KvBlockTable& t = kv.slot(s);
    const int before = p ? p->count[s] : 0;
    const int count = t.NumVisible(end - 1);
    MORSERVE_CHECK(count >= before, "a slot holds fewer entries than its cached parent");
    n.count[s] = count;
    n.first[s] = before / block_size_;
    const absl::Span<const int> blocks = t.blocks();
    for (int b = n.first[s]; b < CeilDiv(count, block_size_); ++b) {
      pool_->Cache(blocks[b]);
      n.blocks[s].push_back(blocks[b]);
    }
    const absl::Span<const int> pos = t.positions();
    n.positions[s].assign(pos.begin() + before, pos.begin() + count);
  }
  n.loops.assign(loops.begin() + (end - block_size_), loops.begin() + end);
  n.last_used = ++clock_;
  if (p != nullptr) {
    Node& pm = nodes_.at(parent);
    if (pm.children++ == 0) leaves_.erase({pm.last_used, parent});
  }
  leaves_.insert({n.last_used, id});
  by_hash_.emplace(hash, id);
  nodes_.emplace(id, std::move(n));
  return id;
}

void PrefixCache::Insert(const std::string& key, absl::Span<const int> tokens, int done,
                         const RequestKv& kv, absl::Span<const int> loops, PrefixCursor* cursor) {
  MORSERVE_CHECK(static_cast<int>(loops.size()) >= done, "loops of every done position needed");
  PrefixCursor at = *cursor;
  if (at.end > 0 && nodes_.count(at.node) == 0) at = PrefixCursor{};  // evicted: start over
  if (at.end == 0) at.hash = KeyHash(key);
  for (int end = at.end + block_size_; end <= done; end += block_size_) {
    const absl::Span<const int> block = tokens.subspan(end - block_size_, block_size_);
    const uint64_t next = ChainHash(at.hash, block);
    int64_t id = Find(next, at.node, key, block);
    if (id < 0) {
      id = Add(next, at.node, key, block, end, kv, loops);
    } else {
      Touch(id);
    }
    at = PrefixCursor{end, id, next};
  }
  *cursor = at;
}

int PrefixCache::Remove(int64_t id) {
  auto it = nodes_.find(id);
  MORSERVE_CHECK(it != nodes_.end() && it->second.children == 0, "removing a node with children");
  Node& n = it->second;
  int freed = 0;
  for (const std::vector<int>& blocks : n.blocks) {
    for (int b : blocks) freed += pool_->Uncache(b) ? 1 : 0;
  }
  leaves_.erase({n.last_used, id});
  auto [lo, hi] = by_hash_.equal_range(n.hash);
  for (auto h = lo; h != hi; ++h) {
    if (h->second == id) {
      by_hash_.erase(h);
      break;
    }
  }
  if (n.parent >= 0) {
    Node& p = nodes_.at(n.parent);
    if (--p.children == 0) leaves_.insert({p.last_used, n.parent});
  }
  nodes_.erase(it);
  return freed;
}

int PrefixCache::Evict(int missing) {
  int freed = 0;
  while (freed < missing && !leaves_.empty()) freed += Remove(leaves_.begin()->second);
  evicted_blocks_ += freed;
  return freed;
}

}  // namespace morserve
