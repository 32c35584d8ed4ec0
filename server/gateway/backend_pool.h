// The morserve gRPC backends behind the gateway: one channel and stubs each, a health thread
// that asks grpc.health.v1 every --health-interval-ms (and GetModelInfo once a backend
// serves: model name, context length), and the choice of a backend for a request: the one
// with the fewest outstanding Generate calls among those SERVING, ties taken in turn so
// sequential requests spread too.
//
// The set of backends can change while serving (SetAddresses, fed by backend_discovery.h):
// new addresses get an entry (channel, health check, metrics label); a removed address
// drains: Acquire no longer picks it, the calls it runs finish, and the entry (with its
// metrics series) is dropped by the next health round once its outstanding count is 0. An
// address that comes back while draining is taken back as it is.
//
// Invariants: `outstanding` counts calls between Acquire and Release exactly (the metrics
// gauge follows it); a backend marked down by a failed call stays down until the next
// health round says SERVING again; entries are shared_ptrs, so a caller's reference stays
// valid after the pool dropped the entry; nothing here blocks an HTTP thread for I/O.
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
  std::string address;  // the gRPC target and the metrics label
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::Morserve::Stub> stub;
  std::unique_ptr<grpc::health::v1::Health::Stub> health;
  std::atomic<int> outstanding{0};
  std::atomic<bool> serving{false};
  bool draining = false;  // under the pool's mutex: removed from the set, finishing its calls
  bool dropped = false;   // under the pool's mutex: out of the pool, metrics series removed
  prometheus::Gauge* outstanding_gauge = nullptr;
  prometheus::Gauge* up_gauge = nullptr;
};
using BackendRef = std::shared_ptr<Backend>;

// What the gateway serves, learnt from the first backend that answers GetModelInfo.
struct ServedModel {
  std::string name;        // --served-model-name or the model_dir's basename
  int context_length = 0;  // 0: not known yet
  int64_t created = 0;     // unix time the gateway learnt it
};

class BackendPool {
 public:
  BackendPool(std::string served_model_name, GatewayMetrics* metrics);
  ~BackendPool();

  // The wanted set of gRPC targets: new ones are added (not serving until their first health
  // check, which the health thread runs at once), missing ones drain, and drained ones with no
  // call left are dropped. Returns how many were added and how many began draining.
  std::pair<int, int> SetAddresses(const std::vector<std::string>& addresses);

  // One health round now (so the first requests see the backends), then the health thread.
  void Start(int interval_ms);
  void Stop();

  // The least-loaded serving backend with its outstanding count already raised; null when
  // none serves. `exclude` (may be null) is skipped: a retry after that one failed.
  BackendRef Acquire(const Backend* exclude = nullptr);
  void Release(Backend* b);
  // A call found the backend unreachable: down until the health check says otherwise.
  void MarkDown(Backend* b);
  bool AnyServing() const;
  ServedModel model() const;
  size_t size() const;  // backends in the set (draining ones not counted)

 private:
  void HealthLoop(int interval_ms);
  void HealthRound();
  void CheckOne(Backend* b);
  void SetServing(Backend* b, bool serving);
  BackendRef MakeBackend(const std::string& address);
  void DropDrained();

  GatewayMetrics* metrics_;
  mutable std::mutex mu_;  // everything below
  std::vector<BackendRef> backends_;
  std::vector<BackendRef> draining_;
  uint64_t turn_ = 0;
  ServedModel model_;
  bool name_fixed_ = false;
  bool stop_ = false;
  bool check_now_ = false;  // new backends: a health round without waiting for the interval
  std::condition_variable cv_;
  std::thread health_thread_;
};

}  // namespace morserve::gateway
