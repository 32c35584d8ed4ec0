// The depth-wise scheduler: FIFO admission, chunked prefill, rows at every loop of the
// shared block, KV reservation and preemption. Pure CPU bookkeeping (no tensors are
// computed here; rows carry their hidden state for the runner), unit-tested on its own.
//
// A step, as the engine drives it:
//   1. ScheduleEntering(): drop cancelled requests; pick tokens to enter the model
//      (continuing rows are never skipped, so the row limit counts them first; then new
//      tokens of running requests; then admission from the queue while KV blocks fit),
//      and reserve the KV entries their unique layers will write.
//   2. ReservePass() before every pass of the shared block: one entry per (row, layer) at
//      the row's loop; when blocks run out the newest running request is preempted (its
//      blocks freed, its tokens recomputed later) until the older ones fit.
//   3. CollectExits() after a pass; TakeTailRows() hands out, per request, the in-order
//      prefix of positions that have left the loop (the unique last layers need every
//      earlier position's entries first).
// Sequence-wise batching is a mode of the same object: new tokens enter only when no row
// is in the loop, and the engine runs passes until the loop is empty.
#pragma once

#include <deque>
#include <functional>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "engine/model/layer_plan.h"
#include "engine/runtime/engine_config.h"
#include "engine/runtime/kv_block_pool.h"
#include "engine/runtime/sequence.h"

namespace morserve {

struct EnteringToken {
  Sequence* seq;
  int position;
};

class DepthScheduler {
 public:
  DepthScheduler(const EngineConfig& config, const LayerPlan& plan, KvBlockPool* pool);

  // Queues a request (the engine bounds the queue before it gets here).
  void Add(std::unique_ptr<Sequence> seq);
  // Marks a request cancelled; it is dropped at the next ScheduleEntering and reported with
  // `reason`. False if unknown.
  bool Cancel(const std::string& request_id, FinishReason reason = FinishReason::kCancelled);

  std::vector<EnteringToken> ScheduleEntering();
  void ReservePass();
  void CollectExits();
  std::vector<Row> TakeTailRows();
  // Removes a finished request and frees its blocks.
  void Finish(Sequence* seq);

  // Places rows that entered: into the loop, or (when they skip it) into the pending tail.
  void AddRows(std::vector<Row> rows);
  // True when some request has rows ready for the tail.
  bool HasPendingTail() const;
  std::vector<Row>& loop_rows() { return loop_rows_; }
  const std::vector<Row>& loop_rows() const { return loop_rows_; }
  // Requests cancelled or aborted since the last call, for the engine to report; the
  // scheduler no longer references them.
  std::vector<std::unique_ptr<Sequence>> TakeDropped();

  int num_waiting() const { return static_cast<int>(waiting_.size()); }
  int num_running() const { return static_cast<int>(running_.size()); }
  int64_t num_preemptions() const { return num_preemptions_; }
  bool idle() const { return waiting_.empty() && running_.empty(); }
  const std::vector<std::unique_ptr<Sequence>>& running() const { return running_; }

  // Cache slots a token writes outside the shared block's passes (unique layers, and every
  // layer when the plan has no single looped segment), and those of loop `loop`.
  const std::vector<int>& entry_slots() const { return entry_slots_; }
  std::vector<int> LoopSlots(int loop) const;

 private:
  int Ready(const Sequence& s) const;
  bool ReserveEntry(Sequence* seq, int n, bool include_loop0);
  bool ReserveRows(Sequence* seq, const std::vector<int>& per_slot);
  Sequence* Newest();
  void Preempt(Sequence* seq);
  void Abort(Sequence* seq, absl::Status why);
  void DropCancelled();
  void Admit(int* row_budget, int* token_budget, std::vector<EnteringToken>* out);
  void RemoveRows(Sequence* seq);
  std::unique_ptr<Sequence> Detach(Sequence* seq);

  EngineConfig config_;
  LayerPlan plan_;
  KvBlockPool* pool_;
  std::vector<int> entry_slots_;
  std::deque<std::unique_ptr<Sequence>> waiting_;  // sorted by id (preempted go back in order)
  std::vector<std::unique_ptr<Sequence>> running_;  // sorted by id
  std::vector<Row> loop_rows_;
  std::vector<std::unique_ptr<Sequence>> dropped_;
  int64_t num_preemptions_ = 0;
};

}  // namespace morserve
