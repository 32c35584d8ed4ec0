// CPU implementation of ModelRunner (see cpu_model_runner.h).
#include "engine/cpu/cpu_model_runner.h"

#include <algorithm>
#include <cmath>
#include <span>
#include <string>

#include "engine/core/aligned_allocator.h"
#include "engine/core/check.h"
#include "engine/cpu/act_arena.h"
#include "engine/cpu/cpu_linear.h"
#include "engine/cpu/cpu_ops.h"
#include "engine/cpu/linear_weights.h"
#include "engine/cpu/paged_attention.h"
#include "engine/cpu/recurrent_layer.h"
#include "engine/cpu/silu_mul.h"
#include "engine/cpu/thread_pool.h"
#include "engine/model/huginn_state.h"
#include "engine/runtime/layer_batch.h"
#include "engine/runtime/row_sampler.h"

namespace morserve {
namespace {

using Vec = std::vector<float>;
using Act = ActArena::Buffer;  // a step's activations, uninitialised (act_arena.h)

// One loop's LoRA delta on a column range of a (fused) projection's output:
// y[:, offset : offset + out] += scale * (x A^T) B^T.
struct LoraPart {
  int offset = 0;
  int out = 0;
  int rank = 0;
  float scale = 0.0f;
  std::unique_ptr<CpuLinear> a;  // [rank, in]
  std::unique_ptr<CpuLinear> b;  // [out, rank]
};

// A linear layer that may differ per loop. The base weight is one variant when the copies
// are tied (it then runs once over every row of a batch, whatever their loops) or one per
// loop (untied copies: run per group of rows at the same loop). Relaxed models add a
// low-rank delta per loop on top of a tied base, computed per loop group.
struct LoopLinear {
  int n = 0;  // output width
  std::vector<std::unique_ptr<CpuLinear>> variants;
  std::vector<std::vector<LoraPart>> lora;  // empty, or per loop

  // y[rows, n] (+)= x[rows, in] W_loop^T for rows grouped by loop.
  void Run(const int* loops, int rows, const float* x, int in, float* y, bool accumulate) const {
    auto base = [&](const CpuLinear& w, int begin, int count) {
      const float* xb = x + static_cast<size_t>(begin) * in;
      float* yb = y + static_cast<size_t>(begin) * n;
      accumulate ? w.ForwardAccumulate(xb, count, yb) : w.Forward(xb, count, yb);
    };
    if (variants.size() == 1) {
      base(*variants[0], 0, rows);
    } else {
      for (const auto [loop, begin, count] : LoopGroups(loops, rows)) {
        base(*variants[loop], begin, count);
      }
    }
    if (lora.empty()) return;
    for (const auto [loop, begin, count] : LoopGroups(loops, rows)) {
      for (const LoraPart& part : lora[loop])
        AddDelta(part, x + static_cast<size_t>(begin) * in, count,
                 y + static_cast<size_t>(begin) * n);
    }
  }

  void AddDelta(const LoraPart& part, const float* x, int count, float* y) const {
    std::vector<float> t(static_cast<size_t>(count) * part.rank),
        d(static_cast<size_t>(count) * part.out);
    part.a->Forward(x, count, t.data());
    part.b->Forward(t.data(), count, d.data());
    for (int i = 0; i < count; ++i) {
      float* row = y + static_cast<size_t>(i) * n + part.offset;
      for (int j = 0; j < part.out; ++j)
        row[j] += part.scale * d[static_cast<size_t>(i) * part.out + j];
    }
  }
};

struct LoopNorm {
  std::vector<Vec> variants;
  const Vec& At(int loop) const { return variants[variants.size() == 1 ? 0 : loop]; }
};

struct CpuLayer {
  LoopLinear qkv, o, gate_up, down;  // q|k|v and gate|up fused along the output dimension
  LoopNorm in_norm, post_norm;
  // Sandwich blocks (Ouro): norms of the attention and MLP outputs; Huginn: norm_2 and norm_4,
  // on the residual sums (docs/models.md#huginn-0125); empty otherwise.
  LoopNorm attn_out_norm, mlp_out_norm;
  // Huginn's attn.qk_bias, added to q and k before RoPE; empty otherwise.
  LoopNorm q_bias, k_bias;
  // k|v alone (the K and V rows of qkv, with their per-loop copies and LoRA): the K/V-only
  // projection. Built for the looped layers of early-exit models with exit_kv propagate.
  LoopLinear kv;
};

class CpuModelRunner : public ModelRunner {
 public:
  CpuModelRunner(std::shared_ptr<const ModelWeights> w, const EngineConfig& config, int num_blocks)
      : w_(std::move(w)),
        cfg_(w_->config),
        pool_(config.threads),
        weights_(config.weights),
        recurrent_prefill_(config.recurrent_prefill) {
    kv_ = MakePagedKvPool(num_blocks, config.block_size, cfg_.num_kv_heads, cfg_.head_dim);
    LoadLayers();
    LoadHeadAndRouters();
    if (cfg_.recursion.exit_rule == LoopExitRule::kHuginnKl)
      huginn_kept_.resize(static_cast<size_t>(HuginnKeptRows(config)));
  }

