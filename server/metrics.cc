// Server metrics (see metrics.h).
#include "server/metrics.h"

#include <prometheus/counter.h>
#include <prometheus/exposer.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
#include <pthread.h>

#include <cerrno>
#include <exception>

#include "absl/strings/str_cat.h"

namespace morserve {
namespace {

using prometheus::Histogram;

// Latency buckets from 1 ms to ~80 s (vLLM's TTFT range, trimmed at both ends).
Histogram::BucketBoundaries LatencyBuckets() {
  return {0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,  0.25,
          0.5,   0.75,   1.0,   2.5,  5.0,  7.5,  10.0, 20.0, 40.0, 80.0};
}

Histogram::BucketBoundaries CountBuckets() {
  return {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192};
}

const char* RejectReasonName(RejectReason r) {
  switch (r) {
    case RejectReason::kInvalidArgument:
      return "invalid_argument";
    case RejectReason::kQueueFull:
      return "queue_full";
    case RejectReason::kContextLength:
      return "context_length";
    case RejectReason::kUnavailable:
      return "unavailable";
    case RejectReason::kNoTokenizer:
      return "no_tokenizer";
  }
  return "";
}

// Debian's civetweb 1.15 starts its threads with 102400-byte stacks (USE_STACK_SIZE), and
// glibc refuses (EINVAL) a stack that cannot hold the process's static TLS block + 16 KiB.
// A library with a large TLS segment linked into the process (libcublasLt.so.13: 92 KiB)
// makes every civetweb thread fail, which CivetServer reports only as "null context ...
// Possible problem binding to port". This names the real cause when it applies.
std::string CivetwebStackProblem() {
  constexpr size_t kCivetwebStackBytes = 102400;
  pthread_attr_t attr;
  if (pthread_attr_init(&attr) != 0) return "";
  pthread_attr_setstacksize(&attr, kCivetwebStackBytes);
  pthread_t thread;
  const int rc = pthread_create(
      &thread, &attr, [](void*) -> void* { return nullptr; }, nullptr);
  pthread_attr_destroy(&attr);
  if (rc == 0) pthread_join(thread, nullptr);
  if (rc != EINVAL) return "";
  return " (the cause: civetweb's 100 KiB thread stacks cannot hold this process's static TLS; "
         "a library with a large thread-local block is linked in, e.g. libcublasLt, which "
         "morserve loads with dlopen instead: see engine/cuda/cublaslt_loader.cc)";
}

}  // namespace

absl::StatusOr<std::unique_ptr<ServerMetrics>> ServerMetrics::Create(const std::string& host,
                                                                     int port, int loops) {
  std::unique_ptr<ServerMetrics> m(new ServerMetrics());
  try {
    // civetweb takes "host:port"; port 0 binds a free port that GetListeningPorts reports.
    m->exposer_ = std::make_unique<prometheus::Exposer>(absl::StrCat(host, ":", port));
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("--metrics-port: cannot listen on ", host, ":", port,
                                               ": ", e.what(), CivetwebStackProblem()));
  }
  const std::vector<int> ports = m->exposer_->GetListeningPorts();
  if (ports.empty()) return absl::UnavailableError("--metrics-port: no listening port");
  m->port_ = ports[0];
  m->registry_ = std::make_shared<prometheus::Registry>();
  m->Register(loops);
  m->exposer_->RegisterCollectable(m->registry_);
  return m;
}

ServerMetrics::~ServerMetrics() = default;

