// Gateway metrics (see gateway_metrics.h).
#include "server/gateway/gateway_metrics.h"

#include <prometheus/text_serializer.h>

namespace morserve::gateway {
namespace {

// 1 ms to ~80 s, as the server's latency histograms.
prometheus::Histogram::BucketBoundaries LatencyBuckets() {
  return {0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,  0.25,
          0.5,   0.75,   1.0,   2.5,  5.0,  7.5,  10.0, 20.0, 40.0, 80.0};
}

}  // namespace

GatewayMetrics::GatewayMetrics() : registry_(std::make_shared<prometheus::Registry>()) {
  prometheus::Registry& r = *registry_;
  requests_ = &prometheus::BuildCounter()
                   .Name("morserve_gateway_requests_total")
                   .Help("HTTP requests by endpoint and status code.")
                   .Register(r);
  duration_ = &prometheus::BuildHistogram()
                   .Name("morserve_gateway_request_duration_seconds")
                   .Help("HTTP request duration (to the last byte) by endpoint.")
                   .Register(r);
  ttft_ = &prometheus::BuildHistogram()
               .Name("morserve_gateway_time_to_first_token_seconds")
               .Help("From the request's arrival to the first generated token from a backend.")
               .Register(r)
               .Add({}, LatencyBuckets());
  prompt_tokens_ = &prometheus::BuildCounter()
                        .Name("morserve_gateway_prompt_tokens_total")
                        .Help("Prompt tokens of finished generation requests.")
                        .Register(r)
                        .Add({});
  completion_tokens_ = &prometheus::BuildCounter()
                            .Name("morserve_gateway_completion_tokens_total")
                            .Help("Generated tokens of finished generation requests.")
                            .Register(r)
                            .Add({});
  open_connections_ = &prometheus::BuildGauge()
                           .Name("morserve_gateway_open_connections")
                           .Help("Open HTTP connections.")
                           .Register(r)
                           .Add({});
  in_flight_ = &prometheus::BuildGauge()
                    .Name("morserve_gateway_requests_in_flight")
                    .Help("HTTP requests being handled.")
                    .Register(r)
                    .Add({});
  outstanding_ = &prometheus::BuildGauge()
                      .Name("morserve_gateway_backend_outstanding_requests")
                      .Help("Generate calls in flight per backend.")
                      .Register(r);
  up_ = &prometheus::BuildGauge()
             .Name("morserve_gateway_backend_up")
             .Help("1 when the backend's health check says SERVING.")
             .Register(r);
}

void GatewayMetrics::OnRequest(const std::string& endpoint, int code, double seconds) {
  requests_->Add({{"endpoint", endpoint}, {"code", std::to_string(code)}}).Increment();
  duration_->Add({{"endpoint", endpoint}}, LatencyBuckets()).Observe(seconds);
}

prometheus::Gauge& GatewayMetrics::BackendOutstanding(const std::string& backend) {
  return outstanding_->Add({{"backend", backend}});
}

prometheus::Gauge& GatewayMetrics::BackendUp(const std::string& backend) {
  return up_->Add({{"backend", backend}});
}

void GatewayMetrics::RemoveBackend(prometheus::Gauge* outstanding, prometheus::Gauge* up) {
  outstanding_->Remove(outstanding);
  up_->Remove(up);
}

std::string GatewayMetrics::Serialize() const {
  return prometheus::TextSerializer().Serialize(registry_->Collect());
}

}  // namespace morserve::gateway
