// prompt_logprobs_bench: what scoring the prompt costs. A batch of requests with prompts of
// `len` tokens is prefilled (max_tokens 1) without prompt logprobs, then with prompt_logprobs
// 0 and 20, and lm-eval's shape (max_tokens 0, prompt_logprobs 1); the extra work is final norm
// + lm_head + log_softmax over every prompt row. Wall and process CPU time of the whole batch,
// best of `reps`; scored runs must produce one entry per prompt token after the first.
// Prints one JSON object.
// Usage: prompt_logprobs_bench MODEL_DIR [len=256] [requests=8] [reps=3]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "engine/model/weights.h"
#include "engine/runtime/engine.h"
#include "nlohmann/json.hpp"

namespace morserve {
namespace {

struct Timing {
  double ms = 1e300, cpu_ms = 1e300;
};

// One batch: every request submitted, then the engine stepped until idle.
Timing RunBatch(Engine* engine, const std::vector<std::vector<int>>& prompts, int max_tokens,
                std::optional<int> k) {
  const std::clock_t c0 = std::clock();
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::shared_ptr<EventChannel>> channels;
  for (const std::vector<int>& p : prompts) {
    GenerateRequest r;
    r.prompt = p;
    r.params.temperature = 0.0f;
    r.params.max_tokens = max_tokens;
    r.params.ignore_eos = true;
    r.params.prompt_logprobs = k;
    auto ch = engine->Submit(r);
    if (!ch.ok()) {
      std::fprintf(stderr, "submit: %s\n", std::string(ch.status().message()).c_str());
      std::exit(1);
    }
    channels.push_back(*ch);
  }
  engine->RunUntilIdle();
  Timing t;
  t.ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  t.cpu_ms = 1000.0 * static_cast<double>(std::clock() - c0) / CLOCKS_PER_SEC;
  for (size_t i = 0; i < channels.size(); ++i) {
    size_t entries = 0;
    for (RequestEvent& e : channels[i]->DrainUntilFinal()) {
      if (e.final() && !e.error.ok()) {
        std::fprintf(stderr, "request failed: %s\n", std::string(e.error.message()).c_str());
        std::exit(1);
      }
      if (e.prompt_logprobs) entries = e.prompt_logprobs->size();
    }
    if (k && entries != prompts[i].size() - 1) {
      std::fprintf(stderr, "request %zu: %zu prompt entries, expected %zu\n", i, entries,
                   prompts[i].size() - 1);
      std::exit(1);
    }
  }
  return t;
}

int Main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: prompt_logprobs_bench MODEL_DIR [len=256] [requests=8] [reps=3]\n");
    return 2;
  }
  const int len = argc > 2 ? std::atoi(argv[2]) : 256;
  const int requests = argc > 3 ? std::atoi(argv[3]) : 8;
  const int reps = argc > 4 ? std::atoi(argv[4]) : 3;
  auto weights = LoadModel(argv[1]);
  if (!weights.ok()) {
    std::fprintf(stderr, "%s\n", std::string(weights.status().message()).c_str());
    return 1;
  }
  std::mt19937 rng(1);
  std::vector<std::vector<int>> prompts(requests, std::vector<int>(len));
  for (auto& p : prompts) {
    for (int& t : p) t = static_cast<int>(rng() % (*weights)->config.vocab_size);
  }
  EngineConfig cfg;
  auto engine = Engine::Create(*weights, cfg);
  if (!engine.ok()) {
    std::fprintf(stderr, "%s\n", std::string(engine.status().message()).c_str());
    return 1;
  }
  struct Variant {
    const char* name;
    int max_tokens;
    std::optional<int> k;
  };
  const Variant variants[] = {{"no_prompt_logprobs", 1, std::nullopt},
                              {"prompt_logprobs_0", 1, 0},
                              {"prompt_logprobs_20", 1, 20},
                              {"loglikelihood_max_tokens_0_k1", 0, 1}};
  RunBatch(engine->get(), prompts, 1, std::nullopt);  // warm-up
  nlohmann::json results = nlohmann::json::array();
  for (const Variant& v : variants) {
    Timing best;
    for (int r = 0; r < reps; ++r) {
      const Timing t = RunBatch(engine->get(), prompts, v.max_tokens, v.k);
      best.ms = std::min(best.ms, t.ms);
      best.cpu_ms = std::min(best.cpu_ms, t.cpu_ms);
    }
    results.push_back({{"variant", v.name},
                       {"wall_ms", best.ms},
                       {"cpu_ms", best.cpu_ms},
                       {"prompt_tokens_per_s", requests * len / (best.ms / 1000.0)}});
  }
  const ModelConfig& c = (*weights)->config;
  nlohmann::json out = {{"model", argv[1]},
                        {"hidden", c.hidden_size},
                        {"vocab", c.vocab_size},
                        {"prompt_len", len},
                        {"requests", requests},
                        {"reps", reps},
                        {"max_step_tokens", cfg.max_step_tokens},
                        {"results", results}};
  std::printf("%s\n", out.dump(2).c_str());
  return 0;
}

}  // namespace
}  // namespace morserve

int main(int argc, char** argv) { return morserve::Main(argc, argv); }
