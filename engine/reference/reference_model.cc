// Reference implementation of docs/models.md (see reference_model.h); the comments below cite
// the sections they implement.
#include "engine/reference/reference_model.h"

#include <algorithm>
#include <cassert>
#include <cmath>

#include "engine/core/check.h"

namespace morserve {
namespace {

using Vec = std::vector<float>;

double Sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }
double Gelu(double x) { return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0))); }
double Silu(double x) { return x / (1.0 + std::exp(-x)); }

Vec Add(const Vec& a, const Vec& b, double scale = 1.0) {
  Vec out(a.size());
  for (size_t i = 0; i < a.size(); ++i) out[i] = static_cast<float>(a[i] + scale * b[i]);
  return out;
}

// Softmax in fp64; returns the max probability.
double MaxSoftmaxProb(const Vec& logits) {
  const double m = *std::max_element(logits.begin(), logits.end());
  double sum = 0;
  for (float l : logits) sum += std::exp(l - m);
  return 1.0 / sum;
}

}  // namespace

Vec RmsNorm(const Vec& x, const Vec& w, float eps) {
  double ss = 0;
  for (float v : x) ss += static_cast<double>(v) * v;
  const double inv = 1.0 / std::sqrt(ss / static_cast<double>(x.size()) + eps);
  Vec out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = static_cast<float>(w[i] * (x[i] * inv));
  return out;
}

Vec MatVec(const Vec& w, const Vec& x, int out, int in) {
  Vec y(out);
  for (int o = 0; o < out; ++o) {
    double acc = 0;
    const float* row = &w[static_cast<size_t>(o) * in];
    for (int i = 0; i < in; ++i) acc += static_cast<double>(row[i]) * x[i];
    y[o] = static_cast<float>(acc);
  }
  return y;
}

void ApplyRopePairs(Vec* x, int n_heads, int head_dim, int position, float theta) {
  for (int h = 0; h < n_heads; ++h) {
    float* v = x->data() + static_cast<size_t>(h) * head_dim;
    for (int i = 0; i < head_dim / 2; ++i) {
      const double inv_freq = std::pow(static_cast<double>(theta), -2.0 * i / head_dim);
      const double angle = position * inv_freq;
      const double c = std::cos(angle), s = std::sin(angle);
      const double a = v[2 * i], b = v[2 * i + 1];
      v[2 * i] = static_cast<float>(a * c - b * s);
      v[2 * i + 1] = static_cast<float>(b * c + a * s);
    }
  }
}

void ApplyRope(Vec* x, int n_heads, int head_dim, int position, float theta) {
  const int half = head_dim / 2;
  for (int h = 0; h < n_heads; ++h) {
    float* v = x->data() + static_cast<size_t>(h) * head_dim;
    for (int i = 0; i < half; ++i) {
      const double inv_freq = std::pow(static_cast<double>(theta), -2.0 * i / head_dim);
      const double angle = position * inv_freq;
      const double c = std::cos(angle), s = std::sin(angle);
      const double a = v[i], b = v[i + half];
      v[i] = static_cast<float>(a * c - b * s);
      v[i + half] = static_cast<float>(b * c + a * s);
    }
  }
}

ReferenceModel::ReferenceModel(std::shared_ptr<const ModelWeights> weights,
                               ReferenceOptions options)
    : weights_(std::move(weights)), options_(options), cfg_(weights_->config) {
  Reset();
}

ReferenceModel::~ReferenceModel() = default;

void ReferenceModel::Reset() {
  position_ = 0;
  slots_.assign(weights_->plan.num_cache_slots, {});
}

int ReferenceModel::SlotEntries(int cache_slot) const {
  return static_cast<int>(slots_[cache_slot].size());
}

const Vec& ReferenceModel::F32(const TensorView& t) {
  auto it = tensor_cache_.find(t.data);
  if (it != tensor_cache_.end()) return it->second;
  return tensor_cache_.emplace(t.data, t.ToF32Vector()).first->second;
}

