// Which CPU kernel set the process was asked to use: $MORSERVE_CPU_KERNELS, read once.
// "scalar" or "avx2" pins every dispatching kernel family (linear_kernels.h,
// logit_reductions.h); "avx512" pins the linear kernels (the other families have no AVX-512
// set and run their fastest); unset or empty picks the fastest the host runs. Any other value is a
// fatal error that names it.
#pragma once

#include <string_view>

namespace morserve {

// "", "scalar", "avx2" or "avx512".
std::string_view RequestedCpuKernels();

}  // namespace morserve
