// recurrent_prefill_bench: prefill time of one request on a recurrent-layer model
// (docs/models.md#recurrent-transformer-layers) against prompt length, for the tiled and the naive
// schedule of the CPU runner (engine/cpu/recurrent_prefill.h) or, with device cuda, of the CUDA
// runner (kernels/recurrent_attention.cuh, engine/runtime/recurrent_schedule.h). Each prompt enters
// as one chunk (one engine step) and produces one token; the time is Submit to the token (wall, and
// process CPU time, which a shared machine's waiting does not inflate), best of `reps` (prefix
// caching off: every rep computes the whole prompt). On the CPU the two schedules must give
// bit-identical logits; on the GPU their attention is bitwise equal but the GEMMs see other row
// counts, so the largest relative logit difference is reported and must stay under 5e-2 (the bf16
// rule of the GPU engine tests). The run fails otherwise. Prints one JSON object. Usage:
// recurrent_prefill_bench MODEL_DIR [max_len=8192] [reps=1] [threads=0] [device=cpu|cuda] (lengths
// 128, 256, ... up to max_len; make the model with `morserve mkmodel --family recurrent`, with
// --max-pos above max_len).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <random>
#include <string>
#include <vector>

#include "engine/model/weights.h"
#include "engine/runtime/engine.h"

namespace morserve {
namespace {

struct Run {
  double ms = 0;
  double cpu_ms = 0;  // process CPU time: all threads, unaffected by waiting for a core
  std::vector<float> logits;
};

Run Prefill(Engine* engine, const std::vector<int>& prompt) {
  GenerateRequest r;
  r.prompt = prompt;
  r.params.temperature = 0.0f;
  r.params.max_tokens = 1;
  r.params.ignore_eos = true;
  r.return_logits = true;
  const std::clock_t c0 = std::clock();
  const auto t0 = std::chrono::steady_clock::now();
  auto ch = engine->Submit(r);
  if (!ch.ok()) {
    std::fprintf(stderr, "submit: %s\n", std::string(ch.status().message()).c_str());
    std::exit(1);
  }
  engine->RunUntilIdle();
  const auto t1 = std::chrono::steady_clock::now();
  Run out;
  out.ms = std::chrono::duration<double, std::milli>(t1 - t0).count();
  out.cpu_ms = 1000.0 * static_cast<double>(std::clock() - c0) / CLOCKS_PER_SEC;
  for (RequestEvent& e : (*ch)->DrainUntilFinal()) {
    if (e.final() && !e.error.ok()) {
      std::fprintf(stderr, "request failed: %s\n", std::string(e.error.message()).c_str());
      std::exit(1);
    }
    for (TokenEvent& t : e.tokens) out.logits = t.logits;
  }
  return out;
}

int Main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: recurrent_prefill_bench MODEL_DIR [max_len] [reps] [threads]\n");
    return 2;
  }
  const int max_len = argc > 2 ? std::atoi(argv[2]) : 8192;
  const int reps = argc > 3 ? std::max(1, std::atoi(argv[3])) : 1;
  const int threads = argc > 4 ? std::atoi(argv[4]) : 0;
  const std::string device = argc > 5 ? argv[5] : "cpu";
  if (device != "cpu" && device != "cuda") {
    std::fprintf(stderr, "device must be cpu or cuda, not %s\n", device.c_str());
    return 2;
  }
  const bool gpu = device == "cuda";
  auto weights = LoadModel(argv[1]);
  if (!weights.ok()) {
    std::fprintf(stderr, "load: %s\n", std::string(weights.status().message()).c_str());
    return 1;
  }
  const ModelConfig& mc = (*weights)->config;
  if (mc.recursion.layer_kind != LayerKind::kRecurrent) {
    std::fprintf(stderr, "%s: not a layer_kind recurrent model\n", argv[1]);
    return 1;
  }
  std::vector<std::unique_ptr<Engine>> engines;
  for (RecurrentPrefill s : {RecurrentPrefill::kTiled, RecurrentPrefill::kNaive}) {
    EngineConfig cfg;
    cfg.recurrent_prefill = s;
    cfg.prefix_cache = false;  // each rep prefills the whole prompt, not the cached prefix
    cfg.max_batch_rows = max_len;
    cfg.max_step_tokens = max_len;
    cfg.threads = threads;
    cfg.device = gpu ? Device::kCuda : Device::kCpu;
    cfg.num_kv_blocks = (max_len / cfg.block_size + 8) * (*weights)->plan.num_cache_slots;
    auto e = Engine::Create(*weights, cfg);
    if (!e.ok()) {
      std::fprintf(stderr, "engine: %s\n", std::string(e.status().message()).c_str());
      return 1;
    }
    engines.push_back(std::move(*e));
  }
  std::mt19937_64 rng(7);
  std::vector<int> warm(16);
  for (int& t : warm) t = static_cast<int>(rng() % mc.vocab_size);
  for (auto& e : engines) Prefill(e.get(), warm);

