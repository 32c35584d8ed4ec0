// The meeting point of one HTTP request's gRPC Generate calls (gRPC callback threads) and its
// handler coroutine (an asio strand): calls push events under a mutex, the coroutine takes
// them all at once and waits on a timer that a push cancels when the coroutine is parked.
//
// Invariants:
//   - Push never blocks on I/O and never runs handler code: it appends and, only when the
//     coroutine is parked, posts one timer cancel to the strand (no wake-up storm per token).
//   - A wake-up cannot be lost: the coroutine arms under the mutex, and the posted cancel
//     runs on the strand only after the coroutine's wait was started (same strand).
//   - The sink outlives every call (each call holds a shared_ptr until OnDone), so a
//     coroutine that returns early (client gone) only cancels; the calls clean up.
#pragma once

#include <optional>
#include <utility>  // before Boost.Asio's awaitable.hpp, which uses std::exchange

#include <grpcpp/grpcpp.h>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/steady_timer.hpp>
#include <memory>
#include <mutex>
#include <vector>

#include "morserve/v1/morserve.pb.h"

namespace morserve::gateway {

struct CallEvent {
  int choice = 0;
  bool done = false;
  v1::GenerateResponse message;  // !done: one stream message
  grpc::Status status;           // done: the call's status
};

class EventSink : public std::enable_shared_from_this<EventSink> {
 public:
  explicit EventSink(boost::asio::any_io_executor strand) : timer_(strand) {}

  // Any thread.
  void Push(CallEvent e);
  // Registers a call's context for CancelAll; false once cancelled (the call must not start).
  bool Register(const std::shared_ptr<grpc::ClientContext>& ctx);
  void Unregister(const grpc::ClientContext* ctx);
  void CancelAll();

  // Strand only: moves the pending events into `out` (cleared first).
  void Take(std::vector<CallEvent>* out);
  // Strand only: returns when an event is pending or Wake() was called.
  boost::asio::awaitable<void> Wait();
  void Wake();

 private:
  std::mutex mu_;
  std::vector<CallEvent> events_;
  std::vector<std::shared_ptr<grpc::ClientContext>> live_;
  bool armed_ = false;     // the coroutine waits on timer_
  bool woken_ = false;     // Wake() while not armed
  bool cancelled_ = false;
  boost::asio::steady_timer timer_;
};

}  // namespace morserve::gateway
