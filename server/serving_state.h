// What the gRPC handlers share with `morserve serve`'s main thread: the engine once it is
// loaded and warmed up (null before), the tokenizer and chat template (set before the engine
// is published, constant after; null without tokenizer files), the draining flag, metrics
// and the wake-up queue. Handlers read it without blocking; the main thread publishes the
// engine last, so a handler that sees the engine sees the tokenizer too.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "engine/runtime/engine.h"
#include "server/metrics.h"
#include "server/request_parse.h"
#include "server/wake_queue.h"

namespace morserve {

struct ServingState {
  std::string model_dir;
  std::atomic<Engine*> engine{nullptr};  // set once the warm-up step ran
  TextModel text;                        // tokenizer / chat template, owned by serve
  std::atomic<bool> draining{false};
  ServerMetrics* metrics = nullptr;      // null in setups without metrics
  WakeQueue* wake = nullptr;
  std::atomic<int> open_streams{0};
  std::atomic<uint64_t> next_request{1};

  // The engine, or UNAVAILABLE while loading or draining.
  absl::StatusOr<Engine*> ReadyEngine() const {
    if (draining.load()) return absl::UnavailableError("the server is draining (shutting down)");
    Engine* e = engine.load();
    if (e == nullptr) return absl::UnavailableError("the model is loading");
    return e;
  }
  void Reject(RejectReason why) const {
    if (metrics) metrics->OnRejected(why);
  }
};

}  // namespace morserve
