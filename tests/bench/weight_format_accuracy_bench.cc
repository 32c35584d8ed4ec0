// weight_format_accuracy_bench: what a CPU weight format (--weights, engine/cpu/linear_weights.h)
// costs in accuracy on a real-width model, against the same model served in its checkpoint's
// own dtype (--weights auto). For each prompt (random ids, fixed seed), greedy decoding with
// both; up to the first token that differs: the next-token KL divergence KL(auto || format)
// and the largest logit difference relative to the row's max(|logit|, 1); then the share of
// generated tokens before the first flip. Prints one JSON object.
// Usage: weight_format_accuracy_bench MODEL_DIR [formats=int8,bf16,f16] [prompts=8] [tokens=32]
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "engine/model/weights.h"
#include "engine/runtime/engine.h"
#include "engine/tools/engine_flags.h"

namespace morserve {
namespace {

struct Run {
  std::vector<int> tokens;
  std::vector<std::vector<float>> logits;
};

Run Generate(Engine* engine, const std::vector<int>& prompt, int tokens) {
  GenerateRequest r;
  r.prompt = prompt;
  r.params.temperature = 0.0f;
  r.params.max_tokens = tokens;
  r.params.ignore_eos = true;
  r.return_logits = true;
  auto ch = engine->Submit(r);
  engine->RunUntilIdle();
  Run out;
  for (const RequestEvent& e : (*ch)->DrainUntilFinal()) {
    for (const TokenEvent& t : e.tokens) {
      out.tokens.push_back(t.token);
      out.logits.push_back(t.logits);
    }
  }
  return out;
}

std::vector<double> LogSoftmax(const std::vector<float>& x) {
  const double m = *std::max_element(x.begin(), x.end());
  double s = 0;
  for (float v : x) s += std::exp(v - m);
  std::vector<double> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = x[i] - m - std::log(s);
  return out;
}

double Kl(const std::vector<float>& p_logits, const std::vector<float>& q_logits) {
  const auto lp = LogSoftmax(p_logits), lq = LogSoftmax(q_logits);
  double kl = 0;
  for (size_t i = 0; i < lp.size(); ++i) kl += std::exp(lp[i]) * (lp[i] - lq[i]);
  return kl;
}

double ScaledDiff(const std::vector<float>& a, const std::vector<float>& b) {
  double scale = 1, worst = 0;
  for (float v : b) scale = std::max(scale, static_cast<double>(std::fabs(v)));
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, static_cast<double>(std::fabs(a[i] - b[i])));
  return worst / scale;
}

int Main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: weight_format_accuracy_bench MODEL_DIR [int8,bf16,f16] [prompts] [tokens]\n");
    return 2;
  }
  auto weights = LoadModel(argv[1]);
  if (!weights.ok()) {
    std::fprintf(stderr, "%s\n", std::string(weights.status().message()).c_str());
    return 1;
  }
  const std::string formats = argc > 2 ? argv[2] : "int8,bf16,f16";
  const int prompts = argc > 3 ? std::atoi(argv[3]) : 8, tokens = argc > 4 ? std::atoi(argv[4]) : 32;
  const int vocab = (*weights)->config.vocab_size;
  std::mt19937 rng(7);
  std::vector<std::vector<int>> inputs(prompts);
  for (auto& p : inputs) {
    p.resize(16);
    for (int& t : p) t = static_cast<int>(rng() % vocab);
  }
  EngineConfig base_cfg;
  base_cfg.kv_cache_bytes = 256ll << 20;
  auto base = Engine::Create(*weights, base_cfg);
  if (!base.ok()) return 1;
  std::vector<Run> want;
  for (const auto& p : inputs) want.push_back(Generate(base->get(), p, tokens));
  std::printf("{\"model\": \"%s\", \"prompts\": %d, \"tokens\": %d, \"formats\": [\n", argv[1], prompts, tokens);
  std::stringstream list(formats);
  std::string name;
  bool first = true;
  while (std::getline(list, name, ',')) {
    auto f = ParseCpuWeights(name);
    if (!f.ok()) return 1;
    EngineConfig cfg = base_cfg;
    cfg.weights = *f;
    auto engine = Engine::Create(*weights, cfg);
    if (!engine.ok()) return 1;
    int agreed = 0, compared = 0;
    double kl_sum = 0, kl_max = 0, diff_max = 0;
    for (size_t i = 0; i < inputs.size(); ++i) {
      const Run got = Generate(engine->get(), inputs[i], tokens);
      for (size_t t = 0; t < want[i].tokens.size(); ++t) {
        const double kl = Kl(want[i].logits[t], got.logits[t]);
        kl_sum += kl;
        kl_max = std::max(kl_max, kl);
        diff_max = std::max(diff_max, ScaledDiff(got.logits[t], want[i].logits[t]));
        ++compared;
        if (got.tokens[t] != want[i].tokens[t]) break;
        ++agreed;
      }
    }
    std::printf("%s  {\"weights\": \"%s\", \"tokens_before_first_flip\": %.3f, \"mean_kl\": %.3g, "
                "\"max_kl\": %.3g, \"max_scaled_logit_diff\": %.3g, \"steps_compared\": %d}",
                first ? "" : ",\n", name.c_str(), static_cast<double>(agreed) / (prompts * tokens),
                kl_sum / compared, kl_max, diff_max, compared);
    first = false;
  }
  std::printf("\n]}\n");
  return 0;
}

}  // namespace
}  // namespace morserve

int main(int argc, char** argv) { return morserve::Main(argc, argv); }