  int block_size() const override { return kv_.block_size; }
  RunnerCounters counters() const override { return counters_; }
  void ReadKv(int32_t slot, float* k, float* v) const override {
    MORSERVE_CHECK(slot >= 0 && slot < kv_.num_slots(), "ReadKv: slot outside the KV pool");
    const size_t d = static_cast<size_t>(kv_.kv_dim());
    std::copy_n(kv_.k.data() + slot * d, d, k);
    std::copy_n(kv_.v.data() + slot * d, d, v);
  }
  void CopyKv(const KvCopy* copies, int n) override {
    MORSERVE_CHECK(KvCopiesDisjoint(copies, n), "CopyKv: overlapping copies");
    const size_t d = static_cast<size_t>(kv_.kv_dim());
    for (int i = 0; i < n; ++i) {
      const KvCopy& c = copies[i];
      MORSERVE_CHECK(c.src >= 0 && c.dst >= 0 && c.count >= 0 &&
                         c.src + c.count <= kv_.num_slots() && c.dst + c.count <= kv_.num_slots(),
                     "CopyKv: slots outside the KV pool");
      std::copy_n(kv_.k.data() + c.src * d, c.count * d, kv_.k.data() + c.dst * d);
      std::copy_n(kv_.v.data() + c.src * d, c.count * d, kv_.v.data() + c.dst * d);
    }
  }

  // Huginn scales the embedding by sqrt(H) (in fp64, rounded once, as the reference does).
  void Embed(const int* tokens, int n, const int32_t* slots) override {
    std::vector<int32_t> ids(tokens, tokens + n);
    Act h = arena_.Take(static_cast<size_t>(n) * cfg_.hidden_size);
    EmbeddingGather(w_->embed, ids.data(), n, h.data());
    ScaleEmbedding(cfg_.huginn.embed_scale, h.data(), h.size());
    WriteStates(slots, n, h.data());
  }

