// Event hand-off between gRPC calls and a handler coroutine (see call_events.h).
#include "server/gateway/call_events.h"

#include <algorithm>
#include <boost/asio/post.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/use_awaitable.hpp>

namespace morserve::gateway {

namespace net = boost::asio;

void EventSink::Push(CallEvent e) {
  std::lock_guard<std::mutex> lock(mu_);
  events_.push_back(std::move(e));
  if (armed_) {
    armed_ = false;
    net::post(timer_.get_executor(), [self = shared_from_this()] { self->timer_.cancel(); });
  }
}

bool EventSink::Register(const std::shared_ptr<grpc::ClientContext>& ctx) {
  std::lock_guard<std::mutex> lock(mu_);
  if (cancelled_) return false;
  live_.push_back(ctx);
  return true;
}

void EventSink::Unregister(const grpc::ClientContext* ctx) {
  std::lock_guard<std::mutex> lock(mu_);
  live_.erase(std::remove_if(live_.begin(), live_.end(),
                             [ctx](const auto& p) { return p.get() == ctx; }),
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
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!events_.empty() || woken_) {
      woken_ = false;
      co_return;
    }
    armed_ = true;
  }
  timer_.expires_at(net::steady_timer::time_point::max());
  boost::system::error_code ec;  // operation_aborted: the wake-up
  co_await timer_.async_wait(net::redirect_error(net::use_awaitable, ec));
}

void EventSink::Wake() {
  std::lock_guard<std::mutex> lock(mu_);
  if (armed_) {
    armed_ = false;
    timer_.cancel();
  } else {
    woken_ = true;
  }
}

}  // namespace morserve::gateway
