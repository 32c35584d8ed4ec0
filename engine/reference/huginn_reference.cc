// ReferenceModel's Huginn-0125 step (docs/models.md#huginn-0125), fp64 sums like the rest of
// the reference: e = wte[tok] * sqrt(H), the prelude, r recurrences of
// s = adapter . concat(s, e) then the core, y = RmsNorm(s, ln_f), the coda, logits
// wte . RmsNorm(y, ln_f). Adaptive mode (decode tokens): after recurrence k < r - 1 the coda
// and head run on s (rewriting the token's coda entries), and the token exits iff
// KL(P_{k-1} || P_k) < threshold (P_{-1} uniform), its later core slots holding copies of its
// recurrence-k entries (copy on exit). The block itself (sandwich norms after each residual
// add, qk_bias, RoPE on pairs) is ReferenceModel::Layer's.
#include <algorithm>
#include <cmath>

#include "engine/core/check.h"
#include "engine/model/huginn_state.h"
#include "engine/reference/reference_model.h"

namespace morserve {
namespace {

using Vec = std::vector<float>;

}  // namespace

// ln_f, the coda on the state, the head (ln_f again): loop k's logits.
Vec ReferenceModel::HuginnCodaLogits(const Vec& s) {
  const LayerPlan& plan = weights_->plan;
  const int coda = static_cast<int>(plan.segments.size()) - 1;
  Vec y = RmsNorm(s, F32(weights_->final_norm), cfg_.rms_norm_eps);
  for (int k = 0; k < plan.segments[coda].num_layers; ++k) y = Layer(coda, 0, k, y);
  return Logits(y);
}

Vec ReferenceModel::HuginnRecurrences(int segment, const Vec& e, StepOutput* out) {
  const RecursionConfig& rc = cfg_.recursion;
  const int planned = weights_->plan.segments[segment].loops;
  const int steps = options_.num_steps.value_or(planned);
  MORSERVE_CHECK(steps >= 1 && steps <= planned, "num_steps outside the plan's recurrences");
  const bool adaptive =
      options_.loop_mode.value_or(rc.default_loop_mode) == LoopMode::kAdaptive && !prompt_token_;
  const double threshold = options_.exit_threshold.value_or(rc.loop_exit_threshold);
  const Vec& adapter = F32(weights_->adapter);
  const int hs = cfg_.hidden_size;
  Vec s = HuginnInitialState(hs, options_.init_scale.value_or(cfg_.huginn.init_scale),
                             options_.seed, position_);
  Vec prev_logits;  // empty: P_{-1} uniform
  Vec joined(2 * static_cast<size_t>(hs));
  for (int k = 0; k < steps; ++k) {
    std::copy(s.begin(), s.end(), joined.begin());  // state first, then the prelude output
    std::copy(e.begin(), e.end(), joined.begin() + hs);
    s = Block(segment, k, MatVec(adapter, joined, hs, 2 * hs));
    ++out->trace.loops;
    if (!adaptive || k + 1 == steps) continue;
    Vec logits = HuginnCodaLogits(s);
    const double kl = HuginnKl(prev_logits, logits);
    out->trace.exit_kl.push_back(kl);
    if (kl < threshold) {
      CopyOnExit(segment, k, steps);
      out->logits = std::move(logits);
      return s;
    }
    prev_logits = std::move(logits);
  }
  out->logits = HuginnCodaLogits(s);
  return s;
}

StepOutput ReferenceModel::HuginnStep(int token) {
  const LayerPlan& plan = weights_->plan;
  MORSERVE_CHECK(plan.segments.size() == 3, "Huginn's plan is prelude, core, coda");
  const Vec& embed = F32(weights_->embed);
  const int hs = cfg_.hidden_size;
  Vec e(hs);
  for (int i = 0; i < hs; ++i) {
    e[i] = static_cast<float>(static_cast<double>(embed[static_cast<size_t>(token) * hs + i]) *
                              cfg_.huginn.embed_scale);
  }
  for (int k = 0; k < plan.segments[0].num_layers; ++k) e = Layer(0, 0, k, e);
  StepOutput out;
  HuginnRecurrences(1, e, &out);
  ++position_;
  return out;
}

}  // namespace morserve
