// HuginnInitialState and HuginnKl (see huginn_state.h).
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

namespace {

std::vector<double> LogSoftmax(const std::vector<float>& logits) {
  const double m = *std::max_element(logits.begin(), logits.end());
  double sum = 0;
  for (float x : logits) sum += std::exp(static_cast<double>(x) - m);
  const double log_z = m + std::log(sum);
  std::vector<double> out(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) out[i] = static_cast<double>(logits[i]) - log_z;
  return out;
}

}  // namespace

double HuginnKl(const std::vector<float>& prev, const std::vector<float>& logits) {
  const std::vector<double> lp = LogSoftmax(logits);
  const double n = static_cast<double>(lp.size());
  double kl = 0;
  if (prev.empty()) {  // uniform: sum_i (1/n) (-log n - lp_i)
    for (double x : lp) kl += (-std::log(n) - x) / n;
    return kl;
  }
  MORSERVE_CHECK(prev.size() == logits.size(), "HuginnKl: rows of different sizes");
  const std::vector<double> lq = LogSoftmax(prev);
  for (size_t i = 0; i < lp.size(); ++i) kl += std::exp(lq[i]) * (lq[i] - lp[i]);
  return kl;
}

}  // namespace morserve
