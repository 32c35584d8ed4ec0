// Helpers for engine tests: tiny models on disk, engine runs with staggered arrivals, and
// comparison with the reference implementation.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/model/weights.h"
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
  std::optional<std::vector<PromptTokenLogprob>> prompt_logprobs;  // as the events carried them
  int prompt_logprob_events = 0;  // events that carried prompt logprobs (must be one)
};

// A tiny-model variant the engine serves, named for test output.
struct FamilyCase {
  std::string name;
  TinyModelSpec spec;
};

// An fp32 tiny model of `family` (mkmodel's defaults otherwise).
TinyModelSpec F32Spec(const std::string& family);
// Every family and variant the engine covers: sharing strategies, KV modes, both MoR
// routings with their router options, LoRA, early exit (skip, propagate), recurrent layers.
std::vector<FamilyCase> EngineFamilies();
// gtest parameter name of a case (alphanumerics and '_').
std::string CaseName(const FamilyCase& c);

// Submits requests[i] at step arrival_step[i] (driving Engine::Step), runs until all finish.
std::vector<RunResult> RunStaggered(Engine* engine, const std::vector<GenerateRequest>& requests,
                                    const std::vector<int>& arrival_step);

RunResult Collect(EventChannel* channel);

GenerateRequest Greedy(const std::vector<int>& prompt, int max_tokens);

// Largest |a - b| / max(|b|, 1) over the vectors.
double MaxRelDiff(const std::vector<float>& a, const std::vector<float>& b);

}  // namespace morserve::testing
