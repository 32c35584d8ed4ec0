// Depth-wise scheduler (see depth_scheduler.h).
#include "engine/runtime/depth_scheduler.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "engine/core/check.h"

namespace morserve {
namespace {

// Keeps a container of unique_ptr<Sequence> sorted by id.
template <typename C>
void InsertById(C* c, std::unique_ptr<Sequence> s) {
  auto it = std::upper_bound(c->begin(), c->end(), s->id,
                             [](uint64_t id, const auto& p) { return id < p->id; });
  c->insert(it, std::move(s));
}

}  // namespace

DepthScheduler::DepthScheduler(const EngineConfig& config, const LayerPlan& plan, KvBlockPool* pool)
    : config_(config), plan_(plan), pool_(pool) {
  for (int s = 0; s < static_cast<int>(plan_.segments.size()); ++s) {
    if (s == plan_.looped_segment) continue;
    const Segment& seg = plan_.segments[s];
    for (int r = 0; r < seg.loops; ++r) {
      if (!plan_.WritesKv(s, r)) continue;
      for (int k = 0; k < seg.num_layers; ++k) {
        entry_slots_.push_back(plan_.CacheSlot(s, r, k));
        if (plan_.looped_segment >= 0 && s > plan_.looped_segment) {
          tail_slots_.push_back(plan_.CacheSlot(s, r, k));
        }
      }
    }
  }
  if (config_.prefix_cache) cache_ = std::make_unique<PrefixCache>(plan_.num_cache_slots, pool_);
}

std::vector<int> DepthScheduler::LoopSlots(int loop) const {
  std::vector<int> slots;
  const int s = plan_.looped_segment;
  if (s < 0 || !plan_.WritesKv(s, loop)) return slots;
  for (int k = 0; k < plan_.segments[s].num_layers; ++k)
    slots.push_back(plan_.CacheSlot(s, loop, k));
  return slots;
}

// The prefix cache namespace: what besides the tokens decides the KV a prefix leaves.
// What a request's prompt KV depends on besides its tokens: the salt, the exit threshold, and
// Huginn's num_steps and initial state (its scale and, when not zeros, the seed it is drawn
// from; Engine::Submit resolves a looped.json init_scale into the request).
std::string CacheKey(const Sequence& seq) {
  const GenerateRequest& r = seq.request;
  std::string key = r.cache_salt;
  key.push_back('\0');
  auto add_float = [&](const char* tag, float v) {
    uint32_t bits = 0;
    std::memcpy(&bits, &v, sizeof(bits));
    key += tag + std::to_string(bits);
  };
  if (r.exit_threshold) add_float("", *r.exit_threshold);
  if (r.num_steps) key += "/steps" + std::to_string(*r.num_steps);
  if (r.init_scale && *r.init_scale != 0.0f) {
    add_float("/init", *r.init_scale);
    key += "/seed" + std::to_string(seq.seed);
  }
  return key;
}

void DepthScheduler::Add(std::unique_ptr<Sequence> seq) {
  seq->kv = std::make_unique<RequestKv>(plan_.num_cache_slots, pool_->block_size());
  seq->cache_key = CacheKey(*seq);
  InsertById(&waiting_, std::move(seq));
}

bool DepthScheduler::Cancel(const std::string& request_id, FinishReason reason) {
  auto mark = [&](Sequence* s) {
    s->cancelled = true;
    s->cancel_reason = reason;
    return true;
  };
  for (auto& s : running_) {
    if (s->request.request_id == request_id) return mark(s.get());
  }
  for (auto& s : waiting_) {
    if (s->request.request_id == request_id) return mark(s.get());
  }
  return false;
}

int DepthScheduler::Ready(const Sequence& s) const {
  const int unentered = static_cast<int>(s.tokens.size()) - s.num_entered;
  if (!s.serial_generated) return unentered;
  if (s.num_entered < s.num_prompt) return s.num_prompt - s.num_entered;  // prompt chunks
  return s.num_done == s.num_entered ? std::min(unentered, 1) : 0;
}

bool DepthScheduler::ReserveRows(Sequence* seq, const std::vector<int>& per_slot) {
  return seq->kv->Reserve(*pool_, per_slot);
}

// Reserves the entries n new tokens write outside the loop (loop 0's: ReservePass).
// Every entered token writes each entry slot once, but the slots after the loop are
// written only when the token leaves it: room is made for all entered tokens, not only
// for entries already written.
bool DepthScheduler::ReserveEntry(Sequence* seq, int n) {
  std::vector<int> per_slot(plan_.num_cache_slots, 0);
  for (int slot : entry_slots_) {
    per_slot[slot] += seq->num_entered + n - seq->kv->slot(slot).num_tokens();
  }
  return ReserveRows(seq, per_slot);
}

Sequence* DepthScheduler::Newest() { return running_.empty() ? nullptr : running_.back().get(); }

// Forgets every row and every entering token of `seq` in the plan being built.
void DepthScheduler::RemoveRows(Sequence* seq) {
  loop_rows_.erase(std::remove_if(loop_rows_.begin(), loop_rows_.end(),
                                  [&](const Row& r) { return r.seq == seq; }),
                   loop_rows_.end());
  std::vector<EnteringToken>& entering = plan_out_.entering;
  entering.erase(std::remove_if(entering.begin(), entering.end(),
                                [&](const EnteringToken& t) { return t.seq == seq; }),
                 entering.end());
  copies_.erase(
      std::remove_if(copies_.begin(), copies_.end(), [&](const auto& c) { return c.first == seq; }),
      copies_.end());
  seq->rows_in_loop = 0;
  seq->pending_tail.clear();
}

std::unique_ptr<Sequence> DepthScheduler::Detach(Sequence* seq) {
  for (auto it = running_.begin(); it != running_.end(); ++it) {
    if (it->get() == seq) {
      std::unique_ptr<Sequence> out = std::move(*it);
      running_.erase(it);
      return out;
    }
  }
  return nullptr;
}

// Recompute later: blocks back to the pool, progress forgotten, tokens kept.
void DepthScheduler::Preempt(Sequence* seq, Preemption::For what) {
  plan_out_.preempted.push_back({seq->id, what});
  CacheDone(seq, CachedUpTo(*seq));  // its recompute may then start from the cache
  RemoveRows(seq);
  seq->kv->FreeAll(*pool_);
  seq->num_entered = seq->num_done = 0;
  seq->running = false;
  seq->token_loops.clear();
  seq->cache_cursor = PrefixCursor{};
  ++seq->usage.preemptions;
  ++num_preemptions_;
  InsertById(&waiting_, Detach(seq));
}

void DepthScheduler::Abort(Sequence* seq, absl::Status why) {
  RemoveRows(seq);
  seq->kv->FreeAll(*pool_);
  plan_out_.dropped.push_back({Detach(seq), FinishReason::kError, std::move(why)});
}

void DepthScheduler::DropCancelled() {
  std::vector<Sequence*> cancelled;
  for (auto& s : running_) {
    if (s->cancelled) cancelled.push_back(s.get());
  }
  for (Sequence* s : cancelled) {
    RemoveRows(s);
    s->kv->FreeAll(*pool_);
    plan_out_.dropped.push_back({Detach(s), s->cancel_reason, absl::OkStatus()});
  }
  for (auto it = waiting_.begin(); it != waiting_.end();) {
    if ((*it)->cancelled) {
      const FinishReason reason = (*it)->cancel_reason;
      plan_out_.dropped.push_back({std::move(*it), reason, absl::OkStatus()});
      it = waiting_.erase(it);
    } else {
      ++it;
    }
  }
}

void DepthScheduler::Admit(int* row_budget, int* token_budget) {
  const int watermark = std::max(1, pool_->num_blocks() / 100);
  while (!waiting_.empty() && static_cast<int>(running_.size()) < config_.max_running &&
         *row_budget > 0 && *token_budget > 0) {
    Sequence* seq = waiting_.front().get();
    PrefixHit hit = LookUp(*seq);
    const int take = std::min({Ready(*seq) - hit.tokens, *row_budget, *token_budget});
    std::vector<int> need(plan_.num_cache_slots, 0);
    for (int slot : entry_slots_) need[slot] += take;
    for (int slot : LoopSlots(0)) need[slot] += take;
    // A request that cannot fit even in an empty pool would wait forever: fail it.
    if (seq->kv->BlocksNeeded(need) > pool_->num_blocks() - watermark && running_.empty()) {
      std::unique_ptr<Sequence> s = std::move(waiting_.front());
      waiting_.pop_front();
      running_.push_back(std::move(s));
      Abort(seq, absl::ResourceExhaustedError("the KV cache is too small for this prompt chunk"));
      continue;
    }
    // Checked before anything moves: a request that waits leaves the cache as it was.
    if (StartCost(*seq, hit, need) > pool_->num_free() - watermark) break;  // FIFO: no skipping
    if (hit.tokens > 0) StartFromCache(seq, std::move(hit));
    if (cache_ && seq->num_prompt > 0) {
      prefix_queries_ += static_cast<int64_t>(seq->tokens.size());
      prefix_hits_ += seq->num_done;
    }
    std::unique_ptr<Sequence> s = std::move(waiting_.front());
    waiting_.pop_front();
    s->running = true;
    InsertById(&running_, std::move(s));
    if (!ReserveEntry(seq, take)) break;  // cannot happen: checked
    for (int i = 0; i < take; ++i) plan_out_.entering.push_back({seq, seq->num_entered + i});
    seq->num_entered += take;
    *row_budget -= take;
    *token_budget -= take;
  }
}

StepPlan DepthScheduler::Schedule() {
  plan_out_ = StepPlan();
  DropCancelled();
  CacheAllDone();
  ScheduleEntering();
  ReservePass();
  plan_out_.loop_rows = std::move(loop_rows_);
  loop_rows_.clear();
  for (auto& [seq, copy] : copies_) plan_out_.kv_copies.push_back(copy);
  copies_.clear();
  return std::move(plan_out_);
}

int DepthScheduler::CachedUpTo(const Sequence& seq) const {
  // A K/V-only row (early exit, exit_kv propagate) may still owe later loops' entries of a
  // position that completed the model.
  int up_to = seq.num_done;
  for (const Row& r : loop_rows_) {
    if (r.seq == &seq) up_to = std::min(up_to, r.position);
  }
  return up_to;
}

void DepthScheduler::CacheDone(Sequence* seq, int up_to) {
  // In adaptive mode a generated token's entries depend on its being generated (it may exit
  // and copy its entries); another request would run the same token as a prompt token at
  // full depth. Only prompt positions are shared.
  if (seq->adaptive_loops) up_to = std::min(up_to, seq->num_prompt);
  if (!cache_ || up_to < seq->cache_cursor.end + pool_->block_size()) return;
  // Started from the cache in this Schedule: its copied entries exist only once the run made
  // the copies (a request preempted before that caches nothing; its prefix was cached anyway).
  for (const auto& c : copies_) {
    if (c.first == seq) return;
  }
  cache_->Insert(seq->cache_key, seq->tokens, up_to, *seq->kv, seq->token_loops,
                 &seq->cache_cursor);
}

void DepthScheduler::CacheAllDone() {
  if (!cache_) return;
  std::map<const Sequence*, int> up_to;
  for (auto& s : running_) up_to[s.get()] = s->num_done;
  for (const Row& r : loop_rows_) {
    int& u = up_to[r.seq];
    u = std::min(u, r.position);
  }
  for (auto& s : running_) CacheDone(s.get(), up_to[s.get()]);
}

// The longest cached prefix a request that has entered nothing may start from: all its tokens
// but the last (whose logits are sampled). Requests that score their prompt need every prompt
// position's row and compute them all.
PrefixHit DepthScheduler::LookUp(Sequence& seq) {
  if (!cache_ || seq.num_entered > 0 || seq.request.params.prompt_logprobs) return {};
  const int limit = static_cast<int>(seq.tokens.size()) - 1;
  return cache_->Lookup(seq.cache_key, seq.tokens, limit);
}

// Blocks that starting from `hit` takes out of the free count: cached blocks no table holds
// yet (held from now on), a copy target per partial block, and the blocks the tables then
// need for `need` more entries per slot.
int DepthScheduler::StartCost(const Sequence& seq, const PrefixHit& hit,
                              const std::vector<int>& need) const {
  if (hit.tokens == 0) return seq.kv->BlocksNeeded(need);
  const int bs = pool_->block_size();
  int cost = 0;
  for (int slot = 0; slot < plan_.num_cache_slots; ++slot) {
    for (int b : hit.blocks[slot]) cost += pool_->refs(b) == 0 ? 1 : 0;
    const int n = static_cast<int>(hit.positions[slot].size());
    const int have = (n + bs - 1) / bs;
    if (n % bs != 0) ++cost;
    cost += std::max(0, (n + need[slot] + bs - 1) / bs - have);
  }
  return cost;
}

// Starts a request from a cached prefix. Full blocks are shared; a partial one is copied into
// a block of its own by the plan's run. The source needs no hold: the run makes its copies, in
// the order they were planned, before any layer writes, and a source evicted later in this
// Schedule can only be written by that run or by a copy planned after its own.
void DepthScheduler::StartFromCache(Sequence* seq, PrefixHit hit) {
  const int bs = pool_->block_size();
  std::vector<int> held;  // every hit block, held while copy targets are allocated (may evict)
  int partial = 0;
  for (int slot = 0; slot < plan_.num_cache_slots; ++slot) {
    for (int b : hit.blocks[slot]) {
      pool_->Share(b);
      held.push_back(b);
    }
    partial += hit.positions[slot].size() % bs != 0 ? 1 : 0;
  }
  std::vector<int> targets;
  MORSERVE_CHECK(pool_->AllocateInto(partial, &targets), "copy targets after the cost check");
  int next = 0;
  for (int slot = 0; slot < plan_.num_cache_slots; ++slot) {
    std::vector<int>& blocks = hit.blocks[slot];
    const int n = static_cast<int>(hit.positions[slot].size());
    if (n % bs == 0) {
      seq->kv->slot(slot).Adopt(*pool_, blocks, {}, std::move(hit.positions[slot]));
      continue;
    }
    const int target = targets[next++];
    copies_.push_back({seq, KvCopy{blocks.back() * bs, target * bs, n % bs}});
    seq->kv->slot(slot).Adopt(*pool_, absl::MakeConstSpan(blocks).first(blocks.size() - 1),
                              {target}, std::move(hit.positions[slot]));
  }
  pool_->Free(held);
  seq->num_entered = seq->num_done = hit.tokens;
  seq->token_loops = std::move(hit.loops);
  seq->usage.cached_tokens = std::min(hit.tokens, seq->num_prompt);
  seq->usage.recursion_loops +=
      std::accumulate(seq->token_loops.begin(), seq->token_loops.end(), int64_t{0});
}

void DepthScheduler::ScheduleEntering() {
  const bool loop_busy = !loop_rows_.empty();
  if (config_.mode == BatchingMode::kSequenceWise && loop_busy) return;
  int row_budget = config_.max_batch_rows;
  for (const Row& r : loop_rows_) row_budget -= r.kv_only ? 0 : 1;
  int token_budget = config_.max_step_tokens;
  // New tokens of running requests, oldest first; make room by preempting newer requests.
  for (size_t i = 0; i < running_.size() && row_budget > 0 && token_budget > 0; ++i) {
    Sequence* seq = running_[i].get();
    const int take = std::min({Ready(*seq), row_budget, token_budget});
    if (take == 0) continue;
    bool ok = ReserveEntry(seq, take);
    while (!ok && Newest() != seq) {
      Preempt(Newest(), Preemption::For::kEntering);
      ok = ReserveEntry(seq, take);
    }
    if (!ok) {
      // Alone, every block not its own is free: nothing will ever make room (as in ReservePass).
      if (running_.size() == 1) {
        Abort(seq,
              absl::ResourceExhaustedError("the KV cache is too small for this request's context"));
      }
      continue;  // else this request is the newest: it waits for older ones to free blocks
    }
    for (int t = 0; t < take; ++t) plan_out_.entering.push_back({seq, seq->num_entered + t});
    seq->num_entered += take;
    row_budget -= take;
    token_budget -= take;
  }
  Admit(&row_budget, &token_budget);
}

// Entries of the pass: each loop row's slots at its loop, and loop 0 for every entering
// token (whether the entry routing sends it into the loop is known only after it entered;
// Update returns the room of a token the router sends past the loop).
void DepthScheduler::ReservePass() {
  for (;;) {
    // Entries per (sequence, slot) this pass writes; oldest sequences reserve first.
    std::map<Sequence*, std::vector<int>> need;
    auto add = [&](Sequence* seq, int loop) {
      std::vector<int>& v = need[seq];
      if (v.empty()) v.assign(plan_.num_cache_slots, 0);
      for (int slot : LoopSlots(loop)) ++v[slot];
    };
    for (const Row& r : loop_rows_) add(r.seq, r.loop);
    if (plan_.looped_segment >= 0) {
      for (const EnteringToken& t : plan_out_.entering) add(t.seq, 0);
    }
    std::vector<Sequence*> order;
    for (auto& [seq, v] : need) order.push_back(seq);
    std::sort(order.begin(), order.end(), [](Sequence* a, Sequence* b) { return a->id < b->id; });
    Sequence* failed = nullptr;
    for (Sequence* seq : order) {
      if (!ReserveRows(seq, need[seq])) {
        failed = seq;
        break;
      }
    }
    if (failed == nullptr) return;
    if (running_.size() == 1) {
      Abort(failed,
            absl::ResourceExhaustedError("the KV cache is too small for this request's context"));
    } else {
      Preempt(Newest(), Preemption::For::kPass);
    }
  }
}

// Records the entries a run wrote: its tables then hold them, in position order.
void DepthScheduler::Commit(const std::vector<KvWrite>& writes) {
  for (const KvWrite& w : writes) {
    const int index = w.seq->kv->slot(w.slot).Append(*pool_, {w.position});
    MORSERVE_CHECK(index >= 0, "a KV entry was written without a reservation");
  }
}

std::vector<Row> DepthScheduler::Update(RunOutput&& out) {
  Commit(out.kv_writes);
  auto to_tail = [](Row&& r) {
    Sequence* seq = r.seq;
    const int pos = r.position;
    seq->pending_tail.emplace(pos, std::move(r));
  };
  for (Row& r : out.skipped) {
    // Routed past the loop at entry: loop 0's room reserved for it goes back to the pool.
    for (int slot : LoopSlots(0)) r.seq->kv->slot(slot).ReleaseUnused(*pool_);
    to_tail(std::move(r));
  }
  for (Row& r : out.passed) {
    if (r.exited && r.kv_only) continue;  // its last later-loop entries are written: gone
    if (r.exited) {
      to_tail(std::move(r));
    } else {
      loop_rows_.push_back(std::move(r));
    }
  }
  for (Row& r : out.kv_only) loop_rows_.push_back(std::move(r));
  for (auto& s : running_) s->rows_in_loop = 0;
  for (const Row& r : loop_rows_) r.seq->rows_in_loop += r.kv_only ? 0 : 1;
  // Sequence-wise: the tail runs once the loop is empty, over every row that left it.
  if (config_.mode == BatchingMode::kSequenceWise && !loop_rows_.empty()) return {};
  return TakeTailRows();
}

std::vector<Row> DepthScheduler::TakeTailRows() {
  std::vector<Row> out;
  for (auto& s : running_) {
    auto& pending = s->pending_tail;
    while (!pending.empty() && pending.begin()->first == s->num_done) {
      // The entries the layers after the loop write: recorded before they run (unless a
      // Huginn exit check of this token wrote and recorded them already).
      for (int slot : tail_slots_) {
        KvBlockTable& table = s->kv->slot(slot);
        if (table.IndexOf(s->num_done) >= 0) continue;
        MORSERVE_CHECK(table.Append(*pool_, {s->num_done}) >= 0,
                       "a KV entry of the layers after the loop was not reserved");
      }
      s->token_loops.resize(s->num_done + 1);
      s->token_loops[s->num_done] = pending.begin()->second.loop;
      out.push_back(std::move(pending.begin()->second));
      pending.erase(pending.begin());
      ++s->num_done;
    }
  }
  return out;
}

void DepthScheduler::Release(Sequence* seq) {
  CacheDone(seq, CachedUpTo(*seq));
  RemoveRows(seq);
  seq->kv->FreeAll(*pool_);
  Detach(seq);  // the engine holds no other reference; destroyed here
}

bool DepthScheduler::HasPendingTail() const {
  for (const auto& s : running_) {
    if (!s->pending_tail.empty() && s->pending_tail.begin()->first == s->num_done) return true;
  }
  return false;
}

}  // namespace morserve