  std::printf(
      "{\"bench\": \"recurrent_prefill\", \"device\": \"%s\", \"model\": \"%s\","
      " \"hidden\": %d, \"layers\": %d,"
      " \"heads\": %d, \"kv_heads\": %d, \"intermediate\": %d, \"block_size\": %d,"
      " \"threads\": %d, \"reps\": %d, \"results\": [",
      device.c_str(), argv[1], mc.hidden_size, mc.num_layers, mc.num_heads, mc.num_kv_heads,
      mc.intermediate_size, EngineConfig{}.block_size, threads, reps);
  bool first = true;
  for (int len = 128; len <= max_len; len *= 2) {
    std::vector<int> prompt(len);
    for (int& t : prompt) t = static_cast<int>(rng() % mc.vocab_size);
    double best[2] = {1e300, 1e300}, cpu[2] = {1e300, 1e300};
    std::vector<float> logits[2];
    for (int r = 0; r < reps; ++r) {
      for (int s = 0; s < 2; ++s) {
        Run run = Prefill(engines[s].get(), prompt);
        best[s] = std::min(best[s], run.ms);
        cpu[s] = std::min(cpu[s], run.cpu_ms);
        logits[s] = std::move(run.logits);
      }
    }
    const bool equal = logits[0] == logits[1] && !logits[0].empty();
    double max_rel = logits[0].size() == logits[1].size() && !logits[0].empty() ? 0.0 : 1e300;
    for (size_t i = 0; max_rel < 1e300 && i < logits[0].size(); ++i) {
      max_rel = std::max(max_rel, std::abs(static_cast<double>(logits[0][i]) - logits[1][i]) /
                                      std::max(1.0, std::abs(static_cast<double>(logits[1][i]))));
    }
    std::printf(
        "%s\n  {\"prompt_tokens\": %d, \"tiled_ms\": %.1f, \"naive_ms\": %.1f,"
        " \"tiled_ms_per_token\": %.4f, \"naive_ms_per_token\": %.4f,"
        " \"tiled_cpu_ms\": %.1f, \"naive_cpu_ms\": %.1f,"
        " \"naive_over_tiled\": %.2f, \"naive_over_tiled_cpu\": %.2f,"
        " \"logits_bit_identical\": %s, \"logits_max_rel_diff\": %.3g}",
        first ? "" : ",", len, best[0], best[1], best[0] / len, best[1] / len, cpu[0], cpu[1],
        best[1] / best[0], cpu[1] / cpu[0], equal ? "true" : "false", max_rel);
    std::fflush(stdout);
    first = false;
    if (gpu ? !(max_rel < 5e-2) : !equal) {
      std::fprintf(stderr, "tiled and naive logits differ at %d tokens (max rel %g)\n", len,
                   max_rel);
      return 1;
    }
  }
  std::printf("\n]}\n");
  return 0;
}

}  // namespace
}  // namespace morserve

int main(int argc, char** argv) { return morserve::Main(argc, argv); }
