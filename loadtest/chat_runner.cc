// The multi-turn chat run loop (see chat_runner.h).
#include "loadtest/chat_runner.h"

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <limits>
#include <mutex>
#include <optional>

#include "loadtest/arrivals.h"
#include "loadtest/progress_bar.h"

namespace morserve::loadtest {
namespace {

using TimePoint = Clock::time_point;

TimePoint After(TimePoint t, double seconds) {
  return t + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

// The conversations' state. The transport threads call Done(); one thread (Phase) sends.
class ChatRun {
 public:
  ChatRun(Target& target, const ChatWorkload& w)
      : target_(target), w_(w), replies_(w.conversations.size()) {}

  // Runs conversations [lo, hi) until each has ended (last turn done or a turn failed), or
  // until `deadline`: then false. Counts the requests sent in *sent.
  bool Phase(int lo, int hi, bool warmup, ArrivalProcess& arrivals, TimePoint epoch,
             std::optional<TimePoint> deadline, int max_concurrency, int* sent) {
    std::unique_lock<std::mutex> lock(mu_);
    ended_ = 0;
    int next = lo;
    double next_s = arrivals.NextGapSeconds();
    while (ended_ < hi - lo) {
      const TimePoint now = Clock::now();
      if (deadline && now >= *deadline) return false;
      const bool room = max_concurrency <= 0 || in_flight_ < max_concurrency;
      const TimePoint arrival = After(epoch, next_s);
      int c = -1;
      if (room && !ready_.empty()) {
        c = ready_.front();
        ready_.pop_front();
      } else if (room && next < hi && now >= arrival) {
        c = next++;
        if (next < hi) next_s += arrivals.NextGapSeconds();
      }
      if (c >= 0) {
        const int turn = static_cast<int>(replies_[c].size());
        RequestSpec spec = ChatTurnSpec(w_, c, turn, replies_[c]);
        RequestRecord r;
        r.index = index_++;
        r.warmup = warmup;
        r.conversation = c;
        r.turn = turn;
        ++in_flight_;
        ++*sent;
        lock.unlock();
        target_.Send(spec, std::move(r), epoch,
                     [this](RequestRecord done) { Done(std::move(done)); });
        lock.lock();
        continue;
      }
      std::optional<TimePoint> wake = deadline;
      if (room && next < hi) wake = wake ? std::min(*wake, arrival) : arrival;
      if (wake) {
        cv_.wait_until(lock, *wake);
      } else {
        cv_.wait(lock);
      }
    }
    return true;
  }

  void Done(RequestRecord r) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!r.ok && cut_ && !r.warmup) r.failure = "cut_at_duration";
    if (r.ok && r.turn + 1 < w_.turns()) {
      replies_[r.conversation].push_back(std::move(r.output_text));
      ready_.push_back(r.conversation);
    } else {
      ++ended_;
    }
    r.output_text.clear();
    if (!r.warmup) ++done_measured_;
    records_.push_back(std::move(r));
    --in_flight_;
    cv_.notify_all();
  }

  // Cancels what is open and waits for it (the cut requests fail).
  void Cut() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      cut_ = true;
    }
    target_.CancelAll();
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return in_flight_ == 0; });
  }

  int in_flight() {
    std::lock_guard<std::mutex> lock(mu_);
    return in_flight_;
  }
  int done_measured() {
    std::lock_guard<std::mutex> lock(mu_);
    return done_measured_;
  }
  std::vector<RequestRecord> Take() {
    std::lock_guard<std::mutex> lock(mu_);
    return std::move(records_);
  }

 private:
  Target& target_;
  const ChatWorkload& w_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::vector<std::string>> replies_;  // per conversation, one per finished turn
  std::deque<int> ready_;                          // conversations whose next turn can go
  int in_flight_ = 0, ended_ = 0, done_measured_ = 0, index_ = 0;
  bool cut_ = false;
  std::vector<RequestRecord> records_;
};

}  // namespace

absl::StatusOr<RunResult> RunChat(Target& target, const ChatWorkload& w, const RunOptions& o,
                                  const std::function<void(Clock::time_point)>& on_measured_start) {
  auto arrivals = ArrivalProcess::Create(o.request_rate, o.burstiness, o.seed);
  if (!arrivals.ok()) return arrivals.status();
  auto at_once = ArrivalProcess::Create(std::numeric_limits<double>::infinity(), 1, 0);
  if (!at_once.ok()) return at_once.status();
  const int total = static_cast<int>(w.conversations.size());
  const int warmup = std::min(o.warmup, total);
  ChatRun run(target, w);
  int sent = 0;
  run.Phase(0, warmup, true, *at_once, Clock::now(), std::nullopt, o.max_concurrency, &sent);

  RunResult result;
  result.epoch = Clock::now();
  if (on_measured_start) on_measured_start(result.epoch);
  std::optional<TimePoint> deadline;
  if (o.duration_s > 0) deadline = After(result.epoch, o.duration_s);
  const int measured_turns = (total - warmup) * w.turns();
  ProgressBar bar(
      o.progress, measured_turns, o.duration_s, [&] { return run.done_measured(); },
      [&] { return run.in_flight(); });
  sent = 0;
  if (!run.Phase(warmup, total, false, *arrivals, result.epoch, deadline, o.max_concurrency,
                 &sent)) {
    result.hit_duration = true;
    run.Cut();
  }
  result.not_sent = measured_turns - sent;
  result.wall_s = SecondsSince(result.epoch, Clock::now());
  bar.Finish();
  result.records = run.Take();
  return result;
}

}  // namespace morserve::loadtest