void ServerMetrics::Register(int loops) {
  prometheus::Registry& r = *registry_;
  auto gauge = [&](const char* name, const char* help) {
    return &prometheus::BuildGauge().Name(name).Help(help).Register(r).Add({});
  };
  auto counter = [&](const char* name, const char* help) {
    return &prometheus::BuildCounter().Name(name).Help(help).Register(r).Add({});
  };
  auto histogram = [&](const char* name, const char* help, const Histogram::BucketBoundaries& b) {
    return &prometheus::BuildHistogram().Name(name).Help(help).Register(r).Add({}, b);
  };
  running_ = gauge("morserve_requests_running", "Requests holding KV blocks in the engine.");
  waiting_ = gauge("morserve_requests_waiting", "Requests queued for admission.");
  open_streams_ = gauge("morserve_open_streams", "Generate calls in flight on the gRPC server.");
  kv_usage_ =
      gauge("morserve_kv_cache_usage_ratio", "Fraction of KV cache blocks in use (0 to 1).");
  auto& kv_blocks = prometheus::BuildGauge()
                        .Name("morserve_kv_cache_blocks")
                        .Help("KV cache blocks by state.")
                        .Register(r);
  kv_used_ = &kv_blocks.Add({{"state", "used"}});
  kv_free_ = &kv_blocks.Add({{"state", "free"}});
  kv_block_size_ = gauge("morserve_kv_cache_block_size_tokens", "Tokens per KV cache block.");
  ttft_ = histogram("morserve_time_to_first_token_seconds",
                    "From arrival at the engine to the first sampled token.", LatencyBuckets());
  itl_ = histogram("morserve_inter_token_latency_seconds",
                   "Between consecutive tokens of a request.", LatencyBuckets());
  e2e_ =
      histogram("morserve_e2e_request_latency_seconds",
                "From arrival at the engine to the request's end (any reason).", LatencyBuckets());
  queue_ = histogram("morserve_request_queue_time_seconds",
                     "From arrival at the engine to the first admission.", LatencyBuckets());
  prompt_tokens_ = counter("morserve_prompt_tokens_total", "Prompt tokens of finished requests.");
  generation_tokens_ = counter("morserve_generation_tokens_total", "Tokens sampled.");
  preemptions_ =
      counter("morserve_preemptions_total", "Requests preempted (KV freed, recomputed).");
  steps_ = counter("morserve_engine_steps_total", "Engine steps that did work.");
  prefix_cache_queries_ =
      counter("morserve_prefix_cache_queries_total",
              "Prompt tokens looked up in the prefix cache at admission (vLLM's "
              "prefix_cache_queries).");
  prefix_cache_hits_ = counter("morserve_prefix_cache_hits_total",
                               "Prompt tokens found in the prefix cache at admission, their KV "
                               "reused instead of computed (vLLM's prefix_cache_hits).");
  prefix_cache_evictions_ = counter("morserve_prefix_cache_evictions_total",
                                    "KV blocks evicted from the prefix cache (LRU).");
  prefix_cache_blocks_ = gauge("morserve_prefix_cache_blocks",
                               "KV blocks the prefix cache holds (some may also be in use).");
  auto& finished = prometheus::BuildCounter()
                       .Name("morserve_requests_finished_total")
                       .Help("Requests that left the engine, by finish reason.")
                       .Register(r);
  for (FinishReason f : {FinishReason::kNone, FinishReason::kLength, FinishReason::kStop,
                         FinishReason::kCancelled, FinishReason::kError}) {
    finished_.push_back(
        f == FinishReason::kNone ? nullptr : &finished.Add({{"reason", FinishReasonName(f)}}));
  }
  auto& rejected = prometheus::BuildCounter()
                       .Name("morserve_requests_rejected_total")
                       .Help("Requests refused before the engine queued them, by reason.")
                       .Register(r);
  for (RejectReason why :
       {RejectReason::kInvalidArgument, RejectReason::kQueueFull, RejectReason::kContextLength,
        RejectReason::kUnavailable, RejectReason::kNoTokenizer}) {
    rejected_.push_back(&rejected.Add({{"reason", RejectReasonName(why)}}));
  }
  auto& rows = prometheus::BuildCounter()
                   .Name("morserve_rows_per_loop_total")
                   .Help("Rows that ran loop L of the shared block (depth-wise batch occupancy).")
                   .Register(r);
  for (int l = 1; l <= loops; ++l)
    rows_per_loop_.push_back(&rows.Add({{"loop", std::to_string(l)}}));
  auto& exits = prometheus::BuildCounter()
                    .Name("morserve_exits_per_loop_total")
                    .Help("Token forwards that left the shared block after L loops.")
                    .Register(r);
  for (int l = 0; l <= loops; ++l)
    exits_per_loop_.push_back(&exits.Add({{"loops", std::to_string(l)}}));
  fill_ratio_ = histogram("morserve_batch_fill_ratio",
                          "Rows per pass of the shared block over max_batch_rows, per step.",
                          {0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1.0});
  step_duration_ =
      histogram("morserve_step_duration_seconds", "Wall time of an engine step.", LatencyBuckets());
  tokens_per_step_ =
      histogram("morserve_tokens_per_step", "Tokens sampled per engine step.", CountBuckets());
  auto& phases = prometheus::BuildCounter()
                     .Name("morserve_engine_step_phase_seconds_total")
                     .Help(
                         "Wall seconds of the engine's steps by phase: schedule, enter (layers "
                         "before the loop), pass (shared block), tail (layers after it, "
                         "lm_head), sample (sampling, events).")
                     .Register(r);
  for (const char* phase : {"schedule", "enter", "pass", "tail", "sample"}) {
    step_phase_seconds_.push_back(&phases.Add({{"phase", phase}}));
  }
  Histogram::BucketBoundaries loop_buckets;
  for (int l = 0; l <= loops; ++l) loop_buckets.push_back(l);
  loops_per_token_ =
      histogram("morserve_loops_per_token", "Loops of the shared block behind each sampled token.",
                loop_buckets);
}