const Vec& ReferenceModel::Norm(const LoopTensor& t, int loop) { return F32(t.At(loop)); }

// W[k] + Delta[r][k] of docs/models.md#per-loop-weights: the stored (possibly per-loop) tensor
// plus the loop's LoRA.
const Vec& ReferenceModel::Weight(int layer_slot, int loop, Proj p) {
  const LoopTensor& t = weights_->layers[layer_slot].P(p);
  const int key_loop = (t.untied() || !t.lora.empty()) ? loop : 0;
  const auto key = std::make_tuple(layer_slot, key_loop, static_cast<int>(p));
  auto it = weight_cache_.find(key);
  if (it != weight_cache_.end()) return it->second;
  Vec w = F32(t.At(loop));
  if (!t.lora.empty()) {
    const LoraDelta& d = t.lora[loop];
    const Vec a = d.a.ToF32Vector(), b = d.b.ToF32Vector();
    const int rank = static_cast<int>(d.a.shape[0]), in = static_cast<int>(d.a.shape[1]);
    const int out = static_cast<int>(d.b.shape[0]);
    for (int o = 0; o < out; ++o) {
      for (int i = 0; i < in; ++i) {
        double acc = 0;
        for (int j = 0; j < rank; ++j) {
          acc += static_cast<double>(b[static_cast<size_t>(o) * rank + j]) *
                 a[static_cast<size_t>(j) * in + i];
        }
        w[static_cast<size_t>(o) * in + i] =
            static_cast<float>(w[static_cast<size_t>(o) * in + i] + d.scale * acc);
      }
    }
  }
  return weight_cache_.emplace(key, std::move(w)).first->second;
}

void ReferenceModel::ProjectKv(int layer_slot, int loop, const Vec& a, Vec* k, Vec* v) const {
  auto* self = const_cast<ReferenceModel*>(this);
  const int h = cfg_.hidden_size, kv = cfg_.kv_dim();
  *k = MatVec(self->Weight(layer_slot, loop, Proj::kK), a, kv, h);
  *v = MatVec(self->Weight(layer_slot, loop, Proj::kV), a, kv, h);
  const LayerWeights& lw = weights_->layers[layer_slot];
  if (cfg_.huginn.qk_bias) *k = Add(*k, self->Norm(lw.k_bias, loop));  // before RoPE
  (cfg_.huginn.rope_pairs ? ApplyRopePairs : ApplyRope)(k, cfg_.num_kv_heads, cfg_.head_dim,
                                                        position_, cfg_.rope_theta);
}

// Appends an entry; Huginn's coda, run again on a later recurrence's state for the exit
// check, rewrites the token's entry instead (the last write stays).
void ReferenceModel::PushKv(int cache_slot, KvEntry entry) {
  std::vector<KvEntry>& slot = slots_[cache_slot];
  if (cfg_.huginn.enabled && !slot.empty() && slot.back().position == entry.position) {
    slot.back() = std::move(entry);
    return;
  }
  slot.push_back(std::move(entry));
}

