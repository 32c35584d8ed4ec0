// The stalled-write guard of a streaming response (--write-timeout-s): a client that stops
// reading but keeps its connection open would otherwise hold its gRPC calls (and the
// backend's KV blocks) forever. Begin()/End() bracket each socket write; when one has been
// pending for the timeout, the socket is closed, which fails the pending write, and the
// handler then cancels its calls as for a disconnect.
//
// Cost: one timer wait per timeout period while writes happen (not one per write): the
// timer is re-armed only when it fires, to the deadline of the write pending then.
// Everything runs on the connection's strand; the timer's handler holds the shared state,
// so it is safe after the watchdog is gone (it then does nothing).
#pragma once

// clang-format off
#include <utility>  // first: Boost 1.74's asio/awaitable.hpp uses std::exchange unincluded
// clang-format on

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <memory>

namespace morserve::gateway {

class WriteWatchdog {
 public:
  WriteWatchdog(boost::asio::ip::tcp::socket& socket, std::chrono::milliseconds timeout);
  ~WriteWatchdog();
  WriteWatchdog(const WriteWatchdog&) = delete;
  WriteWatchdog& operator=(const WriteWatchdog&) = delete;

  void Begin();        // a write starts
  void End();          // it completed (or failed)
  bool fired() const;  // the socket was closed for a stalled write

 private:
  struct State;
  static void Arm(const std::shared_ptr<State>& s, std::chrono::steady_clock::time_point at);
  std::shared_ptr<State> state_;
};

}  // namespace morserve::gateway
