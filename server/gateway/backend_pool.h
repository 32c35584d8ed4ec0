// The morserve gRPC backends behind the gateway: one channel and stubs each, a health thread
// that asks grpc.health.v1 every --health-interval-ms (and GetModelInfo once a backend
// serves: model name, context length), and the choice of a backend for a request: the one
// with the fewest outstanding Generate calls among those SERVING, ties taken in turn so
// sequential requests spread too.
//
// Invariants: `outstanding` counts calls between Acquire and Release exactly (the metrics
// gauge follows it); a backend marked down by a failed call stays down until the next
// health round says SERVING again; nothing here blocks an HTTP thread.
#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "grpc/health/v1/health.grpc.pb.h"
#include "morserve/v1/morserve.grpc.pb.h"
#include "server/gateway/gateway_metrics.h"

namespace morserve::gateway {

struct Backend {
  std::string address;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::Morserve::Stub> stub;
  std::unique_ptr<grpc::health::v1::Health::Stub> health;
  std::atomic<int> outstanding{0};
  std::atomic<bool> serving{false};
  prometheus::Gauge* outstanding_gauge = nullptr;
  prometheus::Gauge* up_gauge = nullptr;
};

// What the gateway serves, learnt from the first backend that answers GetModelInfo.
struct ServedModel {
  std::string name;        // --served-model-name or the model_dir's basename
  int context_length = 0;  // 0: not known yet
  int64_t created = 0;     // unix time the gateway learnt it
};

class BackendPool {
 public:
  BackendPool(const std::vector<std::string>& addresses, std::string served_model_name,
              GatewayMetrics* metrics);
  ~BackendPool();

  // One health round now (so the first requests see the backends), then the health thread.
  void Start(int interval_ms);
  void Stop();

  // The least-loaded serving backend with its outstanding count already raised; nullptr when
  // none serves. `exclude` (may be null) is skipped: a retry after that one failed.
  Backend* Acquire(const Backend* exclude = nullptr);
  void Release(Backend* b);
  // A call found the backend unreachable: down until the health check says otherwise.
  void MarkDown(Backend* b);
  bool AnyServing() const;
  ServedModel model() const;
  size_t size() const { return backends_.size(); }

 private:
  void HealthLoop(int interval_ms);
  void CheckOne(Backend* b);
  void SetServing(Backend* b, bool serving);

  std::vector<std::unique_ptr<Backend>> backends_;
  std::atomic<uint64_t> turn_{0};
  mutable std::mutex mu_;  // model_, stop_
  ServedModel model_;
  bool name_fixed_ = false;
  bool stop_ = false;
  std::condition_variable cv_;
  std::thread health_thread_;
};

}  // namespace morserve::gateway