// softmax(q k^T / sqrt(head_dim)) V over the slot's entries (all at positions <= ours, since
// tokens arrive in order) plus an optional extra entry (a recurrent layer's temporary pair).
Vec ReferenceModel::Attend(const Vec& q, int cache_slot, const KvEntry* extra) const {
  const int hd = cfg_.head_dim, group = cfg_.num_heads / cfg_.num_kv_heads;
  std::vector<const KvEntry*> entries;
  for (const KvEntry& e : slots_[cache_slot]) {
    assert(e.position <= position_);
    entries.push_back(&e);
  }
  if (extra != nullptr) entries.push_back(extra);
  Vec out(cfg_.q_dim(), 0.0f);
  const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
  std::vector<double> scores(entries.size());
  for (int head = 0; head < cfg_.num_heads; ++head) {
    const int kvh = head / group;
    const float* qh = q.data() + static_cast<size_t>(head) * hd;
    double m = -INFINITY;
    for (size_t j = 0; j < entries.size(); ++j) {
      const float* kj = entries[j]->k.data() + static_cast<size_t>(kvh) * hd;
      double dot = 0;
      for (int d = 0; d < hd; ++d) dot += static_cast<double>(qh[d]) * kj[d];
      scores[j] = dot * scale;
      m = std::max(m, scores[j]);
    }
    double sum = 0;
    for (double& s : scores) sum += (s = std::exp(s - m));
    for (int d = 0; d < hd; ++d) {
      double acc = 0;
      for (size_t j = 0; j < entries.size(); ++j) {
        acc += scores[j] * entries[j]->v[static_cast<size_t>(kvh) * hd + d];
      }
      out[static_cast<size_t>(head) * hd + d] = static_cast<float>(acc / sum);
    }
  }
  return out;
}

// docs/models.md#the-block (standard) or docs/models.md#recurrent-transformer-layers for one
// layer of one loop.
Vec ReferenceModel::Layer(int segment, int loop, int k, const Vec& x) {
  const LayerPlan& plan = weights_->plan;
  const int slot = plan.segments[segment].first_layer_slot + k;
  const LayerWeights& lw = weights_->layers[slot];
  const int cache = plan.CacheSlot(segment, loop, k);
  const bool writes = plan.WritesKv(segment, loop);
  const bool recurrent = cfg_.recursion.layer_kind == LayerKind::kRecurrent;
  const int h = cfg_.hidden_size;

  const Vec a = RmsNorm(x, Norm(lw.input_norm, loop), cfg_.rms_norm_eps);
  Vec q = MatVec(Weight(slot, loop, Proj::kQ), a, cfg_.q_dim(), h);
  if (cfg_.huginn.qk_bias) q = Add(q, Norm(lw.q_bias, loop));  // before RoPE
  (cfg_.huginn.rope_pairs ? ApplyRopePairs : ApplyRope)(&q, cfg_.num_heads, cfg_.head_dim,
                                                        position_, cfg_.rope_theta);
  KvEntry self{position_, {}, {}};
  ProjectKv(slot, loop, a, &self.k, &self.v);
  Vec attn;
  if (recurrent) {
    attn = Attend(q, cache, &self);  // persistent pairs j < t plus the temporary pair
  } else {
    if (writes) PushKv(cache, self);
    attn = Attend(q, cache, nullptr);
  }
  // Sandwich blocks (Ouro) norm each sublayer's output before its residual add; Huginn's
  // norm the residual sum after it.
  Vec attn_out = MatVec(Weight(slot, loop, Proj::kO), attn, h, cfg_.q_dim());
  if (cfg_.sandwich_norm)
    attn_out = RmsNorm(attn_out, Norm(lw.attn_out_norm, loop), cfg_.rms_norm_eps);
  Vec y = Add(x, attn_out);
  if (cfg_.huginn.residual_norm) y = RmsNorm(y, Norm(lw.attn_out_norm, loop), cfg_.rms_norm_eps);
  const Vec m = RmsNorm(y, Norm(lw.post_norm, loop), cfg_.rms_norm_eps);
  const int inter = cfg_.intermediate_size;
  const Vec gate = MatVec(Weight(slot, loop, Proj::kGate), m, inter, h);
  const Vec up = MatVec(Weight(slot, loop, Proj::kUp), m, inter, h);
  Vec act(inter);
  for (int i = 0; i < inter; ++i) act[i] = static_cast<float>(Silu(gate[i]) * up[i]);
  Vec mlp_out = MatVec(Weight(slot, loop, Proj::kDown), act, h, inter);
  if (cfg_.sandwich_norm)
    mlp_out = RmsNorm(mlp_out, Norm(lw.mlp_out_norm, loop), cfg_.rms_norm_eps);
  Vec out = Add(y, mlp_out);
  if (cfg_.huginn.residual_norm) out = RmsNorm(out, Norm(lw.mlp_out_norm, loop), cfg_.rms_norm_eps);
  if (recurrent && writes) {  // the persistent pair comes from the layer's own output
    KvEntry persistent{position_, {}, {}};
    ProjectKv(slot, loop, RmsNorm(out, Norm(lw.input_norm, loop), cfg_.rms_norm_eps), &persistent.k,
              &persistent.v);
    slots_[cache].push_back(std::move(persistent));
  }
  return out;
}

