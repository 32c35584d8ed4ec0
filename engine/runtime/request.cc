// Event channel and finish reasons (see request.h).
#include "engine/runtime/request.h"

#include <chrono>

namespace morserve {

const char* FinishReasonName(FinishReason r) {
  switch (r) {
    case FinishReason::kNone: return "";
    case FinishReason::kLength: return "length";
    case FinishReason::kStop: return "stop";
    case FinishReason::kCancelled: return "cancelled";
    case FinishReason::kError: return "error";
  }
  return "";
}

void EventChannel::Push(RequestEvent e) {
  std::shared_ptr<const std::function<void()>> listener;
  {
    std::lock_guard<std::mutex> lock(mu_);
    events_.push_back(std::move(e));
    listener = listener_;
  }
  cv_.notify_one();
  if (listener) (*listener)();
}

void EventChannel::SetListener(std::function<void()> listener) {
  auto l = listener ? std::make_shared<const std::function<void()>>(std::move(listener)) : nullptr;
  std::lock_guard<std::mutex> lock(mu_);
  listener_ = std::move(l);
}

std::optional<RequestEvent> EventChannel::Pop(int timeout_ms) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!cv_.wait_for(lock, std::chrono::milliseconds(timeout_ms), [&] { return !events_.empty(); })) {
    return std::nullopt;
  }
  RequestEvent e = std::move(events_.front());
  events_.pop_front();
  return e;
}

std::optional<RequestEvent> EventChannel::TryPop() { return Pop(0); }

std::vector<RequestEvent> EventChannel::DrainUntilFinal() {
  std::vector<RequestEvent> out;
  while (out.empty() || !out.back().final()) {
    if (auto e = Pop(1000)) out.push_back(std::move(*e));
  }
  return out;
}

}  // namespace morserve
