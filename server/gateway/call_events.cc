// Event hand-off between gRPC calls and a handler coroutine (see call_events.h).
#include "server/gateway/call_events.h"

#include <algorithm>
#include <boost/asio/post.hpp>
#include <boost/asio/use_awaitable.hpp>

namespace morserve::gateway {

namespace net = boost::asio;

void EventSink::Push(CallEvent e) {
  std::lock_guard<std::mutex> lock(mu_);
  events_.push_back(std::move(e));
  ResumeLocked();
}

bool EventSink::ResumeLocked() {
  if (!parked_) return false;
  std::unique_ptr<Parked> p = std::move(parked_);
  p->Resume();  // a post: the coroutine runs later on its strand, never inline here
  return true;
}

bool EventSink::Register(const std::shared_ptr<grpc::ClientContext>& ctx) {
  std::lock_guard<std::mutex> lock(mu_);
  if (cancelled_) return false;
  live_.push_back(ctx);
  return true;
}

void EventSink::Unregister(const grpc::ClientContext* ctx) {
  std::lock_guard<std::mutex> lock(mu_);
  live_.erase(
      std::remove_if(live_.begin(), live_.end(), [ctx](const auto& p) { return p.get() == ctx; }),
      live_.end());
}

void EventSink::CancelAll() {
  std::vector<std::shared_ptr<grpc::ClientContext>> live;
  {
    std::lock_guard<std::mutex> lock(mu_);
    cancelled_ = true;
    live = live_;
  }
  // Outside mu_: a reaction run inline by TryCancel may Push or Unregister.
  for (const auto& ctx : live) ctx->TryCancel();
}

void EventSink::Take(std::vector<CallEvent>* out) {
  out->clear();
  std::lock_guard<std::mutex> lock(mu_);
  out->swap(events_);
}

net::awaitable<void> EventSink::Wait() {
  co_await net::async_initiate<decltype(net::use_awaitable), void()>(
      [this](auto handler) {
        // Runs on the strand as the coroutine suspends.
        std::lock_guard<std::mutex> lock(mu_);
        if (!events_.empty() || woken_) {
          woken_ = false;
          net::post(std::move(handler));
          return;
        }
        parked_ = std::make_unique<ParkedHandler<decltype(handler)>>(std::move(handler));
      },
      net::use_awaitable);
}

void EventSink::Wake() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!ResumeLocked()) woken_ = true;
}

}  // namespace morserve::gateway
