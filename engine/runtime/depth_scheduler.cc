// Depth-wise scheduler (see depth_scheduler.h).
#include "engine/runtime/depth_scheduler.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

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

DepthScheduler::DepthScheduler(const EngineConfig& config, const LayerPlan& plan,
                               KvBlockPool* pool)
    : config_(config), plan_(plan), pool_(pool) {
  for (int s = 0; s < static_cast<int>(plan_.segments.size()); ++s) {
    if (s == plan_.looped_segment) continue;
    const Segment& seg = plan_.segments[s];
    for (int r = 0; r < seg.loops; ++r) {
      if (!plan_.WritesKv(s, r)) continue;
      for (int k = 0; k < seg.num_layers; ++k) entry_slots_.push_back(plan_.CacheSlot(s, r, k));
    }
  }
}

std::vector<int> DepthScheduler::LoopSlots(int loop) const {
  std::vector<int> slots;
  const int s = plan_.looped_segment;
  if (s < 0 || !plan_.WritesKv(s, loop)) return slots;
  for (int k = 0; k < plan_.segments[s].num_layers; ++k) slots.push_back(plan_.CacheSlot(s, loop, k));
  return slots;
}

void DepthScheduler::Add(std::unique_ptr<Sequence> seq) {
  seq->kv = std::make_unique<RequestKv>(plan_.num_cache_slots, pool_->block_size());
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
  return static_cast<int>(s.tokens.size()) - s.num_entered;
}

bool DepthScheduler::ReserveRows(Sequence* seq, const std::vector<int>& per_slot) {
  return seq->kv->Reserve(*pool_, per_slot);
}

// Reserves the entries n new tokens write outside the loop (and at loop 0 when asked).
// Every entered token writes each entry slot once, but the slots after the loop are
// written only when the token leaves it: room is made for all entered tokens, not only
// for entries already written.
bool DepthScheduler::ReserveEntry(Sequence* seq, int n, bool include_loop0) {
  std::vector<int> per_slot(plan_.num_cache_slots, 0);
  for (int slot : entry_slots_) {
    per_slot[slot] += seq->num_entered + n - seq->kv->slot(slot).num_tokens();
  }
  if (include_loop0) {
    for (int slot : LoopSlots(0)) per_slot[slot] += n;
  }
  return ReserveRows(seq, per_slot);
}

Sequence* DepthScheduler::Newest() { return running_.empty() ? nullptr : running_.back().get(); }

