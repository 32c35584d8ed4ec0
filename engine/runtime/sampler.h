// CPU sampler for one row of logits (docs/models.md#sampling).
//
// Pipeline, in vLLM v1's order (its Sampler.apply_logits_processors, then sampling):
//   allowed_token_ids -> logit_bias -> min_tokens -> penalties -> temperature -> top_k ->
//   top_p -> min_p -> sample.
// - allowed_token_ids: every other id's logit becomes -inf.
// - logit_bias: added to the logit (so a repetition penalty then divides or multiplies the
//   biased value, as in vLLM). -inf stays -inf whatever the bias.
// - min_tokens: while fewer than min_tokens tokens have been generated (output_ids.size()),
//   the eos ids and stop_token_ids are -inf. Validate() guarantees something stays finite.
// - Repetition penalty (HF/vLLM): for every token id present in prompt or output, a logit
//   > 0 is divided by the penalty and a logit <= 0 is multiplied by it. Then frequency
//   (logit -= f * count in output) and presence (logit -= p if count > 0) on output only.
// - Greedy (temperature < kGreedyTemperature): argmax of the penalised logits, ties to the
//   lowest id. top_k / top_p / min_p are ignored.
// - top_k keeps exactly k tokens: ties at the k-th value go to the lowest ids (vLLM keeps
//   every tie; we keep exactly k so that top_k = 1 is greedy bit for bit).
// - top_p keeps a token when the mass of the tokens ranked strictly above it is < top_p,
//   i.e. the smallest prefix whose mass reaches top_p (vLLM's rule), on the distribution
//   renormalised after top_k. Ranking: probability descending, then id ascending.
// - min_p keeps tokens whose probability >= min_p * max probability.
// - Sampling inverts the CDF of the kept tokens, in ascending id order, at one uniform.
//
// Randomness is counter based: the uniform for output step i is a pure function of
// (seed, i), i = number of output tokens already generated. So a seeded request's tokens
// depend only on its seed, its history and its logits, never on batch neighbours or call
// order, and the same inputs give the same token bit for bit.
//
// Logprobs follow vLLM's default (logprobs_mode = "raw_logprobs"): log_softmax of the raw
// model logits, before allowed ids, bias, min_tokens, penalties, temperature and filtering. The
// chosen token's logprob is always returned; `logprobs` alternatives (descending, ties to lowest
// id) on request.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/types/span.h"
#include "engine/runtime/sampling_params.h"

namespace morserve {

// A fresh random seed (std::random_device); call once when a request without a
// seed is created, so that a retried or recomputed step draws the same numbers.
uint64_t DrawRandomSeed();
// The request's seed: params.seed when set, otherwise DrawRandomSeed().
uint64_t ResolveSeed(const SamplingParams& params);
// The uniform in [0, 1) (53 bits) for output step `step` of a request seeded
// with `seed`.
double UniformForStep(uint64_t seed, uint64_t step);

struct TokenLogprob {
  int token = -1;
  float logprob = 0.0f;
};

// log(sum(exp(logits))) = max + log(sum(exp(x - max))), the sum in the lane order of
// engine/cpu/logit_reductions.h (float expf, double lane sums): the normaliser of every
// logprob the engine reports, sampled or prompt.
double LogSumExp(absl::Span<const float> logits);
// The same given m = the row's largest non-NaN entry (one pass saved when it is known).
double LogSumExpGivenMax(absl::Span<const float> logits, float m);
// The n best tokens of a logits row as logprobs (logit - log_z), best first, ties to the
// lowest id. `scratch` is reused between calls.
void TopLogprobs(absl::Span<const float> logits, double log_z, int n, std::vector<int>* scratch,
                 std::vector<TokenLogprob>* out);

struct SampleResult {
  int token = -1;
  float logprob = 0.0f;                    // raw log_softmax of the chosen token
  std::vector<TokenLogprob> top_logprobs;  // params.logprobs entries, best first
};

struct SampleInput {
  absl::Span<const float> logits;  // one row, vocab entries; finite or -inf
  const SamplingParams* params = nullptr;
  absl::Span<const int> prompt_ids;  // for the repetition penalty
  absl::Span<const int> output_ids;  // generated so far; its size is the RNG step
  absl::Span<const int> eos_ids;     // the model's end-of-sequence ids (for min_tokens)
  uint64_t seed = 0;                 // ResolveSeed() at request creation
};

// Holds scratch buffers so that a step's rows reuse memory; not thread safe,
// use one per thread. Token ids in the history and in the parameters must lie in
// [0, vocab) (checked, abort otherwise: Validate() refuses them first).
class Sampler {
 public:
  SampleResult Sample(const SampleInput& in);
  // Every stage before temperature: the row after allowed ids, bias, min_tokens and the
  // repetition, frequency and presence penalties (greedy takes its argmax). The view is into
  // scratch memory and is valid until the next call on this object.
  absl::Span<const float> ProcessLogits(const SampleInput& in);
  // Whether ProcessLogits would change any logit of `in` (allowed ids, bias, a min_tokens ban
  // at this step, a penalty).
  static bool ChangesLogits(const SampleInput& in);

 private:
  void Constrain(const SampleInput& in);
  void Penalize(const SampleInput& in);
  int Argmax() const;
  int SampleFiltered(const SamplingParams& p, double u);
  void TopK(int k);
  void Softmax();
  void TopP(double top_p);
  void MinP(double min_p);

  std::vector<float> work_;    // penalised (then scaled) logits, one per vocab id
  std::vector<int> counts_;    // output-token counts; zero outside Penalize
  std::vector<uint8_t> seen_;  // prompt-or-output marks; zero outside Penalize
  std::vector<int> touched_;   // ids whose counts_/seen_ need resetting
  std::vector<int> cand_;      // candidate ids still in play
  std::vector<double> prob_;   // unnormalised probability by id, valid for cand_ only
  std::vector<int> order_;     // scratch for ranking (top_p probe, top-n logprobs)
  std::vector<float> kept_;    // logits of allowed_token_ids while the row is masked
};

}  // namespace morserve
