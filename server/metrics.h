// Prometheus metrics of the server (prometheus-cpp, text exposition on /metrics of their
// own port). Names follow Prometheus conventions: `morserve_` prefix, base units in the name
// (`_seconds`), counters end in `_total`. The engine feeds it through EngineObserver (on the
// engine thread: every update here is a lock-free atomic or a histogram observe); the gRPC
// layer reports rejections and open streams.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/runtime/engine_observer.h"

namespace prometheus {
class Counter;
class Exposer;
class Gauge;
class Histogram;
class Registry;
}  // namespace prometheus

namespace morserve {

// Why the server refused a request before the engine queued it.
enum class RejectReason {
  kInvalidArgument,
  kQueueFull,
  kContextLength,
  kUnavailable,
  kNoTokenizer
};

class ServerMetrics : public EngineObserver {
 public:
  // Binds `host:port` (port 0: any free port); `loops` labels the per-loop series.
  static absl::StatusOr<std::unique_ptr<ServerMetrics>> Create(const std::string& host, int port,
                                                               int loops);
  ~ServerMetrics() override;

  int port() const { return port_; }
  // Engine events are dropped until this is on (the server's warm-up request is not
  // traffic); rejections and streams always count.
  void SetRecording(bool on) { recording_.store(on); }

  void OnAdmitted(double queue_seconds) override;
  void OnToken(bool first, double latency_seconds, int loops) override;
  void OnFinished(FinishReason reason, double e2e_seconds, const Usage& usage) override;
  void OnStep(const StepReport& s) override;

  void OnRejected(RejectReason reason);
  void OnStreamOpened();
  void OnStreamClosed();
  // Static model facts, set once after loading.
  void SetKvCapacity(int blocks_total, int block_size);

 private:
  ServerMetrics() = default;
  void Register(int loops);

  std::atomic<bool> recording_{false};
  // Declared before the exposer so it is destroyed after it: the exposer's threads stop
  // (mg_stop) before the registry they scrape goes.
  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<prometheus::Exposer> exposer_;
  int port_ = 0;

  prometheus::Gauge* running_ = nullptr;
  prometheus::Gauge* waiting_ = nullptr;
  prometheus::Gauge* open_streams_ = nullptr;
  prometheus::Gauge* kv_usage_ = nullptr;
  prometheus::Gauge* kv_used_ = nullptr;
  prometheus::Gauge* kv_free_ = nullptr;
  prometheus::Gauge* kv_block_size_ = nullptr;
  prometheus::Histogram* ttft_ = nullptr;
  prometheus::Histogram* itl_ = nullptr;
  prometheus::Histogram* e2e_ = nullptr;
  prometheus::Histogram* queue_ = nullptr;
  prometheus::Counter* prompt_tokens_ = nullptr;
  prometheus::Counter* generation_tokens_ = nullptr;
  prometheus::Counter* preemptions_ = nullptr;
  prometheus::Counter* steps_ = nullptr;
  // Prefix cache (vLLM's prefix_cache_queries / prefix_cache_hits, in tokens).
  prometheus::Counter* prefix_cache_queries_ = nullptr;
  prometheus::Counter* prefix_cache_hits_ = nullptr;
  prometheus::Counter* prefix_cache_evictions_ = nullptr;
  prometheus::Gauge* prefix_cache_blocks_ = nullptr;
  std::vector<prometheus::Counter*> finished_;  // by FinishReason
  std::vector<prometheus::Counter*> rejected_;  // by RejectReason
  std::vector<prometheus::Counter*> rows_per_loop_;
  std::vector<prometheus::Counter*> exits_per_loop_;
  prometheus::Histogram* fill_ratio_ = nullptr;
  prometheus::Histogram* step_duration_ = nullptr;
  prometheus::Histogram* tokens_per_step_ = nullptr;
  std::vector<prometheus::Counter*> step_phase_seconds_;  // schedule, enter, pass, tail, sample
  prometheus::Histogram* loops_per_token_ = nullptr;
};

}  // namespace morserve
