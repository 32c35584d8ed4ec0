// Scrapes the server's Prometheus /metrics every interval on its own thread during a run and
// turns consecutive samples into time series of the engine's state:
//   fill_ratio     mean batch fill ratio of the steps in the interval (histogram sum/count)
//   rows_per_loop  rows that ran loop L per engine step in the interval, for each L
//   kv_usage       KV cache usage ratio (gauge), requests running / waiting (gauges)
//   gen_tokens     tokens the server sampled in the interval (counter delta)
// Counter totals over the whole run (first and last scrape) go into the report too.
#pragma once

#include <atomic>
#include <condition_variable>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "loadtest/prometheus_text.h"
#include "loadtest/target.h"
#include "loadtest/url.h"
#include "nlohmann/json.hpp"

namespace morserve::loadtest {

struct ScrapePoint {
  double t_s = 0;                               // since the run's start (the end of the interval)
  double fill_ratio = -1;                       // -1: no steps in the interval
  std::map<std::string, double> rows_per_loop;  // loop -> rows per step
  double kv_usage = 0;
  double running = 0, waiting = 0;
  double gen_tokens = 0;
};

class MetricsScraper {
 public:
  MetricsScraper(Url url, int interval_ms);
  ~MetricsScraper();
  void Start(Clock::time_point epoch);
  void Stop();  // takes a last sample
  const std::vector<ScrapePoint>& points() const { return points_; }
  int failures() const { return failures_; }
  nlohmann::json ToJson() const;
  // Server-side deltas between the first and last scrape (0 when absent).
  double CounterDelta(const std::string& name) const;

 private:
  void Loop();
  void Scrape();
  Url url_;
  int interval_ms_;
  Clock::time_point epoch_;
  std::thread thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::optional<PrometheusSample> first_, last_;
  double last_t_ = 0;
  std::vector<ScrapePoint> points_;
  int failures_ = 0;
};

}  // namespace morserve::loadtest