Vec ReferenceModel::Block(int segment, int loop, const Vec& h) {
  Vec x = h;
  for (int k = 0; k < weights_->plan.segments[segment].num_layers; ++k)
    x = Layer(segment, loop, k, x);
  return x;
}

// exit_kv propagate: K/V of a skipped (loop, layer) computed from the exit state.
void ReferenceModel::WriteKvFromState(int segment, int loop, int k, const Vec& h) {
  const LayerPlan& plan = weights_->plan;
  if (!plan.WritesKv(segment, loop)) return;
  const int slot = plan.segments[segment].first_layer_slot + k;
  KvEntry e{position_, {}, {}};
  const Vec a = RmsNorm(h, Norm(weights_->layers[slot].input_norm, loop), cfg_.rms_norm_eps);
  ProjectKv(slot, loop, a, &e.k, &e.v);
  slots_[plan.CacheSlot(segment, loop, k)].push_back(std::move(e));
}

double ReferenceModel::RouterScore(const LoopRouter& r, const Vec& h, int out_row) {
  const int hs = cfg_.hidden_size;
  const Vec& w1 = F32(r.w1);
  if (r.w2.empty()) {
    double acc = 0;
    for (int i = 0; i < hs; ++i)
      acc += static_cast<double>(w1[static_cast<size_t>(out_row) * hs + i]) * h[i];
    return acc;
  }
  const int mid = static_cast<int>(r.w1.shape[0]);
  const Vec hidden = MatVec(w1, h, mid, hs);
  const Vec& w2 = F32(r.w2);
  double acc = 0;
  for (int i = 0; i < mid; ++i)
    acc += static_cast<double>(w2[static_cast<size_t>(out_row) * mid + i]) * Gelu(hidden[i]);
  return acc;
}

// docs/models.md#mixture-of-recursions-expert-choice
Vec ReferenceModel::ExpertChoice(int segment, Vec h, TokenTrace* trace) {
  const RouterConfig& rc = cfg_.recursion.router;
  const RouterWeights& rw = weights_->router;
  for (int r = 0; r < cfg_.recursion.num_recursions; ++r) {
    Vec hin(h.size());
    for (size_t i = 0; i < h.size(); ++i)
      hin[i] = static_cast<float>(h[i] / static_cast<double>(rc.temperature));
    const double s = RouterScore(rw.expert[r], hin, 0);
    const double decide = rc.aux_router ? RouterScore(rw.aux[r], hin, 0) : s;
    trace->router_scores.push_back(s);
    const bool active = rc.capacity[r] >= 1.0f || decide > rc.threshold;
    if (!active) break;
    const double g =
        rc.alpha * (rc.activation == RouterActivation::kTanh ? std::tanh(s) : Sigmoid(s));
    const Vec b = Block(segment, r, h);
    h = Add(h, b, rc.gating == Gating::kAdditive ? 1.0 : g);
    ++trace->loops;
  }
  return h;
}

