// Ouro in the reference (docs/models.md#ouro, docs/models.md#serving-looped-checkpoints):
// one token's math computed here in double from the loaded tensors (sandwich norms, the norm
// after every loop, the exit gate), the cumulative exit rule of adaptive mode, prompt tokens at
// full depth, and copy on exit in the KV slots.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "engine/reference/reference_model.h"
#include "tests/engine_harness.h"

namespace morserve {
namespace {

using V = std::vector<double>;

constexpr int kLoops = 4;

TinyModelSpec OuroSpec() {
  TinyModelSpec s = testing::F32Spec("ouro");
  s.recursions = kLoops;  // total_ut_steps
  s.layers = 2 * kLoops;  // 2 stored layers
  s.exit_threshold = 1.0f;
  return s;
}

V Vec(const TensorView& t) {
  const std::vector<float> f = t.ToF32Vector();
  return V(f.begin(), f.end());
}

V MatVec(const V& m, const V& x, int rows) {
  const size_t cols = x.size();
  V y(rows, 0.0);
  for (int r = 0; r < rows; ++r) {
    for (size_t i = 0; i < cols; ++i) y[r] += m[r * cols + i] * x[i];
  }
  return y;
}

// What one token at position 0 computes after each loop: h_t, the logits lm_head h_t and the
// gate lambda_t. With one key, attention returns V (each query head reads its kv head's v).
struct Loops {
  std::vector<V> logits;
  V lambda;
};

Loops OuroPositionZero(const ModelWeights& w, int token, bool sandwich) {
  const ModelConfig& c = w.config;
  const int hs = c.hidden_size, d = c.head_dim, heads = c.num_heads, kvh = c.num_kv_heads;
  auto rms = [&](const V& x, const V& wt) {
    double ss = 0;
    for (double v : x) ss += v * v;
    const double inv = 1.0 / std::sqrt(ss / x.size() + c.rms_norm_eps);
    V y(x.size());
    for (size_t i = 0; i < x.size(); ++i) y[i] = wt[i] * x[i] * inv;
    return y;
  };
  const V embed = Vec(w.embed), norm = Vec(w.final_norm), gate = Vec(w.exit_gate_w);
  const double gate_b = Vec(w.exit_gate_b)[0];
  V x(embed.begin() + static_cast<size_t>(token) * hs,
      embed.begin() + static_cast<size_t>(token + 1) * hs);
  Loops out;
  const Segment& seg = w.plan.segments[0];
  for (int t = 0; t < seg.loops; ++t) {
    for (int k = 0; k < seg.num_layers; ++k) {
      const LayerWeights& lw = w.Layer(0, k);
      auto P = [&](Proj p) { return Vec(lw.P(p).At(t)); };
      const V v = MatVec(P(Proj::kV), rms(x, Vec(lw.input_norm.At(t))), kvh * d);
      V attn(static_cast<size_t>(heads) * d);
      for (int h = 0; h < heads; ++h) {
        for (int j = 0; j < d; ++j) attn[h * d + j] = v[(h / (heads / kvh)) * d + j];
      }
      V o = MatVec(P(Proj::kO), attn, hs);
      if (sandwich) o = rms(o, Vec(lw.attn_out_norm.At(t)));
      for (int i = 0; i < hs; ++i) x[i] += o[i];
      const V m = rms(x, Vec(lw.post_norm.At(t)));
      const V g = MatVec(P(Proj::kGate), m, c.intermediate_size);
      const V u = MatVec(P(Proj::kUp), m, c.intermediate_size);
      V act(c.intermediate_size);
      for (int i = 0; i < c.intermediate_size; ++i) act[i] = g[i] / (1.0 + std::exp(-g[i])) * u[i];
      V down = MatVec(P(Proj::kDown), act, hs);
      if (sandwich) down = rms(down, Vec(lw.mlp_out_norm.At(t)));
      for (int i = 0; i < hs; ++i) x[i] += down[i];
    }
    x = rms(x, norm);  // h_t, the next loop's input
    out.logits.push_back(MatVec(Vec(w.lm_head), x, c.vocab_size));
    double dot = gate_b;
    for (int i = 0; i < hs; ++i) dot += gate[i] * x[i];
    out.lambda.push_back(1.0 / (1.0 + std::exp(-dot)));
  }
  return out;
}

double MaxAbsDiff(const V& a, const std::vector<float>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(a[i] - b[i]));
  return m;
}

double Scale(const std::vector<float>& l) {
  return 1.0 + std::fabs(*std::max_element(l.begin(), l.end()));
}

std::shared_ptr<const ModelWeights> Model(testing::TempDir* dir) {
  auto w = testing::MakeModel(OuroSpec(), dir);
  if (w != nullptr) {
    EXPECT_EQ(w->plan.segments.size(), 1u);
    EXPECT_EQ(w->plan.segments[0].loops, kLoops);
    EXPECT_TRUE(w->config.sandwich_norm);
  }
  return w;
}

ReferenceModel Reference(std::shared_ptr<const ModelWeights> w, LoopMode mode, float threshold) {
  ReferenceOptions o;
  o.loop_mode = mode;
  o.exit_threshold = threshold;
  return ReferenceModel(std::move(w), o);
}

TEST(OuroReference, FullModeIsTheSandwichStackWithTheNormAfterEveryLoop) {
  testing::TempDir dir;
  auto w = Model(&dir);
  ASSERT_NE(w, nullptr);
  ReferenceModel ref(w);  // the model's default mode: full
  for (int token : {5, 77, 200}) {
    ref.Reset();
    const StepOutput out = ref.Step(token, /*prompt=*/false);
    EXPECT_EQ(out.trace.loops, kLoops);
    EXPECT_TRUE(out.trace.exit_cumulative.empty()) << "full mode does not read the gate";
    const double scale = Scale(out.logits);
    EXPECT_LT(MaxAbsDiff(OuroPositionZero(*w, token, true).logits.back(), out.logits), 2e-4 * scale)
        << "token " << token;
    // Without the sandwich norms the logits are measurably different: the test tells them apart.
    EXPECT_GT(MaxAbsDiff(OuroPositionZero(*w, token, false).logits.back(), out.logits),
              1e-2 * scale)
        << "token " << token;
  }
}

// A decode token exits after the first loop t < T-1 whose cumulative exit probability
// c_t = sum_{i <= t} lambda_i prod_{j < i} (1 - lambda_j) reaches the threshold; its logits are
// loop t's. Thresholds sit halfway between consecutive c_t, far from any rounding.
TEST(OuroReference, AdaptiveDecodeTokenExitsWhereTheCumulativeGateReachesTheThreshold) {
  testing::TempDir dir;
  auto w = Model(&dir);
  ASSERT_NE(w, nullptr);
  for (int token : {5, 77, 200}) {
    const Loops want = OuroPositionZero(*w, token, true);
    V c;
    double cum = 0, survive = 1;
    for (int t = 0; t + 1 < kLoops; ++t) {
      cum += want.lambda[t] * survive;
      survive *= 1 - want.lambda[t];
      c.push_back(cum);
    }
    for (int exit_loop = 0; exit_loop < kLoops; ++exit_loop) {
      // Below c_exit and above c_{exit-1}; past the last gate: above every c.
      const double hi = exit_loop + 1 < kLoops ? c[exit_loop] : 1.0;
      const double lo = exit_loop == 0 ? 0.0 : c[exit_loop - 1];
      const float q = static_cast<float>(exit_loop + 1 < kLoops ? (lo + hi) / 2 : 1.5);
      ReferenceModel ref = Reference(w, LoopMode::kAdaptive, q);
      const StepOutput out = ref.Step(token, /*prompt=*/false);
      const std::string label = "token " + std::to_string(token) + " q " + std::to_string(q);
      EXPECT_EQ(out.trace.loops, exit_loop + 1) << label;
      ASSERT_EQ(out.trace.exit_cumulative.size(),
                static_cast<size_t>(std::min(exit_loop + 1, kLoops - 1)))
          << label;
      for (size_t t = 0; t < out.trace.exit_cumulative.size(); ++t) {
        EXPECT_NEAR(out.trace.exit_cumulative[t], c[t], 1e-5) << label << " loop " << t;
      }
      EXPECT_LT(MaxAbsDiff(want.logits[exit_loop], out.logits), 2e-4 * Scale(out.logits)) << label;
    }
  }
}

// Prompt tokens run every loop in adaptive mode (the first generated token comes from
// full-depth logits); generated tokens fed back decide at the gate.
TEST(OuroReference, PromptTokensRunFullDepthInAdaptiveMode) {
  testing::TempDir dir;
  auto w = Model(&dir);
  ASSERT_NE(w, nullptr);
  ReferenceModel full = Reference(w, LoopMode::kFull, 1e-6f);
  ReferenceModel adaptive = Reference(w, LoopMode::kAdaptive, 1e-6f);  // any gate exits at once
  const std::vector<int> prompt = {3, 14, 15, 92, 65};
  std::vector<StepOutput> fo, ao;
  const std::vector<int> ft = full.GenerateGreedy(prompt, 6, &fo);
  const std::vector<int> at = adaptive.GenerateGreedy(prompt, 6, &ao);
  ASSERT_EQ(ao.size(), prompt.size() + 5);
  for (size_t p = 0; p < ao.size(); ++p) {
    const bool prompt_token = p < prompt.size();
    EXPECT_EQ(ao[p].trace.loops, prompt_token ? kLoops : 1) << "position " << p;
    EXPECT_EQ(fo[p].trace.loops, kLoops) << "position " << p;
    if (prompt_token) EXPECT_EQ(ao[p].logits, fo[p].logits) << "position " << p;
  }
  EXPECT_EQ(at[0], ft[0]) << "the first generated token comes from full-depth logits";
}

// Copy on exit: a token that exits at loop t leaves, at its position in every later loop's
// slot of every layer, the entry it wrote at loop t, bit for bit; so every slot holds every
// position. A threshold >= 1 never exits and equals full mode.
TEST(OuroReference, CopyOnExitFillsTheLaterLoopsWithTheExitLoopsEntries) {
  testing::TempDir dir;
  auto w = Model(&dir);
  ASSERT_NE(w, nullptr);
  const LayerPlan& plan = w->plan;
  const std::vector<int> prompt = {7, 1, 8, 2};
  const int generated = 12;
  // 0.55 sits between typical c_0 and c_1 of random gates: exits after 1, 2 and more loops.
  ReferenceModel ref = Reference(w, LoopMode::kAdaptive, 0.55f);
  std::vector<StepOutput> outs;
  ref.GenerateGreedy(prompt, generated, &outs);
  const int positions = static_cast<int>(outs.size());
  std::vector<int> exits(kLoops + 1, 0);
  for (int p = static_cast<int>(prompt.size()); p < positions; ++p) ++exits[outs[p].trace.loops];
  EXPECT_GT(exits[1] + exits[2] + exits[3], 0)
      << "no decode token exited early: the test shows nothing";
  for (int loop = 0; loop < kLoops; ++loop) {
    for (int k = 0; k < plan.segments[0].num_layers; ++k) {
      const auto& slot = ref.SlotContents(plan.CacheSlot(0, loop, k));
      ASSERT_EQ(static_cast<int>(slot.size()), positions) << "loop " << loop << " layer " << k;
      for (int p = 0; p < positions; ++p) {
        EXPECT_EQ(slot[p].position, p);
        const int exit_loop = outs[p].trace.loops - 1;
        if (loop <= exit_loop) continue;
        const auto& src = ref.SlotContents(plan.CacheSlot(0, exit_loop, k))[p];
        EXPECT_EQ(slot[p].k, src.k) << "loop " << loop << " layer " << k << " position " << p;
        EXPECT_EQ(slot[p].v, src.v) << "loop " << loop << " layer " << k << " position " << p;
      }
    }
  }
  ReferenceModel never = Reference(w, LoopMode::kAdaptive, 1.0f);
  ReferenceModel full = Reference(w, LoopMode::kFull, 1.0f);
  std::vector<StepOutput> no, fo;
  EXPECT_EQ(never.GenerateGreedy(prompt, generated, &no),
            full.GenerateGreedy(prompt, generated, &fo));
  for (size_t p = 0; p < no.size(); ++p) {
    EXPECT_EQ(no[p].trace.loops, kLoops);
    EXPECT_EQ(no[p].logits, fo[p].logits);
  }
}

}  // namespace
}  // namespace morserve
