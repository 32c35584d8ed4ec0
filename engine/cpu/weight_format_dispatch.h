// VisitWeightFormat: the one switch from a LinearWeights format to a vector kernel file's
// decoder type. Each kernel set (linear_kernels_avx2.cc, linear_kernels_avx512.cc) has its own
// decoder structs per format; this calls fn(FormatTag<Decoder>{}) with the one for `format`,
// and refuses amx-bf16, w8a8, bf16-quads and int8-octets, which other code reads (CpuLinear
// routes them).
#pragma once

#include "engine/core/check.h"
#include "engine/cpu/linear_weights.h"

namespace morserve {

template <class T>
struct FormatTag {
  using type = T;
};

template <class F32, class Bf16, class F16, class Q8, class Fn>
void VisitWeightFormat(WeightFormat format, Fn&& fn) {
  switch (format) {
    case WeightFormat::kF32:
      return fn(FormatTag<F32>{});
    case WeightFormat::kBF16:
      return fn(FormatTag<Bf16>{});
    case WeightFormat::kF16:
      return fn(FormatTag<F16>{});
    case WeightFormat::kQ8:
      return fn(FormatTag<Q8>{});
    case WeightFormat::kAmxBf16:
      MORSERVE_CHECK(false, "amx-bf16 weights run on the AMX kernel set only");
      return;
    case WeightFormat::kBF16Quads:
    case WeightFormat::kQ8Octets:
      MORSERVE_CHECK(false,
                     "bf16-quads and int8-octets weights: each kernel set reads them on its own "
                     "path");
      return;
    case WeightFormat::kW8A8:
      break;
  }
  MORSERVE_CHECK(false, "w8a8 weights run on the w8a8 kernel sets only");
}

}  // namespace morserve