// docs/models.md#mixture-of-recursions-token-choice
Vec ReferenceModel::TokenChoice(int segment, const Vec& x0, TokenTrace* trace) {
  const RouterConfig& rc = cfg_.recursion.router;
  const RouterWeights& rw = weights_->router;
  const int nr = cfg_.recursion.num_recursions;
  const LoopRouter router{rw.token_choice, rw.token_choice_w2};
  std::vector<double> s(nr), p(nr);
  for (int r = 0; r < nr; ++r) trace->router_scores.push_back(s[r] = RouterScore(router, x0, r));
  if (rc.activation == RouterActivation::kSigmoid) {
    for (int r = 0; r < nr; ++r) p[r] = rc.alpha * Sigmoid(s[r]);
  } else {
    const double m = *std::max_element(s.begin(), s.end());
    double sum = 0;
    for (int r = 0; r < nr; ++r) sum += std::exp(s[r] - m);
    for (int r = 0; r < nr; ++r) p[r] = rc.alpha * std::exp(s[r] - m) / sum;
  }
  auto biased = [&](int i) {
    return p[i] + (rw.token_choice_bias.empty() ? 0.0 : rw.token_choice_bias[i]);
  };
  int best = 0;  // argmax, lowest index on ties
  for (int r = 1; r < nr; ++r) {
    if (biased(r) > biased(best)) best = r;
  }
  const int depth = best + 1;
  Vec h = x0;
  for (int r = 0; r < depth; ++r) h = Block(segment, r, h);
  trace->loops = depth;
  return Add(x0, h, p[depth - 1]);
}

// docs/models.md#early-exit
Vec ReferenceModel::EarlyExit(int segment, Vec h, TokenTrace* trace) {
  const int nr = cfg_.recursion.num_recursions;
  const float threshold = options_.exit_threshold.value_or(cfg_.recursion.early_exit.threshold);
  const int num_layers = weights_->plan.segments[segment].num_layers;
  for (int r = 0; r < nr; ++r) {
    h = Block(segment, r, h);
    ++trace->loops;
    if (r == nr - 1) break;
    const double confidence = MaxSoftmaxProb(Logits(h));
    trace->exit_confidence.push_back(confidence);
    if (confidence >= threshold) {
      if (cfg_.recursion.early_exit.exit_kv == ExitKv::kPropagate) {
        for (int later = r + 1; later < nr; ++later) {
          for (int k = 0; k < num_layers; ++k) WriteKvFromState(segment, later, k, h);
        }
      }
      break;
    }
  }
  return h;
}

// Copy on exit (docs/models.md#serving-looped-checkpoints): every later loop's slot of every
// layer gets, at this position, the entry the token wrote at its exit loop.
void ReferenceModel::CopyOnExit(int segment, int exit_loop, int loops) {
  const LayerPlan& plan = weights_->plan;
  const Segment& seg = plan.segments[segment];
  for (int later = exit_loop + 1; later < loops; ++later) {
    for (int k = 0; k < seg.num_layers; ++k) {
      const KvEntry src = slots_[plan.CacheSlot(segment, exit_loop, k)].back();
      assert(src.position == position_);
      slots_[plan.CacheSlot(segment, later, k)].push_back(src);
    }
  }
}

// docs/models.md#ouro: T loops with RMSNorm(x, model.norm) after each; in adaptive mode a
// decode token reads the exit gate on h_t after loop t < T-1 and stops once the cumulative
// exit probability reaches the threshold. The state returned is pre-norm: Logits applies
// model.norm once, giving lm_head . h_t.
Vec ReferenceModel::OuroLoops(int segment, Vec h, TokenTrace* trace) {
  const RecursionConfig& rc = cfg_.recursion;
  const int loops = weights_->plan.segments[segment].loops;
  const bool adaptive =
      options_.loop_mode.value_or(rc.default_loop_mode) == LoopMode::kAdaptive && !prompt_token_;
  const double q = options_.exit_threshold.value_or(rc.loop_exit_threshold);
  const Vec& norm = F32(weights_->final_norm);
  const Vec& gate_w = F32(weights_->exit_gate_w);
  const double gate_b = F32(weights_->exit_gate_b)[0];
  double cumulative = 0, survive = 1;
  for (int t = 0; t < loops; ++t) {
    h = Block(segment, t, h);
    ++trace->loops;
    if (t + 1 == loops) break;
    const Vec normed = RmsNorm(h, norm, cfg_.rms_norm_eps);
    if (adaptive) {
      double dot = gate_b;
      for (size_t i = 0; i < normed.size(); ++i) dot += static_cast<double>(gate_w[i]) * normed[i];
      const double lambda = Sigmoid(dot);
      cumulative += lambda * survive;
      survive *= 1.0 - lambda;
      trace->exit_cumulative.push_back(cumulative);
      if (cumulative >= q) {
        CopyOnExit(segment, t, loops);
        return h;
      }
    }
    h = normed;
  }
  return h;
}

