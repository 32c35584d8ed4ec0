// Huginn-0125's step functions that the reference and the engine share
// (docs/models.md#huginn-0125).
//
// HuginnInitialState: the initial recurrent state s0, zeros when init_scale is 0, else a normal
// N(0, sigma^2) truncated at +-3 sigma (rejection), sigma = sqrt(2 / (5 H)) * init_scale, times
// sqrt(H). Draws come from a counter-based stream of Mix64 over (seed, position, counter) through
// Box-Muller, so a token's state depends on nothing but its request seed and position (not on
// batch neighbours, chunking or platform).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace morserve {

std::vector<float> HuginnInitialState(int hidden, float init_scale, uint64_t seed,
                                      int64_t position);

// Huginn's embedding scale (HuginnConfig::embed_scale, sqrt(H)) on `count` gathered values:
// each multiplied in fp64 and rounded to fp32 once, as the reference does; nothing when 1.
void ScaleEmbedding(double scale, float* h, size_t count);

// A row of exit-check logits with its log-partition log_z = max + log(sum_i exp(x_i - max)) in
// fp64, so that the next recurrence's check reads log P_prev = x - log_z without a second
// softmax (empty logits: the uniform distribution, before the first recurrence).
struct HuginnLogits {
  std::vector<float> logits;
  double log_z = 0;
};
HuginnLogits HuginnNormalize(std::vector<float> logits);

// The adaptive exit statistic after a recurrence: KL(P_prev || P) of the softmaxes of two rows
// of logits, in fp64 (sum_i P_prev,i (log P_prev,i - log P_i), in index order); an empty
// `prev` stands for the uniform distribution. The token exits iff it is below the threshold.
// Both forms give the same bits; the first reuses prev's log_z.
double HuginnKl(const HuginnLogits& prev, const HuginnLogits& cur);
double HuginnKl(const std::vector<float>& prev, const std::vector<float>& logits);

}  // namespace morserve