  // Layer by layer over the rows gathered from their states: the K/V-only rows' entries, then
  // the full rows, whose states get the result.
  void RunSegment(const SegmentBatch& b) override {
    const size_t hs = static_cast<size_t>(cfg_.hidden_size), nk = b.num_kv_only;
    Act h = Gather(b.slots, b.n);
    for (int k = 0; k < static_cast<int>(b.layers.size()); ++k) {
      if (nk > 0) RunKvOnlyRows(KvOnlyLayer(b, k, h.data()));
      if (b.n > b.num_kv_only) RunLayer(FullLayer(b, k, h.data() + nk * hs));
    }
    WriteStates(b.slots + nk, b.n - b.num_kv_only, h.data() + nk * hs);
  }
  void ExpertRouter(const int* loops, const int32_t* slots, int n, float* score,
                    float* decide) override;
  void TokenChoiceRouter(const int32_t* slots, int n, float* scores) override {
    const Act h = Gather(slots, n);
    RouterForward(*tc_w1_, tc_w2_.get(), h.data(), n, scores);
  }
  void Logits(const int32_t* slots, int n, float* logits) override {
    Act x = Gather(slots, n);
    RmsNormRows(x.data(), final_norm_.data(), n, cfg_.hidden_size, cfg_.rms_norm_eps, x.data());
    lm_head_->Forward(x.data(), n, logits);
  }
  // The logits here, then the host sampler on each row (the engine's own rule, bit for bit).
  void Sample(const int32_t* slots, absl::Span<const SampleInput> rows,
              SampleResult* out) override {
    const size_t n = rows.size(), vocab = static_cast<size_t>(cfg_.vocab_size);
    if (n == 0) return;
    std::vector<float> logits(n * vocab);
    Logits(slots, static_cast<int>(n), logits.data());
    std::vector<SampleInput> in(rows.begin(), rows.end());
    for (size_t i = 0; i < n; ++i) in[i].logits = absl::MakeConstSpan(&logits[i * vocab], vocab);
    SampleFrom(in, out);
  }
  void KeptLogits(const int32_t* kept, int n, float* logits) override {
    const size_t vocab = static_cast<size_t>(cfg_.vocab_size);
    for (int i = 0; i < n; ++i) std::copy_n(Kept(kept[i]).data(), vocab, logits + i * vocab);
    counters_.kept_logit_rows += n;
  }
  void SampleKept(const int32_t* kept, absl::Span<const SampleInput> rows,
                  SampleResult* out) override {
    if (rows.empty()) return;
    std::vector<SampleInput> in(rows.begin(), rows.end());
    for (size_t i = 0; i < in.size(); ++i) in[i].logits = Kept(kept[i]);
    SampleFrom(in, out);
    counters_.kept_logit_rows += static_cast<int64_t>(rows.size());
  }
  void InjectInput(const int32_t* s, const int32_t* e, int n) override {
    MORSERVE_CHECK(adapter_ != nullptr, "InjectInput: the model has no Huginn adapter");
    const size_t hs = static_cast<size_t>(cfg_.hidden_size);
    Act joined = arena_.Take(static_cast<size_t>(n) * 2 * hs);
    Act out = arena_.Take(static_cast<size_t>(n) * hs);
    for (int i = 0; i < n; ++i) {
      std::copy_n(State(s[i]), hs, &joined[i * 2 * hs]);
      std::copy_n(State(e[i]), hs, &joined[i * 2 * hs + hs]);
    }
    adapter_->Forward(joined.data(), n, out.data());
    WriteStates(s, n, out.data());
  }
  void ReadStates(const int32_t* slots, int n, float* h) override {
    const size_t hs = static_cast<size_t>(cfg_.hidden_size);
    for (int i = 0; i < n; ++i) {
      if (slots[i] < 0) {
        std::fill_n(h + i * hs, hs, 0.0f);
      } else {
        std::copy_n(State(slots[i]), hs, h + i * hs);
      }
    }
  }
  void WriteStates(const int32_t* slots, int n, const float* h) override {
    const size_t hs = static_cast<size_t>(cfg_.hidden_size);
    for (int i = 0; i < n; ++i)
      if (slots[i] >= 0) std::copy_n(h + i * hs, hs, State(slots[i]));
  }
  void GatedAdd(const int32_t* base, const int32_t* slots, const float* scale, int n) override {
    Act h = Gather(base, n);
    const Act b = Gather(slots, n);
    ScaleAddRows(h.data(), b.data(), scale, n, cfg_.hidden_size);
    WriteStates(slots, n, h.data());
  }
  // Each row normed into its new state (docs/models.md#ouro), then Ouro's gate logit in fp64
  // from b in index order, the reference's sum.
  void NormBetweenLoops(const int32_t* src, const int32_t* dst, int n,
                        double* gate_logit) override {
    const int hs = cfg_.hidden_size;
    for (int i = 0; i < n; ++i) {
      State(dst[i]);  // grows the pool first: both pointers below stay valid
      float* out = State(dst[i]);
      RmsNormRows(State(src[i]), final_norm_.data(), 1, hs, cfg_.rms_norm_eps, out);
      if (gate_logit == nullptr) continue;
      MORSERVE_CHECK(!exit_gate_w_.empty(),
                     "NormBetweenLoops: a gate logit without Ouro's exit gate");
      double dot = exit_gate_b_;
      for (int c = 0; c < hs; ++c) dot += static_cast<double>(exit_gate_w_[c]) * out[c];
      gate_logit[i] = dot;
    }
  }
  // The logits here, then each row's HuginnNormalize and HuginnKl against its kept row,
  // computed whole by one task (the reference's order, whatever the threads).
  void HuginnExitKl(const int32_t* slots, const int32_t* prev, const int32_t* has_prev, int n,
                    double* kl) override {
    if (n == 0) return;
    for (int i = 0; i < n; ++i) {
      MORSERVE_CHECK(prev[i] >= 0 && prev[i] < static_cast<int32_t>(huginn_kept_.size()),
                     "HuginnExitKl: a previous-logits row outside the runner's");
    }
    const size_t vocab = static_cast<size_t>(cfg_.vocab_size);
    std::vector<float> logits(static_cast<size_t>(n) * vocab);
    Logits(slots, n, logits.data());
    static const HuginnLogits kUniform;
    pool_.ParallelFor(n, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        HuginnLogits cur =
            HuginnNormalize(std::vector<float>(&logits[i * vocab], &logits[(i + 1) * vocab]));
        HuginnLogits& kept = huginn_kept_[prev[i]];
        kl[i] = HuginnKl(has_prev[i] != 0 ? kept : kUniform, cur);
        kept = std::move(cur);
      }
    });
  }
  // The host sampler on rows whose logits are set.
  void SampleFrom(const std::vector<SampleInput>& in, SampleResult* out) {
    std::vector<SampleResult> results;
    row_sampler_.SampleRows(in, &results);
    std::move(results.begin(), results.end(), out);
    counters_.sampled_rows += static_cast<int64_t>(in.size());
  }
  // The logits an exit check kept in previous-logits row `row`.
  absl::Span<const float> Kept(int32_t row) const {
    MORSERVE_CHECK(row >= 0 && row < static_cast<int32_t>(huginn_kept_.size()) &&
                       huginn_kept_[row].logits.size() == static_cast<size_t>(cfg_.vocab_size),
                   "KeptLogits: a previous-logits row that holds no check's logits");
    return huginn_kept_[row].logits;
  }
  void CopyStates(const int32_t* src, const int32_t* dst, int n) override {
    const size_t hs = static_cast<size_t>(cfg_.hidden_size);
    for (int i = 0; i < n; ++i) {
      State(dst[i]);  // grows the pool first: the source pointer stays valid
      std::copy_n(State(src[i]), hs, State(dst[i]));
    }
  }

