// Huginn-0125's initial recurrent state s0 (docs/models.md#huginn-0125), the same function
// for the reference and the engine: zeros when init_scale is 0, else a normal N(0, sigma^2)
// truncated at +-3 sigma (rejection), sigma = sqrt(2 / (5 H)) * init_scale, times sqrt(H).
// Draws come from a counter-based stream of Mix64 over (seed, position, counter) through
// Box-Muller, so a token's state depends on nothing but its request seed and position (not on
// batch neighbours, chunking or platform).
#pragma once

#include <cstdint>
#include <vector>

namespace morserve {

std::vector<float> HuginnInitialState(int hidden, float init_scale, uint64_t seed,
                                      int64_t position);

}  // namespace morserve
