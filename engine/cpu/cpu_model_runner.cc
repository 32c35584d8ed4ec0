// CPU implementation of ModelRunner (see cpu_model_runner.h).
#include "engine/cpu/cpu_model_runner.h"

#include <algorithm>
#include <cmath>

#include "engine/cpu/cpu_linear.h"
#include "engine/cpu/cpu_ops.h"
#include "engine/cpu/paged_attention.h"
#include "engine/cpu/thread_pool.h"

namespace morserve {
namespace {

using Vec = std::vector<float>;

// W[loop] + scale * B[loop] A[loop], dense fp32 [out, in].
Vec DenseWeight(const LoopTensor& t, int loop) {
  Vec w = t.At(loop).ToF32Vector();
  if (t.lora.empty()) return w;
  const LoraDelta& d = t.lora[loop];
  const Vec a = d.a.ToF32Vector(), b = d.b.ToF32Vector();
  const int rank = static_cast<int>(d.a.shape[0]), in = static_cast<int>(d.a.shape[1]);
  const int out = static_cast<int>(d.b.shape[0]);
  for (int o = 0; o < out; ++o) {
    for (int i = 0; i < in; ++i) {
      double acc = 0;
      for (int j = 0; j < rank; ++j) acc += static_cast<double>(b[static_cast<size_t>(o) * rank + j]) * a[static_cast<size_t>(j) * in + i];
      w[static_cast<size_t>(o) * in + i] += static_cast<float>(d.scale * acc);
    }
  }
  return w;
}

bool PerLoop(const LoopTensor& t) { return t.untied() || !t.lora.empty(); }

// A linear layer that may differ per loop: variants.size() is 1 or the segment's loops.
struct LoopLinear {
  std::vector<std::unique_ptr<CpuLinear>> variants;
  const CpuLinear& At(int loop) const { return *variants[variants.size() == 1 ? 0 : loop]; }
};

struct LoopNorm {
  std::vector<Vec> variants;
  const Vec& At(int loop) const { return variants[variants.size() == 1 ? 0 : loop]; }
};

struct CpuLayer {
  LoopLinear qkv, o, gate_up, down;  // q|k|v and gate|up fused along the output dimension
  LoopNorm in_norm, post_norm;
};

// Contiguous runs of rows at the same loop.
template <typename Fn>
void ForEachLoopGroup(const int* loops, int n, Fn fn) {
  for (int begin = 0; begin < n;) {
    int end = begin + 1;
    while (end < n && loops[end] == loops[begin]) ++end;
    fn(loops[begin], begin, end - begin);
    begin = end;
  }
}

class CpuModelRunner : public ModelRunner {
 public:
  CpuModelRunner(std::shared_ptr<const ModelWeights> w, const EngineConfig& config, int num_blocks)
      : w_(std::move(w)), cfg_(w_->config), pool_(config.threads) {
    compute_ = config.compute == ComputeType::kBF16 && CpuSupportsBf16() ? CpuCompute::kBF16
                                                                          : CpuCompute::kF32;
    kv_ = MakePagedKvPool(num_blocks, config.block_size, cfg_.num_kv_heads, cfg_.head_dim);
    LoadLayers();
    LoadHeadAndRouters();
  }

  int block_size() const override { return kv_.block_size; }

  void Embed(const int* tokens, int n, float* h) override {
    std::vector<int32_t> ids(tokens, tokens + n);
    EmbeddingGather(embed_.data(), cfg_.vocab_size, ids.data(), n, cfg_.hidden_size, h);
  }

  void RunLayer(const LayerBatch& b) override;
  void ExpertRouter(const int* loops, const float* h, int n, float* score, float* decide) override;
  void TokenChoiceRouter(const float* h, int n, float* scores) override;
  void Logits(const float* h, int n, float* logits) override {
    Vec x(static_cast<size_t>(n) * cfg_.hidden_size);
    RmsNormRows(h, final_norm_.data(), n, cfg_.hidden_size, cfg_.rms_norm_eps, x.data());
    lm_head_->Forward(x.data(), n, logits);
  }

 private:
  std::unique_ptr<CpuLinear> Linear(const Vec& w, int out, int in) {
    return std::make_unique<CpuLinear>(w.data(), out, in, compute_, &pool_);
  }
  LoopLinear Fused(const LayerWeights& lw, std::initializer_list<Proj> parts, int loops);
  void LoadLayers();
  void LoadHeadAndRouters();
  void RouterForward(const CpuLinear& w1, const CpuLinear* w2, const float* x, int n, float* out);

