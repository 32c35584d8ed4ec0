// The gateway's own Prometheus metrics (prometheus-cpp registry), served as text on the
// HTTP port's /metrics. Every method is thread-safe (prometheus-cpp metrics are atomic;
// labelled series are looked up once and cached where the label set is fixed).
#pragma once

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <memory>
#include <string>

namespace morserve::gateway {

class GatewayMetrics {
 public:
  GatewayMetrics();

  // One finished HTTP request: its endpoint label, status code and duration.
  void OnRequest(const std::string& endpoint, int code, double seconds);
  void OnFirstToken(double seconds) { ttft_->Observe(seconds); }
  void OnTokens(int prompt, int completion) {
    prompt_tokens_->Increment(prompt);
    completion_tokens_->Increment(completion);
  }
  prometheus::Gauge& open_connections() { return *open_connections_; }
  prometheus::Gauge& in_flight() { return *in_flight_; }
  prometheus::Gauge& BackendOutstanding(const std::string& backend);
  prometheus::Gauge& BackendUp(const std::string& backend);
  // A backend left the pool: its two series disappear from /metrics.
  void RemoveBackend(prometheus::Gauge* outstanding, prometheus::Gauge* up);

  // The text exposition format of everything registered.
  std::string Serialize() const;

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Family<prometheus::Counter>* requests_ = nullptr;
  prometheus::Family<prometheus::Histogram>* duration_ = nullptr;
  prometheus::Histogram* ttft_ = nullptr;
  prometheus::Counter* prompt_tokens_ = nullptr;
  prometheus::Counter* completion_tokens_ = nullptr;
  prometheus::Gauge* open_connections_ = nullptr;
  prometheus::Gauge* in_flight_ = nullptr;
  prometheus::Family<prometheus::Gauge>* outstanding_ = nullptr;
  prometheus::Family<prometheus::Gauge>* up_ = nullptr;
};

}  // namespace morserve::gateway
