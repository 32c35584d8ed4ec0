// Helpers for engine tests: tiny models on disk, the model variants every engine test covers
// (shared by the CPU engine_test and the GPU engine_gpu_test), engine runs with staggered
// arrivals, and comparison with the reference implementation.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <ostream>
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

// One tiny model variant of the engine tests: its name (the test's parameter) and spec.
struct FamilyCase {
  std::string name;
  TinyModelSpec spec;
};

// Every model variant the engine covers: each family, plus routers, sharing, KV modes, LoRA,
// early exit, recurrent layers and tied embeddings. `spec(family)` gives the test's base
// spec for a family (dtype and shape: f32 on the CPU, a bf16 GPU shape on the device); each
// variant then sets only its own fields.
// An fp32 tiny model of `family` (mkmodel's defaults otherwise): the CPU tests' base spec.
TinyModelSpec F32Spec(const std::string& family);

// mkmodel's tiny model of `family`, narrower (hidden 32, 4 heads of which 2 kv, intermediate
// 64, vocab 64): the checkpoint tests' spec (mkmodel, convert).
TinyModelSpec NarrowSpec(const std::string& family);

std::vector<FamilyCase> EngineFamilies(
    const std::function<TinyModelSpec(const std::string& family)>& spec);

// gtest prints a FamilyCase parameter as its name (not the struct's bytes).
void PrintTo(const FamilyCase& c, std::ostream* os);

// A gtest parameter name for a FamilyCase: its name with every non-alphanumeric as '_'.
std::string FamilyCaseName(const ::testing::TestParamInfo<FamilyCase>& info);

// Deterministic prompts of mixed lengths in [min_len, max_len].
std::vector<std::vector<int>> MakePrompts(int count, int min_len, int max_len, int vocab,
                                          uint64_t seed);

// Requests with the step at which each arrives.
struct Workload {
  std::vector<GenerateRequest> requests;
  std::vector<int> arrivals;
};

// `count` greedy requests (prompts of 1..24 tokens, 6..10 new tokens) arriving over 11 steps.
Workload MakeWorkload(int vocab, int count = 16);

struct RunResult {
  std::vector<int> tokens;
  std::vector<float> logprobs;             // of each generated token
  std::vector<std::vector<float>> logits;  // per generated token
  std::vector<int> loops;
  FinishReason finish = FinishReason::kNone;
  Usage usage;
  std::optional<std::vector<PromptTokenLogprob>> prompt_logprobs;  // as the events carried them
  int prompt_logprob_events = 0;  // events that carried prompt logprobs (must be one)
};

// Submits requests[i] at step arrival_step[i] (driving Engine::Step), runs until all finish.
std::vector<RunResult> RunStaggered(Engine* engine, const std::vector<GenerateRequest>& requests,
                                    const std::vector<int>& arrival_step);

RunResult Collect(EventChannel* channel);

// `request` alone on a fresh in-process engine (EngineConfig defaults), run to the end; the
// same conversion a server makes, so tests compare a server's answer with it.
RunResult RunAlone(const std::shared_ptr<const ModelWeights>& weights,
                   const GenerateRequest& request);

GenerateRequest Greedy(const std::vector<int>& prompt, int max_tokens);

// The reference's log_softmax(logits)[token] (in double) and max(|logit|, 1): the engine's
// prompt logprobs are within 2e-4 * scale of it (prompt_logprobs_test explains the bound).
struct RefLogprob {
  double logprob = 0;
  double scale = 1;
};
RefLogprob ReferenceLogprob(const std::vector<float>& logits, int token);

// Largest |a - b| / max(|b|, 1) over the vectors.
double MaxRelDiff(const std::vector<float>& a, const std::vector<float>& b);

// Largest |a - b| over the vectors, relative to the scale of b: max(max |b|, 1). The rule for
// bf16 activations, whose rounding error in a logit is proportional to the whole row's scale
// (the hidden state's norm), not to that logit: a logit near 0 in a row whose largest is 16
// is off by as much as the largest (about 0.5% of 16 over four bf16 layers).
double MaxScaledDiff(const std::vector<float>& a, const std::vector<float>& b);

// The bf16 comparison rule of the GPU engine tests (tests/gpu/engine_gpu_test.cc explains
// it): per request, tokens, loop counts and logits (within kGpuLogitTolerance by
// MaxScaledDiff) are compared up to the first step whose reference top-1 margin
// (top1 - top2) / max(|top1|, 1) is at most kGpuMargin; a differing loop count ends the
// request's comparison and counts as a loop flip.
inline constexpr double kGpuMargin = 1e-2;

// A Foundation test family at the GPU test shape (hidden 256, 4 heads of 64, 2 kv heads,
// intermediate 256, bf16 weights: the attention kernels take head_dim 64/128).
TinyModelSpec GpuModelSpec(const std::string& family);
inline constexpr double kGpuLogitTolerance = 2e-2;

double Margin(const std::vector<float>& logits);

struct Tally {
  int generated = 0, compared = 0, loop_flips = 0;
};

struct RefRun {
  std::vector<int> tokens;
  std::vector<StepOutput> outs;
  // A prompt position (before the last) whose early-exit confidence after some loop is within
  // kGpuMargin of the threshold: bf16 rounding may exit there at another loop, which changes
  // the cache every later position reads, and no generated token's loop count shows it.
  // CompareWithReference compares no step of such a request (it still counts as generated).
  bool unclear_prompt = false;
};

// The reference's greedy run of every request.
std::vector<RefRun> ReferenceRuns(std::shared_ptr<const ModelWeights> weights,
                                  const std::vector<GenerateRequest>& requests);

// Applies the rule above to got[i] vs refs[i] for every request (gtest failures on mismatch).
void CompareWithReference(const std::vector<RefRun>& refs,
                          const std::vector<GenerateRequest>& requests,
                          const std::vector<RunResult>& got, const std::string& label,
                          Tally* tally);

// Adaptive looped models with copy on exit (Ouro, Huginn), mid-run: steps `ref` (fresh, on
// the engine's model with the model's defaults) through seq's done positions, then checks
// every entry of the looped segment's slots at those positions against the reference's (to
// 1e-4: fp32 compute), and each copy on exit against the engine's own exit-loop entry, bit for
// bit. An entry not written yet must be owed by a K/V-only row still riding the loop. Returns
// the number of copies checked.
int ExpectLoopSlotsMatchReference(const Engine& engine, const Sequence& seq, ReferenceModel& ref,
                                  const std::string& label);

}  // namespace morserve::testing
