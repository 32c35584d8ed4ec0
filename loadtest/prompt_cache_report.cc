// The prefix cache's part of the report (see prompt_cache_report.h).
#include "loadtest/prompt_cache_report.h"

#include <map>

#include "loadtest/report.h"
#include "loadtest/stats.h"

namespace morserve::loadtest {

nlohmann::json PromptCacheJson(const std::vector<RequestRecord>& records) {
  int n = 0;
  int64_t prompt = 0, cached = 0;
  for (const RequestRecord& r : records) {
    if (r.warmup || !r.ok || r.usage_cached_tokens < 0 || r.usage_prompt_tokens < 0) continue;
    ++n;
    prompt += r.usage_prompt_tokens;
    cached += r.usage_cached_tokens;
  }
  if (n == 0) return nullptr;
  return {{"requests_with_usage", n},
          {"prompt_tokens", prompt},
          {"cached_tokens", cached},
          {"computed_prompt_tokens", prompt - cached},
          {"cached_fraction", prompt > 0 ? static_cast<double>(cached) / prompt : 0.0}};
}

nlohmann::json ChatTurnsJson(const std::vector<RequestRecord>& records) {
  struct Turn {
    int completed = 0, failed = 0, with_usage = 0;
    int64_t prompt = 0, cached = 0;
    std::vector<double> ttft_ms;
  };
  std::map<int, Turn> turns;
  for (const RequestRecord& r : records) {
    if (r.warmup || r.turn < 0) continue;
    Turn& t = turns[r.turn];
    if (!r.ok) {
      ++t.failed;
      continue;
    }
    ++t.completed;
    t.ttft_ms.push_back(TtftSeconds(r) * 1e3);
    if (r.usage_prompt_tokens >= 0 && r.usage_cached_tokens >= 0) {
      ++t.with_usage;
      t.prompt += r.usage_prompt_tokens;
      t.cached += r.usage_cached_tokens;
    }
  }
  nlohmann::json out = nlohmann::json::array();
  for (const auto& [turn, t] : turns) {
    const double n = t.with_usage;
    out.push_back({{"turn", turn},
                   {"completed", t.completed},
                   {"failed", t.failed},
                   {"ttft_ms", ToJson(Summarize(t.ttft_ms))},
                   {"mean_prompt_tokens", n > 0 ? t.prompt / n : 0.0},
                   {"mean_cached_tokens", n > 0 ? t.cached / n : 0.0}});
  }
  return out;
}

}  // namespace morserve::loadtest
