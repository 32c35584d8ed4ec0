// LoRA factors from a truncated SVD (Relaxed Recursive Transformers, section 3.2): the
// residual R = W_layer - W_shared [out, in] is factored R = U Sigma V^T (LAPACK dgesdd, in
// fp64) and its leading `rank` triplets become B = U_r Sigma_r / scale and A = V_r^T, so the
// delta the loader applies, scale * B * A (scale = lora alpha / rank), is the best rank-r
// approximation of R (Eckart-Young). rank >= min(out, in) reproduces R up to rounding;
// triplets beyond min(out, in) are zero.
#pragma once

#include <vector>

#include "absl/status/statusor.h"

namespace morserve {

struct LoraFactors {
  std::vector<float> a;  // [rank, in], row-major
  std::vector<float> b;  // [out, rank], row-major
};

// `residual` is row-major [out, in]. Errors: non-positive sizes or scale, rank < 1, or an
// SVD that does not converge.
absl::StatusOr<LoraFactors> TruncatedSvdLora(const std::vector<double>& residual, int out, int in,
                                             int rank, double scale);

}  // namespace morserve
