// The reference implementation of Huginn-0125 (engine/reference/huginn_reference.cc) against
// the properties docs/models.md#huginn-0125 states: RoPE on pairs, the KL statistic, the
// seeded initial state, the first two tokens of a tiny model computed by hand from the
// spec's formulas, the recurrence structure (an adapter that ignores the state makes every
// recurrence the same), and adaptive mode (exit at KL < threshold, decode tokens only, copy
// on exit, one coda entry per position).
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "engine/io/safetensors_writer.h"
#include "engine/model/huginn_state.h"
#include "engine/model/weights.h"
#include "engine/reference/reference_model.h"
#include "engine/tools/mkmodel.h"
#include "tests/engine_harness.h"
#include "tests/testutil.h"

namespace morserve {
namespace {

using testing::NarrowSpec;
using testing::TempDir;
using Vec = std::vector<float>;

TEST(HuginnReferenceTest, RopePairsRotateAdjacentDims) {
  Vec x = {1, 0, 0, 1};  // one head of 4: pairs (0, 1) at theta^0, (2, 3) at theta^-1/2
  ApplyRopePairs(&x, 1, 4, 1, 10000.0f);
  EXPECT_NEAR(x[0], std::cos(1.0), 1e-6);
  EXPECT_NEAR(x[1], std::sin(1.0), 1e-6);
  EXPECT_NEAR(x[2], -std::sin(0.01), 1e-6);
  EXPECT_NEAR(x[3], std::cos(0.01), 1e-6);
  Vec half = {1, 0, 0, 1};  // rotate_half pairs dims (0, 2) and (1, 3): another result
  ApplyRope(&half, 1, 4, 1, 10000.0f);
  EXPECT_GT(std::abs(half[1] - x[1]), 0.1);
}

TEST(HuginnReferenceTest, KlAgainstUniformAndAgainstThePreviousRow) {
  const Vec p = {0.0f, static_cast<float>(std::log(3.0))};  // P = (1/4, 3/4)
  EXPECT_NEAR(HuginnKl({}, p), 0.5 * std::log(2.0) + 0.5 * std::log(2.0 / 3.0), 1e-7);
  EXPECT_NEAR(HuginnKl({}, {2.0f, 2.0f}), 0.0, 1e-12);
  EXPECT_NEAR(HuginnKl(p, p), 0.0, 1e-12);
  const Vec q = {0.0f, 0.0f};  // KL(P || Q), not KL(Q || P)
  EXPECT_NEAR(HuginnKl(p, q), 0.25 * std::log(0.5) + 0.75 * std::log(1.5), 1e-7);
}

TEST(HuginnReferenceTest, InitialStateIsSeededAndTruncated) {
  EXPECT_EQ(HuginnInitialState(64, 0.0f, 7, 3), Vec(64, 0.0f));
  const Vec a = HuginnInitialState(64, 1.0f, 7, 3);
  EXPECT_EQ(a, HuginnInitialState(64, 1.0f, 7, 3));
  EXPECT_NE(a, HuginnInitialState(64, 1.0f, 8, 3));
  EXPECT_NE(a, HuginnInitialState(64, 1.0f, 7, 4));
  const double sigma = std::sqrt(2.0 / (5.0 * 64)) * std::sqrt(64.0);  // init_scale 1, x sqrt(H)
  double sum2 = 0;
  int n = 0;
  for (int pos = 0; pos < 200; ++pos) {
    for (float v : HuginnInitialState(64, 1.0f, 11, pos)) {
      ASSERT_LE(std::abs(v), 3.0 * sigma + 1e-6);
      sum2 += static_cast<double>(v) * v;
      ++n;
    }
  }
  // A normal truncated at 3 sigma has standard deviation 0.9866 sigma.
  EXPECT_NEAR(std::sqrt(sum2 / n), 0.9866 * sigma, 0.03 * sigma);
  const Vec scaled = HuginnInitialState(64, 2.0f, 7, 3);
  for (int i = 0; i < 64; ++i) EXPECT_NEAR(scaled[i], 2.0f * a[i], 1e-5);
}

// A Huginn model written by mkmodel, with `edit` applied to its tensors first.
std::shared_ptr<const ModelWeights> Model(const TinyModelSpec& spec, const TempDir& dir,
                                          const std::function<void(OwnedTensor*)>& edit = {}) {
  EXPECT_TRUE(WriteTinyModel(spec, dir.path()).ok());
  if (edit) {
    auto tensors = TinyModelTensors(spec);
    EXPECT_TRUE(tensors.ok());
    for (OwnedTensor& t : *tensors) edit(&t);
    EXPECT_TRUE(WriteSafetensors(dir.File("model.safetensors"), *tensors).ok());
  }
  auto w = LoadModel(dir.path());
  EXPECT_TRUE(w.ok()) << w.status();
  return w.ok() ? *w : nullptr;
}

TinyModelSpec Spec(int prelude, int core, int coda, int steps) {
  TinyModelSpec s = NarrowSpec("huginn");
  s.prelude_layers = prelude;
  s.coda_layers = coda;
  s.recursions = steps;
  s.layers = prelude + core * steps + coda;
  s.dtype = DType::kF32;
  return s;
}

// One SandwichBlock of the spec written out for one token at `pos`, attending to `cache`
// (this token's entry appended), every norm, bias and rotation as docs/models.md states.
struct HandBlock {
  const ModelWeights& w;
  int slot;
  std::vector<Vec> ks, vs;  // the layer's cache: keys after bias and RoPE
  Vec T(const TensorView& t) const { return t.ToF32Vector(); }
  Vec Run(const Vec& x, int pos) {
    const ModelConfig& c = w.config;
    const LayerWeights& l = w.layers[slot];
    const int h = c.hidden_size, hd = c.head_dim, nh = c.num_heads;
    const float eps = c.rms_norm_eps;
    const Vec a = RmsNorm(x, T(l.input_norm.At(0)), eps);
    Vec q = MatVec(T(l.P(Proj::kQ).At(0)), a, h, h), k = MatVec(T(l.P(Proj::kK).At(0)), a, h, h);
    const Vec v = MatVec(T(l.P(Proj::kV).At(0)), a, h, h);
    const Vec qb = T(l.q_bias.At(0)), kb = T(l.k_bias.At(0));
    for (int i = 0; i < h; ++i) {
      q[i] += qb[i];
      k[i] += kb[i];
    }
    ApplyRopePairs(&q, nh, hd, pos, c.rope_theta);
    ApplyRopePairs(&k, nh, hd, pos, c.rope_theta);
    ks.push_back(k);
    vs.push_back(v);
    Vec attn(h);
    for (int head = 0; head < nh; ++head) {
      std::vector<double> s(ks.size());
      double m = -1e300, z = 0;
      for (size_t j = 0; j < ks.size(); ++j) {
        double dot = 0;
        for (int d = 0; d < hd; ++d) dot += double{q[head * hd + d]} * ks[j][head * hd + d];
        s[j] = dot / std::sqrt(double{1.0 * hd});
        m = std::max(m, s[j]);
      }
      for (double& e : s) z += (e = std::exp(e - m));
      for (int d = 0; d < hd; ++d) {
        double acc = 0;
        for (size_t j = 0; j < ks.size(); ++j) acc += s[j] * vs[j][head * hd + d];
        attn[head * hd + d] = static_cast<float>(acc / z);
      }
    }
    const Vec o = MatVec(T(l.P(Proj::kO).At(0)), attn, h, h);
    Vec y(h);
    for (int i = 0; i < h; ++i) y[i] = x[i] + o[i];
    y = RmsNorm(y, T(l.attn_out_norm.At(0)), eps);
    const Vec m = RmsNorm(y, T(l.post_norm.At(0)), eps);
    const int inter = c.intermediate_size;
    const Vec g = MatVec(T(l.P(Proj::kGate).At(0)), m, inter, h);
    const Vec u = MatVec(T(l.P(Proj::kUp).At(0)), m, inter, h);
    Vec act(inter);
    for (int i = 0; i < inter; ++i)
      act[i] = static_cast<float>(g[i] / (1 + std::exp(-g[i])) * u[i]);
    const Vec down = MatVec(T(l.P(Proj::kDown).At(0)), act, h, inter);
    for (int i = 0; i < h; ++i) y[i] += down[i];
    return RmsNorm(y, T(l.mlp_out_norm.At(0)), eps);
  }
};

TEST(HuginnReferenceTest, FirstTokensEqualTheSpecWrittenOut) {
  TempDir dir;
  auto w = Model(Spec(1, 1, 1, 2), dir);  // prelude 1, core 1 x 2 recurrences, coda 1
  ASSERT_NE(w, nullptr);
  const ModelConfig& c = w->config;
  const int h = c.hidden_size;
  const Vec wte = w->embed.ToF32Vector(), head = w->lm_head.ToF32Vector();
  const Vec adapter = w->adapter.ToF32Vector(), ln_f = w->final_norm.ToF32Vector();
  HandBlock prelude{*w, 0, {}, {}}, core0{*w, 1, {}, {}}, core1{*w, 1, {}, {}}, coda{*w, 2, {}, {}};
  const std::vector<int> tokens = {5, 17, 3};
  ReferenceModel ref(w);
  const std::vector<StepOutput> got = ref.Forward(tokens);
  for (int pos = 0; pos < 3; ++pos) {
    SCOPED_TRACE(pos);
    Vec e(h);
    for (int i = 0; i < h; ++i) e[i] = wte[tokens[pos] * h + i] * std::sqrt(float(h));
    e = prelude.Run(e, pos);
    Vec s(h, 0.0f), joined(2 * h);
    for (HandBlock* core : {&core0, &core1}) {  // one cache per recurrence
      std::copy(s.begin(), s.end(), joined.begin());
      std::copy(e.begin(), e.end(), joined.begin() + h);
      s = core->Run(MatVec(adapter, joined, h, 2 * h), pos);
    }
    const Vec y = coda.Run(RmsNorm(s, ln_f, c.rms_norm_eps), pos);
    const Vec logits = MatVec(head, RmsNorm(y, ln_f, c.rms_norm_eps), c.vocab_size, h);
    ASSERT_EQ(got[pos].logits.size(), logits.size());
    for (size_t i = 0; i < logits.size(); ++i) {
      EXPECT_NEAR(got[pos].logits[i], logits[i], 1e-4 * (1 + std::abs(logits[i]))) << i;
    }
    EXPECT_EQ(got[pos].trace.loops, 2);
  }
}

// With adapter = [0 | I] a recurrence ignores the state: every recurrence computes the same
// core output from e and writes the same entries, so any num_steps gives the same logits;
// with the written adapter the recurrences matter.
TEST(HuginnReferenceTest, RecurrencesChainThroughTheAdapterAndOwnSlots) {
  const TinyModelSpec spec = Spec(2, 2, 2, 4);
  TempDir dir, plain_dir;
  auto identity = Model(spec, dir, [](OwnedTensor* t) {
    if (t->name != "transformer.adapter.weight") return;
    const int64_t h = t->shape[0];
    std::vector<float> a(static_cast<size_t>(2 * h * h), 0.0f);
    for (int64_t i = 0; i < h; ++i) a[i * 2 * h + h + i] = 1.0f;
    *t = OwnedTensor::FromF32(t->name, DType::kF32, t->shape, a);
  });
  auto plain = Model(spec, plain_dir);
  ASSERT_TRUE(identity != nullptr && plain != nullptr);
  const std::vector<int> tokens = {5, 17, 3, 42, 8};
  auto run = [&](const std::shared_ptr<const ModelWeights>& w, int steps) {
    ReferenceOptions o;
    o.num_steps = steps;
    ReferenceModel ref(w, o);
    std::vector<StepOutput> out = ref.Forward(tokens);
    for (int k = 0; k < 4; ++k) {  // a core slot per recurrence run, one entry per token
      for (int l = 0; l < 2; ++l) {
        EXPECT_EQ(ref.SlotEntries(w->plan.CacheSlot(1, k, l)), k < steps ? 5 : 0);
      }
    }
    for (int slot : {0, 1, 2 + 4 * 2, 2 + 4 * 2 + 1}) EXPECT_EQ(ref.SlotEntries(slot), 5);
    return out;
  };
  auto max_diff = [](const std::vector<StepOutput>& a, const std::vector<StepOutput>& b) {
    double d = 0;
    for (size_t t = 0; t < a.size(); ++t) {
      for (size_t i = 0; i < a[t].logits.size(); ++i) {
        d = std::max(d, double{std::abs(a[t].logits[i] - b[t].logits[i])});
      }
    }
    return d;
  };
  EXPECT_LT(max_diff(run(identity, 1), run(identity, 4)), 1e-5);
  EXPECT_GT(max_diff(run(plain, 1), run(plain, 4)), 1e-3);
  EXPECT_GT(max_diff(run(plain, 3), run(plain, 4)), 1e-4);
}

// Adaptive mode: prompt tokens run every recurrence; a decode token reads KL after each
// recurrence but the last and exits below the threshold, its later core slots holding copies
// of its exit recurrence's entries; the coda keeps one entry per position.
TEST(HuginnReferenceTest, AdaptiveExitsOnKlAndCopiesOnExit) {
  TempDir dir;
  auto w = Model(Spec(1, 2, 1, 4), dir);
  ASSERT_NE(w, nullptr);
  const std::vector<int> prompt = {5, 17, 3};
  for (const double threshold : {1e9, 1e-30}) {
    SCOPED_TRACE(threshold);
    ReferenceOptions o;
    o.loop_mode = LoopMode::kAdaptive;
    o.exit_threshold = static_cast<float>(threshold);
    ReferenceModel ref(w, o);
    std::vector<StepOutput> out;
    ref.GenerateGreedy(prompt, 5, &out);
    ASSERT_EQ(out.size(), 3u + 5u - 1u);  // the last token generated is not fed back
    const bool exits = threshold > 1;
    for (size_t t = 0; t < out.size(); ++t) {
      const bool decode = t >= prompt.size();
      EXPECT_EQ(out[t].trace.loops, decode && exits ? 1 : 4) << t;
      EXPECT_EQ(out[t].trace.exit_kl.size(), decode ? (exits ? 1u : 3u) : 0u) << t;
      for (double kl : out[t].trace.exit_kl) EXPECT_GE(kl, -1e-12);
    }
    const int positions = static_cast<int>(out.size());
    for (int l = 0; l < 2; ++l) {
      const auto& first = ref.SlotContents(w->plan.CacheSlot(1, 0, l));
      for (int k = 1; k < 4; ++k) {
        const auto& later = ref.SlotContents(w->plan.CacheSlot(1, k, l));
        ASSERT_EQ(later.size(), static_cast<size_t>(positions));
        for (int p = static_cast<int>(prompt.size()); p < positions; ++p) {
          EXPECT_EQ(later[p].position, p);
          if (exits) {
            EXPECT_EQ(later[p].k, first[p].k) << "slot " << k << " position " << p;
            EXPECT_EQ(later[p].v, first[p].v);
          } else {
            EXPECT_NE(later[p].k, first[p].k);
          }
        }
      }
    }
    const int coda_slot = w->plan.CacheSlot(2, 0, 0);
    ASSERT_EQ(ref.SlotEntries(coda_slot), positions);
    for (int p = 0; p < positions; ++p) EXPECT_EQ(ref.SlotContents(coda_slot)[p].position, p);
  }
}

}  // namespace
}  // namespace morserve
