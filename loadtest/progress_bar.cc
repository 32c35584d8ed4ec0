// Progress bar (see progress_bar.h).
#include "loadtest/progress_bar.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>

namespace morserve::loadtest {

ProgressBar::ProgressBar(bool enabled, int total, double duration_s, std::function<int()> done,
                         std::function<int()> in_flight)
    : enabled_(enabled),
      total_(total),
      duration_s_(duration_s),
      done_(std::move(done)),
      in_flight_(std::move(in_flight)) {
  if (!enabled_) return;
  thread_ = std::thread([this] {
    const auto start = std::chrono::steady_clock::now();
    std::unique_lock<std::mutex> lock(mu_);
    while (!cv_.wait_for(lock, std::chrono::milliseconds(250), [&] { return stop_; })) {
      Draw(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
    Draw(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    std::fputc('\n', stderr);
  });
}

ProgressBar::~ProgressBar() { Finish(); }

void ProgressBar::Finish() {
  if (!thread_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void ProgressBar::Draw(double elapsed_s) {
  const int done = done_();
  double frac = total_ > 0 ? static_cast<double>(done) / total_ : 0;
  if (duration_s_ > 0) frac = std::max(frac, elapsed_s / duration_s_);
  frac = std::clamp(frac, 0.0, 1.0);
  constexpr int kWidth = 30;
  const int filled = static_cast<int>(frac * kWidth);
  std::string bar(filled, '#');
  bar.append(kWidth - filled, '.');
  std::fprintf(stderr, "\r[%s] %d/%d done, %d in flight, %.1f s ", bar.c_str(), done, total_,
               in_flight_(), elapsed_s);
  std::fflush(stderr);
}

}  // namespace morserve::loadtest
