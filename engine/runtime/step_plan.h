// What passes between the four verbs of an engine step (docs/design.md#one-engine-step):
//   DepthScheduler::Schedule() -> StepPlan      drop, admit, reserve the pass's KV
//   ModelExecutor::Run(StepPlan&&) -> RunOutput enter, one pass of the shared block, routing
//   DepthScheduler::Update(RunOutput&&) -> rows  commit the KV the run wrote, exits, tail order
//   Engine::Complete(rows)                         tail layers, logits, sampling, events
// Every object moves forward by value: no component lends another a container it keeps.
#pragma once

#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "engine/runtime/model_runner.h"
#include "engine/runtime/sequence.h"

namespace morserve {

struct EnteringToken {
  Sequence* seq;
  int position;
};

// A request the scheduler let go without finishing it: cancelled (`reason` is the cancel
// reason, `status` OK) or failed (kError, `status` says why). It holds no blocks and no rows.
struct Dropped {
  std::unique_ptr<Sequence> seq;
  FinishReason reason = FinishReason::kCancelled;
  absl::Status status;
};

// A request preempted while the step was planned, and what needed the room.
struct Preemption {
  enum class For { kEntering, kPass };
  uint64_t id = 0;
  For what = For::kEntering;
};

// One KV entry a layer call wrote that was not yet recorded in its table: the scheduler
// appends it (Update), in the order listed (per table, increasing positions).
struct KvWrite {
  Sequence* seq = nullptr;
  int slot = 0;  // cache slot (LayerPlan::CacheSlot)
  int position = 0;
};

struct StepPlan {
  // Tokens entering the model this step, grouped by request, in position order.
  std::vector<EnteringToken> entering;
  // Rows already inside the loop, each running the next pass at its `loop` (K/V-only rows
  // included). Blocks for every entry this pass may write are reserved: these rows' loop
  // slots and loop 0 of every entering token.
  std::vector<Row> loop_rows;
  std::vector<Dropped> dropped;
  std::vector<Preemption> preempted;
  // Prefix-cache hits: partial cached blocks copied into the admitted requests' own blocks.
  // The run does them first and in this order, before any layer writes the cache (their
  // sources are not held: see DepthScheduler::StartFromCache).
  std::vector<KvCopy> kv_copies;

  bool has_work() const { return !entering.empty() || !loop_rows.empty(); }
};

struct RunOutput {
  std::vector<Row> skipped;  // entered rows that leave before the loop (exited set)
  std::vector<Row> passed;   // rows that ran the pass: loop advanced, exited set on leavers
  std::vector<Row> kv_only;  // K/V-only rows of this pass's exits, riding from the next pass
  bool ran_pass = false;
  std::vector<KvWrite> kv_writes;  // entries written by the entry layers and the pass
  double enter_seconds = 0, pass_seconds = 0;
};

}  // namespace morserve
