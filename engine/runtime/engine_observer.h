// What the engine tells an observer (the server's metrics) as it runs. Every call comes
// from the engine thread, between steps' work: implementations must be cheap and must never
// block (prometheus-cpp counters and histograms are), nor call back into the engine.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/runtime/request.h"

namespace morserve {

// Wall seconds the engine thread spent in each part of its steps (the benchmark reports
// them to show where a batching mode spends its time).
struct StepPhaseSeconds {
  double schedule = 0;  // scheduler: drain, admission, KV reservation, exits, tail order
  double enter = 0;     // embedding, layers before the loop, entry routing
  double pass = 0;      // passes of the shared block, with the routing after each
  double tail = 0;      // layers after the loop, final norm, lm_head
  double sample = 0;    // sampling and pushing events to the requests' channels
  double report = 0;    // gauges and the observer (metrics)
};

// One step's work (deltas, not totals) and the state after it.
struct StepReport {
  double duration_seconds = 0;
  int passes = 0;                       // passes of the shared block
  int pass_rows = 0;                    // rows over those passes
  int pass_row_capacity = 0;            // max_batch_rows per pass
  std::vector<int64_t> rows_per_loop;   // rows that ran loop r+1, by r
  std::vector<int64_t> exits_per_loop;  // tokens that left the model after r loops, by r
  int tokens_generated = 0;
  int prompt_tokens = 0;  // prompt positions that completed the model (recomputes included)
  int preemptions = 0;
  int running = 0, waiting = 0;
  int kv_blocks_used = 0, kv_blocks_total = 0;
  // Prefix cache (deltas in tokens, like vLLM's prefix_cache_queries/hits): prompt tokens
  // looked up and found at admission; blocks evicted; blocks cached after the step (gauge).
  int64_t prefix_cache_queries = 0, prefix_cache_hits = 0, prefix_cache_evictions = 0;
  int prefix_cache_blocks = 0;
  StepPhaseSeconds phases;  // `report` stays 0: the observer runs during it
};

class EngineObserver {
 public:
  virtual ~EngineObserver() = default;
  // A request got KV blocks for the first time, `queue_seconds` after Submit.
  virtual void OnAdmitted(double queue_seconds) {}
  // A token was sampled. `latency_seconds`: since Submit for the first token (TTFT), since
  // the previous token otherwise (inter-token latency). `loops`: its forward's loops.
  virtual void OnToken(bool first, double latency_seconds, int loops) {}
  // A request left the engine (any reason) `e2e_seconds` after Submit.
  virtual void OnFinished(FinishReason reason, double e2e_seconds, const Usage& usage) {}
  virtual void OnStep(const StepReport& report) {}
};

}  // namespace morserve
