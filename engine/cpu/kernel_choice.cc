// $MORSERVE_CPU_KERNELS, validated once (kernel_choice.h).
#include "engine/cpu/kernel_choice.h"

#include <cstdlib>
#include <string>

#include "engine/core/check.h"

namespace morserve {

std::string_view RequestedCpuKernels() {
  static const std::string want = [] {
    const char* env = std::getenv("MORSERVE_CPU_KERNELS");
    std::string v = env ? env : "";
    const std::string bad = "MORSERVE_CPU_KERNELS: scalar, avx2 or avx512, got '" + v + "'";
    MORSERVE_CHECK(v.empty() || v == "scalar" || v == "avx2" || v == "avx512", bad.c_str());
    return v;
  }();
  return want;
}

}  // namespace morserve
