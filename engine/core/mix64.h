// Mix64: splitmix64's finaliser, a bijection on 64 bits with full avalanche. Used where a
// value must be a fixed, well-spread function of integers (seeded sampling draws, mkmodel's
// token-to-depth assignment), the same on every platform and standard library.
#pragma once

#include <cstdint>

namespace morserve {

inline uint64_t Mix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

}  // namespace morserve
