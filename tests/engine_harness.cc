// Engine test helpers (see engine_harness.h).
#include "tests/engine_harness.h"

#include <algorithm>
#include <cmath>
#include <random>

#include <gtest/gtest.h>

namespace morserve::testing {

std::shared_ptr<const ModelWeights> MakeModel(const TinyModelSpec& spec, TempDir* dir) {
  const std::string path = dir->File(spec.family);
  absl::Status s = WriteTinyModel(spec, path);
  if (!s.ok()) {
    ADD_FAILURE() << "mkmodel " << spec.family << ": " << s;
    return nullptr;
  }
  auto w = LoadModel(path);
  if (!w.ok()) {
    ADD_FAILURE() << "load " << spec.family << ": " << w.status();
    return nullptr;
  }
  return *w;
}

std::vector<std::vector<int>> MakePrompts(int count, int min_len, int max_len, int vocab,
                                          uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::vector<int>> out;
  for (int i = 0; i < count; ++i) {
    const int len = min_len + static_cast<int>(rng() % static_cast<uint64_t>(max_len - min_len + 1));
    std::vector<int> p(len);
    for (int& t : p) t = static_cast<int>(rng() % static_cast<uint64_t>(vocab));
    out.push_back(p);
  }
  return out;
}

RunResult Collect(EventChannel* channel) {
  RunResult r;
  for (RequestEvent& e : channel->DrainUntilFinal()) {
    for (TokenEvent& t : e.tokens) {
      r.tokens.push_back(t.token);
      r.logits.push_back(std::move(t.logits));
      r.loops.push_back(t.loops);
    }
    if (e.final()) {
      r.finish = e.finish;
      r.usage = e.usage;
    }
  }
  return r;
}

std::vector<RunResult> RunStaggered(Engine* engine, const std::vector<GenerateRequest>& requests,
                                    const std::vector<int>& arrival_step) {
  std::vector<std::shared_ptr<EventChannel>> channels(requests.size());
  const int last = *std::max_element(arrival_step.begin(), arrival_step.end());
  for (int step = 0; step <= last; ++step) {
    for (size_t i = 0; i < requests.size(); ++i) {
      if (arrival_step[i] != step) continue;
      auto ch = engine->Submit(requests[i]);
      EXPECT_TRUE(ch.ok()) << ch.status();
      if (ch.ok()) channels[i] = *ch;
    }
    engine->Step();
  }
  engine->RunUntilIdle();
  std::vector<RunResult> out;
  for (auto& ch : channels) out.push_back(ch ? Collect(ch.get()) : RunResult{});
  return out;
}

GenerateRequest Greedy(const std::vector<int>& prompt, int max_tokens) {
  GenerateRequest r;
  r.prompt = prompt;
  r.params.temperature = 0.0f;
  r.params.max_tokens = max_tokens;
  r.params.ignore_eos = true;
  r.return_logits = true;
  return r;
}

double MaxRelDiff(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return INFINITY;
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    m = std::max(m, std::fabs(static_cast<double>(a[i]) - b[i]) / std::max(1.0, std::fabs(static_cast<double>(b[i]))));
  }
  return m;
}

}  // namespace morserve::testing
