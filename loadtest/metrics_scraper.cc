// Periodic /metrics scraping (see metrics_scraper.h).
#include "loadtest/metrics_scraper.h"

#include "loadtest/http_get.h"

namespace morserve::loadtest {
namespace {

double Delta(const PrometheusSample& a, const PrometheusSample& b, const std::string& series) {
  return b.Get(series).value_or(0) - a.Get(series).value_or(0);
}

ScrapePoint Between(const PrometheusSample& prev, const PrometheusSample& cur, double t) {
  ScrapePoint p;
  p.t_s = t;
  const double steps = Delta(prev, cur, "morserve_batch_fill_ratio_count");
  if (steps > 0) p.fill_ratio = Delta(prev, cur, "morserve_batch_fill_ratio_sum") / steps;
  const double engine_steps = Delta(prev, cur, "morserve_engine_steps_total");
  const auto rows_prev = prev.ByLabel("morserve_rows_per_loop_total", "loop");
  for (const auto& [loop, v] : cur.ByLabel("morserve_rows_per_loop_total", "loop")) {
    const auto it = rows_prev.find(loop);
    const double d = v - (it == rows_prev.end() ? 0 : it->second);
    p.rows_per_loop[loop] = engine_steps > 0 ? d / engine_steps : 0;
  }
  p.kv_usage = cur.Get("morserve_kv_cache_usage_ratio").value_or(0);
  p.running = cur.Get("morserve_requests_running").value_or(0);
  p.waiting = cur.Get("morserve_requests_waiting").value_or(0);
  p.gen_tokens = Delta(prev, cur, "morserve_generation_tokens_total");
  return p;
}

}  // namespace

MetricsScraper::MetricsScraper(Url url, int interval_ms)
    : url_(std::move(url)), interval_ms_(interval_ms) {}

MetricsScraper::~MetricsScraper() { Stop(); }

void MetricsScraper::Start(Clock::time_point epoch) {
  epoch_ = epoch;
  Scrape();  // the baseline
  thread_ = std::thread([this] { Loop(); });
}

void MetricsScraper::Stop() {
  if (!thread_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
  Scrape();
}

void MetricsScraper::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!cv_.wait_for(lock, std::chrono::milliseconds(interval_ms_), [&] { return stop_; })) {
    lock.unlock();
    Scrape();
    lock.lock();
  }
}

void MetricsScraper::Scrape() {
  auto body = HttpGet(url_, 5000);
  const double t = SecondsSince(epoch_, Clock::now());
  if (!body.ok()) {
    ++failures_;
    return;
  }
  PrometheusSample cur = PrometheusSample::Parse(*body);
  if (last_) points_.push_back(Between(*last_, cur, t));
  if (!first_) first_ = cur;
  last_ = std::move(cur);
  last_t_ = t;
}

double MetricsScraper::CounterDelta(const std::string& name) const {
  if (!first_ || !last_) return 0;
  return last_->Sum(name).value_or(0) - first_->Sum(name).value_or(0);
}

nlohmann::json MetricsScraper::ToJson() const {
  nlohmann::json series = nlohmann::json::array();
  for (const ScrapePoint& p : points_) {
    series.push_back({{"t_s", p.t_s},
                      {"fill_ratio", p.fill_ratio},
                      {"rows_per_loop", p.rows_per_loop},
                      {"kv_usage", p.kv_usage},
                      {"running", p.running},
                      {"waiting", p.waiting},
                      {"gen_tokens", p.gen_tokens}});
  }
  const double steps = CounterDelta("morserve_batch_fill_ratio_count");
  nlohmann::json totals = {
      {"generation_tokens", CounterDelta("morserve_generation_tokens_total")},
      {"prompt_tokens", CounterDelta("morserve_prompt_tokens_total")},
      {"engine_steps", CounterDelta("morserve_engine_steps_total")},
      {"preemptions", CounterDelta("morserve_preemptions_total")},
      // Prefix cache (tokens looked up and found at admission; blocks evicted).
      {"prefix_cache_queries", CounterDelta("morserve_prefix_cache_queries_total")},
      {"prefix_cache_hits", CounterDelta("morserve_prefix_cache_hits_total")},
      {"prefix_cache_evictions", CounterDelta("morserve_prefix_cache_evictions_total")},
      // null for a model without a shared block (no pass of it, no ratio).
      {"mean_fill_ratio",
       steps > 0 ? nlohmann::json(CounterDelta("morserve_batch_fill_ratio_sum") / steps)
                 : nlohmann::json()}};
  return {{"url", "http://" + url_.host + ":" + url_.port + url_.target},
          {"interval_ms", interval_ms_},
          {"scrape_failures", failures_},
          {"totals", totals},
          {"series", series}};
}

}  // namespace morserve::loadtest
