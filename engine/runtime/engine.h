// The engine: one API (Submit -> stream of events, Cancel) over one engine thread that runs
// a step after another: Schedule -> Run -> Update -> Complete (step_plan.h; vLLM v1's
// loop). Front ends (gRPC, HTTP, CLI, benchmarks) are thin adapters over it.
#pragma once

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/cpu/thread_pool.h"
#include "engine/model/weights.h"
#include "engine/runtime/depth_scheduler.h"
#include "engine/runtime/engine_config.h"
#include "engine/runtime/engine_observer.h"
#include "engine/runtime/model_executor.h"
#include "engine/runtime/request.h"
#include "engine/runtime/row_sampler.h"
#include "engine/runtime/sampler.h"
#include "engine/runtime/step_plan.h"

namespace morserve {

class PhaseClock;

// Counters since start; the benchmark and the metrics read them.
struct EngineStats {
  int64_t steps = 0;
  int64_t passes = 0;             // passes of the shared block
  int64_t pass_rows = 0;          // full rows over all passes (K/V-only rows: layer_rows)
  int64_t pass_row_capacity = 0;  // max_batch_rows per pass (fill ratio denominator)
  int64_t tokens_generated = 0;
  int64_t prompt_tokens = 0;
  int64_t preemptions = 0;
  std::vector<int64_t> rows_per_loop;   // full rows that ran loop r, by r
  std::vector<int64_t> exits_per_loop;  // tokens that left the loop after r loops, by r
  RunnerCounters layer_rows;            // layer rows the runner computed: full and K/V-only
  int kv_blocks_used = 0, kv_blocks_total = 0, max_kv_blocks_used = 0;
  int running = 0, waiting = 0;
  // Prefix cache totals (tokens looked up / found at admission, blocks evicted) and the
  // blocks it holds now (some may also be held by running requests).
  int64_t prefix_cache_queries = 0, prefix_cache_hits = 0, prefix_cache_evictions = 0;
  int prefix_cache_blocks = 0;
  StepPhaseSeconds phases;
  double fill_ratio() const {
    return pass_row_capacity ? static_cast<double>(pass_rows) / pass_row_capacity : 0.0;
  }
};

class Engine {
 public:
  static absl::StatusOr<std::unique_ptr<Engine>> Create(std::shared_ptr<const ModelWeights> weights,
                                                        const EngineConfig& config);
  ~Engine();

  // Validates and queues a request. INVALID_ARGUMENT names the field; FAILED_PRECONDITION
  // for a prompt that does not fit the context; RESOURCE_EXHAUSTED when the queue is full.
  absl::StatusOr<std::shared_ptr<EventChannel>> Submit(GenerateRequest request);
  // Cancels a queued or running request; its blocks are freed at the next step. `reason`
  // is what the final event and the metrics report (kStop when a front end matched a stop
  // string on the text and ends the request early).
  void Cancel(const std::string& request_id, FinishReason reason = FinishReason::kCancelled);

  // The engine thread. Without it, tests and benchmarks drive Step() themselves.
  void Start();
  void Stop();
  // One step; false when there was nothing to do.
  bool Step();
  // Steps until every submitted request finished (no thread running).
  void RunUntilIdle();

  EngineStats stats() const;
  // Set before Start() (nullptr: none); called from the engine thread (engine_observer.h).
  void SetObserver(EngineObserver* observer) { observer_ = observer; }
  // Iterations of the engine thread's loop, idle waits included: a watchdog that sees it
  // stand still while the thread should run knows the engine stopped stepping.
  int64_t heartbeat() const { return heartbeat_.load(std::memory_order_relaxed); }
  const ModelWeights& weights() const { return *weights_; }
  const EngineConfig& config() const { return config_; }
  const KvBlockPool& kv_pool() const { return *pool_; }
  // Tests inspect bookkeeping between steps (never while the engine thread runs).
  const DepthScheduler& scheduler() const { return *scheduler_; }
  const ModelRunner& runner() const { return *runner_; }

 private:
  Engine(std::shared_ptr<const ModelWeights> weights, const EngineConfig& config,
         std::unique_ptr<ModelRunner> runner, int num_blocks);
  absl::Status Validate(const GenerateRequest& r) const;
  void DrainIncoming();
  void FinishDropped(std::vector<Dropped>* dropped);
  void UpdateGauges();
  void RecordPass(const RunOutput& out);
  void Complete(std::vector<Row> tail, StepPhaseSeconds* t, PhaseClock* clock);
  void Finish(Sequence& seq, RequestEvent last);
  bool Emit(Sequence* seq, const Row& row, SampleResult s);
  void KeepPromptLogprob(Sequence* seq, Row& row);
  void AttachPromptLogprobs(Sequence* seq, RequestEvent* e);
  void FinishScoredPrompt(Sequence* seq);
  void NoteAdmitted(const std::vector<EnteringToken>& entering);
  void ReportStep(double start, const EngineStats& before, const StepPhaseSeconds& phases);
  void AddPhases(const StepPhaseSeconds& t);

  std::shared_ptr<const ModelWeights> weights_;
  EngineConfig config_;
  std::unique_ptr<KvBlockPool> pool_;
  std::unique_ptr<ModelRunner> runner_;
  std::unique_ptr<ModelExecutor> executor_;
  std::unique_ptr<DepthScheduler> scheduler_;
  std::unique_ptr<ThreadPool> host_pool_;  // host work over a step's rows: sampling
  std::unique_ptr<RowSampler> row_sampler_;
  std::vector<int> eos_;

  std::mutex incoming_mu_;
  std::condition_variable incoming_cv_;
  std::vector<std::unique_ptr<Sequence>> incoming_;
  std::vector<std::pair<std::string, FinishReason>> cancels_;
  uint64_t next_id_ = 1;
  int pending_ = 0;  // submitted, not yet finished (guarded by incoming_mu_)

  mutable std::mutex stats_mu_;
  EngineStats stats_;

  EngineObserver* observer_ = nullptr;
  std::atomic<int64_t> heartbeat_{0};
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// Bytes one KV block takes (K and V, fp32 on the CPU backend).
int64_t KvBlockBytes(const ModelConfig& config, int block_size);

}  // namespace morserve