 private:
  // The rows of `parts` stacked, in the format the --weights policy gives their dtype
  // (quantizable: projections and the LM head may be int8; routers and LoRA stay as stored).
  std::unique_ptr<CpuLinear> Linear(std::span<const TensorView* const> parts, bool quantizable) {
    auto lw = LinearWeights::FromViews(parts, FormatFor(parts[0]->dtype, quantizable));
    MORSERVE_CHECK(lw.ok(), std::string(lw.status().message()).c_str());
    return std::make_unique<CpuLinear>(std::move(*lw), &pool_, nullptr, &counters_.weight_bytes);
  }
  std::unique_ptr<CpuLinear> Linear(const TensorView& t, bool quantizable) {
    const TensorView* parts[] = {&t};
    return Linear(parts, quantizable);
  }
  WeightFormat FormatFor(DType stored, bool quantizable) const;
  // Row state `slot` ([hidden] fp32), the pool grown to hold it (growth keeps the contents).
  float* State(int32_t slot) {
    MORSERVE_CHECK(slot >= 0, "a row without a state");
    const size_t hs = static_cast<size_t>(cfg_.hidden_size), need = (slot + size_t{1}) * hs;
    if (states_.size() < need) states_.resize(std::max(need, 2 * states_.size()));
    return &states_[slot * hs];
  }
  // The states of n slots as one batch [n, hidden].
  Act Gather(const int32_t* slots, int n) {
    Act h = arena_.Take(static_cast<size_t>(n) * cfg_.hidden_size);
    ReadStates(slots, n, h.data());
    return h;
  }
  LoopLinear Fused(const LayerWeights& lw, std::initializer_list<Proj> parts, int loops);
  void LoadLayers();
  void LoadHeadAndRouters();
  void RouterForward(const CpuLinear& w1, const CpuLinear* w2, const float* x, int n, float* out);
  void SplitQkv(const Act& qkv, int n, Act* q, Act* k, Act* v) const;
  void NormRows(const LoopNorm& w, const int* loops, int n, const float* x, float* out) const;
  void AddSublayerOutput(const LoopNorm& norm, const int* loops, int n, float* out, float* h) const;
  void AddAttentionAndMlp(const CpuLayer& L, const int* loops, int n, const float* attn, float* h);
  void SwiGluRows(const float* gate_up, int n, float* act);
  void RunRecurrent(const LayerBatch& b, const CpuLayer& L, const Act& q, const Act& k,
                    const Act& v);
  void FinishRecurrentRows(const CpuLayer& L, const int* loops, const int* positions,
                           const int32_t* write_slot, int n, const float* attn, float* h);
  void RunLayer(const LayerBatch& b);
  void RunKvOnlyRows(const LayerBatch& b);
  void ProjectKv(const CpuLayer& L, const int* loops, const int* positions, const float* h, int n,
                 float* k, float* v);
  void PositionQk(const CpuLayer& L, const int* loops, const int* positions, int n, float* q,
                  float* k) const;

  std::shared_ptr<const ModelWeights> w_;
  const ModelConfig& cfg_;
  ThreadPool pool_;
  CpuWeights weights_;
  RecurrentPrefill recurrent_prefill_;
  PagedKvPool kv_;
  std::vector<CpuLayer> layers_;  // by layer slot
  Vec final_norm_;
  Vec exit_gate_w_;  // Ouro's exit gate [H] (docs/models.md#ouro); empty for other models
  double exit_gate_b_ = 0;
  std::unique_ptr<CpuLinear> lm_head_;
  std::unique_ptr<CpuLinear> adapter_;  // Huginn's input injection [H, 2H]; null otherwise
  // Expert-choice routers per loop (w1, and w2 for mlp), aux routers, token-choice router.
  std::vector<std::unique_ptr<CpuLinear>> ec_w1_, ec_w2_, aux_w1_, aux_w2_;
  std::unique_ptr<CpuLinear> tc_w1_, tc_w2_;
  RunnerCounters counters_;
  RowSampler row_sampler_{&pool_};
  AlignedFloats states_;  // row states by slot, [slots, hidden]
  ActArena arena_;        // the steps' activation buffers
  // Huginn adaptive: the last exit check's logits of each previous-logits row (HuginnExitKl).
  std::vector<HuginnLogits> huginn_kept_;
};

