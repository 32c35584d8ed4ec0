// sampler_bench: what host sampling costs per generated token, the before/after of the
// vectorised logit reductions (engine/cpu/logit_reductions.h). For each vocabulary size, best
// of `reps` over `rows` distinct random logits rows (L2-cold: the rows together exceed the
// cache), microseconds per row of:
//   before      the sampler's greedy path as it was (copy, sequential argmax, max and a double
//               std::exp per entry for the logprob), written out here;
//   scalar/avx2 one max, the argmax (find) and sum_exp with each kernel set the host runs;
//   sample      Sampler::Sample, greedy (copy + the best set), as the engine calls it.
// Prints one JSON object.
// Usage: sampler_bench [rows=64] [reps=5]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "engine/cpu/logit_reductions.h"
#include "engine/runtime/sampler.h"
#include "engine/runtime/sampling_params.h"
#include "nlohmann/json.hpp"

namespace morserve {
namespace {

double g_sink = 0;  // keeps results alive

// The greedy path of sampler.cc before the vectorised reductions.
void Before(const std::vector<float>& logits, std::vector<float>* work) {
  work->assign(logits.begin(), logits.end());
  int best = 0;
  for (int i = 1; i < static_cast<int>(work->size()); ++i) {
    if ((*work)[i] > (*work)[best]) best = i;
  }
  float m = -std::numeric_limits<float>::infinity();
  for (float v : logits) m = std::max(m, v);
  double sum = 0.0;
  for (float v : logits) sum += std::exp(v - m);
  g_sink += static_cast<double>(logits[best]) - (m + std::log(sum));
}

template <typename F>
double BestUsPerRow(const std::vector<std::vector<float>>& rows, int reps, F f) {
  double best = 1e300;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    for (const auto& row : rows) f(row);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::min(best, s * 1e6 / rows.size());
  }
  return best;
}

int Main(int argc, char** argv) {
  const int nrows = argc > 1 ? std::atoi(argv[1]) : 64;
  const int reps = argc > 2 ? std::atoi(argv[2]) : 5;
  std::mt19937 rng(1);
  std::normal_distribution<float> logit(0.0f, 4.0f);
  nlohmann::json out = {{"bench", "sampler"}, {"rows", nrows}, {"reps", reps}, {"results", nlohmann::json::array()}};
  std::vector<const LogitReductionSet*> sets{&ScalarLogitReductions()};
  if (Avx2LogitReductions() != nullptr) sets.push_back(Avx2LogitReductions());
  out["best_set"] = std::string(BestLogitReductions().name);
  for (int vocab : {32000, 49152, 151936}) {
    std::vector<std::vector<float>> rows(nrows, std::vector<float>(vocab));
    for (auto& row : rows) {
      for (float& v : row) v = logit(rng);
    }
    nlohmann::json r = {{"vocab", vocab}};
    std::vector<float> work;
    const double before = BestUsPerRow(rows, reps, [&](const std::vector<float>& x) { Before(x, &work); });
    r["before_us"] = before;
    for (const LogitReductionSet* set : sets) {
      r[std::string(set->name) + "_us"] = BestUsPerRow(rows, reps, [&](const std::vector<float>& x) {
        const float m = set->max(x.data(), vocab);
        g_sink += ArgmaxGivenMax(*set, x.data(), vocab, m) + set->sum_exp(x.data(), vocab, m);
      });
    }
    Sampler sampler;
    SamplingParams greedy;
    greedy.temperature = 0.0f;
    const double sample = BestUsPerRow(rows, reps, [&](const std::vector<float>& x) {
      SampleInput in;
      in.logits = x;
      in.params = &greedy;
      g_sink += sampler.Sample(in).logprob;
    });
    r["sample_us"] = sample;
    r["before_over_sample"] = before / sample;
    std::fprintf(stderr, "vocab %6d: before %7.1f us, sample %6.1f us (%.1fx)\n", vocab, before, sample, before / sample);
    out["results"].push_back(r);
  }
  out["sink"] = g_sink;
  std::printf("%s\n", out.dump(2).c_str());
  return 0;
}

}  // namespace
}  // namespace morserve

int main(int argc, char** argv) { return morserve::Main(argc, argv); }
