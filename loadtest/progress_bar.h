// A one-line progress bar on stderr, redrawn a few times a second by its own thread while a
// run lasts: requests done of the total (or time of --duration), in flight, elapsed. Drawn
// only when enabled (the caller passes isatty(stderr) and not --no-progress).
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>

namespace morserve::loadtest {

class ProgressBar {
 public:
  ProgressBar(bool enabled, int total, double duration_s, std::function<int()> done,
              std::function<int()> in_flight);
  ~ProgressBar();
  void Finish();  // draws the last state and a newline

 private:
  void Draw(double elapsed_s);
  bool enabled_;
  int total_;
  double duration_s_;
  std::function<int()> done_, in_flight_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace morserve::loadtest