LoopLinear CpuModelRunner::Fused(const LayerWeights& lw, std::initializer_list<Proj> parts,
                                 int loops) {
  bool untied = false, has_lora = false;
  for (Proj p : parts) {
    untied |= lw.P(p).untied();
    has_lora |= !lw.P(p).lora.empty();
  }
  LoopLinear out;
  for (int r = 0; r < (untied ? loops : 1); ++r) {
    std::vector<const TensorView*> views;
    for (Proj p : parts) views.push_back(&lw.P(p).At(r));
    out.variants.push_back(Linear(views, /*quantizable=*/true));
    out.n = out.variants.back()->n();
  }
  if (!has_lora) return out;
  out.lora.resize(loops);
  for (int r = 0; r < loops; ++r) {
    int offset = 0;
    for (Proj p : parts) {
      const LoopTensor& t = lw.P(p);
      const int width = static_cast<int>(t.At(r).shape[0]);
      if (!t.lora.empty()) {
        const LoraDelta& d = t.lora[r];
        LoraPart part;
        part.offset = offset;
        part.out = width;
        part.rank = static_cast<int>(d.a.shape[0]);
        part.scale = d.scale;
        part.a = Linear(d.a, /*quantizable=*/false);
        part.b = Linear(d.b, /*quantizable=*/false);
        out.lora[r].push_back(std::move(part));
      }
      offset += width;
    }
  }
  return out;
}

void CpuModelRunner::LoadLayers() {
  const LayerPlan& plan = w_->plan;
  const bool kv_only_rows = cfg_.recursion.routing == Routing::kEarlyExit &&
                            cfg_.recursion.early_exit.exit_kv == ExitKv::kPropagate;
  layers_.resize(plan.num_layer_slots);
  for (int s = 0; s < static_cast<int>(plan.segments.size()); ++s) {
    const Segment& seg = plan.segments[s];
    for (int k = 0; k < seg.num_layers; ++k) {
      const LayerWeights& lw = w_->layers[seg.first_layer_slot + k];
      CpuLayer& L = layers_[seg.first_layer_slot + k];
      L.qkv = Fused(lw, {Proj::kQ, Proj::kK, Proj::kV}, seg.loops);
      L.o = Fused(lw, {Proj::kO}, seg.loops);
      L.gate_up = Fused(lw, {Proj::kGate, Proj::kUp}, seg.loops);
      L.down = Fused(lw, {Proj::kDown}, seg.loops);
      if (kv_only_rows && s == plan.looped_segment)
        L.kv = Fused(lw, {Proj::kK, Proj::kV}, seg.loops);
      for (auto [norm, t] :
           {std::pair{&L.in_norm, &lw.input_norm}, std::pair{&L.post_norm, &lw.post_norm},
            std::pair{&L.attn_out_norm, &lw.attn_out_norm},
            std::pair{&L.mlp_out_norm, &lw.mlp_out_norm}, std::pair{&L.q_bias, &lw.q_bias},
            std::pair{&L.k_bias, &lw.k_bias}}) {
        if (t->per_loop.empty()) continue;  // sandwich norms and qk biases of other models
        for (int r = 0; r < (t->untied() ? seg.loops : 1); ++r)
          norm->variants.push_back(t->At(r).ToF32Vector());
      }
    }
  }
}

// bf16 weights are held as bf16-quads where the AVX-512 set runs (the same values and bits, in
// a layout its quad tiles stream 1.05-1.25x faster than rows in place), else read in place (the
// AVX2 set reads quads column by column, 0.72-0.99x of in place: docs/benchmarks.md). int8
// weights likewise as int8-octets (the Q8 values and bits, one stream per 8 columns).
WeightFormat CpuModelRunner::FormatFor(DType stored, bool quantizable) const {
  const bool avx512 = &BestLinearKernels() == Avx512LinearKernels();
  const WeightFormat bf16 = avx512 ? WeightFormat::kBF16Quads : WeightFormat::kBF16;
  switch (weights_) {
    case CpuWeights::kF32:
      return WeightFormat::kF32;
    case CpuWeights::kBF16:
      return bf16;
    case CpuWeights::kF16:
      return WeightFormat::kF16;
    case CpuWeights::kInt8:
      if (quantizable) return avx512 ? WeightFormat::kQ8Octets : WeightFormat::kQ8;
      break;
    case CpuWeights::kAmxBf16:
      if (quantizable) return WeightFormat::kAmxBf16;
      break;
    case CpuWeights::kW8A8:
      if (quantizable) return WeightFormat::kW8A8;
      break;
    case CpuWeights::kAuto:
      break;
  }
  if (stored == DType::kBF16) return bf16;
  if (stored == DType::kF16) return WeightFormat::kF16;
  return WeightFormat::kF32;
}

