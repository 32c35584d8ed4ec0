// The HTTP target's keep-alive connection pool: idle HTTP/1.1 connections to the one target
// server, handed to the next request instead of dialling a new one (as aiohttp, k6 and wrk
// do). A call gives its connection back only after its response was read to the end and
// neither side asked to close (Connection: close, HTTP/1.0); anything else is closed. At
// most `max_idle` connections wait (0: no bound; the runner's --max-concurrency bounds the
// connections in use, so the pool never holds more than the peak number of open requests).
// An idle connection the server has closed meanwhile is found when it is taken (a
// non-blocking peek reads EOF) and dropped. Touched only on the target's I/O thread; the
// counters are atomics so that the report can read them from another thread.
#pragma once

#include <atomic>
#include <boost/beast/core/tcp_stream.hpp>
#include <cstdint>
#include <deque>
#include <memory>

#include "nlohmann/json.hpp"

namespace morserve::loadtest {

class HttpConnectionPool {
 public:
  using Stream = boost::beast::tcp_stream;

  HttpConnectionPool(bool keep_alive, int max_idle)
      : keep_alive_(keep_alive), max_idle_(max_idle) {}

  bool keep_alive() const { return keep_alive_; }

  // An idle connection still open (most recently used first), or null: dial a new one.
  std::unique_ptr<Stream> Take();
  // Keeps `stream` for the next request when `reusable` (the response was read to its end
  // and both sides keep the connection), the pool is on and has room; closes it otherwise.
  void Give(std::unique_ptr<Stream> stream, bool reusable);
  void CloseAll();

  // Counted by the calls: a new TCP connection dialled, and a reused one that failed before
  // any response byte (the server closed it as it was taken; the request was re-sent).
  void CountDialled() { ++dialled_; }
  void CountRetried() { ++retried_; }

  // {"keep_alive", "dialled", "reused", "retried", "dropped_closed_idle"}.
  nlohmann::json StatsJson() const;

 private:
  static bool ClosedByPeer(Stream& stream);

  const bool keep_alive_;
  const int max_idle_;
  std::deque<std::unique_ptr<Stream>> idle_;
  std::atomic<int64_t> dialled_{0}, reused_{0}, retried_{0}, dropped_{0};
};

}  // namespace morserve::loadtest