void DepthScheduler::RemoveRows(Sequence* seq) {
  loop_rows_.erase(std::remove_if(loop_rows_.begin(), loop_rows_.end(),
                                  [&](const Row& r) { return r.seq == seq; }),
                   loop_rows_.end());
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
void DepthScheduler::Preempt(Sequence* seq) {
  RemoveRows(seq);
  seq->kv->FreeAll(*pool_);
  seq->num_entered = seq->num_done = 0;
  seq->running = false;
  seq->token_loops.clear();
  ++seq->usage.preemptions;
  ++num_preemptions_;
  InsertById(&waiting_, Detach(seq));
}

void DepthScheduler::Abort(Sequence* seq, absl::Status why) {
  RemoveRows(seq);
  seq->kv->FreeAll(*pool_);
  seq->usage.prompt_tokens = seq->num_prompt;
  std::unique_ptr<Sequence> s = Detach(seq);
  RequestEvent e;
  e.finish = FinishReason::kError;
  e.error = std::move(why);
  s->channel->Push(std::move(e));
  dropped_.push_back(std::move(s));
}

void DepthScheduler::DropCancelled() {
  std::vector<Sequence*> cancelled;
  for (auto& s : running_) {
    if (s->cancelled) cancelled.push_back(s.get());
  }
  for (Sequence* s : cancelled) {
    RemoveRows(s);
    s->kv->FreeAll(*pool_);
    dropped_.push_back(Detach(s));
  }
  for (auto it = waiting_.begin(); it != waiting_.end();) {
    if ((*it)->cancelled) {
      dropped_.push_back(std::move(*it));
      it = waiting_.erase(it);
    } else {
      ++it;
    }
  }
}

void DepthScheduler::Admit(int* row_budget, int* token_budget, std::vector<EnteringToken>* out) {
  const int watermark = std::max(1, pool_->num_blocks() / 100);
  while (!waiting_.empty() && static_cast<int>(running_.size()) < config_.max_running &&
         *row_budget > 0 && *token_budget > 0) {
    Sequence* seq = waiting_.front().get();
    const int take = std::min({Ready(*seq), *row_budget, *token_budget});
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
    if (seq->kv->BlocksNeeded(need) > pool_->num_free() - watermark) break;  // FIFO: no skipping
    std::unique_ptr<Sequence> s = std::move(waiting_.front());
    waiting_.pop_front();
    s->running = true;
    InsertById(&running_, std::move(s));
    if (!ReserveEntry(seq, take, /*include_loop0=*/false)) break;  // cannot happen: checked
    for (int i = 0; i < take; ++i) out->push_back({seq, seq->num_entered + i});
    seq->num_entered += take;
    *row_budget -= take;
    *token_budget -= take;
  }
}

std::vector<EnteringToken> DepthScheduler::ScheduleEntering() {
  DropCancelled();
  std::vector<EnteringToken> out;
  const bool loop_busy = !loop_rows_.empty();
  if (config_.mode == BatchingMode::kSequenceWise && loop_busy) return out;
  int row_budget = config_.max_batch_rows - static_cast<int>(loop_rows_.size());
  int token_budget = config_.max_step_tokens;
  // New tokens of running requests, oldest first; make room by preempting newer requests.
  for (size_t i = 0; i < running_.size() && row_budget > 0 && token_budget > 0; ++i) {
    Sequence* seq = running_[i].get();
    const int take = std::min({Ready(*seq), row_budget, token_budget});
    if (take == 0) continue;
    bool ok = ReserveEntry(seq, take, false);
    while (!ok && Newest() != seq) {
      Preempt(Newest());
      ok = ReserveEntry(seq, take, false);
    }
    if (!ok) {
      // Alone, every block not its own is free: nothing will ever make room (as in ReservePass).
      if (running_.size() == 1) {
        Abort(seq, absl::ResourceExhaustedError(
                       "the KV cache is too small for this request's context"));
      }
      continue;  // else this request is the newest: it waits for older ones to free blocks
    }
    for (int t = 0; t < take; ++t) out.push_back({seq, seq->num_entered + t});
    seq->num_entered += take;
    row_budget -= take;
    token_budget -= take;
  }
  Admit(&row_budget, &token_budget, &out);
  return out;
}

void DepthScheduler::ReservePass() {
  for (;;) {
    // Entries per (sequence, slot) this pass writes; oldest sequences reserve first.
    std::map<Sequence*, std::vector<int>> need;
    for (const Row& r : loop_rows_) {
      std::vector<int>& v = need[r.seq];
      if (v.empty()) v.assign(plan_.num_cache_slots, 0);
      for (int slot : LoopSlots(r.loop)) ++v[slot];
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
      Abort(failed, absl::ResourceExhaustedError(
                        "the KV cache is too small for this request's context"));
    } else {
      Preempt(Newest());
    }
  }
}

void DepthScheduler::CollectExits() {
  auto keep = loop_rows_.begin();
  for (auto it = loop_rows_.begin(); it != loop_rows_.end(); ++it) {
    if (it->exited && it->kv_only) {
      continue;  // its last later-loop entries are written: gone
    } else if (it->exited) {
      --it->seq->rows_in_loop;
      const int pos = it->position;
      it->seq->pending_tail.emplace(pos, std::move(*it));
    } else {
      if (keep != it) *keep = std::move(*it);
      ++keep;
    }
  }
  loop_rows_.erase(keep, loop_rows_.end());
}

std::vector<Row> DepthScheduler::TakeTailRows() {
  std::vector<Row> out;
  for (auto& s : running_) {
    auto& pending = s->pending_tail;
    while (!pending.empty() && pending.begin()->first == s->num_done) {
      out.push_back(std::move(pending.begin()->second));
      pending.erase(pending.begin());
      ++s->num_done;
    }
  }
  return out;
}

void DepthScheduler::Finish(Sequence* seq) {
  RemoveRows(seq);
  seq->kv->FreeAll(*pool_);
  Detach(seq);  // the engine holds no other reference; destroyed here
}

std::vector<std::unique_ptr<Sequence>> DepthScheduler::TakeDropped() {
  std::vector<std::unique_ptr<Sequence>> out;
  out.swap(dropped_);
  return out;
}

void DepthScheduler::AddRows(std::vector<Row> rows) {
  for (Row& r : rows) {
    if (r.exited) {
      const int pos = r.position;
      r.seq->pending_tail.emplace(pos, std::move(r));
    } else {
      ++r.seq->rows_in_loop;
      loop_rows_.push_back(std::move(r));
    }
  }
}

bool DepthScheduler::HasPendingTail() const {
  for (const auto& s : running_) {
    if (!s->pending_tail.empty() && s->pending_tail.begin()->first == s->num_done) return true;
  }
  return false;
}

}  // namespace morserve
