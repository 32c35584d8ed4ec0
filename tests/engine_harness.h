// Helpers for engine tests: tiny models on disk, engine runs with staggered arrivals, and
// comparison with the reference implementation.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "engine/model/weights.h"
#include "engine/reference/reference_model.h"
#include "engine/runtime/engine.h"
#include "engine/tools/mkmodel.h"
#include "tests/testutil.h"

namespace morserve::testing {

// Writes the tiny model of `spec` into a temp dir and loads it (aborts the test on error).
std::shared_ptr<const ModelWeights> MakeModel(const TinyModelSpec& spec, TempDir* dir);

// Deterministic prompts of mixed lengths in [min_len, max_len].
std::vector<std::vector<int>> MakePrompts(int count, int min_len, int max_len, int vocab,
                                          uint64_t seed);

struct RunResult {
  std::vector<int> tokens;
  std::vector<std::vector<float>> logits;  // per generated token
  std::vector<int> loops;
  FinishReason finish = FinishReason::kNone;
  Usage usage;
};

// Submits requests[i] at step arrival_step[i] (driving Engine::Step), runs until all finish.
std::vector<RunResult> RunStaggered(Engine* engine, const std::vector<GenerateRequest>& requests,
                                    const std::vector<int>& arrival_step);

RunResult Collect(EventChannel* channel);

GenerateRequest Greedy(const std::vector<int>& prompt, int max_tokens);

// Largest |a - b| / max(|b|, 1) over the vectors.
double MaxRelDiff(const std::vector<float>& a, const std::vector<float>& b);

// The bf16 comparison rule of the GPU engine tests (tests/gpu/engine_gpu_test.cc explains
// it): per request, tokens, loop counts and logits (within kGpuLogitTolerance relative to
// max(|logit|, 1)) are compared up to the first step whose reference top-1 margin
// (top1 - top2) / max(|top1|, 1) is at most kGpuMargin; a differing loop count ends the
// request's comparison and counts as a loop flip.
inline constexpr double kGpuMargin = 1e-2;

// A Foundation test family at the GPU test shape (hidden 256, 4 heads of 64, 2 kv heads,
// intermediate 256, bf16 weights: the attention kernels take head_dim 64/128).
TinyModelSpec GpuModelSpec(const std::string& family);
inline constexpr double kGpuLogitTolerance = 5e-2;

double Margin(const std::vector<float>& logits);

struct Tally {
  int generated = 0, compared = 0, loop_flips = 0;
};

struct RefRun {
  std::vector<int> tokens;
  std::vector<StepOutput> outs;
};

// The reference's greedy run of every request.
std::vector<RefRun> ReferenceRuns(std::shared_ptr<const ModelWeights> weights,
                                  const std::vector<GenerateRequest>& requests);

// Applies the rule above to got[i] vs refs[i] for every request (gtest failures on mismatch).
void CompareWithReference(const std::vector<RefRun>& refs,
                          const std::vector<GenerateRequest>& requests,
                          const std::vector<RunResult>& got, const std::string& label,
                          Tally* tally);

}  // namespace morserve::testing