Vec ReferenceModel::RunLoopedSegment(int segment, const Vec& x, TokenTrace* trace) {
  if (segment == weights_->plan.looped_segment &&
      cfg_.recursion.exit_rule == LoopExitRule::kOuroGate) {
    return OuroLoops(segment, x, trace);
  }
  if (segment == weights_->plan.looped_segment) {
    switch (cfg_.recursion.routing) {
      case Routing::kExpertChoice:
        return ExpertChoice(segment, x, trace);
      case Routing::kTokenChoice:
        return TokenChoice(segment, x, trace);
      case Routing::kEarlyExit:
        return EarlyExit(segment, x, trace);
      case Routing::kNone:
        break;
    }
  }
  Vec h = x;
  const int loops = weights_->plan.segments[segment].loops;
  for (int r = 0; r < loops; ++r) {
    h = Block(segment, r, h);
    // docs/models.md#nanbeige42: the final norm between loops.
    if (cfg_.recursion.norm_between_loops && r + 1 < loops) {
      h = RmsNorm(h, F32(weights_->final_norm), cfg_.rms_norm_eps);
    }
  }
  trace->loops = loops;
  return h;
}

Vec ReferenceModel::Logits(const Vec& h) {
  const Vec n = RmsNorm(h, F32(weights_->final_norm), cfg_.rms_norm_eps);
  return MatVec(F32(weights_->lm_head), n, cfg_.vocab_size, cfg_.hidden_size);
}

StepOutput ReferenceModel::Step(int token, bool prompt) {
  prompt_token_ = prompt;
  if (cfg_.huginn.enabled) return HuginnStep(token);
  const Vec& embed = F32(weights_->embed);
  const int hs = cfg_.hidden_size;
  Vec h(embed.begin() + static_cast<size_t>(token) * hs,
        embed.begin() + static_cast<size_t>(token + 1) * hs);
  StepOutput out;
  const LayerPlan& plan = weights_->plan;
  for (int s = 0; s < static_cast<int>(plan.segments.size()); ++s) {
    if (plan.segments[s].looped()) {
      h = RunLoopedSegment(s, h, &out.trace);
    } else {
      for (int k = 0; k < plan.segments[s].num_layers; ++k) h = Layer(s, 0, k, h);
    }
  }
  out.logits = Logits(h);
  ++position_;
  return out;
}

std::vector<StepOutput> ReferenceModel::Forward(const std::vector<int>& tokens) {
  Reset();
  std::vector<StepOutput> outs;
  outs.reserve(tokens.size());
  for (int t : tokens) outs.push_back(Step(t));
  return outs;
}

std::vector<int> ReferenceModel::GenerateGreedy(const std::vector<int>& prompt, int n,
                                                std::vector<StepOutput>* outputs) {
  std::vector<StepOutput> outs = Forward(prompt);
  std::vector<int> generated;
  for (int i = 0; i < n; ++i) {
    const Vec& l = outs.back().logits;
    const int next = static_cast<int>(std::max_element(l.begin(), l.end()) - l.begin());
    generated.push_back(next);
    if (i + 1 < n) outs.push_back(Step(next, /*prompt=*/false));
  }
  if (outputs != nullptr) *outputs = std::move(outs);
  return generated;
}

}  // namespace morserve
