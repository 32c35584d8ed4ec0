// Depth mix weights (see depth_mix.h).
#include "engine/tools/depth_mix.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "engine/core/mix64.h"

namespace morserve {
namespace {

float Pow2(double exponent) { return std::ldexp(1.0f, static_cast<int>(exponent)); }

absl::Status MixError(const std::string& problem) {
  return absl::InvalidArgumentError(absl::StrCat("mkmodel: --depth-mix: ", problem));
}

// Zeroes columns [0, n) of every row.
void ZeroColumns(int64_t rows, int64_t cols, int64_t n, std::vector<float>* w) {
  for (int64_t r = 0; r < rows; ++r) std::fill_n(w->begin() + r * cols, std::min(n, cols), 0.0f);
}

void ZeroRows(int64_t first, int64_t count, int64_t cols, std::vector<float>* w) {
  std::fill_n(w->begin() + first * cols, count * cols, 0.0f);
}

}  // namespace

absl::Status CheckDepthMix(const std::vector<float>& mix, int recursions) {
  if (static_cast<int>(mix.size()) != recursions) {
    return MixError(absl::StrCat("lists ", mix.size(), " fractions; the model has ", recursions,
                                 " recursions (one fraction per loop)"));
  }
  double sum = 0;
  for (float f : mix) {
    if (!std::isfinite(f) || f < 0) return MixError(absl::StrCat("fraction ", f, " is not >= 0"));
    sum += f;
  }
  if (std::abs(sum - 1.0) > 1e-6) return MixError(absl::StrCat("fractions sum to ", sum, ", not 1"));
  return absl::OkStatus();
}

std::vector<int> TokenDepths(const std::vector<float>& mix, int vocab, uint64_t seed) {
  std::vector<int> order(vocab);
  std::iota(order.begin(), order.end(), 0);
  const uint64_t key = Mix64(seed ^ 0x64657074686d6978ull);  // "depthmix"
  std::vector<uint64_t> hash(vocab);
  for (int i = 0; i < vocab; ++i) hash[i] = Mix64(key ^ static_cast<uint64_t>(i));
  std::sort(order.begin(), order.end(), [&](int a, int b) {
    return hash[a] != hash[b] ? hash[a] < hash[b] : a < b;
  });
  std::vector<int> depths(vocab);
  const int nr = static_cast<int>(mix.size());
  for (int rank = 0; rank < vocab; ++rank) {
    const double u = (rank + 0.5) / vocab;
    double cumulative = 0;
    int d = 1;
    for (; d < nr; ++d) {
      cumulative += mix[d - 1];
      if (u < cumulative) break;
    }
    depths[order[rank]] = d;
  }
  return depths;
}

std::vector<float> DepthMixCapacity(const std::vector<float>& mix) {
  std::vector<float> capacity;
  double continuing = 1.0;
  for (float f : mix) {
    capacity.push_back(continuing >= 1.0 - 1e-6 ? 1.0f
                                                : static_cast<float>(std::max(continuing, 1e-6)));
    continuing -= f;
  }
  return capacity;
}

absl::StatusOr<DepthMix> DepthMix::Make(const std::vector<float>& mix, const DepthMixModel& m) {
  if (auto s = CheckDepthMix(mix, m.recursions); !s.ok()) return s;
  const bool routed = m.routing == Routing::kExpertChoice || m.routing == Routing::kTokenChoice ||
                      m.routing == Routing::kEarlyExit;
  if (!routed) return MixError("needs a family with routers or early exit (mor-ec, mor-tc, early-exit)");
  DepthMix d;
  d.m_ = m;
  if (m.hidden < 4) return MixError("needs --hidden >= 4 (control channels)");
  d.depths_ = TokenDepths(mix, m.vocab, m.seed);
  if (m.routing != Routing::kEarlyExit) return d;

  if (!m.last_layer_unique) return MixError("early-exit needs a unique last layer (sharing middle_cycle)");
  if (m.tied_embeddings) return MixError("early-exit needs an untied lm_head (no --tie-embeddings)");
  if (!(m.exit_threshold >= 0.5f && m.exit_threshold <= 0.999f)) {
    return MixError("early-exit needs --exit-threshold in [0.5, 0.999]");
  }
  for (int id = m.vocab - 1; id >= 0 && d.exit_token_ < 0; --id) {
    if (std::find(m.special_ids.begin(), m.special_ids.end(), id) == m.special_ids.end()) d.exit_token_ = id;
  }
  if (d.exit_token_ < 0 || m.vocab < 8) return MixError("early-exit needs --vocab >= 8");
  const double h = m.hidden, k = m.layers_per_loop;
  d.s_ = Pow2(std::ceil(std::log2(8.0 * std::sqrt(h))));
  d.gate_ = Pow2(std::round(std::log2(32.0 / std::sqrt(h))));
  d.up_ = Pow2(std::round(std::log2(1.0 / std::sqrt(h))));
  const double per_layer = static_cast<double>(d.gate_) * d.up_ * h;  // silu(G m0) U m0, m0^2 ~ h
  d.down_ = Pow2(std::round(std::log2(1.0 / (k * per_layer))));
  d.kappa_ = static_cast<float>(k * d.down_ * per_layer);
  d.a_ = Pow2(std::ceil(std::log2(80.0 * d.s_ / std::sqrt(h))));
  return d;
}

void DepthMix::Embedding(std::vector<float>* e) const {
  const int64_t h = m_.hidden;
  const double nr = m_.recursions;
  for (int64_t t = 0; t < m_.vocab; ++t) {
    float* row = e->data() + t * h;
    if (m_.routing == Routing::kEarlyExit) {
      row[0] = s_;
      row[1] = static_cast<float>(depths_[t]);
      row[2] = 0.0f;
    } else {
      row[0] = 1.0f;
      row[1] = static_cast<float>((depths_[t] - 0.5) / nr);
    }
  }
}

void DepthMix::Projection(int p, LayerPlace place, int64_t rows, int64_t cols,
                          std::vector<float>* w) const {
  const bool writer = p == 3 || p == 6;
  if (writer) ZeroRows(0, Reserved(), cols, w);
  if (m_.routing != Routing::kEarlyExit) return;
  if (!writer) ZeroColumns(rows, cols, 3, w);
  if (p == 4 || p == 5) {  // unit 0 reads channel 0 only
    ZeroRows(0, 1, cols, w);
    (*w)[0] = p == 4 ? gate_ : up_;
  }
  if (p == 6) {  // unit 0 writes the counter only
    for (int64_t r = 0; r < rows; ++r) (*w)[r * cols] = 0.0f;
    const float step = place == LayerPlace::kLooped  ? down_
                       : place == LayerPlace::kAfter ? -(m_.recursions + 1) * m_.layers_per_loop * down_
                                                     : 0.0f;
    (*w)[2 * cols] = step;
  }
}

void DepthMix::LoraA(int p, int64_t rank, int64_t cols, std::vector<float>* a) const {
  if (m_.routing != Routing::kEarlyExit) return;
  const bool writer = p == 3 || p == 6;
  if (p == 6) {
    ZeroColumns(rank, cols, 1, a);  // never reads unit 0
  } else if (!writer) {
    ZeroColumns(rank, cols, 3, a);
  }
}

void DepthMix::LoraB(int p, int64_t rows, int64_t rank, std::vector<float>* b) const {
  if (p == 3 || p == 6) ZeroRows(0, Reserved(), rank, b);
  if (m_.routing == Routing::kEarlyExit && (p == 4 || p == 5)) ZeroRows(0, 1, rank, b);
}

void DepthMix::PostAttentionNorm(std::vector<float>* w) const {
  if (m_.routing == Routing::kEarlyExit) (*w)[0] = 1.0f;
}

void DepthMix::FinalNorm(std::vector<float>* w) const {
  if (m_.routing == Routing::kEarlyExit) std::fill_n(w->begin(), 3, 1.0f);
}

void DepthMix::LmHead(std::vector<float>* w) const {
  if (m_.routing != Routing::kEarlyExit) return;
  const int64_t h = m_.hidden;
  ZeroColumns(m_.vocab, h, 3, w);
  ZeroRows(exit_token_, 1, h, w);
  float* row = w->data() + static_cast<int64_t>(exit_token_) * h;
  row[0] = 0.5f * a_ / s_;
  row[1] = -a_;
  row[2] = a_ / kappa_;
}

void DepthMix::MlpReadout(std::vector<float>* w1, std::vector<float>* w2,
                          const std::vector<std::pair<float, float>>& rows) const {
  const int64_t h = m_.hidden, units = 2 * h;
  ZeroRows(0, 4, h, w1);
  (*w1)[0 * h + 0] = 1.0f;  // GELU(x) - GELU(-x) = x
  (*w1)[1 * h + 0] = -1.0f;
  (*w1)[2 * h + 1] = 1.0f;
  (*w1)[3 * h + 1] = -1.0f;
  std::fill(w2->begin(), w2->end(), 0.0f);
  for (size_t j = 0; j < rows.size(); ++j) {
    float* out = w2->data() + j * units;
    out[0] = rows[j].first;
    out[1] = -rows[j].first;
    out[2] = rows[j].second;
    out[3] = -rows[j].second;
  }
}

void DepthMix::ExpertRouter(int loop, std::vector<float>* w) const {
  std::fill(w->begin(), w->end(), 0.0f);
  (*w)[0] = -4.0f * loop;
  (*w)[1] = 4.0f * m_.recursions;
}

void DepthMix::ExpertRouter(int loop, std::vector<float>* w1, std::vector<float>* w2) const {
  MlpReadout(w1, w2, {{-4.0f * loop, 4.0f * m_.recursions}});
}

void DepthMix::TokenRouter(std::vector<float>* w) const {
  const int64_t h = m_.hidden;
  std::fill(w->begin(), w->end(), 0.0f);
  for (int j = 0; j < m_.recursions; ++j) {
    (*w)[j * h + 0] = -static_cast<float>((2 * j + 1) * (2 * j + 1));
    (*w)[j * h + 1] = 4.0f * m_.recursions * (2 * j + 1);
  }
}

void DepthMix::TokenRouter(std::vector<float>* w1, std::vector<float>* w2) const {
  std::vector<std::pair<float, float>> rows;
  for (int j = 0; j < m_.recursions; ++j) {
    rows.push_back({-static_cast<float>((2 * j + 1) * (2 * j + 1)), 4.0f * m_.recursions * (2 * j + 1)});
  }
  MlpReadout(w1, w2, rows);
}

}  // namespace morserve
