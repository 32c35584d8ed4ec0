// Truncated-SVD LoRA initialisation (see lora_svd.h).
#include "engine/convert/lora_svd.h"

#include <lapacke.h>

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace morserve {

absl::StatusOr<LoraFactors> TruncatedSvdLora(const std::vector<double>& residual, int out, int in,
                                             int rank, double scale) {
  if (out <= 0 || in <= 0 || rank < 1 || !(scale > 0) ||
      residual.size() != static_cast<size_t>(out) * in) {
    return absl::InvalidArgumentError(absl::StrCat("TruncatedSvdLora: bad arguments (out ", out,
                                                   ", in ", in, ", rank ", rank, ", scale ", scale,
                                                   ", ", residual.size(), " values)"));
  }
  const int kmin = std::min(out, in);
  std::vector<double> a = residual;  // dgesdd overwrites its input
  std::vector<double> s(kmin), u(static_cast<size_t>(out) * kmin), vt(static_cast<size_t>(kmin) * in);
  const lapack_int info = LAPACKE_dgesdd(LAPACK_ROW_MAJOR, 'S', out, in, a.data(), in, s.data(),
                                         u.data(), kmin, vt.data(), in);
  if (info != 0) {
    return absl::InternalError(absl::StrCat("LAPACKE_dgesdd failed on a [", out, ", ", in,
                                            "] residual (info ", info, ")"));
  }
  LoraFactors f;
  f.a.assign(static_cast<size_t>(rank) * in, 0.0f);
  f.b.assign(static_cast<size_t>(out) * rank, 0.0f);
  const int kept = std::min(rank, kmin);
  for (int r = 0; r < kept; ++r) {
    for (int i = 0; i < in; ++i) f.a[static_cast<size_t>(r) * in + i] = static_cast<float>(vt[static_cast<size_t>(r) * in + i]);
    for (int o = 0; o < out; ++o) {
      f.b[static_cast<size_t>(o) * rank + r] = static_cast<float>(u[static_cast<size_t>(o) * kmin + r] * s[r] / scale);
    }
  }
  return f;
}

}  // namespace morserve
