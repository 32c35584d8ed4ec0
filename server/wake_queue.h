// Hands work from the engine thread to a server thread. The engine's EventChannel listener
// posts a stream here instead of calling into gRPC itself, so the engine thread only takes a
// short mutex per push and never serialises or writes a message. A stream is posted at most
// once until its Wake() runs (the stream coalesces with its own flag), so the queue holds at
// most one entry per open stream.
#pragma once

#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace morserve {

class Wakeable {
 public:
  virtual ~Wakeable() = default;
  virtual void Wake() = 0;
};

class WakeQueue {
 public:
  explicit WakeQueue(int threads);
  ~WakeQueue();  // runs what is queued, then joins
  void Post(std::shared_ptr<Wakeable> w);

 private:
  void Run();
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Wakeable>> queue_;
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace morserve
