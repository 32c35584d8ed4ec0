// Engine-to-server hand-off (see wake_queue.h).
#include "server/wake_queue.h"

namespace morserve {

WakeQueue::WakeQueue(int threads) {
  for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { Run(); });
}

WakeQueue::~WakeQueue() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (std::thread& t : threads_) t.join();
}

void WakeQueue::Post(std::shared_ptr<Wakeable> w) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(w));
  }
  cv_.notify_one();
}

void WakeQueue::Run() {
  for (;;) {
    std::shared_ptr<Wakeable> w;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stop_ and nothing left
      w = std::move(queue_.front());
      queue_.pop_front();
    }
    w->Wake();
  }
}

}  // namespace morserve