  std::shared_ptr<const ModelWeights> w_;
  const ModelConfig& cfg_;
  ThreadPool pool_;
  CpuCompute compute_;
  PagedKvPool kv_;
  std::vector<CpuLayer> layers_;  // by layer slot
  Vec embed_, final_norm_;
  std::unique_ptr<CpuLinear> lm_head_;
  // Expert-choice routers per loop (w1, and w2 for mlp), aux routers, token-choice router.
  std::vector<std::unique_ptr<CpuLinear>> ec_w1_, ec_w2_, aux_w1_, aux_w2_;
  std::unique_ptr<CpuLinear> tc_w1_, tc_w2_;
};

LoopLinear CpuModelRunner::Fused(const LayerWeights& lw, std::initializer_list<Proj> parts, int loops) {
  bool per_loop = false;
  for (Proj p : parts) per_loop |= PerLoop(lw.P(p));
  LoopLinear out;
  for (int r = 0; r < (per_loop ? loops : 1); ++r) {
    Vec fused;
    int rows = 0, in = 0;
    for (Proj p : parts) {
      const Vec w = DenseWeight(lw.P(p), r);
      const TensorView& v = lw.P(p).At(r);
      rows += static_cast<int>(v.shape[0]);
      in = static_cast<int>(v.shape[1]);
      fused.insert(fused.end(), w.begin(), w.end());
    }
    out.variants.push_back(Linear(fused, rows, in));
  }
  return out;
}

void CpuModelRunner::LoadLayers() {
  const LayerPlan& plan = w_->plan;
  layers_.resize(plan.num_layer_slots);
  for (const Segment& seg : plan.segments) {
    for (int k = 0; k < seg.num_layers; ++k) {
      const LayerWeights& lw = w_->layers[seg.first_layer_slot + k];
      CpuLayer& L = layers_[seg.first_layer_slot + k];
      L.qkv = Fused(lw, {Proj::kQ, Proj::kK, Proj::kV}, seg.loops);
      L.o = Fused(lw, {Proj::kO}, seg.loops);
      L.gate_up = Fused(lw, {Proj::kGate, Proj::kUp}, seg.loops);
      L.down = Fused(lw, {Proj::kDown}, seg.loops);
      for (auto [norm, t] : {std::pair{&L.in_norm, &lw.input_norm}, std::pair{&L.post_norm, &lw.post_norm}}) {
        for (int r = 0; r < (t->untied() ? seg.loops : 1); ++r) norm->variants.push_back(t->At(r).ToF32Vector());
      }
    }
  }
}

void CpuModelRunner::LoadHeadAndRouters() {
  embed_ = w_->embed.ToF32Vector();
  final_norm_ = w_->final_norm.ToF32Vector();
  const Vec head = w_->lm_head.ToF32Vector();
  lm_head_ = Linear(head, cfg_.vocab_size, cfg_.hidden_size);
  auto load = [&](const TensorView& t) -> std::unique_ptr<CpuLinear> {
    if (t.empty()) return nullptr;
    return Linear(t.ToF32Vector(), static_cast<int>(t.shape[0]), static_cast<int>(t.shape[1]));
  };
  for (const LoopRouter& r : w_->router.expert) {
    ec_w1_.push_back(load(r.w1));
    ec_w2_.push_back(load(r.w2));
  }
  for (const LoopRouter& r : w_->router.aux) {
    aux_w1_.push_back(load(r.w1));
    aux_w2_.push_back(load(r.w2));
  }
  tc_w1_ = load(w_->router.token_choice);
  tc_w2_ = load(w_->router.token_choice_w2);
}

void CpuModelRunner::RunLayer(const LayerBatch& b) {
  const int n = b.n, hs = cfg_.hidden_size, qd = cfg_.q_dim(), kvd = cfg_.kv_dim();
  const int inter = cfg_.intermediate_size, qkv_dim = qd + 2 * kvd;
  const CpuLayer& L = layers_[w_->plan.segments[b.segment].first_layer_slot + b.k];
  const LayerKvPlan& kv = *b.kv;
  Vec a(static_cast<size_t>(n) * hs), qkv(static_cast<size_t>(n) * qkv_dim);
  ForEachLoopGroup(b.loops, n, [&](int loop, int begin, int count) {
    RmsNormRows(b.h + static_cast<size_t>(begin) * hs, L.in_norm.At(loop).data(), count, hs,
                cfg_.rms_norm_eps, &a[static_cast<size_t>(begin) * hs]);
    L.qkv.At(loop).Forward(&a[static_cast<size_t>(begin) * hs], count, &qkv[static_cast<size_t>(begin) * qkv_dim]);
  });
  Vec q(static_cast<size_t>(n) * qd), k(static_cast<size_t>(n) * kvd), v(static_cast<size_t>(n) * kvd);
  for (int i = 0; i < n; ++i) {
    const float* row = &qkv[static_cast<size_t>(i) * qkv_dim];
    std::copy(row, row + qd, &q[static_cast<size_t>(i) * qd]);
    std::copy(row + qd, row + qd + kvd, &k[static_cast<size_t>(i) * kvd]);
    std::copy(row + qd + kvd, row + qkv_dim, &v[static_cast<size_t>(i) * kvd]);
  }
  std::vector<int32_t> positions(b.positions, b.positions + n);
  RopeRows(q.data(), positions.data(), n, cfg_.num_heads, cfg_.head_dim, cfg_.rope_theta);
  RopeRows(k.data(), positions.data(), n, cfg_.num_kv_heads, cfg_.head_dim, cfg_.rope_theta);
  if (!kv.recurrent) KvWrite(kv_, k.data(), v.data(), kv.write_slot.data(), n);

  Vec attn(static_cast<size_t>(n) * qd);
  PagedAttentionParams p;
  p.num_rows = n;
  p.q = q.data();
  p.out = attn.data();
  p.pool = &kv_;
  p.table_indptr = kv.table_indptr.data();
  p.table_blocks = kv.table_blocks.data();
  p.kv_len = kv.kv_len.data();
  p.extra_k = kv.recurrent ? k.data() : nullptr;
  p.extra_v = kv.recurrent ? v.data() : nullptr;
  p.n_heads = cfg_.num_heads;
  p.n_kv_heads = cfg_.num_kv_heads;
  p.head_dim = cfg_.head_dim;
  p.scale = 1.0f / std::sqrt(static_cast<float>(cfg_.head_dim));
  PagedAttention(p, &pool_);

  Vec m(static_cast<size_t>(n) * hs), gu(static_cast<size_t>(n) * 2 * inter), act(static_cast<size_t>(n) * inter);
  ForEachLoopGroup(b.loops, n, [&](int loop, int begin, int count) {
    float* h = b.h + static_cast<size_t>(begin) * hs;
    L.o.At(loop).ForwardAccumulate(&attn[static_cast<size_t>(begin) * qd], count, h);
    RmsNormRows(h, L.post_norm.At(loop).data(), count, hs, cfg_.rms_norm_eps, &m[static_cast<size_t>(begin) * hs]);
    float* g = &gu[static_cast<size_t>(begin) * 2 * inter];
    L.gate_up.At(loop).Forward(&m[static_cast<size_t>(begin) * hs], count, g);
    for (int i = 0; i < count; ++i) {
      SiluMulRows(g + static_cast<size_t>(i) * 2 * inter, g + static_cast<size_t>(i) * 2 * inter + inter, 1, inter,
                  &act[static_cast<size_t>(begin + i) * inter]);
    }
    L.down.At(loop).ForwardAccumulate(&act[static_cast<size_t>(begin) * inter], count, h);
  });
  if (kv.recurrent) {  // persistent pair from the layer output (spec section 5)
    ForEachLoopGroup(b.loops, n, [&](int loop, int begin, int count) {
      RmsNormRows(b.h + static_cast<size_t>(begin) * hs, L.in_norm.At(loop).data(), count, hs,
                  cfg_.rms_norm_eps, &a[static_cast<size_t>(begin) * hs]);
      L.qkv.At(loop).Forward(&a[static_cast<size_t>(begin) * hs], count, &qkv[static_cast<size_t>(begin) * qkv_dim]);
    });
    for (int i = 0; i < n; ++i) {
      const float* row = &qkv[static_cast<size_t>(i) * qkv_dim];
      std::copy(row + qd, row + qd + kvd, &k[static_cast<size_t>(i) * kvd]);
      std::copy(row + qd + kvd, row + qkv_dim, &v[static_cast<size_t>(i) * kvd]);
    }
    RopeRows(k.data(), positions.data(), n, cfg_.num_kv_heads, cfg_.head_dim, cfg_.rope_theta);
    KvWrite(kv_, k.data(), v.data(), kv.write_slot.data(), n);
  }
}

// Router scores of n rows: w1 · x (linear), or w2 · gelu(w1 · x) (mlp).
void CpuModelRunner::RouterForward(const CpuLinear& w1, const CpuLinear* w2, const float* x,
                                   int n, float* out) {
  if (w2 == nullptr) {
    w1.Forward(x, n, out);
    return;
  }
  Vec mid(static_cast<size_t>(n) * w1.n());
  w1.Forward(x, n, mid.data());
  GeluErf(mid.data(), static_cast<int64_t>(mid.size()));
  w2->Forward(mid.data(), n, out);
}

void CpuModelRunner::ExpertRouter(const int* loops, const float* h, int n, float* score, float* decide) {
  const int hs = cfg_.hidden_size;
  const float temperature = cfg_.recursion.router.temperature;
  Vec x(h, h + static_cast<size_t>(n) * hs);
  for (float& v : x) v = v / temperature;
  // Rows may be at different loops: each group of rows uses its loop's router.
  ForEachLoopGroup(loops, n, [&](int r, int begin, int count) {
    const float* xr = &x[static_cast<size_t>(begin) * hs];
    RouterForward(*ec_w1_[r], ec_w2_[r].get(), xr, count, &score[begin]);
    if (aux_w1_.empty()) {
      std::copy(score + begin, score + begin + count, decide + begin);
    } else {
      RouterForward(*aux_w1_[r], aux_w2_[r].get(), xr, count, &decide[begin]);
    }
  });
}

void CpuModelRunner::TokenChoiceRouter(const float* h, int n, float* scores) {
  RouterForward(*tc_w1_, tc_w2_.get(), h, n, scores);
}

}  // namespace

absl::StatusOr<std::unique_ptr<ModelRunner>> CreateCpuModelRunner(
    std::shared_ptr<const ModelWeights> weights, const EngineConfig& config, int num_kv_blocks) {
  return std::unique_ptr<ModelRunner>(new CpuModelRunner(std::move(weights), config, num_kv_blocks));
}

}  // namespace morserve