void ServerMetrics::OnAdmitted(double queue_seconds) {
  if (recording_.load(std::memory_order_relaxed)) queue_->Observe(queue_seconds);
}

void ServerMetrics::OnToken(bool first, double latency_seconds, int loops) {
  if (!recording_.load(std::memory_order_relaxed)) return;
  generation_tokens_->Increment();
  (first ? ttft_ : itl_)->Observe(latency_seconds);
  loops_per_token_->Observe(loops);
}

void ServerMetrics::OnFinished(FinishReason reason, double e2e_seconds, const Usage& usage) {
  if (!recording_.load(std::memory_order_relaxed)) return;
  const size_t i = static_cast<size_t>(reason);
  if (i < finished_.size() && finished_[i]) finished_[i]->Increment();
  e2e_->Observe(e2e_seconds);
  prompt_tokens_->Increment(usage.prompt_tokens);
}

void ServerMetrics::OnStep(const StepReport& s) {
  if (!recording_.load(std::memory_order_relaxed)) return;
  steps_->Increment();
  running_->Set(s.running);
  waiting_->Set(s.waiting);
  kv_used_->Set(s.kv_blocks_used);
  kv_free_->Set(s.kv_blocks_total - s.kv_blocks_used);
  kv_usage_->Set(s.kv_blocks_total ? static_cast<double>(s.kv_blocks_used) / s.kv_blocks_total : 0);
  if (s.preemptions > 0) preemptions_->Increment(s.preemptions);
  if (s.prefix_cache_queries > 0) {
    prefix_cache_queries_->Increment(static_cast<double>(s.prefix_cache_queries));
  }
  if (s.prefix_cache_hits > 0)
    prefix_cache_hits_->Increment(static_cast<double>(s.prefix_cache_hits));
  if (s.prefix_cache_evictions > 0) {
    prefix_cache_evictions_->Increment(static_cast<double>(s.prefix_cache_evictions));
  }
  prefix_cache_blocks_->Set(s.prefix_cache_blocks);
  for (size_t l = 0; l < s.rows_per_loop.size() && l < rows_per_loop_.size(); ++l) {
    if (s.rows_per_loop[l]) rows_per_loop_[l]->Increment(static_cast<double>(s.rows_per_loop[l]));
  }
  for (size_t l = 0; l < s.exits_per_loop.size() && l < exits_per_loop_.size(); ++l) {
    if (s.exits_per_loop[l])
      exits_per_loop_[l]->Increment(static_cast<double>(s.exits_per_loop[l]));
  }
  if (s.pass_row_capacity > 0) {
    fill_ratio_->Observe(static_cast<double>(s.pass_rows) / s.pass_row_capacity);
  }
  step_duration_->Observe(s.duration_seconds);
  tokens_per_step_->Observe(s.tokens_generated);
  const StepPhaseSeconds& p = s.phases;
  const double by_phase[] = {p.schedule, p.enter, p.pass, p.tail, p.sample};
  for (size_t i = 0; i < step_phase_seconds_.size(); ++i) {
    if (by_phase[i] > 0) step_phase_seconds_[i]->Increment(by_phase[i]);
  }
}

void ServerMetrics::OnRejected(RejectReason reason) {
  rejected_[static_cast<size_t>(reason)]->Increment();
}

void ServerMetrics::OnStreamOpened() { open_streams_->Increment(); }
void ServerMetrics::OnStreamClosed() { open_streams_->Decrement(); }

void ServerMetrics::SetKvCapacity(int blocks_total, int block_size) {
  kv_free_->Set(blocks_total);
  kv_used_->Set(0);
  kv_block_size_->Set(block_size);
}

}  // namespace morserve
