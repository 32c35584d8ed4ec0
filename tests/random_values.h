// Seeded uniform random inputs for the CPU op tests (cpu_linear_test, cpu_ops_test): the same
// seed gives the same values, so a failure names a reproducible input.
#pragma once

#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

namespace morserve::testing {

// n values uniform in [-scale, scale] from std::mt19937(seed).
inline std::vector<float> UniformRandom(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-scale, scale);
  std::vector<float> v(n);
  for (float& f : v) f = dist(rng);
  return v;
}

}  // namespace morserve::testing