void CpuModelRunner::LoadHeadAndRouters() {
  final_norm_ = w_->final_norm.ToF32Vector();
  if (cfg_.recursion.exit_rule == LoopExitRule::kOuroGate) {
    exit_gate_w_ = w_->exit_gate_w.ToF32Vector();
    exit_gate_b_ = w_->exit_gate_b.ToF32Vector()[0];
  }
  lm_head_ = Linear(w_->lm_head, /*quantizable=*/true);
  if (!w_->adapter.empty()) adapter_ = Linear(w_->adapter, /*quantizable=*/true);
  auto load = [&](const TensorView& t) -> std::unique_ptr<CpuLinear> {
    if (t.empty()) return nullptr;
    return Linear(t, /*quantizable=*/false);
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

// Rows of one batch are grouped by loop: norms and per-loop weights run per group; tied
// projections run once over every row.
void CpuModelRunner::RunLayer(const LayerBatch& b) {
  counters_.full_rows += b.n;
  const int n = b.n, hs = cfg_.hidden_size, qd = cfg_.q_dim(), kvd = cfg_.kv_dim();
  const int qkv_dim = qd + 2 * kvd;
  const CpuLayer& L = layers_[w_->plan.segments[b.segment].first_layer_slot + b.k];
  const LayerKvPlan& kv = *b.kv;
  Act a = arena_.Take(static_cast<size_t>(n) * hs);
  Act qkv = arena_.Take(static_cast<size_t>(n) * qkv_dim);
  NormRows(L.in_norm, b.loops, n, b.h, a.data());
  L.qkv.Run(b.loops, n, a.data(), hs, qkv.data(), /*accumulate=*/false);
  Act q = arena_.Take(static_cast<size_t>(n) * qd);
  Act k = arena_.Take(static_cast<size_t>(n) * kvd);
  Act v = arena_.Take(static_cast<size_t>(n) * kvd);
  SplitQkv(qkv, n, &q, &k, &v);
  PositionQk(L, b.loops, b.positions, n, q.data(), k.data());
  if (kv.recurrent) {  // the pair just computed is temporary; the persistent one comes later
    RunRecurrent(b, L, q, k, v);
    return;
  }
  KvWrite(kv_, k.data(), v.data(), kv.write_slot.data(), n);

  Act attn = arena_.Take(static_cast<size_t>(n) * qd);
  PagedAttentionParams p;
  p.num_rows = n;
  p.q = q.data();
  p.out = attn.data();
  p.pool = &kv_;
  p.table_indptr = kv.table_indptr.data();
  p.table_blocks = kv.table_blocks.data();
  p.kv_len = kv.kv_len.data();
  p.n_heads = cfg_.num_heads;
  p.n_kv_heads = cfg_.num_kv_heads;
  p.head_dim = cfg_.head_dim;
  p.scale = 1.0f / std::sqrt(static_cast<float>(cfg_.head_dim));
  PagedAttention(p, &pool_);

  AddAttentionAndMlp(L, b.loops, n, attn.data(), b.h);
}

void CpuModelRunner::NormRows(const LoopNorm& w, const int* loops, int n, const float* x,
                              float* out) const {
  const int hs = cfg_.hidden_size;
  for (const auto [loop, begin, count] : LoopGroups(loops, n)) {
    RmsNormRows(x + static_cast<size_t>(begin) * hs, w.At(loop).data(), count, hs,
                cfg_.rms_norm_eps, out + static_cast<size_t>(begin) * hs);
  }
}

// h += out (n rows of the residual stream), h += RMSNorm(out, norm) in a sandwich block (Ouro),
// or h = RMSNorm(h + out, norm) in Huginn's.
void CpuModelRunner::AddSublayerOutput(const LoopNorm& norm, const int* loops, int n, float* out,
                                       float* h) const {
  const size_t count = static_cast<size_t>(n) * cfg_.hidden_size;
  if (cfg_.sandwich_norm) NormRows(norm, loops, n, out, out);
  for (size_t i = 0; i < count; ++i) h[i] += out[i];
  if (cfg_.huginn.residual_norm) NormRows(norm, loops, n, h, h);
}

// h += attn Wo^T, then h += MLP(RMSNorm_post(h)); a sandwich block (Ouro) norms each of the
// two outputs before its add (docs/models.md#ouro).
void CpuModelRunner::AddAttentionAndMlp(const CpuLayer& L, const int* loops, int n,
                                        const float* attn, float* h) {
  const int hs = cfg_.hidden_size, qd = cfg_.q_dim(), inter = cfg_.intermediate_size;
  const bool normed_sums = cfg_.sandwich_norm || cfg_.huginn.residual_norm;
  if (normed_sums) {
    Act o = arena_.Take(static_cast<size_t>(n) * hs);
    L.o.Run(loops, n, attn, qd, o.data(), /*accumulate=*/false);
    AddSublayerOutput(L.attn_out_norm, loops, n, o.data(), h);
  } else {
    L.o.Run(loops, n, attn, qd, h, /*accumulate=*/true);
  }
  Act m = arena_.Take(static_cast<size_t>(n) * hs);
  Act gu = arena_.Take(static_cast<size_t>(n) * 2 * inter);
  Act act = arena_.Take(static_cast<size_t>(n) * inter);
  NormRows(L.post_norm, loops, n, h, m.data());
  L.gate_up.Run(loops, n, m.data(), hs, gu.data(), /*accumulate=*/false);
  SwiGluRows(gu.data(), n, act.data());
  if (normed_sums) {
    Act d = arena_.Take(static_cast<size_t>(n) * hs);
    L.down.Run(loops, n, act.data(), inter, d.data(), /*accumulate=*/false);
    AddSublayerOutput(L.mlp_out_norm, loops, n, d.data(), h);
  } else {
    L.down.Run(loops, n, act.data(), inter, h, /*accumulate=*/true);
  }
}

// act[n, inter] = SiLU(gate) * up from gate_up[n, 2 * inter], over the pool in pieces of
// kSwiGluCols columns of a row: element-wise, so the bits do not depend on the split (its
// double-precision exp runs 8 lanes per AVX-512 vector where the host has it: silu_mul.h).
void CpuModelRunner::SwiGluRows(const float* gate_up, int n, float* act) {
  constexpr int kSwiGluCols = 512;
  const int inter = cfg_.intermediate_size, pieces = (inter + kSwiGluCols - 1) / kSwiGluCols;
  pool_.ParallelFor(static_cast<int64_t>(n) * pieces, [&](int64_t begin, int64_t end) {
    for (int64_t u = begin; u < end; ++u) {
      const int64_t row = u / pieces;
      const int c0 = static_cast<int>(u % pieces) * kSwiGluCols;
      const int cols = std::min(kSwiGluCols, inter - c0);
      const float* g = gate_up + row * 2 * inter + c0;
      SiluMulRows(g, g + inter, 1, cols, act + row * inter + c0);
    }
  });
}

// Recurrent layers (docs/models.md#recurrent-transformer-layers) from the rows' q and
// temporary pairs: attention by recurrent_layer.h, the rest of the layer here.
void CpuModelRunner::RunRecurrent(const LayerBatch& b, const CpuLayer& L, const Act& q,
                                  const Act& k, const Act& v) {
  RecurrentLayerParams p;
  p.batch = &b;
  p.q = q.data();
  p.k = k.data();
  p.v = v.data();
  p.kv = &kv_;
  p.threads = &pool_;
  p.hidden = cfg_.hidden_size;
  p.n_heads = cfg_.num_heads;
  p.n_kv_heads = cfg_.num_kv_heads;
  p.head_dim = cfg_.head_dim;
  p.schedule = recurrent_prefill_;
  p.finish = [&](const int* loops, const int* positions, const int32_t* write_slot, int n,
                 const float* attn,
                 float* h) { FinishRecurrentRows(L, loops, positions, write_slot, n, attn, h); };
  RunRecurrentLayer(p);
}

// The rest of a recurrent layer after attention: Wo, MLP, then the persistent pair from
// RMSNorm_in(out) (K/V projections, RoPE at the row's position) written to the cache.
void CpuModelRunner::FinishRecurrentRows(const CpuLayer& L, const int* loops, const int* positions,
                                         const int32_t* write_slot, int n, const float* attn,
                                         float* h) {
  const int hs = cfg_.hidden_size, qd = cfg_.q_dim(), kvd = cfg_.kv_dim();
  AddAttentionAndMlp(L, loops, n, attn, h);
  Act a = arena_.Take(static_cast<size_t>(n) * hs);
  Act qkv = arena_.Take(static_cast<size_t>(n) * (qd + 2 * kvd));
  NormRows(L.in_norm, loops, n, h, a.data());
  L.qkv.Run(loops, n, a.data(), hs, qkv.data(), /*accumulate=*/false);
  Act q = arena_.Take(static_cast<size_t>(n) * qd);
  Act k = arena_.Take(static_cast<size_t>(n) * kvd);
  Act v = arena_.Take(static_cast<size_t>(n) * kvd);
  SplitQkv(qkv, n, &q, &k, &v);
  PositionQk(L, loops, positions, n, nullptr, k.data());
  KvWrite(kv_, k.data(), v.data(), write_slot, n);
}

// K/V-only rows (their h unchanged): the entries written from their exit state.
void CpuModelRunner::RunKvOnlyRows(const LayerBatch& b) {
  const CpuLayer& L = layers_[w_->plan.segments[b.segment].first_layer_slot + b.k];
  MORSERVE_CHECK(L.kv.n > 0, "K/V-only rows on a layer without the K/V-only projection");
  const int n = b.n, kvd = cfg_.kv_dim();
  counters_.kv_only_rows += n;
  Act k = arena_.Take(static_cast<size_t>(n) * kvd);
  Act v = arena_.Take(static_cast<size_t>(n) * kvd);
  ProjectKv(L, b.loops, b.positions, b.h, n, k.data(), v.data());
  KvWrite(kv_, k.data(), v.data(), b.kv->write_slot.data(), n);
}

// K and V ([n, kv_dim] each, K after RoPE) of n rows grouped by loop, from their layer input
// h: RMSNorm_in, the K/V-only projection (per-loop weights and LoRA deltas exactly as the
// fused projection applies them to its K and V columns), RoPE. No Q is computed.
void CpuModelRunner::ProjectKv(const CpuLayer& L, const int* loops, const int* positions,
                               const float* h, int n, float* k, float* v) {
  const int hs = cfg_.hidden_size, kvd = cfg_.kv_dim();
  Act a = arena_.Take(static_cast<size_t>(n) * hs);
  Act kv = arena_.Take(static_cast<size_t>(n) * 2 * kvd);
  NormRows(L.in_norm, loops, n, h, a.data());
  L.kv.Run(loops, n, a.data(), hs, kv.data(), /*accumulate=*/false);
  for (int i = 0; i < n; ++i) {
    const float* row = &kv[static_cast<size_t>(i) * 2 * kvd];
    std::copy_n(row, kvd, k + static_cast<size_t>(i) * kvd);
    std::copy_n(row + kvd, kvd, v + static_cast<size_t>(i) * kvd);
  }
  PositionQk(L, loops, positions, n, nullptr, k);
}

// q (when not null) and k of n rows grouped by loop: Huginn's qk_bias added, then RoPE at each
// row's position, on halves or (Huginn) adjacent pairs.
void CpuModelRunner::PositionQk(const CpuLayer& L, const int* loops, const int* positions, int n,
                                float* q, float* k) const {
  const int qd = cfg_.q_dim(), kvd = cfg_.kv_dim();
  if (!L.k_bias.variants.empty()) {
    for (const auto [loop, begin, count] : LoopGroups(loops, n)) {
      for (int i = begin; i < begin + count; ++i) {
        if (q != nullptr)
          AddRows(q + static_cast<size_t>(i) * qd, L.q_bias.At(loop).data(), 1, qd,
                  q + static_cast<size_t>(i) * qd);
        AddRows(k + static_cast<size_t>(i) * kvd, L.k_bias.At(loop).data(), 1, kvd,
                k + static_cast<size_t>(i) * kvd);
      }
    }
  }
  std::vector<int32_t> pos(positions, positions + n);
  auto rope = cfg_.huginn.rope_pairs ? &RopePairsRows : &RopeRows;
  if (q != nullptr) rope(q, pos.data(), n, cfg_.num_heads, cfg_.head_dim, cfg_.rope_theta);
  rope(k, pos.data(), n, cfg_.num_kv_heads, cfg_.head_dim, cfg_.rope_theta);
}

void CpuModelRunner::SplitQkv(const Act& qkv, int n, Act* q, Act* k, Act* v) const {
  const int qd = cfg_.q_dim(), kvd = cfg_.kv_dim(), qkv_dim = qd + 2 * kvd;
  for (int i = 0; i < n; ++i) {
    const float* row = &qkv[static_cast<size_t>(i) * qkv_dim];
    std::copy(row, row + qd, &(*q)[static_cast<size_t>(i) * qd]);
    std::copy(row + qd, row + qd + kvd, &(*k)[static_cast<size_t>(i) * kvd]);
    std::copy(row + qd + kvd, row + qkv_dim, &(*v)[static_cast<size_t>(i) * kvd]);
  }
}

// Router scores of n rows: w1 · x (linear), or w2 · gelu(w1 · x) (mlp).
void CpuModelRunner::RouterForward(const CpuLinear& w1, const CpuLinear* w2, const float* x, int n,
                                   float* out) {
  if (w2 == nullptr) {
    w1.Forward(x, n, out);
    return;
  }
  Act mid = arena_.Take(static_cast<size_t>(n) * w1.n());
  w1.Forward(x, n, mid.data());
  GeluErf(mid.data(), static_cast<int64_t>(mid.size()));
  w2->Forward(mid.data(), n, out);
}

void CpuModelRunner::ExpertRouter(const int* loops, const int32_t* slots, int n, float* score,
                                  float* decide) {
  const int hs = cfg_.hidden_size;
  const float temperature = cfg_.recursion.router.temperature;
  Act x = Gather(slots, n);
  for (float& v : x) v = v / temperature;
  // Rows may be at different loops: each group of rows uses its loop's router.
  for (const auto [r, begin, count] : LoopGroups(loops, n)) {
    const float* xr = &x[static_cast<size_t>(begin) * hs];
    RouterForward(*ec_w1_[r], ec_w2_[r].get(), xr, count, &score[begin]);
    if (aux_w1_.empty()) {
      std::copy(score + begin, score + begin + count, decide + begin);
    } else {
      RouterForward(*aux_w1_[r], aux_w2_[r].get(), xr, count, &decide[begin]);
    }
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<ModelRunner>> CreateCpuModelRunner(
    std::shared_ptr<const ModelWeights> weights, const EngineConfig& config, int num_kv_blocks) {
  return std::unique_ptr<ModelRunner>(
      new CpuModelRunner(std::move(weights), config, num_kv_blocks));
}

}  // namespace morserve
