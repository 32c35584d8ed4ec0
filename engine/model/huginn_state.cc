// HuginnInitialState, ScaleEmbedding and HuginnKl (see huginn_state.h).
#include "engine/model/huginn_state.h"

#include <algorithm>
#include <cmath>

#include "engine/core/check.h"
#include "engine/core/mix64.h"

namespace morserve {

std::vector<float> HuginnInitialState(int hidden, float init_scale, uint64_t seed,
                                      int64_t position) {
  std::vector<float> s(static_cast<size_t>(hidden), 0.0f);
  if (init_scale == 0.0f) return s;
  const double sigma = std::sqrt(2.0 / (5.0 * hidden)) * init_scale;
  const double scale = std::sqrt(static_cast<double>(hidden));
  const uint64_t base = Mix64(Mix64(seed) ^ static_cast<uint64_t>(position));
  uint64_t counter = 0;
  auto uniform = [&] {  // (0, 1)
    return (static_cast<double>(Mix64(base + counter++) >> 11) + 0.5) * 0x1.0p-53;
  };
  for (int i = 0; i < hidden;) {
    const double radius = std::sqrt(-2.0 * std::log(uniform()));
    const double angle = 2.0 * M_PI * uniform();
    for (double z : {radius * std::cos(angle), radius * std::sin(angle)}) {
      if (i < hidden && std::abs(z) <= 3.0) s[i++] = static_cast<float>(z * sigma * scale);
    }
  }
  return s;
}

void ScaleEmbedding(double scale, float* h, size_t count) {
  if (scale == 1.0) return;
  for (size_t i = 0; i < count; ++i) h[i] = static_cast<float>(h[i] * scale);
}

HuginnLogits HuginnNormalize(std::vector<float> logits) {
  HuginnLogits out;
  out.logits = std::move(logits);
  if (out.logits.empty()) return out;
  const double m = *std::max_element(out.logits.begin(), out.logits.end());
  double sum = 0;
  for (float x : out.logits) sum += std::exp(static_cast<double>(x) - m);
  out.log_z = m + std::log(sum);
  return out;
}

double HuginnKl(const HuginnLogits& prev, const HuginnLogits& cur) {
  const std::vector<float>& p = cur.logits;
  const double n = static_cast<double>(p.size());
  double kl = 0;
  if (prev.logits.empty()) {  // uniform: sum_i (1/n) (-log n - lp_i)
    for (float x : p) kl += (-std::log(n) - (static_cast<double>(x) - cur.log_z)) / n;
    return kl;
  }
  const std::vector<float>& q = prev.logits;
  MORSERVE_CHECK(q.size() == p.size(), "HuginnKl: rows of different sizes");
  for (size_t i = 0; i < p.size(); ++i) {
    const double lq = static_cast<double>(q[i]) - prev.log_z;
    const double lp = static_cast<double>(p[i]) - cur.log_z;
    kl += std::exp(lq) * (lq - lp);
  }
  return kl;
}

double HuginnKl(const std::vector<float>& prev, const std::vector<float>& logits) {
  return HuginnKl(HuginnNormalize(prev), HuginnNormalize(logits));
}

}  // namespace morserve
