// The run loop (see runner.h).
#include "loadtest/runner.h"

#include <condition_variable>
#include <mutex>
#include <optional>
#include <thread>

#include "loadtest/arrivals.h"
#include "loadtest/progress_bar.h"

namespace morserve::loadtest {
namespace {

// Requests in flight and the finished records; the transport threads call Done().
class Ledger {
 public:
  void Sent() {
    std::lock_guard<std::mutex> lock(mu_);
    ++in_flight_;
  }
  void Done(RequestRecord r) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!r.ok && cut_ && !r.warmup) r.failure = "cut_at_duration";
    if (!r.warmup) ++done_measured_;
    records_.push_back(std::move(r));
    --in_flight_;
    cv_.notify_all();
  }
  // Waits until fewer than `limit` are in flight (limit 0: no wait); false at `deadline`.
  bool WaitBelow(int limit, std::optional<Clock::time_point> deadline) {
    if (limit <= 0) return true;
    std::unique_lock<std::mutex> lock(mu_);
    auto pred = [&] { return in_flight_ < limit; };
    if (!deadline) {
      cv_.wait(lock, pred);
      return true;
    }
    return cv_.wait_until(lock, *deadline, pred);
  }
  bool WaitIdle(std::optional<Clock::time_point> deadline) {
    std::unique_lock<std::mutex> lock(mu_);
    auto pred = [&] { return in_flight_ == 0; };
    if (!deadline) {
      cv_.wait(lock, pred);
      return true;
    }
    return cv_.wait_until(lock, *deadline, pred);
  }
  void MarkCut() {
    std::lock_guard<std::mutex> lock(mu_);
    cut_ = true;
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
  std::mutex mu_;
  std::condition_variable cv_;
  int in_flight_ = 0, done_measured_ = 0;
  bool cut_ = false;
  std::vector<RequestRecord> records_;
};

void SendOne(Target& target, const RequestSpec& spec, int index, bool warmup,
             Clock::time_point epoch, Ledger& ledger) {
  RequestRecord r;
  r.index = index;
  r.warmup = warmup;
  r.prompt_tokens = spec.prompt_tokens();
  ledger.Sent();
  target.Send(spec, std::move(r), epoch,
              [&ledger](RequestRecord done) { ledger.Done(std::move(done)); });
}

}  // namespace

absl::StatusOr<RunResult> Run(Target& target, const std::vector<RequestSpec>& specs,
                              const RunOptions& o,
                              const std::function<void(Clock::time_point)>& on_measured_start) {
  auto arrivals = ArrivalProcess::Create(o.request_rate, o.burstiness, o.seed);
  if (!arrivals.ok()) return arrivals.status();
  const int warmup = std::min<int>(o.warmup, specs.size());
  const int measured = static_cast<int>(specs.size()) - warmup;
  Ledger ledger;

  const Clock::time_point warm_epoch = Clock::now();
  for (int i = 0; i < warmup; ++i) {
    ledger.WaitBelow(o.max_concurrency, std::nullopt);
    SendOne(target, specs[i], i, true, warm_epoch, ledger);
  }
  ledger.WaitIdle(std::nullopt);

  RunResult result;
  result.epoch = Clock::now();
  if (on_measured_start) on_measured_start(result.epoch);
  std::optional<Clock::time_point> deadline;
  if (o.duration_s > 0) {
    deadline = result.epoch + std::chrono::duration_cast<Clock::duration>(
                                  std::chrono::duration<double>(o.duration_s));
  }
  ProgressBar bar(
      o.progress, measured, o.duration_s, [&] { return ledger.done_measured(); },
      [&] { return ledger.in_flight(); });
  double next_s = 0;
  int sent = 0;
  for (int i = warmup; i < static_cast<int>(specs.size()); ++i) {
    next_s += arrivals->NextGapSeconds();
    auto at = result.epoch +
              std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(next_s));
    if (deadline && at >= *deadline) {
      std::this_thread::sleep_until(*deadline);
      result.hit_duration = true;
      break;
    }
    std::this_thread::sleep_until(at);
    if (!ledger.WaitBelow(o.max_concurrency, deadline)) {
      result.hit_duration = true;
      break;
    }
    SendOne(target, specs[i], i, false, result.epoch, ledger);
    ++sent;
  }
  result.not_sent = measured - sent;
  if (!ledger.WaitIdle(deadline)) {
    result.hit_duration = true;
    ledger.MarkCut();
    target.CancelAll();
    ledger.WaitIdle(std::nullopt);
  }
  result.wall_s = SecondsSince(result.epoch, Clock::now());
  bar.Finish();
  result.records = ledger.Take();
  return result;
}

}  // namespace morserve::loadtest
