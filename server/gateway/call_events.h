// The meeting point of one HTTP request's gRPC Generate calls (gRPC callback threads) and its
// handler coroutine (an asio strand): calls push events under a mutex, the coroutine takes
// them all at once and parks until the next push.
//
// Invariants:
//   - Push never blocks on I/O and never runs handler code: it appends and, only when the
//     coroutine is parked, posts its resumption to the strand once (no wake-up per token
//     while the coroutine is busy writing; no timer either: a parked coroutine is a stored
//     completion handler, so waking it costs no timer-queue or timerfd work).
//   - A wake-up cannot be lost: the coroutine parks (stores its handler) under the mutex.
//   - The sink outlives every call (each call holds a shared_ptr until OnDone), so a
//     coroutine that returns early (client gone) only cancels; the calls clean up.
#pragma once

// clang-format off
#include <utility>  // first: Boost 1.74's asio/awaitable.hpp uses std::exchange unincluded
// clang-format on

#include <grpcpp/grpcpp.h>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/async_result.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <memory>
#include <mutex>
#include <optional>
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
  explicit EventSink(boost::asio::any_io_executor strand) : strand_(std::move(strand)) {}

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
  // Any thread: ends the current or next Wait().
  void Wake();

 private:
  // A parked coroutine's completion handler, type-erased (it is move-only).
  struct Parked {
    virtual ~Parked() = default;
    virtual void Resume() = 0;  // posts the handler to its own executor
  };
  template <typename Handler>
  struct ParkedHandler : Parked {
    explicit ParkedHandler(Handler h) : handler(std::move(h)) {}
    void Resume() override { boost::asio::post(std::move(handler)); }
    Handler handler;
  };
  // Under mu_: resumes the parked coroutine (true) or does nothing (false).
  bool ResumeLocked();

  std::mutex mu_;
  std::vector<CallEvent> events_;
  std::vector<std::shared_ptr<grpc::ClientContext>> live_;
  std::unique_ptr<Parked> parked_;  // the coroutine waits
  bool woken_ = false;              // Wake() while not parked
  bool cancelled_ = false;
  boost::asio::any_io_executor strand_;
};

}  // namespace morserve::gateway
