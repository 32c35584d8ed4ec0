// The depth-wise scheduler: FIFO admission, chunked prefill, rows at every loop of the
// shared block, KV reservation and preemption. Pure CPU bookkeeping (no tensors are
// computed here; rows carry their hidden state for the runner), unit-tested on its own.
// It alone changes requests' KV bookkeeping (reserve, append, free).
//
// Its two verbs in a step (step_plan.h):
//   Schedule(): drop cancelled requests; pick tokens to enter the model (continuing rows
//     are never skipped, so the row limit counts them first; then new tokens of running
//     requests; then admission from the queue while KV blocks fit); reserve the entries
//     their unique layers will write and the entries of the pass (one per row and layer at
//     the row's loop, loop 0 for entering tokens): when blocks run out the newest running
//     request is preempted (blocks freed, tokens recomputed later) until the older ones
//     fit. The loop's rows move into the plan. K/V-only rows (early exit, exit_kv
//     propagate) take no row of the limit: an exit frees its row at once, and the rows
//     that write its later K/V cost a projection each, not a layer.
//   With the prefix cache on, Schedule() first caches the full blocks running requests have
//   completed, and admission starts a request from the longest cached prefix of its tokens
//   (prefix_cache.h): shared full blocks, and copies of partial ones in the plan.
//   Update(): records the entries the run wrote; rows that left go to their request's
//     pending tail, the others back into the loop; hands out, per request, the in-order
//     prefix of positions that have left the loop (the unique last layers need every
//     earlier position's entries first), with the entries those layers will write recorded.
// Sequence-wise batching is a mode of the same object: new tokens enter only when no row
// is in the loop, the engine repeats Schedule/Run/Update until the loop is empty, and the
// tail is handed out only then.
#pragma once

#include <deque>
#include <functional>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "engine/model/layer_plan.h"
#include "engine/runtime/engine_config.h"
#include "engine/runtime/kv_block_pool.h"
#include "engine/runtime/prefix_cache.h"
#include "engine/runtime/sequence.h"
#include "engine/runtime/step_plan.h"

namespace morserve {

class DepthScheduler {
 public:
  // `pool` must outlive the scheduler (its prefix cache gives the cached blocks back).
  DepthScheduler(const EngineConfig& config, const LayerPlan& plan, KvBlockPool* pool);

  // Queues a request (the engine bounds the queue before it gets here).
  void Add(std::unique_ptr<Sequence> seq);
  // Marks a request cancelled; it is dropped at the next Schedule() and reported with
  // `reason`. False if unknown.
  bool Cancel(const std::string& request_id, FinishReason reason = FinishReason::kCancelled);

  StepPlan Schedule();
  // Takes the rows back after the run; returns the rows ready for the tail, in order.
  std::vector<Row> Update(RunOutput&& out);
  // Removes a request the engine finished and frees its blocks.
  void Release(Sequence* seq);

  // True when some request has rows ready for the tail.
  bool HasPendingTail() const;
  // Rows inside the loop between steps (tests inspect them).
  const std::vector<Row>& loop_rows() const { return loop_rows_; }

  int num_waiting() const { return static_cast<int>(waiting_.size()); }
  int num_running() const { return static_cast<int>(running_.size()); }
  int64_t num_preemptions() const { return num_preemptions_; }
  bool idle() const { return waiting_.empty() && running_.empty(); }
  // Prefix cache: tokens of admitted requests looked up and found (vLLM's queries and hits),
  // and the cache itself (nullptr when EngineConfig::prefix_cache is off).
  int64_t prefix_queries() const { return prefix_queries_; }
  int64_t prefix_hits() const { return prefix_hits_; }
  const PrefixCache* prefix_cache() const { return cache_.get(); }
  const std::vector<std::unique_ptr<Sequence>>& running() const { return running_; }

  // Cache slots a token writes outside the shared block's passes (unique layers, and every
  // layer when the plan has no single looped segment), and those of loop `loop`.
  const std::vector<int>& entry_slots() const { return entry_slots_; }
  std::vector<int> LoopSlots(int loop) const;

 private:
  int Ready(const Sequence& s) const;
  bool ReserveEntry(Sequence* seq, int n);
  bool ReserveRows(Sequence* seq, const std::vector<int>& per_slot);
  Sequence* Newest();
  void Preempt(Sequence* seq, Preemption::For what);
  void Abort(Sequence* seq, absl::Status why);
  void DropCancelled();
  void ScheduleEntering();
  void ReservePass();
  void Admit(int* row_budget, int* token_budget);
  void Commit(const std::vector<KvWrite>& writes);
  // Prefix cache: the last position before which every entry of `seq` is written.
  int CachedUpTo(const Sequence& seq) const;
  void CacheDone(Sequence* seq, int up_to);
  void CacheAllDone();
  PrefixHit LookUp(Sequence& seq);
  int StartCost(const Sequence& seq, const PrefixHit& hit, const std::vector<int>& need) const;
  void StartFromCache(Sequence* seq, PrefixHit hit);
  std::vector<Row> TakeTailRows();
  void RemoveRows(Sequence* seq);
  std::unique_ptr<Sequence> Detach(Sequence* seq);

  EngineConfig config_;
  LayerPlan plan_;
  KvBlockPool* pool_;
  std::vector<int> entry_slots_;
  std::vector<int> tail_slots_;                     // entry slots of the segments after the loop
  std::deque<std::unique_ptr<Sequence>> waiting_;   // sorted by id (preempted go back in order)
  std::vector<std::unique_ptr<Sequence>> running_;  // sorted by id
  std::vector<Row> loop_rows_;
  StepPlan plan_out_;  // the plan Schedule() is building
  int64_t num_preemptions_ = 0;
  std::unique_ptr<PrefixCache> cache_;
  std::vector<std::pair<Sequence*, KvCopy>> copies_;  // this plan's, by request
  int64_t prefix_queries_ = 0, prefix_hits_ = 0;
};

}  // namespace morserve
