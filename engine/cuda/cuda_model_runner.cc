// CUDA implementation of ModelRunner (see cuda_model_runner.h).
//
// Dtypes through a layer: the residual stream h is fp32 on the device; RMSNorm writes bf16
// (the GEMMs' input); every GEMM accumulates in fp32 and writes fp32 (so LoRA deltas and
// residual adds are fp32 adds); the QKV epilogue emits bf16 q and the bf16 cache entries;
// attention writes bf16 (the o projection's input); SwiGLU writes bf16 (down's input).
// Relaxed models' per-loop LoRA deltas are added into a linear's fp32 output by two launches
// over all of the batch's loops (segmented shrink into fp32 t, expand-and-add), whatever the
// number of loops in the batch.
// Huginn-0125 (docs/models.md#huginn-0125): the QKV epilogue adds the qk bias and rotates
// adjacent pairs; each residual sum is normed in place (fp32); the embedding kernel applies the
// sqrt(H) scale in fp64 as the CPU does (the same bits); the input injection is one bf16 GEMM
// over concat(s, e), joined and rounded to bf16 by state_join.
// Row states live in a device pool by slot (states_); each call gathers its rows' states into
// scratch h (row_copy) and scatters the results back, so a state stays on the device from the
// embedding to the sampling. Each call's uploads go through one pinned arena in one copy and
// need no synchronisation; only a call that returns data (logits, sampled tokens, router
// scores, ReadStates) waits for the stream, and that frees the arena.
#include "engine/cuda/cuda_model_runner.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <set>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/core/check.h"
#include "engine/cuda/cuda_step_graphs.h"
#include "engine/cuda/device_buffer.h"
#include "engine/cuda/recurrent_staging.h"
#include "engine/cuda/sample_staging.h"
#include "engine/cuda/step_staging.h"
#include "engine/cuda/weight_packing.h"
#include "engine/runtime/cuda_runner_registry.h"
#include "engine/runtime/recurrent_schedule.h"
#include "kernels/argmax.cuh"
#include "kernels/embedding.cuh"
#include "kernels/exit_confidence.cuh"
#include "kernels/expert_router.cuh"
#include "kernels/fixed_gemm.cuh"
#include "kernels/gemm.cuh"
#include "kernels/huginn_kl.cuh"
#include "kernels/kv_copy.cuh"
#include "kernels/logit_process.cuh"
#include "kernels/lora_expand.cuh"
#include "kernels/lora_shrink.cuh"
#include "kernels/paged_attention.cuh"
#include "kernels/qkv_rope.cuh"
#include "kernels/recurrent_attention.cuh"
#include "kernels/rmsnorm.cuh"
#include "kernels/row_copy.cuh"
#include "kernels/sampling.cuh"
#include "kernels/scale_add.cuh"
#include "kernels/state_join.cuh"
#include "kernels/swiglu.cuh"
#include "kernels/token_choice_router.cuh"

namespace morserve {
namespace {

namespace k = morserve::kernels;

// The largest batch a segment pass is captured at (CUDA graphs, cuda_step_graphs.h).
constexpr int kMaxGraphRows = 256;

// The fixed-order GEMM's split schedule gets a workspace for calls of up to this many rows
// (decode; larger calls run in one pass, with the same bits).
constexpr int kFixedGemmWorkspaceRows = 64;

// Split-KV chunk of the attention kernel, in tokens (fixed: batch invariance).
constexpr int kAttentionChunk = 256;
// Recurrent layers attend in split chunks of kRecurrentRange entries (the extra pair included):
// the naive path's paged attention with that chunk_len and the tiled path's range partials
// (kernels/recurrent_attention.cuh) give the same bits, for any batch and any chunking.
static_assert(kRecurrentGpuTile == k::kRecurrentTile && kRecurrentGpuRange == k::kRecurrentRange &&
                  sizeof(RecurrentFold) == sizeof(k::RecurrentFoldItem),
              "the recurrent schedule and kernel agree on tiles, ranges and items");

struct DeviceLinear {
  int out = 0;
  int in = 0;
  std::vector<DeviceBuffer> variants;  // bf16 [out, in]
  int lora_rank = 0, lora_loops = 0;
  DeviceBuffer lora_a, lora_b;  // every loop's adapter stacked (see weight_packing.h)
  const uint16_t* At(int loop) const {
    return variants[variants.size() == 1 ? 0 : loop].as<uint16_t>();
  }
};

struct DeviceNorm {
  std::vector<DeviceBuffer> variants;  // fp32 [hidden]
  const float* At(int loop) const { return variants[variants.size() == 1 ? 0 : loop].as<float>(); }
};

struct DeviceLayer {
  DeviceLinear qkv, o, gate_up, down;
  DeviceNorm in_norm, post_norm;
  DeviceNorm attn_out_norm, mlp_out_norm;  // sandwich blocks (Ouro), Huginn's sum norms
  // Huginn's qk bias: fp32 [variants, q_dim + kv_dim] (q's then k's); empty otherwise.
  DeviceBuffer qk_bias;
  int qk_bias_variants = 0;
};

DeviceLinear Upload(const PackedLinear& p) {
  DeviceLinear d;
  d.out = p.out;
  d.in = p.in;
  d.lora_rank = p.lora_rank;
  d.lora_loops = p.lora_loops;
  for (const auto& v : p.variants) d.variants.push_back(UploadVector(v));
  if (p.lora_rank > 0) {
    d.lora_a = UploadVector(p.lora_a);
    d.lora_b = UploadVector(p.lora_b);
  }
  return d;
}

// A router kept on the host in fp32 (mlp routers: w2 · gelu(w1 · x)), evaluated in double.
struct HostMlp {
  int mid = 0, out = 0, in = 0;
  std::vector<float> w1, w2;
  void Forward(const float* x, float* y) const {
    std::vector<double> m(mid);
    for (int j = 0; j < mid; ++j) {
      double s = 0;
      for (int c = 0; c < in; ++c)
        s += static_cast<double>(w1[static_cast<size_t>(j) * in + c]) * x[c];
      const double v = static_cast<float>(s);
      m[j] = static_cast<float>(0.5 * v * (1.0 + std::erf(v / std::sqrt(2.0))));
    }
    for (int o = 0; o < out; ++o) {
      double s = 0;
      for (int j = 0; j < mid; ++j)
        s += static_cast<double>(w2[static_cast<size_t>(o) * mid + j]) * m[j];
      y[o] = static_cast<float>(s);
    }
  }
};

HostMlp LoadHostMlp(const TensorView& w1, const TensorView& w2) {
  HostMlp r;
  r.mid = static_cast<int>(w1.shape[0]);
  r.in = static_cast<int>(w1.shape[1]);
  r.out = static_cast<int>(w2.shape[0]);
  r.w1 = w1.ToF32Vector();
  r.w2 = w2.ToF32Vector();
  return r;
}

// Bytes of Sample's per-row device arrays for `rows` rows (SampleLayout, below).
size_t SampleBytes(size_t rows);

// Per-call device scratch, reserved at Init (ReserveStepBuffers) and grown if a call is larger.
struct Scratch {
  DeviceBuffer h, a, qkv, q, k_tmp, v_tmp, attn, proj, gu, act, lora_t, logits, attn_ws, router_f,
      router_i, sample_io;
  DeviceBuffer processed;  // rows of logits after the sampler's pre-temperature stages
};

class CudaModelRunner : public ModelRunner {
 public:
  // Step buffers are reserved at Init for `rows` rows per call and `logit_rows` rows of logits,
  // and huginn_rows previous-logits rows (HuginnExitKl). Segment passes of up to graph_rows rows
  // are captured in CUDA graphs (0: none).
  CudaModelRunner(std::shared_ptr<const ModelWeights> w, int num_blocks, int block_size,
                  RecurrentPrefill recurrent_prefill, int64_t initial_states, int rows,
                  int logit_rows, int huginn_rows, int graph_rows, CudaGemm gemm_choice,
                  CudaAttentionFold attention_fold)
      : w_(std::move(w)),
        cfg_(w_->config),
        num_blocks_(num_blocks),
        block_size_(block_size),
        recurrent_prefill_(recurrent_prefill),
        initial_states_(initial_states),
        reserve_rows_(rows),
        reserve_logit_rows_(logit_rows),
        huginn_rows_(huginn_rows),
        graph_rows_(graph_rows),
        gemm_choice_(gemm_choice),
        attention_fold_(attention_fold == CudaAttentionFold::kWarp ? k::AttentionFold::kWarp
                                                                   : k::AttentionFold::kCta) {}
  ~CudaModelRunner() override {
    if (stream_ == nullptr) return;
    cudaStreamSynchronize(stream_);  // no graph is running when it is destroyed
    graphs_.Invalidate();
    cudaStreamDestroy(stream_);
  }

  absl::Status Init();
  int block_size() const override { return block_size_; }
  void Embed(const int* tokens, int n, const int32_t* slots) override;
  void RunSegment(const SegmentBatch& b) override;
  void ExpertRouter(const int* loops, const int32_t* slots, int n, float* score,
                    float* decide) override;
  void TokenChoiceRouter(const int32_t* slots, int n, float* scores) override;
  void Logits(const int32_t* slots, int n, float* logits) override;
  void Sample(const int32_t* slots, absl::Span<const SampleInput> rows, SampleResult* out) override;
  void KeptLogits(const int32_t* kept, int n, float* logits) override;
  void SampleKept(const int32_t* kept, absl::Span<const SampleInput> rows,
                  SampleResult* out) override;
  void InjectInput(const int32_t* s, const int32_t* e, int n) override;
  void ReadStates(const int32_t* slots, int n, float* h) override;
  void WriteStates(const int32_t* slots, int n, const float* h) override;
  void CopyStates(const int32_t* src, const int32_t* dst, int n) override;
  void GatedAdd(const int32_t* base, const int32_t* slots, const float* scale, int n) override;
  void NormBetweenLoops(const int32_t* src, const int32_t* dst, int n, double* gate_logit) override;
  void HuginnExitKl(const int32_t* slots, const int32_t* prev, const int32_t* has_prev, int n,
                    double* kl) override;
  // One cache entry read back as fp32 (tests).
  void ReadKv(int32_t slot, float* k, float* v) const override;
  void CopyKv(const KvCopy* copies, int n) override;
  RunnerCounters counters() const override {
    RunnerCounters c = counters_;
    c.device.allocations = StepAllocations();
    return c;
  }

 private:
  // RunSegment's pass over full rows as a replay of its captured graph (cuda_step_graphs.h);
  // false when the batch is beyond what graphs take (then it runs eagerly).
  bool RunSegmentGraphed(const SegmentBatch& b);
  // Every layer of the segment over nk K/V-only rows then nf full rows staged in kv_only and
  // full, whose states are the slots at Meta(slots_at): gathered, run, the full rows' scattered
  // back.
  void SegmentPass(const Segment& seg, const std::vector<StagedRows>& kv_only,
                   const std::vector<StagedRows>& full, size_t slots_at, int nk, int nf);
  // Linear router scores of n rows (see the definition).
  void LinearRouterScores(const float* h, const DeviceBuffer& w, const int32_t* loops,
                          const DeviceBuffer& capacity, int num_loops, float temperature, int n,
                          float* score);
  // True when a layer of seg has per-loop weights (a GEMM or norm per loop group).
  bool SegmentHasLoopWeights(const Segment& seg) const;
  // body's launches captured on stream_ (nothing runs) and instantiated.
  StepGraph Capture(const std::function<void()>& body);
  // The bound of graph_meta_, in int32 values, at Init.
  size_t GraphMetaInts() const;
  // One recurrent layer by the naive schedule, its rows' h on the host (see RunSegment).
  void RunRecurrentNaive(const LayerBatch& b);
  // Full rows: attention and MLP, h updated (uploaded and downloaded around the layer).
  void RunFullRows(const LayerBatch& b);
  // The same on the device: n rows staged in s (their metadata uploaded), h their device
  // states; recurrent: the temporary pair attended and the persistent pair written after.
  void FullRowsOnDevice(const DeviceLayer& L, const StagedRows& s, float* h, int n, bool recurrent);
  // Recurrent layers by the exact tiled schedule (engine/runtime/recurrent_schedule.h): the
  // batch reordered into waves of positions; q and the temporary pairs for all rows at once;
  // per wave, key-tile merges into pending queries' softmax partials (one per range of
  // kRecurrentRange keys: a decode row's cached prefix is one CTA per range and kv head), the
  // wave's finish (own tile, then the ranges combined in order), then RecurrentRowsTail. The
  // rows' states (slots, in b's row order) are gathered in wave order and scattered back: one
  // upload, no synchronisation.
  void RunRecurrentTiled(const LayerBatch& b, const int32_t* slots);
  // Merge (finish = false) or finish items [begin, begin + count) staged at items_at, on the
  // rows' range partials in `partials` (RecurrentAttentionWorkspaceFloats for s).
  void RecurrentAttend(bool finish, const StagedRows& s, int rows, float* partials, size_t items_at,
                       int begin, int count);
  // Rows [begin, begin + m) after their attention: o, MLP, persistent pair to the cache.
  // ws: the rows' own staging (loop runs from 0), appended to s's upload (AppendStaged).
  void RecurrentRowsTail(const DeviceLayer& L, const StagedRows& s, const StagedRows& ws, int begin,
                         int m);
  // Rows `rows` of b as full rows in a sub-batch of their own (`sub` is reused scratch), their
  // h written back into b.h.
  void RunFullSubBatch(const LayerBatch& b, const std::vector<int>& rows, SubBatch* sub);
  void LoadLayers();
  void LoadHeadAndRouters();
  // Copies host h [n, hidden] to scratch h and the staged metadata to the device (Meta).
  void UploadRows(const float* h, int n, const StagedRows* staged);
  // Copies `bytes` of host `src` to the device (async on stream_) through the step's upload
  // arena: to `dst`, or to a fresh part of the device arena, which it returns. The arena's
  // parts are free again after the next Sync (every upload of before has happened).
  void* Stage(const void* src, size_t bytes, void* dst = nullptr);
  void BeginUploads(std::initializer_list<size_t> sizes);
  // The device copy of n slot ids, and the state pool grown to hold them.
  const int32_t* UploadSlots(const int32_t* slots, int n);
  void EnsureStates(const int32_t* slots, int n);
  // The waiting embeddings (Embed) done now, with an upload of their own; EmbedStaged: the
  // embedding of ids already on the device into the states dev_slots.
  void FlushEmbeds();
  void EmbedStaged(const int32_t* dev_ids, const int32_t* dev_slots, int n);
  // n rows of [hidden] fp32: src row src_rows[i] to dst row dst_rows[i]; an index array is
  // slots of the state pool, or null: row i of a contiguous buffer of n rows.
  void CopyRows(const float* src, const int32_t* src_rows, float* dst, const int32_t* dst_rows,
                int n);
  // States of n rows (slot ids on the device) to a contiguous [n, hidden] buffer and back.
  void GatherStates(const int32_t* dev_slots, int n, float* out);
  void ScatterStates(const float* in, const int32_t* dev_slots, int n);
  // scratch_.logits [n, vocab] fp32 = lm_head(RMSNorm_final(h)) of the states dev_slots.
  void LogitsOnDevice(const int32_t* dev_slots, int n);
  // scratch_.logits [n, vocab] fp32 = the previous-logits rows dev_kept (SampleKept).
  void KeptLogitsOnDevice(const int32_t* dev_kept, int n);
  // Logits / Sample of rows named by ids: state slots, or previous-logits rows when `kept`.
  void LogitsOf(const int32_t* ids, bool kept, int n, float* logits);
  void SampleRows(const int32_t* ids, bool kept, absl::Span<const SampleInput> rows,
                  SampleResult* out);
  // Copies `bytes` of device `src` to host `dst` through the pinned buffer, then waits.
  void Download(const void* src, size_t bytes, void* dst);
  // Every launch, copy and stream synchronisation of the step path goes through these, which
  // count it (RunnerCounters; ReadKv, for tests, is not counted).
  void Launched(cudaError_t e, const char* what) {
    ++counters_.device.launches;
    CudaCheck(e, what);
  }
  void CopyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, const char* what) {
    const bool up = kind == cudaMemcpyHostToDevice;
    ++(up ? counters_.device.h2d_copies : counters_.device.d2h_copies);
    (up ? counters_.device.h2d_bytes : counters_.device.d2h_bytes) += static_cast<int64_t>(bytes);
    CudaCheck(cudaMemcpyAsync(dst, src, bytes, kind, stream_), what);
  }
  void Sync() {
    ++counters_.device.syncs;
    CudaCheck(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
    arena_used_ = 0;
  }
  // Device and pinned allocations of the step's buffers since the runner was made.
  int64_t StepAllocations() const;
  void Gemm(const uint16_t* x, const uint16_t* w, void* y, DType y_dtype, int m, int n, int kdim);
  // y[rows, L.out] fp32 = x[rows, L.in] bf16 · W_loop^T (+ LoRA delta), rows grouped by loop.
  void Linear(const DeviceLinear& L, const StagedRows& s, const uint16_t* x, float* y);
  // y += (x A_loop^T) B_loop^T for every row with its loop's adapter: one segmented shrink
  // and one segmented expand-and-add over all the loops' rows (t in fp32).
  void LoraDelta(const DeviceLinear& L, const StagedRows& s, const uint16_t* x, float* y, int n);
  // out[rows, hidden] bf16 = RMSNorm(h) with the row's loop's weights.
  void Norm(const DeviceNorm& w, const StagedRows& s, const float* h, uint16_t* out);
  void NormTo(const DeviceNorm& w, const StagedRows& s, const float* x, void* out, DType out_dtype);
  void AddResidual(float* h, const float* b, int n, int dim);
  void AddSublayer(const DeviceNorm& norm, const StagedRows& s, float* h, float* out, int n);
  // Rows [begin, begin + n) of s: q -> scratch q (bf16, RoPE'd) at row begin; k, v -> the
  // cache at write_slot when write_cache; k, v -> k_tmp / v_tmp when emit_kv (the recurrent
  // layers' temporary pair). scratch qkv holds the n rows from its start.
  // L gives the qk bias (Huginn); the rows' loops pick its variant.
  void QkvEpilogue(const DeviceLayer& L, const StagedRows& s, int n, bool write_cache, bool emit_kv,
                   int begin = 0);
  // h[m, hidden] += down(SwiGLU(gate_up(RMSNorm_post(h)))), rows grouped by ws's loops.
  void Mlp(const DeviceLayer& L, const StagedRows& ws, float* h, int m);
  // K/V entries computed from h, written to the cache at write_slot (rows [begin, begin + m)
  // of s): RMSNorm_in, the QKV projection (loops from ws), RoPE. A recurrent layer's
  // persistent pair from its output (docs/models.md#recurrent-transformer-layers), and the
  // K/V-only rows' entries.
  void KvFromHidden(const DeviceLayer& L, const StagedRows& s, const StagedRows& ws, float* h,
                    int begin, int m);
  const int32_t* Meta(size_t offset) const { return meta_ + offset; }
  // The fields paged and recurrent attention launches share: q, the cache and s's block
  // tables and kv lengths, bf16 output to scratch attn, the model's head shape and scale.
  template <typename P>
  void FillAttention(const StagedRows& s, int rows, P* p) const {
    p->q = scratch_.q.as<uint16_t>();
    p->k_cache = k_cache_.as<uint16_t>();
    p->v_cache = v_cache_.as<uint16_t>();
    p->table_indptr = Meta(s.table_indptr);
    p->table_blocks = Meta(s.table_blocks);
    p->kv_len = Meta(s.kv_len);
    p->out = scratch_.attn.as<void>();
    p->out_dtype = DType::kBF16;
    p->rows = rows;
    p->n_heads = cfg_.num_heads;
    p->n_kv_heads = cfg_.num_kv_heads;
    p->head_dim = cfg_.head_dim;
    p->block_size = block_size_;
    p->num_blocks = num_blocks_;
    p->scale = 1.0f / std::sqrt(static_cast<float>(cfg_.head_dim));
  }
  void Ensure(DeviceBuffer& b, size_t bytes) { b.Reserve(bytes); }
  // The layer scratch for `rows` rows: normed input, QKV, q (all rows); with `full` also the
  // temporary K/V pair, attention output, projections and the MLP's buffers.
  void EnsureLayerScratch(size_t rows, bool full);
  // Every step buffer at its size for reserve_rows_ rows per call (and reserve_logit_rows_ of
  // logits; decode attention's split workspace at the model's longest context), at Init: the
  // step path then allocates nothing unless a call is larger.
  void ReserveStepBuffers();
  // Pins one cuBLASLt algorithm for each GEMM shape of the step (kernels/gemm.cuh: the same
  // kernel, so the same bits, at every batch size).
  absl::Status PinGemms();

  std::shared_ptr<const ModelWeights> w_;
  const ModelConfig& cfg_;
  int num_blocks_ = 0;
  int block_size_ = 0;
  cudaStream_t stream_ = nullptr;
  k::LtGemm gemm_;
  // --cuda-gemm (gemm_choice_): the (n, k) shapes that run on the fixed-order kernel, and its
  // split schedule's workspace (reserved at start-up for up to kFixedGemmWorkspaceRows rows).
  std::set<std::pair<int, int>> fixed_shapes_;
  DeviceBuffer fixed_ws_;
  DeviceBuffer k_cache_, v_cache_;   // bf16 [num_blocks, block_size, kv_heads, head_dim]
  std::vector<DeviceLayer> layers_;  // by layer slot
  DeviceBuffer embed_, lm_head_, final_norm_;
  DeviceBuffer adapter_;  // Huginn's input injection, bf16 [H, 2H]; empty otherwise
  const uint16_t* lm_head_ptr_ = nullptr;  // lm_head_, or embed_ when tied
  // Linear routers, stacked per loop (fp32), or mlp routers on the host.
  DeviceBuffer ec_w_, aux_w_, tc_w_, capacity_zero_;
  // Ouro's exit gate [H] fp32, its bias, and the zero capacity of its one "loop"
  // (NormBetweenLoops).
  DeviceBuffer exit_gate_w_, exit_gate_capacity_;
  double exit_gate_b_ = 0;
  std::vector<HostMlp> ec_mlp_, aux_mlp_;
  HostMlp tc_mlp_;
  bool ec_linear_ = true, tc_linear_ = true;
  Scratch scratch_;
  RecurrentPrefill recurrent_prefill_ = RecurrentPrefill::kTiled;
  PinnedBuffer pinned_out_;
  // The step's uploads: host parts and their device copies, bump-allocated, reset by Sync.
  PinnedBuffer arena_host_;
  DeviceBuffer arena_dev_;
  size_t arena_used_ = 0;
  const int32_t* meta_ = nullptr;  // the last staged rows' metadata (Meta)
  // Row states [state_rows_, hidden] fp32 by slot; grown (kept) when a slot is beyond them.
  DeviceBuffer states_;
  int64_t state_rows_ = 0, initial_states_ = 0, state_allocations_ = 0;
  int reserve_rows_ = 0, reserve_logit_rows_ = 0;
  // Huginn adaptive (HuginnExitKl): each previous-logits row's last exit-check logits, fp32
  // [huginn_rows_, vocab], and log-partition [huginn_rows_]; the checks' statistics [rows].
  int huginn_rows_ = 0;
  DeviceBuffer huginn_kept_, huginn_log_z_, huginn_kl_;
  // Captured segment passes; their rows' metadata at a fixed address (graph_meta_); they are
  // valid while StepAllocations() == graph_generation_.
  int graph_rows_ = 0;
  StepGraphs graphs_{64};
  DeviceBuffer graph_meta_;
  int64_t graph_generation_ = -1;
  CudaGemm gemm_choice_ = CudaGemm::kAuto;
  // --cuda-attention-fold: the non-recurrent layers' attention fold (recurrent layers: kCta).
  k::AttentionFold attention_fold_ = k::AttentionFold::kCta;
  std::vector<int32_t> pending_ids_, pending_slots_;  // embeddings not yet run (Embed)
  RunnerCounters counters_;  // since construction (device.allocations: StepAllocations)
};

absl::Status CudaModelRunner::Init() {
  const int hs = cfg_.hidden_size, hd = cfg_.head_dim;
  if (!k::AttentionHeadDimSupported(hd))
    return absl::UnimplementedError(absl::StrCat("--device cuda: head_dim ", hd,
                                                 " (the attention kernels take 64, 96 or 128)"));
  if (cfg_.num_heads % cfg_.num_kv_heads != 0 ||
      cfg_.num_heads / cfg_.num_kv_heads > k::kAttentionMaxGroup) {
    return absl::UnimplementedError("--device cuda: GQA group over 8 query heads per kv head");
  }
  if (hs % 8 != 0 || cfg_.intermediate_size % 8 != 0 || cfg_.vocab_size % 8 != 0) {
    return absl::UnimplementedError(
        absl::StrCat("--device cuda: hidden (", hs, "), intermediate (", cfg_.intermediate_size,
                     ") and vocab (", cfg_.vocab_size, ") must be multiples of 8 (cuBLASLt rows)"));
  }
  if (w_->config.recursion.routing == Routing::kTokenChoice && !w_->router.token_choice.empty() &&
      w_->router.token_choice_w2.empty() &&
      cfg_.recursion.num_recursions > k::kTokenChoiceMaxRecursions) {
    return absl::UnimplementedError(
        "--device cuda: more than 16 recursions for a token-choice router");
  }
  if (cudaError_t e = cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking);
      e != cudaSuccess) {
    return absl::InternalError(
        absl::StrCat("--device cuda: cudaStreamCreate: ", cudaGetErrorString(e)));
  }
  if (cublasStatus_t st = gemm_.Init(); st != CUBLAS_STATUS_SUCCESS) {
    return absl::InternalError(
        absl::StrCat("--device cuda: cuBLASLt init: ", k::GemmStatusString(st)));
  }
  // Weights first, then the pool, each checked against free memory with a clear error.
  size_t free_bytes = 0, total = 0;
  CudaCheck(cudaMemGetInfo(&free_bytes, &total), "cudaMemGetInfo");
  const size_t pool_bytes =
      static_cast<size_t>(num_blocks_) * block_size_ * cfg_.kv_dim() * sizeof(uint16_t);
  LoadLayers();
  for (const DeviceLayer& L : layers_) {
    for (const DeviceLinear* lin : {&L.qkv, &L.o, &L.gate_up, &L.down}) {
      if (lin->lora_rank > k::kLoraMaxRank) {
        return absl::UnimplementedError(absl::StrCat("--device cuda: LoRA rank ", lin->lora_rank,
                                                     " of a fused projection is over ",
                                                     k::kLoraMaxRank));
      }
    }
  }
  LoadHeadAndRouters();
  if (absl::Status st = PinGemms(); !st.ok()) return st;
  CudaCheck(cudaMemGetInfo(&free_bytes, &total), "cudaMemGetInfo");
  if (2 * pool_bytes + (size_t{256} << 20) > free_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("--device cuda: the KV pool (", num_blocks_, " blocks, ",
                     (2 * pool_bytes) >> 20, " MiB) does not fit in ", free_bytes >> 20,
                     " MiB of free GPU memory; lower --kv-cache-mb or --kv-blocks"));
  }
  k_cache_.Reserve(pool_bytes);
  v_cache_.Reserve(pool_bytes);
  constexpr size_t kInitialArena = size_t{8} << 20;
  arena_host_.Reserve(kInitialArena);
  arena_dev_.Reserve(kInitialArena);
  states_.Reserve(static_cast<size_t>(initial_states_) * hs * sizeof(float));
  state_rows_ = initial_states_;
  ReserveStepBuffers();
  CudaCheck(cudaMemset(k_cache_.as<void>(), 0, pool_bytes), "cudaMemset");
  CudaCheck(cudaMemset(v_cache_.as<void>(), 0, pool_bytes), "cudaMemset");
  // The uploads and memsets ran on the legacy stream, which a non-blocking stream does not
  // wait for: finish them before the first step.
  CudaCheck(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  return absl::OkStatus();
}

void CudaModelRunner::LoadLayers() {
  const LayerPlan& plan = w_->plan;
  layers_.resize(plan.num_layer_slots);
  for (const Segment& seg : plan.segments) {
    for (int j = 0; j < seg.num_layers; ++j) {
      const LayerWeights& lw = w_->layers[seg.first_layer_slot + j];
      DeviceLayer& L = layers_[seg.first_layer_slot + j];
      L.qkv = Upload(PackFusedLinear(lw, {Proj::kQ, Proj::kK, Proj::kV}, seg.loops));
      L.o = Upload(PackFusedLinear(lw, {Proj::kO}, seg.loops));
      L.gate_up = Upload(PackFusedLinear(lw, {Proj::kGate, Proj::kUp}, seg.loops));
      L.down = Upload(PackFusedLinear(lw, {Proj::kDown}, seg.loops));
      for (auto [norm, t] :
           {std::pair{&L.in_norm, &lw.input_norm}, std::pair{&L.post_norm, &lw.post_norm},
            std::pair{&L.attn_out_norm, &lw.attn_out_norm},
            std::pair{&L.mlp_out_norm, &lw.mlp_out_norm}}) {
        if (t->per_loop.empty()) continue;  // sandwich norms of other models
        for (int r = 0; r < (t->untied() ? seg.loops : 1); ++r)
          norm->variants.push_back(UploadVector(t->At(r).ToF32Vector()));
      }
      if (!lw.q_bias.per_loop.empty()) {
        const bool untied = lw.q_bias.untied() || lw.k_bias.untied();
        std::vector<float> stacked;
        for (int r = 0; r < (untied ? seg.loops : 1); ++r) {
          for (const LoopTensor* t : {&lw.q_bias, &lw.k_bias}) {
            const std::vector<float> v = t->At(r).ToF32Vector();
            stacked.insert(stacked.end(), v.begin(), v.end());
          }
        }
        L.qk_bias = UploadVector(stacked);
        L.qk_bias_variants = untied ? seg.loops : 1;
      }
    }
  }
}

void CudaModelRunner::LoadHeadAndRouters() {
  embed_ = UploadVector(ToBf16Bits(w_->embed));
  if (w_->adapter.data != nullptr) adapter_ = UploadVector(ToBf16Bits(w_->adapter));
  final_norm_ = UploadVector(w_->final_norm.ToF32Vector());
  if (cfg_.recursion.exit_rule == LoopExitRule::kOuroGate) {
    exit_gate_w_ = UploadVector(w_->exit_gate_w.ToF32Vector());
    exit_gate_b_ = w_->exit_gate_b.ToF32Vector()[0];
    exit_gate_capacity_ = UploadVector(std::vector<float>{0.0f});
  }
  if (w_->lm_head.data == w_->embed.data && w_->lm_head.dtype == w_->embed.dtype) {
    lm_head_ptr_ = embed_.as<uint16_t>();  // tied: one table serves both
  } else {
    lm_head_ = UploadVector(ToBf16Bits(w_->lm_head));
    lm_head_ptr_ = lm_head_.as<uint16_t>();
  }
  const RouterWeights& r = w_->router;
  if (!r.expert.empty()) {
    ec_linear_ = r.expert[0].w2.empty();
    if (ec_linear_) {
      ec_w_ = UploadVector(StackLinearRouters(r.expert, cfg_.hidden_size));
      if (!r.aux.empty()) aux_w_ = UploadVector(StackLinearRouters(r.aux, cfg_.hidden_size));
      capacity_zero_ = UploadVector(std::vector<float>(r.expert.size(), 0.0f));
    } else {
      for (const LoopRouter& l : r.expert) ec_mlp_.push_back(LoadHostMlp(l.w1, l.w2));
      for (const LoopRouter& l : r.aux) aux_mlp_.push_back(LoadHostMlp(l.w1, l.w2));
    }
  }
  if (!r.token_choice.empty()) {
    tc_linear_ = r.token_choice_w2.empty();
    if (tc_linear_) {
      tc_w_ = UploadVector(r.token_choice.ToF32Vector());
    } else {
      tc_mlp_ = LoadHostMlp(r.token_choice, r.token_choice_w2);
    }
  }
}

absl::Status CudaModelRunner::PinGemms() {
  std::set<std::pair<int, int>> shapes;  // (n, k) of every GEMM the step runs
  for (const DeviceLayer& L : layers_) {
    for (const DeviceLinear* lin : {&L.qkv, &L.o, &L.gate_up, &L.down})
      shapes.emplace(lin->out, lin->in);
  }
  shapes.emplace(cfg_.vocab_size, cfg_.hidden_size);
  if (adapter_.bytes() > 0) shapes.emplace(cfg_.hidden_size, 2 * cfg_.hidden_size);
  for (auto [n, kdim] : shapes) {
    if (gemm_choice_ == CudaGemm::kFixed) {
      fixed_shapes_.emplace(n, kdim);
      continue;
    }
    const cublasStatus_t st = gemm_.Pin(n, kdim, DType::kF32);
    if (st == CUBLAS_STATUS_NOT_SUPPORTED && gemm_choice_ == CudaGemm::kAuto) {
      std::fprintf(stderr,
                   "morserve: --device cuda: cuBLASLt has no algorithm without split-K that runs "
                   "at every batch size for the %d x %d projection; it runs on the fixed-order "
                   "GEMM (--cuda-gemm)\n",
                   n, kdim);
      fixed_shapes_.emplace(n, kdim);
    } else if (st != CUBLAS_STATUS_SUCCESS) {
      return absl::UnimplementedError(absl::StrCat(
          "--device cuda: no cuBLASLt algorithm without split-K runs at every batch size for a ", n,
          " x ", kdim, " projection: ", k::GemmStatusString(st),
          " (--cuda-gemm auto or fixed runs it on the fixed-order kernel)"));
    }
  }
  return absl::OkStatus();
}

void CudaModelRunner::ReserveStepBuffers() {
  const size_t rows = static_cast<size_t>(reserve_rows_), hs = cfg_.hidden_size,
               vocab = cfg_.vocab_size, logit_rows = static_cast<size_t>(reserve_logit_rows_);
  EnsureLayerScratch(rows, /*full=*/true);
  Ensure(scratch_.h, 2 * rows * hs * sizeof(float));     // InjectInput reads s and e together
  Ensure(scratch_.a, rows * 2 * hs * sizeof(uint16_t));  // and joins them
  const size_t router_cols = std::max(3, cfg_.recursion.num_recursions + 1);
  Ensure(scratch_.router_f, rows * router_cols * sizeof(float));
  Ensure(scratch_.router_i, rows * sizeof(int32_t));
  Ensure(scratch_.logits, logit_rows * vocab * sizeof(float));
  Ensure(scratch_.processed, logit_rows * vocab * sizeof(float));
  scratch_.sample_io.Reserve(SampleBytes(logit_rows));
  pinned_out_.Reserve(std::max(logit_rows * vocab, 2 * rows * hs) * sizeof(float));
  int lora_rank = 0;
  for (const DeviceLayer& L : layers_) {
    for (const DeviceLinear* lin : {&L.qkv, &L.o, &L.gate_up, &L.down})
      lora_rank = std::max(lora_rank, lin->lora_rank);
  }
  if (lora_rank > 0) scratch_.lora_t.Reserve(rows * lora_rank * sizeof(float));
  size_t ws = k::PagedAttentionWorkspaceFloats(reserve_rows_, cfg_.num_heads, cfg_.head_dim,
                                               cfg_.max_position_embeddings, /*extra=*/false,
                                               kAttentionChunk);
  if (cfg_.recursion.layer_kind == LayerKind::kRecurrent) {  // range partials, both schedules
    ws = std::max(ws,
                  k::RecurrentAttentionWorkspaceFloats(reserve_rows_, cfg_.num_heads, cfg_.head_dim,
                                                       cfg_.max_position_embeddings));
  }
  if (ws > 0) scratch_.attn_ws.Reserve(ws * sizeof(float));
  size_t fixed_ws = 0;  // the split schedule's partials at decode sizes (larger m: one pass)
  for (auto [n, kdim] : fixed_shapes_) {
    for (int m = 1; m <= std::min(reserve_rows_, kFixedGemmWorkspaceRows); ++m)
      fixed_ws = std::max(fixed_ws, k::FixedGemmWorkspaceBytes(m, n, kdim));
  }
  if (fixed_ws > 0) fixed_ws_.Reserve(fixed_ws);
  if (graph_rows_ > 0) graph_meta_.Reserve(GraphMetaInts() * sizeof(int32_t));
  if (huginn_rows_ > 0) {
    const size_t kept = static_cast<size_t>(huginn_rows_);
    huginn_kept_.Reserve(kept * vocab * sizeof(float));
    huginn_log_z_.Reserve(kept * sizeof(double));
    huginn_kl_.Reserve(kept * sizeof(double));
  }
}

void CudaModelRunner::EnsureLayerScratch(size_t rows, bool full) {
  const size_t hs = cfg_.hidden_size, qd = cfg_.q_dim(), kvd = cfg_.kv_dim(),
               inter = cfg_.intermediate_size;
  Ensure(scratch_.a, rows * std::max(hs, inter) * sizeof(uint16_t));
  Ensure(scratch_.qkv, rows * (qd + 2 * kvd) * sizeof(float));
  Ensure(scratch_.q, rows * qd * sizeof(uint16_t));
  if (!full) return;
  Ensure(scratch_.k_tmp, rows * kvd * sizeof(uint16_t));
  Ensure(scratch_.v_tmp, rows * kvd * sizeof(uint16_t));
  Ensure(scratch_.attn, rows * qd * sizeof(uint16_t));
  Ensure(scratch_.proj, rows * hs * sizeof(float));
  Ensure(scratch_.gu, rows * 2 * inter * sizeof(float));
  Ensure(scratch_.act, rows * inter * sizeof(uint16_t));
}

void CudaModelRunner::UploadRows(const float* h, int n, const StagedRows* staged) {
  const size_t h_bytes =
      h == nullptr ? 0 : static_cast<size_t>(n) * cfg_.hidden_size * sizeof(float);
  const size_t m_bytes = staged == nullptr ? 0 : staged->data.size() * sizeof(int32_t);
  BeginUploads({h_bytes, m_bytes});
  if (h != nullptr) {
    Ensure(scratch_.h, h_bytes);
    Stage(h, h_bytes, scratch_.h.as<void>());
  }
  if (staged != nullptr) meta_ = static_cast<const int32_t*>(Stage(staged->data.data(), m_bytes));
}

namespace {
constexpr size_t kArenaAlign = 256;
size_t ArenaBytes(size_t bytes) { return (bytes + kArenaAlign - 1) / kArenaAlign * kArenaAlign; }
}  // namespace

// Room for one runner call's uploads, made before the first: when the arena is full, a Sync
// (every earlier upload has happened) frees it; it grows when one call needs more.
void CudaModelRunner::BeginUploads(std::initializer_list<size_t> sizes) {
  size_t need = 0;
  for (size_t b : sizes) need += ArenaBytes(b);
  if (arena_used_ + need <= arena_host_.bytes()) return;
  if (arena_used_ > 0) Sync();
  if (need > arena_host_.bytes()) {
    arena_host_.Reserve(std::max(need, 2 * arena_host_.bytes()));
    arena_dev_.Reserve(arena_host_.bytes());
  }
}

void* CudaModelRunner::Stage(const void* src, size_t bytes, void* dst) {
  const size_t need = ArenaBytes(bytes);
  MORSERVE_CHECK(arena_used_ + need <= arena_host_.bytes(), "a Stage without BeginUploads");
  char* host = arena_host_.as<char>() + arena_used_;
  if (dst == nullptr) dst = arena_dev_.as<char>() + arena_used_;
  arena_used_ += need;
  std::memcpy(host, src, bytes);
  CopyAsync(dst, host, bytes, cudaMemcpyHostToDevice, "upload");
  return dst;
}

void CudaModelRunner::EnsureStates(const int32_t* slots, int n) {
  int64_t need = 0;
  for (int i = 0; i < n; ++i) need = std::max<int64_t>(need, int64_t{slots[i]} + 1);
  if (need <= state_rows_) return;
  const size_t row_bytes = static_cast<size_t>(cfg_.hidden_size) * sizeof(float);
  const int64_t rows = std::max<int64_t>(need, 2 * state_rows_);
  DeviceBuffer grown;
  grown.Reserve(static_cast<size_t>(rows) * row_bytes);
  if (state_rows_ > 0) {
    CudaCheck(cudaMemcpyAsync(grown.as<void>(), states_.as<void>(), state_rows_ * row_bytes,
                              cudaMemcpyDeviceToDevice, stream_),
              "state pool growth");
    Sync();  // the old pool is freed below
  }
  states_ = std::move(grown);
  state_rows_ = rows;
  ++state_allocations_;
}

const int32_t* CudaModelRunner::UploadSlots(const int32_t* slots, int n) {
  return static_cast<const int32_t*>(Stage(slots, static_cast<size_t>(n) * sizeof(int32_t)));
}

void CudaModelRunner::CopyRows(const float* src, const int32_t* src_rows, float* dst,
                               const int32_t* dst_rows, int n) {
  k::RowCopyParams p;
  p.src = src;
  p.dst = dst;
  p.src_rows = src_rows;
  p.dst_rows = dst_rows;
  p.src_capacity = src_rows == nullptr ? n : state_rows_;
  p.dst_capacity = dst_rows == nullptr ? n : state_rows_;
  p.n = n;
  p.dim = cfg_.hidden_size;
  Launched(k::row_copy_forward(p, stream_), "row_copy");
}

void CudaModelRunner::GatherStates(const int32_t* dev_slots, int n, float* out) {
  CopyRows(states_.as<float>(), dev_slots, out, nullptr, n);
}

void CudaModelRunner::ScatterStates(const float* in, const int32_t* dev_slots, int n) {
  CopyRows(in, nullptr, states_.as<float>(), dev_slots, n);
}

void CudaModelRunner::ReadStates(const int32_t* slots, int n, float* h) {
  FlushEmbeds();
  if (n == 0) return;
  const size_t bytes = static_cast<size_t>(n) * cfg_.hidden_size * sizeof(float);
  EnsureStates(slots, n);
  BeginUploads({n * sizeof(int32_t)});
  const int32_t* dev = UploadSlots(slots, n);
  Ensure(scratch_.h, bytes);
  if (std::any_of(slots, slots + n, [](int32_t id) { return id < 0; }))
    CudaCheck(cudaMemsetAsync(scratch_.h.as<void>(), 0, bytes, stream_), "cudaMemsetAsync");
  GatherStates(dev, n, scratch_.h.as<float>());
  Download(scratch_.h.as<void>(), bytes, h);
}

void CudaModelRunner::WriteStates(const int32_t* slots, int n, const float* h) {
  FlushEmbeds();
  if (n == 0) return;
  const size_t bytes = static_cast<size_t>(n) * cfg_.hidden_size * sizeof(float);
  EnsureStates(slots, n);
  BeginUploads({n * sizeof(int32_t), bytes});
  const int32_t* dev = UploadSlots(slots, n);
  ScatterStates(static_cast<const float*>(Stage(h, bytes)), dev, n);
}

void CudaModelRunner::CopyStates(const int32_t* src, const int32_t* dst, int n) {
  FlushEmbeds();
  if (n == 0) return;
  std::vector<int32_t> both(src, src + n);
  both.insert(both.end(), dst, dst + n);
  EnsureStates(both.data(), 2 * n);
  BeginUploads({both.size() * sizeof(int32_t)});
  const int32_t* dev = UploadSlots(both.data(), 2 * n);
  CopyRows(states_.as<float>(), dev, states_.as<float>(), dev + n, n);
}

// The base rows gathered into scratch proj, the rows into scratch h, scale_add, the sums
// scattered to the rows' states: one upload (ids and scales), no synchronisation.
void CudaModelRunner::GatedAdd(const int32_t* base, const int32_t* slots, const float* scale,
                               int n) {
  FlushEmbeds();
  if (n == 0) return;
  std::vector<int32_t> up(base, base + n);
  up.insert(up.end(), slots, slots + n);
  for (int i = 0; i < n; ++i) {
    int32_t bits;
    std::memcpy(&bits, &scale[i], sizeof(bits));
    up.push_back(bits);
  }
  EnsureStates(up.data(), 2 * n);
  const size_t bytes = static_cast<size_t>(n) * cfg_.hidden_size * sizeof(float);
  Ensure(scratch_.h, bytes);
  Ensure(scratch_.proj, bytes);
  BeginUploads({up.size() * sizeof(int32_t)});
  const int32_t* dev = UploadSlots(up.data(), 3 * n);
  GatherStates(dev, n, scratch_.proj.as<float>());
  GatherStates(dev + n, n, scratch_.h.as<float>());
  k::ScaleAddParams p;
  p.h = scratch_.proj.as<float>();
  p.b = scratch_.h.as<void>();
  p.scale = reinterpret_cast<const float*>(dev + 2 * n);
  p.rows = n;
  p.dim = cfg_.hidden_size;
  p.b_dtype = DType::kF32;
  Launched(k::scale_add_forward(p, stream_), "scale_add gate");
  ScatterStates(scratch_.proj.as<float>(), dev + n, n);
}

// The rows' states gathered, RMSNorm'd in fp32 with the final norm's weights into scratch
// proj and scattered to dst; with gate_logit, the gate's w · normed by the expert_router
// kernel (a linear router of one loop: fp32 sums in a fixed order, one CTA per row) and one
// download. One upload (the slots), no synchronisation without a gate.
void CudaModelRunner::NormBetweenLoops(const int32_t* src, const int32_t* dst, int n,
                                       double* gate_logit) {
  FlushEmbeds();
  if (n == 0) return;
  const size_t hs = static_cast<size_t>(cfg_.hidden_size);
  StagedRows s = StageLoops(nullptr, n);  // loop 0: the gate's one router
  while (s.data.size() % 4 != 0) s.data.push_back(0);
  const size_t src_at = s.data.size();
  s.data.insert(s.data.end(), src, src + n);
  const size_t dst_at = s.data.size();
  s.data.insert(s.data.end(), dst, dst + n);
  EnsureStates(src, n);
  EnsureStates(dst, n);
  Ensure(scratch_.h, n * hs * sizeof(float));
  Ensure(scratch_.proj, n * hs * sizeof(float));
  UploadRows(nullptr, n, &s);
  GatherStates(Meta(src_at), n, scratch_.h.as<float>());
  k::RmsNormParams p;
  p.x = scratch_.h.as<float>();
  p.weight = final_norm_.as<float>();
  p.out = scratch_.proj.as<void>();
  p.rows = n;
  p.dim = cfg_.hidden_size;
  p.eps = cfg_.rms_norm_eps;
  p.x_dtype = DType::kF32;
  p.weight_dtype = DType::kF32;
  p.out_dtype = DType::kF32;
  Launched(k::rmsnorm_forward(p, stream_), "loop rmsnorm");
  ScatterStates(scratch_.proj.as<float>(), Meta(dst_at), n);
  if (gate_logit == nullptr) return;
  MORSERVE_CHECK(exit_gate_w_.bytes() > 0,
                 "NormBetweenLoops: a gate logit without Ouro's exit gate");
  Ensure(scratch_.router_f, 3 * static_cast<size_t>(n) * sizeof(float));
  LinearRouterScores(scratch_.proj.as<float>(), exit_gate_w_, Meta(s.loops), exit_gate_capacity_,
                     /*num_loops=*/1, /*temperature=*/1.0f, n, scratch_.router_f.as<float>());
  std::vector<float> score(n);
  Download(scratch_.router_f.as<void>(), score.size() * sizeof(float), score.data());
  for (int i = 0; i < n; ++i) gate_logit[i] = exit_gate_b_ + static_cast<double>(score[i]);
}

// The rows' logits (LogitsOnDevice), then the huginn_kl kernel: each row's log-partition and KL
// against its kept row, which then keeps these logits. One upload (slots, kept rows, flags), one
// download of n doubles; the logits never leave the device.
void CudaModelRunner::HuginnExitKl(const int32_t* slots, const int32_t* prev,
                                   const int32_t* has_prev, int n, double* kl) {
  FlushEmbeds();
  if (n == 0) return;
  MORSERVE_CHECK(n <= huginn_rows_, "HuginnExitKl: more rows than previous-logits rows");
  std::vector<int32_t> meta(3 * static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    MORSERVE_CHECK(prev[i] >= 0 && prev[i] < huginn_rows_,
                   "HuginnExitKl: a previous-logits row outside the runner's");
    meta[i] = slots[i];
    meta[n + i] = prev[i];
    meta[2 * n + i] = has_prev[i];
  }
  EnsureStates(slots, n);
  BeginUploads({meta.size() * sizeof(int32_t)});
  const int32_t* dev =
      static_cast<const int32_t*>(Stage(meta.data(), meta.size() * sizeof(int32_t)));
  LogitsOnDevice(dev, n);
  k::HuginnKlParams p;
  p.logits = scratch_.logits.as<float>();
  p.prev_logits = huginn_kept_.as<float>();
  p.prev_log_z = huginn_log_z_.as<double>();
  p.capacity = huginn_rows_;
  p.prev_rows = dev + n;
  p.has_prev = dev + 2 * n;
  p.kl = huginn_kl_.as<double>();
  p.n = n;
  p.vocab = cfg_.vocab_size;
  Launched(k::huginn_kl_forward(p, stream_), "huginn_kl");
  Download(huginn_kl_.as<void>(), static_cast<size_t>(n) * sizeof(double), kl);
}

// score[i] = w[loops[i]] · (h[i] / temperature) by the expert_router kernel (fp32 sums in a
// fixed order, one CTA per row); its continue flags and gates go to scratch (router_i, and
// router_f from 2n: the caller reserves 3n floats there).
void CudaModelRunner::LinearRouterScores(const float* h, const DeviceBuffer& w,
                                         const int32_t* loops, const DeviceBuffer& capacity,
                                         int num_loops, float temperature, int n, float* score) {
  Ensure(scratch_.router_i, static_cast<size_t>(n) * sizeof(int32_t));
  k::ExpertRouterParams p;
  p.h = h;
  p.router_w = w.as<void>();
  p.w_dtype = DType::kF32;
  p.loops = loops;
  p.capacity = capacity.as<float>();
  p.score_out = score;
  p.active = scratch_.router_i.as<int32_t>();
  p.gate = scratch_.router_f.as<float>() + 2 * n;
  p.rows = n;
  p.hidden = cfg_.hidden_size;
  p.num_loops = num_loops;
  p.temperature = temperature;
  Launched(k::expert_router_forward(p, stream_), "expert_router");
}

int64_t CudaModelRunner::StepAllocations() const {
  const Scratch& x = scratch_;
  int64_t n = state_allocations_;
  for (const DeviceBuffer* b : {&x.h, &x.a, &x.qkv, &x.q, &x.k_tmp, &x.v_tmp, &x.attn, &x.proj,
                                &x.gu, &x.act, &x.lora_t, &x.logits, &x.attn_ws, &x.router_f,
                                &x.router_i, &x.sample_io, &arena_dev_, &graph_meta_, &fixed_ws_}) {
    n += b->allocations();
  }
  for (const DeviceBuffer* b : {&huginn_kept_, &huginn_log_z_, &huginn_kl_}) n += b->allocations();
  for (const PinnedBuffer* b : {&pinned_out_, &arena_host_}) n += b->allocations();
  return n;
}

void CudaModelRunner::Download(const void* src, size_t bytes, void* dst) {
  CopyAsync(pinned_out_.Reserve(bytes), src, bytes, cudaMemcpyDeviceToHost, "download");
  Sync();
  std::memcpy(dst, pinned_out_.as<void>(), bytes);
}

void CudaModelRunner::Gemm(const uint16_t* x, const uint16_t* w, void* y, DType y_dtype, int m,
                           int n, int kdim) {
  ++counters_.device.launches;
  counters_.weight_bytes += static_cast<int64_t>(n) * kdim * 2;  // bf16 [n, kdim], read once
  if (fixed_shapes_.count({n, kdim}) > 0) {
    MORSERVE_CHECK(y_dtype == DType::kF32, "the fixed-order GEMM writes fp32");
    k::FixedGemmParams f;
    f.x = x;
    f.w = w;
    f.y = static_cast<float*>(y);
    f.m = m;
    f.n = n;
    f.k = kdim;
    f.workspace = fixed_ws_.as<float>();
    f.workspace_bytes = fixed_ws_.bytes();
    ++counters_.device.fixed_gemm_calls;
    CudaCheck(k::fixed_gemm_forward(f, stream_), "fixed_gemm");
    return;
  }
  k::GemmParams p;
  p.x = x;
  p.w = w;
  p.y = y;
  p.y_dtype = y_dtype;
  p.m = m;
  p.n = n;
  p.k = kdim;
  const cublasStatus_t st = gemm_.Run(p, stream_);
  MORSERVE_CHECK(st == CUBLAS_STATUS_SUCCESS, k::GemmStatusString(st));
}

void CudaModelRunner::Linear(const DeviceLinear& L, const StagedRows& s, const uint16_t* x,
                             float* y) {
  const int n = s.groups.empty() ? 0 : s.groups.back().begin + s.groups.back().count;
  if (n == 0) return;
  if (L.variants.size() == 1) {
    Gemm(x, L.At(0), y, DType::kF32, n, L.out, L.in);
  } else {
    for (const LoopGroup& g : s.groups) {
      Gemm(x + static_cast<size_t>(g.begin) * L.in, L.At(g.loop),
           y + static_cast<size_t>(g.begin) * L.out, DType::kF32, g.count, L.out, L.in);
    }
  }
  if (L.lora_rank > 0) LoraDelta(L, s, x, y, n);
}

void CudaModelRunner::LoraDelta(const DeviceLinear& L, const StagedRows& s, const uint16_t* x,
                                float* y, int n) {
  float* t = static_cast<float*>(
      scratch_.lora_t.Reserve(static_cast<size_t>(n) * L.lora_rank * sizeof(float)));
  const int segments = static_cast<int>(s.groups.size());
  k::LoraShrinkParams sp;
  sp.x = x;
  sp.a = L.lora_a.as<uint16_t>();
  sp.t = t;
  sp.seg_indptr = Meta(s.seg_indptr);
  sp.seg_loop = Meta(s.seg_loop);
  sp.num_segments = segments;
  sp.rows = n;
  sp.in = L.in;
  sp.rank = L.lora_rank;
  sp.num_loops = L.lora_loops;
  sp.t_dtype = DType::kF32;
  Launched(k::lora_shrink_forward(sp, stream_), "lora_shrink");
  k::LoraExpandParams ep;
  ep.t = t;
  ep.b = L.lora_b.as<uint16_t>();
  ep.y = y;
  ep.seg_indptr = sp.seg_indptr;
  ep.seg_loop = sp.seg_loop;
  ep.num_segments = segments;
  ep.rows = n;
  ep.out = L.out;
  ep.rank = L.lora_rank;
  ep.num_loops = L.lora_loops;
  ep.t_dtype = DType::kF32;
  Launched(k::lora_expand_forward(ep, stream_), "lora_expand");
}

// out = RMSNorm(x, w) per loop group of the staged rows; out_dtype kBF16 (a GEMM's input) or
// kF32 (in place: a sandwich block's sublayer output).
void CudaModelRunner::NormTo(const DeviceNorm& w, const StagedRows& s, const float* x, void* out,
                             DType out_dtype) {
  const size_t out_bytes = out_dtype == DType::kF32 ? sizeof(float) : sizeof(uint16_t);
  auto run = [&](const float* weight, int begin, int count) {
    k::RmsNormParams p;
    p.x = x + static_cast<size_t>(begin) * cfg_.hidden_size;
    p.weight = weight;
    p.out = static_cast<char*>(out) + static_cast<size_t>(begin) * cfg_.hidden_size * out_bytes;
    p.rows = count;
    p.dim = cfg_.hidden_size;
    p.eps = cfg_.rms_norm_eps;
    p.x_dtype = DType::kF32;
    p.weight_dtype = DType::kF32;
    p.out_dtype = out_dtype;
    Launched(k::rmsnorm_forward(p, stream_), "rmsnorm");
  };
  if (w.variants.size() == 1) {
    const int n = s.groups.empty() ? 0 : s.groups.back().begin + s.groups.back().count;
    run(w.At(0), 0, n);
    return;
  }
  for (const LoopGroup& g : s.groups) run(w.At(g.loop), g.begin, g.count);
}

void CudaModelRunner::Norm(const DeviceNorm& w, const StagedRows& s, const float* h,
                           uint16_t* out) {
  NormTo(w, s, h, out, DType::kBF16);
}

// h += out, h += RMSNorm(out, norm) in a sandwich block (docs/models.md#ouro), or
// h = RMSNorm(h + out, norm) in Huginn's (docs/models.md#huginn-0125).
void CudaModelRunner::AddSublayer(const DeviceNorm& norm, const StagedRows& s, float* h, float* out,
                                  int n) {
  if (cfg_.sandwich_norm) NormTo(norm, s, out, out, DType::kF32);
  AddResidual(h, out, n, cfg_.hidden_size);
  if (cfg_.huginn.residual_norm) NormTo(norm, s, h, h, DType::kF32);
}

void CudaModelRunner::AddResidual(float* h, const float* b, int n, int dim) {
  k::ScaleAddParams p;
  p.h = h;
  p.b = b;
  p.rows = n;
  p.dim = dim;
  p.b_dtype = DType::kF32;
  Launched(k::scale_add_forward(p, stream_), "scale_add");
}

void CudaModelRunner::QkvEpilogue(const DeviceLayer& L, const StagedRows& s, int n,
                                  bool write_cache, bool emit_kv, int begin) {
  k::QkvRopeParams p;
  p.qkv = scratch_.qkv.as<void>();
  p.qkv_dtype = DType::kF32;
  p.positions = Meta(s.positions) + begin;
  p.write_slot = write_cache ? Meta(s.write_slot) + begin : nullptr;
  p.q_out = scratch_.q.as<uint16_t>() + static_cast<size_t>(begin) * cfg_.q_dim();
  p.k_cache = k_cache_.as<uint16_t>();
  p.v_cache = v_cache_.as<uint16_t>();
  p.num_slots = static_cast<int64_t>(num_blocks_) * block_size_;
  p.k_out = emit_kv ? scratch_.k_tmp.as<uint16_t>() : nullptr;
  p.v_out = emit_kv ? scratch_.v_tmp.as<uint16_t>() : nullptr;
  p.rows = n;
  p.n_heads = cfg_.num_heads;
  p.n_kv_heads = cfg_.num_kv_heads;
  p.head_dim = cfg_.head_dim;
  p.theta = cfg_.rope_theta;
  p.rope_pairs = cfg_.huginn.rope_pairs;
  if (L.qk_bias_variants > 0) {
    p.qk_bias = L.qk_bias.as<float>();
    p.bias_variants = L.qk_bias_variants;
    p.bias_index = L.qk_bias_variants > 1 ? Meta(s.loops) + begin : nullptr;
  }
  Launched(k::qkv_rope_forward(p, stream_), "qkv_rope");
}

void CudaModelRunner::Mlp(const DeviceLayer& L, const StagedRows& ws, float* h, int m) {
  uint16_t* a = scratch_.a.as<uint16_t>();
  float* proj = scratch_.proj.as<float>();
  Norm(L.post_norm, ws, h, a);
  Linear(L.gate_up, ws, a, scratch_.gu.as<float>());
  k::SwigluParams sw;
  sw.gate_up = scratch_.gu.as<void>();
  sw.out = scratch_.act.as<void>();
  sw.rows = m;
  sw.inter = cfg_.intermediate_size;
  sw.in_dtype = DType::kF32;
  sw.out_dtype = DType::kBF16;
  Launched(k::swiglu_forward(sw, stream_), "swiglu");
  Linear(L.down, ws, scratch_.act.as<uint16_t>(), proj);
  AddSublayer(L.mlp_out_norm, ws, h, proj, m);
}

void CudaModelRunner::KvFromHidden(const DeviceLayer& L, const StagedRows& s, const StagedRows& ws,
                                   float* h, int begin, int m) {
  Norm(L.in_norm, ws, h, scratch_.a.as<uint16_t>());
  Linear(L.qkv, ws, scratch_.a.as<uint16_t>(), scratch_.qkv.as<float>());
  QkvEpilogue(L, s, m, /*write_cache=*/true, /*emit_kv=*/false, begin);
}

// Embeddings wait until the next call that needs states (FlushEmbeds); RunSegment takes their
// ids and slots into its own upload (Huginn's sqrt(H) scale too, in the embedding kernel).
void CudaModelRunner::Embed(const int* tokens, int n, const int32_t* slots) {
  if (n == 0) return;
  EnsureStates(slots, n);
  pending_ids_.insert(pending_ids_.end(), tokens, tokens + n);
  pending_slots_.insert(pending_slots_.end(), slots, slots + n);
}

void CudaModelRunner::FlushEmbeds() {
  const int n = static_cast<int>(pending_ids_.size());
  if (n == 0) return;
  std::vector<int32_t> ids_slots = std::move(pending_ids_);
  ids_slots.insert(ids_slots.end(), pending_slots_.begin(), pending_slots_.end());
  pending_ids_.clear();
  pending_slots_.clear();
  BeginUploads({ids_slots.size() * sizeof(int32_t)});
  const int32_t* dev = UploadSlots(ids_slots.data(), 2 * n);
  EmbedStaged(dev, dev + n, n);
}

void CudaModelRunner::EmbedStaged(const int32_t* dev_ids, const int32_t* dev_slots, int n) {
  Ensure(scratch_.h, static_cast<size_t>(n) * cfg_.hidden_size * sizeof(float));
  k::EmbeddingParams p;
  p.table = embed_.as<uint16_t>();
  p.ids = dev_ids;
  p.out = scratch_.h.as<void>();
  p.rows = n;
  p.dim = cfg_.hidden_size;
  p.vocab = cfg_.vocab_size;
  p.out_dtype = DType::kF32;
  p.scale = cfg_.huginn.embed_scale;  // Huginn's sqrt(H), rounded as ScaleEmbedding does
  Launched(k::embedding_forward(p, stream_), "embedding");
  ScatterStates(scratch_.h.as<float>(), dev_slots, n);
}

// s = adapter . concat(s, e): the two states of each row joined and rounded to bf16 on the
// device (state_join: the GEMM's input dtype, as RMSNorm's output is for the other linears),
// one GEMM, s's states written. One upload (both slot arrays), no synchronisation.
void CudaModelRunner::InjectInput(const int32_t* s, const int32_t* e, int n) {
  FlushEmbeds();
  MORSERVE_CHECK(adapter_.bytes() > 0, "InjectInput: the model has no Huginn adapter");
  if (n == 0) return;
  const size_t hs = static_cast<size_t>(cfg_.hidden_size);
  std::vector<int32_t> both(s, s + n);
  both.insert(both.end(), e, e + n);
  EnsureStates(both.data(), 2 * n);
  Ensure(scratch_.a, static_cast<size_t>(n) * 2 * hs * sizeof(uint16_t));
  Ensure(scratch_.proj, static_cast<size_t>(n) * hs * sizeof(float));
  BeginUploads({both.size() * sizeof(int32_t)});
  const int32_t* dev = UploadSlots(both.data(), 2 * n);
  k::StateJoinParams p;
  p.states = states_.as<float>();
  p.capacity = state_rows_;
  p.s_rows = dev;
  p.e_rows = dev + n;
  p.out = scratch_.a.as<uint16_t>();
  p.n = n;
  p.dim = cfg_.hidden_size;
  Launched(k::state_join_forward(p, stream_), "state_join");
  Gemm(scratch_.a.as<uint16_t>(), adapter_.as<uint16_t>(), scratch_.proj.as<void>(), DType::kF32, n,
       static_cast<int>(hs), static_cast<int>(2 * hs));
  ScatterStates(scratch_.proj.as<float>(), dev, n);
}

// Every layer of the segment with the rows' states on the device: one upload of every layer's
// staged rows and the slots, the states gathered into scratch h, K/V-only rows' entries
// (RMSNorm_in, QKV projection, RoPE from their frozen h) then the full rows at each layer, the
// full rows' states scattered back. No synchronisation. Recurrent layers reorder their rows
// per layer (waves of positions): they go layer by layer (RunRecurrentTiled: one upload each,
// the states on the device; with --recurrent-prefill naive, h through the host).
void CudaModelRunner::RunSegment(const SegmentBatch& b) {
  if (b.n == 0) return;
  const int num_layers = static_cast<int>(b.layers.size());
  const size_t hs = static_cast<size_t>(cfg_.hidden_size);
  if (num_layers > 0 && b.layers[0].full.recurrent) {
    FlushEmbeds();
    MORSERVE_CHECK(b.num_kv_only == 0, "K/V-only rows on a recurrent layer");
    EnsureStates(b.slots, b.n);
    if (recurrent_prefill_ == RecurrentPrefill::kTiled) {
      for (int k = 0; k < num_layers; ++k) RunRecurrentTiled(FullLayer(b, k, nullptr), b.slots);
      return;
    }
    std::vector<float> h(b.n * hs);
    ReadStates(b.slots, b.n, h.data());
    for (int k = 0; k < num_layers; ++k) RunRecurrentNaive(FullLayer(b, k, h.data()));
    WriteStates(b.slots, b.n, h.data());
    return;
  }
  if (graph_rows_ > 0 && b.num_kv_only == 0 && RunSegmentGraphed(b)) return;
  const Segment& seg = w_->plan.segments[b.segment];
  const int nk = b.num_kv_only, nf = b.n - nk;
  StagedRows all;
  std::vector<StagedRows> kv_only(num_layers), full(num_layers);
  for (int k = 0; k < num_layers; ++k) {
    for (auto [rows, part, out] : {std::tuple{nk, KvOnlyLayer(b, k, nullptr), &kv_only[k]},
                                   std::tuple{nf, FullLayer(b, k, nullptr), &full[k]}}) {
      if (rows == 0) continue;
      auto staged = StageLayerBatch(part, seg.loops, block_size_);
      MORSERVE_CHECK(staged.ok(), std::string(staged.status().message()).c_str());
      *out = AppendStaged(*std::move(staged), &all);
    }
  }
  while (all.data.size() % 4 != 0) all.data.push_back(0);
  const size_t slots_at = all.data.size();
  all.data.insert(all.data.end(), b.slots, b.slots + b.n);
  const int embeds = static_cast<int>(pending_ids_.size());  // they ride in this upload
  const size_t embeds_at = all.data.size();
  all.data.insert(all.data.end(), pending_ids_.begin(), pending_ids_.end());
  all.data.insert(all.data.end(), pending_slots_.begin(), pending_slots_.end());
  pending_ids_.clear();
  pending_slots_.clear();
  EnsureStates(b.slots, b.n);
  EnsureLayerScratch(static_cast<size_t>(b.n), /*full=*/nf > 0);
  UploadRows(nullptr, b.n, &all);
  if (embeds > 0) EmbedStaged(Meta(embeds_at), Meta(embeds_at) + embeds, embeds);
  Ensure(scratch_.h, b.n * hs * sizeof(float));
  counters_.kv_only_rows += int64_t{nk} * num_layers;
  counters_.full_rows += int64_t{nf} * num_layers;
  SegmentPass(seg, kv_only, full, slots_at, nk, nf);
}

void CudaModelRunner::SegmentPass(const Segment& seg, const std::vector<StagedRows>& kv_only,
                                  const std::vector<StagedRows>& full, size_t slots_at, int nk,
                                  int nf) {
  const size_t hs = static_cast<size_t>(cfg_.hidden_size);
  float* h = scratch_.h.as<float>();
  GatherStates(Meta(slots_at), nk + nf, h);
  float* h_full = h + static_cast<size_t>(nk) * hs;
  for (size_t k = 0; k < full.size(); ++k) {
    const DeviceLayer& L = layers_[seg.first_layer_slot + k];
    if (nk > 0) KvFromHidden(L, kv_only[k], kv_only[k], h, /*begin=*/0, nk);
    if (nf > 0) FullRowsOnDevice(L, full[k], h_full, nf, /*recurrent=*/false);
  }
  if (nf > 0) ScatterStates(h_full, Meta(slots_at) + nk, nf);
}

// The batch padded to its row bucket, every layer's metadata at the fixed layout of the
// key's bounds in graph_meta_ (one upload; the waiting embeddings ride after it and run
// before the replay), then one graph launch. The padding rows' slots are -1: row_copy
// neither reads nor writes them.
bool CudaModelRunner::RunSegmentGraphed(const SegmentBatch& b) {
  const int rows = GraphRows(b.n, graph_rows_);
  if (rows == 0) return false;
  const Segment& seg = w_->plan.segments[b.segment];
  const int num_layers = static_cast<int>(b.layers.size());
  size_t blocks = 1;
  int max_kv_len = 0;
  for (const SegmentLayerKv& layer : b.layers) {
    blocks = std::max(blocks, layer.full.table_blocks.size());
    for (int32_t len : layer.full.kv_len) max_kv_len = std::max(max_kv_len, static_cast<int>(len));
  }
  StepGraphKey key;
  key.segment = b.segment;
  key.rows = rows;
  key.table_blocks = Pow2Bucket(static_cast<int64_t>(blocks), 1, 0);
  key.max_kv_len = static_cast<int>(
      Pow2Bucket(max_kv_len, kAttentionChunk, std::max(cfg_.max_position_embeddings, 1)));
  if (max_kv_len > key.max_kv_len) return false;  // beyond the reserved attention workspace
  StagedRows all;
  std::vector<StagedRows> full(num_layers);
  for (int k = 0; k < num_layers; ++k) {
    auto staged = StagePaddedLayerBatch(FullLayer(b, k, nullptr), seg.loops, block_size_, rows,
                                        static_cast<size_t>(key.table_blocks));
    MORSERVE_CHECK(staged.ok(), std::string(staged.status().message()).c_str());
    staged->max_kv_len = key.max_kv_len;
    full[k] = AppendStaged(*std::move(staged), &all);
  }
  while (all.data.size() % 4 != 0) all.data.push_back(0);
  const size_t slots_at = all.data.size();
  all.data.insert(all.data.end(), b.slots, b.slots + b.n);
  all.data.resize(slots_at + rows, -1);
  const size_t embeds_at = all.data.size();
  const int embeds = static_cast<int>(pending_ids_.size());
  if ((embeds_at + 2 * pending_ids_.size()) * sizeof(int32_t) > graph_meta_.bytes()) return false;
  if (SegmentHasLoopWeights(seg)) {  // each group's GEMMs are their own launches
    for (const LoopGroup& g : full[0].groups)
      key.groups.insert(key.groups.end(), {g.count, g.loop});
  } else {
    key.groups.push_back(static_cast<int32_t>(full[0].groups.size()));
  }
  all.data.insert(all.data.end(), pending_ids_.begin(), pending_ids_.end());
  all.data.insert(all.data.end(), pending_slots_.begin(), pending_slots_.end());
  pending_ids_.clear();
  pending_slots_.clear();
  EnsureStates(b.slots, b.n);
  EnsureLayerScratch(static_cast<size_t>(rows), /*full=*/true);
  Ensure(scratch_.h, static_cast<size_t>(rows) * cfg_.hidden_size * sizeof(float));
  const size_t ws = k::PagedAttentionWorkspaceFloats(rows, cfg_.num_heads, cfg_.head_dim,
                                                     key.max_kv_len, false, kAttentionChunk);
  if (ws > 0) scratch_.attn_ws.Reserve(ws * sizeof(float));
  const size_t bytes = all.data.size() * sizeof(int32_t);
  BeginUploads({bytes});
  if (StepAllocations() != graph_generation_) {  // a buffer a graph uses may have moved
    graphs_.Invalidate();
    graph_generation_ = StepAllocations();
  }
  meta_ = static_cast<const int32_t*>(Stage(all.data.data(), bytes, graph_meta_.as<void>()));
  if (embeds > 0) EmbedStaged(Meta(embeds_at), Meta(embeds_at) + embeds, embeds);
  const StepGraph* g = graphs_.Find(key);
  if (g == nullptr) {
    g = graphs_.Insert(key, Capture([&] { SegmentPass(seg, {}, full, slots_at, 0, rows); }));
  }
  CudaCheck(cudaGraphLaunch(g->exec, stream_), "cudaGraphLaunch");
  ++counters_.device.graph_launches;
  counters_.weight_bytes += g->weight_bytes;
  counters_.device.fixed_gemm_calls += g->fixed_gemm_calls;
  counters_.full_rows += int64_t{b.n} * num_layers;
  return true;
}

bool CudaModelRunner::SegmentHasLoopWeights(const Segment& seg) const {
  for (int k = 0; k < seg.num_layers; ++k) {
    const DeviceLayer& L = layers_[seg.first_layer_slot + k];
    for (const DeviceLinear* lin : {&L.qkv, &L.o, &L.gate_up, &L.down}) {
      if (lin->variants.size() > 1) return true;
    }
    for (const DeviceNorm* n : {&L.in_norm, &L.post_norm, &L.attn_out_norm, &L.mlp_out_norm}) {
      if (n->variants.size() > 1) return true;
    }
  }
  return false;
}

// Rows of the largest bucket at the model's longest context (tables padded to a power of
// two) for the largest segment, and the waiting embeddings of a call of reserve_rows_; at
// most 16 Mi values (larger passes run eagerly).
size_t CudaModelRunner::GraphMetaInts() const {
  if (graph_rows_ == 0) return 0;
  int layers = 0;
  for (const Segment& seg : w_->plan.segments) layers = std::max(layers, seg.num_layers);
  const int64_t rows = graph_rows_;
  const int64_t row_blocks = cfg_.max_position_embeddings / block_size_ + 2;
  const int64_t per_layer = 8 * (rows + 4) + Pow2Bucket(rows * row_blocks, 1, 0);
  const int64_t ints = layers * per_layer + rows + 4 + 2 * int64_t{reserve_rows_};
  return static_cast<size_t>(std::min<int64_t>(ints, int64_t{16} << 20));
}

StepGraph CudaModelRunner::Capture(const std::function<void()>& body) {
  const int64_t launches = counters_.device.launches, weight_bytes = counters_.weight_bytes,
                fixed = counters_.device.fixed_gemm_calls;
  CudaCheck(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal),
            "cudaStreamBeginCapture");
  body();
  cudaGraph_t graph = nullptr;
  CudaCheck(cudaStreamEndCapture(stream_, &graph), "cudaStreamEndCapture");
  StepGraph g;
  CudaCheck(cudaGraphInstantiate(&g.exec, graph, 0), "cudaGraphInstantiate");
  cudaGraphDestroy(graph);
  g.kernel_launches = counters_.device.launches - launches;
  g.weight_bytes = counters_.weight_bytes - weight_bytes;
  g.fixed_gemm_calls = counters_.device.fixed_gemm_calls - fixed;
  counters_.device.launches = launches;  // they run at the replays
  counters_.weight_bytes = weight_bytes;
  counters_.device.fixed_gemm_calls = fixed;
  ++counters_.device.graph_captures;
  return g;
}

// A recurrent layer with --recurrent-prefill naive: one position per wave, each wave a
// sub-batch through RunFullRows (every wave's attention re-reads all earlier entries).
void CudaModelRunner::RunRecurrentNaive(const LayerBatch& b) {
  const LayerKvPlan& kv = *b.kv;
  if (kv.chunk_indptr.empty()) return RunFullRows(b);
  MORSERVE_CHECK(static_cast<int>(kv.chunk_indptr.size()) >= 1 && kv.chunk_indptr.front() == 0 &&
                     kv.chunk_indptr.back() == b.n,
                 "chunk_indptr does not span the batch");
  const std::vector<std::vector<int>> waves = RecurrentWaves(kv.chunk_indptr, b.n);
  if (waves.size() <= 1) return RunFullRows(b);
  SubBatch sub;
  for (const std::vector<int>& rows : waves) RunFullSubBatch(b, rows, &sub);
}

// Recurrent layer, tiled: see the declaration and engine/runtime/recurrent_schedule.h.
void CudaModelRunner::RunRecurrentTiled(const LayerBatch& b, const int32_t* slots) {
  const int n = b.n;
  if (n == 0) return;
  const int hs = cfg_.hidden_size;
  const Segment& seg = w_->plan.segments[b.segment];
  RecurrentStaging st;  // rows in wave-major order, items and waves' loop runs: one upload
  std::string error;
  MORSERVE_CHECK(StageRecurrentLayer(b, seg.loops, block_size_, hs, &st, &error), error.c_str());
  const RecurrentSchedule& sched = st.sched;
  const StagedRows& s = st.rows;
  while (st.rows.data.size() % 4 != 0) st.rows.data.push_back(0);
  const size_t slots_at = st.rows.data.size();  // the states in wave-major order
  for (int r : sched.order) st.rows.data.push_back(slots[r]);
  counters_.full_rows += n;
  const DeviceLayer& L = layers_[seg.first_layer_slot + b.k];
  const size_t rows = static_cast<size_t>(n);
  EnsureLayerScratch(rows, /*full=*/true);
  UploadRows(nullptr, n, &s);
  Ensure(scratch_.h, rows * hs * sizeof(float));
  GatherStates(Meta(slots_at), n, scratch_.h.as<float>());
  // Every row's range partials, from its first merge to its finish.
  const size_t ws =
      k::RecurrentAttentionWorkspaceFloats(n, cfg_.num_heads, cfg_.head_dim, s.max_kv_len);
  float* partials = static_cast<float*>(scratch_.attn_ws.Reserve(ws * sizeof(float)));

  // q and the temporary pairs of every row come from the layer input: one batch.
  Norm(L.in_norm, s, scratch_.h.as<float>(), scratch_.a.as<uint16_t>());
  Linear(L.qkv, s, scratch_.a.as<uint16_t>(), scratch_.qkv.as<float>());
  QkvEpilogue(L, s, n, /*write_cache=*/false, /*emit_kv=*/true);
  for (int w = 0; w < sched.waves(); ++w) {
    const int mb = sched.merge_begin[w], wb = sched.wave_begin[w];
    const int m = sched.wave_begin[w + 1] - wb;
    RecurrentAttend(/*finish=*/false, s, n, partials, st.merge_at, mb,
                    sched.merge_begin[w + 1] - mb);
    RecurrentAttend(/*finish=*/true, s, n, partials, st.finish_at, wb, m);
    RecurrentRowsTail(L, s, st.waves[w], wb, m);
  }
  ScatterStates(scratch_.h.as<float>(), Meta(slots_at), n);
}

void CudaModelRunner::RecurrentAttend(bool finish, const StagedRows& s, int rows, float* partials,
                                      size_t items_at, int begin, int count) {
  if (count == 0) return;
  k::RecurrentAttentionParams p;
  FillAttention(s, rows, &p);
  p.extra_k = scratch_.k_tmp.as<uint16_t>();
  p.extra_v = scratch_.v_tmp.as<uint16_t>();
  p.workspace = partials;
  p.max_kv_len = s.max_kv_len;
  p.items = reinterpret_cast<const k::RecurrentFoldItem*>(Meta(items_at)) + begin;
  p.num_items = count;
  Launched(
      finish ? k::recurrent_attention_finish(p, stream_) : k::recurrent_attention_merge(p, stream_),
      finish ? "recurrent_attention_finish" : "recurrent_attention_merge");
}

void CudaModelRunner::RecurrentRowsTail(const DeviceLayer& L, const StagedRows& s,
                                        const StagedRows& ws, int begin, int m) {
  if (m == 0) return;
  const int hs = cfg_.hidden_size, qd = cfg_.q_dim();
  float* h = scratch_.h.as<float>() + static_cast<size_t>(begin) * hs;
  float* proj = scratch_.proj.as<float>();
  Linear(L.o, ws, scratch_.attn.as<uint16_t>() + static_cast<size_t>(begin) * qd, proj);
  AddSublayer(L.attn_out_norm, ws, h, proj, m);
  Mlp(L, ws, h, m);
  KvFromHidden(L, s, ws, h, begin, m);  // q at rows [begin, ...) is spent: overwritten
}

void CudaModelRunner::RunFullSubBatch(const LayerBatch& b, const std::vector<int>& rows,
                                      SubBatch* sub) {
  MakeSubBatch(b, rows, cfg_.hidden_size, sub);
  RunFullRows(sub->b);
  ScatterSubBatch(*sub, rows, cfg_.hidden_size, b.h);
}

void CudaModelRunner::ReadKv(int32_t slot, float* k, float* v) const {
  MORSERVE_CHECK(
      slot >= 0 && static_cast<int64_t>(slot) < static_cast<int64_t>(num_blocks_) * block_size_,
      "ReadKv: slot outside the KV pool");
  const size_t d = static_cast<size_t>(cfg_.kv_dim());
  std::vector<uint16_t> kb(d), vb(d);
  CudaCheck(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
  CudaCheck(cudaMemcpy(kb.data(), k_cache_.as<uint16_t>() + slot * d, d * sizeof(uint16_t),
                       cudaMemcpyDeviceToHost),
            "ReadKv");
  CudaCheck(cudaMemcpy(vb.data(), v_cache_.as<uint16_t>() + slot * d, d * sizeof(uint16_t),
                       cudaMemcpyDeviceToHost),
            "ReadKv");
  for (size_t i = 0; i < d; ++i) {
    k[i] = Bf16ToF32(kb[i]);
    v[i] = Bf16ToF32(vb[i]);
  }
}

// Every copy of the call in one kv_copy launch on the step's stream (ordered before every
// later layer call), its (src, dst, count) triples uploaded through the step's arena.
void CudaModelRunner::CopyKv(const KvCopy* copies, int n) {
  if (n == 0) return;
  const int64_t slots = static_cast<int64_t>(num_blocks_) * block_size_;
  for (int i = 0; i < n; ++i) {
    const KvCopy& c = copies[i];
    MORSERVE_CHECK(c.src >= 0 && c.dst >= 0 && c.count >= 0 && c.src + c.count <= slots &&
                       c.dst + c.count <= slots,
                   "CopyKv: slots outside the KV pool");
  }
  MORSERVE_CHECK(KvCopiesDisjoint(copies, n), "CopyKv: overlapping copies");
  static_assert(sizeof(KvCopy) == 3 * sizeof(int32_t), "KvCopy is the kernel's triple");
  const size_t bytes = static_cast<size_t>(n) * sizeof(KvCopy);
  BeginUploads({bytes});
  k::KvCopyParams p;
  p.k_cache = k_cache_.as<uint16_t>();
  p.v_cache = v_cache_.as<uint16_t>();
  p.copies = static_cast<const int32_t*>(Stage(copies, bytes));
  p.n = n;
  p.kv_dim = cfg_.kv_dim();
  p.slots = slots;
  Launched(k::kv_copy_forward(p, stream_), "kv_copy");
}

void CudaModelRunner::RunFullRows(const LayerBatch& b) {
  const int n = b.n;
  if (n == 0) return;
  const Segment& seg = w_->plan.segments[b.segment];
  auto staged = StageLayerBatch(b, seg.loops, block_size_);
  MORSERVE_CHECK(staged.ok(), std::string(staged.status().message()).c_str());
  const size_t rows = static_cast<size_t>(n);
  EnsureLayerScratch(rows, /*full=*/true);
  UploadRows(b.h, n, &*staged);
  counters_.full_rows += n;
  FullRowsOnDevice(layers_[seg.first_layer_slot + b.k], *staged, scratch_.h.as<float>(), n,
                   b.kv->recurrent);
  Download(scratch_.h.as<float>(), rows * cfg_.hidden_size * sizeof(float), b.h);
}

void CudaModelRunner::FullRowsOnDevice(const DeviceLayer& L, const StagedRows& s, float* h, int n,
                                       bool recurrent) {
  uint16_t* a = scratch_.a.as<uint16_t>();
  // Attention: h += o(Attn(RoPE(qkv(RMSNorm_in(h))))).
  Norm(L.in_norm, s, h, a);
  Linear(L.qkv, s, a, scratch_.qkv.as<float>());
  QkvEpilogue(L, s, n, /*write_cache=*/!recurrent, /*emit_kv=*/recurrent);
  k::PagedAttentionParams p;
  FillAttention(s, n, &p);
  p.extra_k = recurrent ? scratch_.k_tmp.as<uint16_t>() : nullptr;
  p.extra_v = recurrent ? scratch_.v_tmp.as<uint16_t>() : nullptr;
  p.max_kv_len = s.max_kv_len;
  const int chunk_len = recurrent ? k::kRecurrentRange : kAttentionChunk;
  p.chunk_len = chunk_len;
  // Recurrent layers' rows equal recurrent_attention's folds only under the CTA fold.
  p.fold = recurrent ? k::AttentionFold::kCta : attention_fold_;
  const size_t ws = k::PagedAttentionWorkspaceFloats(n, cfg_.num_heads, cfg_.head_dim, s.max_kv_len,
                                                     recurrent, chunk_len);
  p.workspace =
      ws == 0 ? nullptr : static_cast<float*>(scratch_.attn_ws.Reserve(ws * sizeof(float)));
  Launched(k::paged_attention_forward(p, stream_), "paged_attention");
  Linear(L.o, s, scratch_.attn.as<uint16_t>(), scratch_.proj.as<float>());
  AddSublayer(L.attn_out_norm, s, h, scratch_.proj.as<float>(), n);

  Mlp(L, s, h, n);
  if (recurrent) KvFromHidden(L, s, s, h, /*begin=*/0, n);
}

void CudaModelRunner::ExpertRouter(const int* loops, const int32_t* slots, int n, float* score,
                                   float* decide) {
  FlushEmbeds();
  if (n == 0) return;
  const int hs = cfg_.hidden_size;
  const float temperature = cfg_.recursion.router.temperature;
  if (!ec_linear_) {  // mlp routers: on the host (see the class comment)
    std::vector<float> hv(static_cast<size_t>(n) * hs), x(hs);
    const float* h = hv.data();
    ReadStates(slots, n, hv.data());
    for (int i = 0; i < n; ++i) {
      for (int c = 0; c < hs; ++c) x[c] = h[static_cast<size_t>(i) * hs + c] / temperature;
      ec_mlp_[loops[i]].Forward(x.data(), &score[i]);
      if (aux_mlp_.empty()) {
        decide[i] = score[i];
      } else {
        aux_mlp_[loops[i]].Forward(x.data(), &decide[i]);
      }
    }
    return;
  }
  StagedRows s = StageLoops(loops, n);
  while (s.data.size() % 4 != 0) s.data.push_back(0);
  const size_t slots_at = s.data.size();
  s.data.insert(s.data.end(), slots, slots + n);
  EnsureStates(slots, n);
  Ensure(scratch_.h, static_cast<size_t>(n) * hs * sizeof(float));
  UploadRows(nullptr, n, &s);
  GatherStates(Meta(slots_at), n, scratch_.h.as<float>());
  const int num_loops = static_cast<int>(w_->router.expert.size());
  Ensure(scratch_.router_f, static_cast<size_t>(n) * 3 * sizeof(float));
  float* out = scratch_.router_f.as<float>();  // [score | decide | gate]
  const float* h = scratch_.h.as<float>();
  LinearRouterScores(h, ec_w_, Meta(s.loops), capacity_zero_, num_loops, temperature, n, out);
  if (aux_w_.bytes() > 0) {
    LinearRouterScores(h, aux_w_, Meta(s.loops), capacity_zero_, num_loops, temperature, n,
                       out + n);
  }
  std::vector<float> host(2 * static_cast<size_t>(n));
  Download(out, host.size() * sizeof(float), host.data());
  std::copy(host.begin(), host.begin() + n, score);
  std::copy(host.begin() + (aux_w_.bytes() > 0 ? n : 0),
            host.begin() + (aux_w_.bytes() > 0 ? 2 * n : n), decide);
}

void CudaModelRunner::TokenChoiceRouter(const int32_t* slots, int n, float* scores) {
  FlushEmbeds();
  if (n == 0) return;
  const int hs = cfg_.hidden_size, nr = cfg_.recursion.num_recursions;
  if (!tc_linear_) {
    std::vector<float> h(static_cast<size_t>(n) * hs);
    ReadStates(slots, n, h.data());
    for (int i = 0; i < n; ++i)
      tc_mlp_.Forward(&h[static_cast<size_t>(i) * hs], scores + static_cast<size_t>(i) * nr);
    return;
  }
  EnsureStates(slots, n);
  BeginUploads({n * sizeof(int32_t)});
  Ensure(scratch_.h, static_cast<size_t>(n) * hs * sizeof(float));
  GatherStates(UploadSlots(slots, n), n, scratch_.h.as<float>());
  Ensure(scratch_.router_f, static_cast<size_t>(n) * (nr + 1) * sizeof(float));
  Ensure(scratch_.router_i, static_cast<size_t>(n) * sizeof(int32_t));
  k::TokenChoiceRouterParams p;
  p.h = scratch_.h.as<float>();
  p.router_w = tc_w_.as<void>();
  p.w_dtype = DType::kF32;
  p.scores_out = scratch_.router_f.as<float>();
  p.gate = scratch_.router_f.as<float>() + static_cast<size_t>(n) * nr;
  p.depth = scratch_.router_i.as<int32_t>();
  p.rows = n;
  p.hidden = hs;
  p.num_recursions = nr;
  Launched(k::token_choice_router_forward(p, stream_), "token_choice_router");
  Download(p.scores_out, static_cast<size_t>(n) * nr * sizeof(float), scores);
}

void CudaModelRunner::LogitsOnDevice(const int32_t* dev_slots, int n) {
  const int hs = cfg_.hidden_size, vocab = cfg_.vocab_size;
  Ensure(scratch_.h, static_cast<size_t>(n) * hs * sizeof(float));
  GatherStates(dev_slots, n, scratch_.h.as<float>());
  Ensure(scratch_.a, static_cast<size_t>(n) * hs * sizeof(uint16_t));
  Ensure(scratch_.logits, static_cast<size_t>(n) * vocab * sizeof(float));
  k::RmsNormParams p;
  p.x = scratch_.h.as<float>();
  p.weight = final_norm_.as<float>();
  p.out = scratch_.a.as<void>();
  p.rows = n;
  p.dim = hs;
  p.eps = cfg_.rms_norm_eps;
  p.x_dtype = DType::kF32;
  p.weight_dtype = DType::kF32;
  p.out_dtype = DType::kBF16;
  Launched(k::rmsnorm_forward(p, stream_), "final rmsnorm");
  Gemm(scratch_.a.as<uint16_t>(), lm_head_ptr_, scratch_.logits.as<void>(), DType::kF32, n, vocab,
       hs);
}

void CudaModelRunner::KeptLogitsOnDevice(const int32_t* dev_kept, int n) {
  Ensure(scratch_.logits, static_cast<size_t>(n) * cfg_.vocab_size * sizeof(float));
  k::RowCopyParams p;
  p.src = huginn_kept_.as<float>();
  p.dst = scratch_.logits.as<float>();
  p.src_rows = dev_kept;
  p.src_capacity = huginn_rows_;
  p.dst_capacity = n;
  p.n = n;
  p.dim = cfg_.vocab_size;
  Launched(k::row_copy_forward(p, stream_), "row_copy (kept logits)");
  counters_.kept_logit_rows += n;
}

// Previous-logits row ids as the host passed them: each must be one of the runner's.
void CheckKeptRows(const int32_t* kept, int n, int capacity) {
  for (int i = 0; i < n; ++i) {
    MORSERVE_CHECK(kept[i] >= 0 && kept[i] < capacity,
                   "KeptLogits: a previous-logits row outside the runner's");
  }
}

void CudaModelRunner::LogitsOf(const int32_t* ids, bool kept, int n, float* logits) {
  FlushEmbeds();
  if (n == 0) return;
  if (kept) {
    CheckKeptRows(ids, n, huginn_rows_);
  } else {
    EnsureStates(ids, n);
  }
  BeginUploads({n * sizeof(int32_t)});
  const int32_t* dev = UploadSlots(ids, n);
  if (kept) {
    KeptLogitsOnDevice(dev, n);
  } else {
    LogitsOnDevice(dev, n);
  }
  Download(scratch_.logits.as<void>(), static_cast<size_t>(n) * cfg_.vocab_size * sizeof(float),
           logits);
}

void CudaModelRunner::Logits(const int32_t* slots, int n, float* logits) {
  LogitsOf(slots, /*kept=*/false, n, logits);
}

void CudaModelRunner::KeptLogits(const int32_t* kept, int n, float* logits) {
  LogitsOf(kept, /*kept=*/true, n, logits);
}

namespace {

// Sample's per-row device arrays in one buffer (one upload, one download): inputs first, then
// the outputs, each array 8-byte aligned.
struct SampleLayout {
  size_t temperature, top_k, top_p, min_p, seed, step, threshold, slots, processed_row;  // inputs
  size_t token, chosen, max_logit, argmax, max_prob, exit;                               // outputs
  size_t inputs_end, end;
  explicit SampleLayout(size_t n) {
    size_t at = 0;
    auto take = [&](size_t bytes) {
      const size_t here = at;
      at += (bytes * n + 7) / 8 * 8;
      return here;
    };
    seed = take(8);
    step = take(8);
    temperature = take(4);
    top_k = take(4);
    top_p = take(4);
    min_p = take(4);
    threshold = take(4);
    slots = take(4);
    processed_row = take(4);
    inputs_end = at;
    max_prob = take(8);
    token = take(4);
    chosen = take(4);
    max_logit = take(4);
    argmax = take(4);
    exit = take(4);
    end = at;
  }
};

template <typename T>
T* Field(void* base, size_t offset) {
  return reinterpret_cast<T*>(static_cast<char*>(base) + offset);
}

}  // namespace

size_t SampleBytes(size_t rows) { return SampleLayout(rows).end; }

// The rows' logits stay on the device: rows whose request changes its logits before
// temperature (Sampler::ChangesLogits) get a processed copy (logit_process: their per-id
// operations, staged by StageLogitOps, ride in a second upload); the sampling kernel draws
// each row's token from its raw or processed row (and reports the raw logit), argmax and
// exit_confidence give the raw row's max and 1 / sum exp(x - max), so logprob = x_token -
// log_z with log_z = max - log(max_prob); one upload of the parameters, one download of the
// results.
void CudaModelRunner::Sample(const int32_t* slots, absl::Span<const SampleInput> rows,
                             SampleResult* out) {
  SampleRows(slots, /*kept=*/false, rows, out);
}

// Sample on the logits a Huginn exit check kept (KeptLogitsOnDevice instead of the LM head).
void CudaModelRunner::SampleKept(const int32_t* kept, absl::Span<const SampleInput> rows,
                                 SampleResult* out) {
  SampleRows(kept, /*kept=*/true, rows, out);
}

void CudaModelRunner::SampleRows(const int32_t* ids, bool kept, absl::Span<const SampleInput> rows,
                                 SampleResult* out) {
  FlushEmbeds();
  const int n = static_cast<int>(rows.size());
  if (n == 0) return;
  const SampleLayout L(rows.size());
  std::vector<uint64_t> inputs((L.inputs_end + 7) / 8);
  void* host = inputs.data();
  std::vector<k::LogitOp> ops;
  std::vector<k::LogitRowProcess> processed;
  for (int i = 0; i < n; ++i) {
    const SamplingParams& p = *rows[i].params;
    Field<uint64_t>(host, L.seed)[i] = rows[i].seed;
    Field<uint64_t>(host, L.step)[i] = rows[i].output_ids.size();
    Field<float>(host, L.temperature)[i] = p.temperature;
    Field<int32_t>(host, L.top_k)[i] = p.top_k;
    Field<float>(host, L.top_p)[i] = p.top_p;
    Field<float>(host, L.min_p)[i] = p.min_p;
    Field<float>(host, L.threshold)[i] = 0.0f;
    Field<int32_t>(host, L.slots)[i] = ids[i];
    Field<int32_t>(host, L.processed_row)[i] = -1;
    if (Sampler::ChangesLogits(rows[i])) {
      Field<int32_t>(host, L.processed_row)[i] = static_cast<int32_t>(processed.size());
      processed.emplace_back();
      StageLogitOps(rows[i], cfg_.vocab_size, i, &ops, &processed.back());
    }
  }
  // One blob: the operations, then the rows (16-byte aligned LogitOps first).
  const size_t ops_bytes = ops.size() * sizeof(k::LogitOp),
               blob_bytes = ops_bytes + processed.size() * sizeof(k::LogitRowProcess);
  std::vector<char> blob(blob_bytes);
  if (!ops.empty()) std::memcpy(blob.data(), ops.data(), ops_bytes);
  if (!processed.empty()) {
    std::memcpy(blob.data() + ops_bytes, processed.data(), blob_bytes - ops_bytes);
  }
  if (kept) {
    CheckKeptRows(ids, n, huginn_rows_);
  } else {
    EnsureStates(ids, n);
  }
  void* dev = scratch_.sample_io.Reserve(L.end);
  BeginUploads({L.inputs_end, blob_bytes});
  Stage(host, L.inputs_end, dev);
  char* blob_dev = processed.empty() ? nullptr : static_cast<char*>(Stage(blob.data(), blob_bytes));
  if (kept) {
    KeptLogitsOnDevice(Field<int32_t>(dev, L.slots), n);
  } else {
    LogitsOnDevice(Field<int32_t>(dev, L.slots), n);
  }
  const float* logits = scratch_.logits.as<float>();
  if (!processed.empty()) {
    k::LogitProcessParams lp;
    lp.logits = logits;
    lp.vocab = cfg_.vocab_size;
    lp.out = scratch_.processed.as<float>();
    lp.rows = reinterpret_cast<const k::LogitRowProcess*>(blob_dev + ops_bytes);
    lp.n_rows = static_cast<int>(processed.size());
    lp.ops = ops.empty() ? nullptr : reinterpret_cast<const k::LogitOp*>(blob_dev);
    Launched(k::logit_process_forward(lp, stream_), "logit_process");
  }
  k::DeviceSamplingParams sp;
  sp.logits = logits;
  sp.rows = n;
  sp.vocab = cfg_.vocab_size;
  sp.temperature = Field<float>(dev, L.temperature);
  sp.top_k = Field<int32_t>(dev, L.top_k);
  sp.top_p = Field<float>(dev, L.top_p);
  sp.min_p = Field<float>(dev, L.min_p);
  sp.seed = Field<uint64_t>(dev, L.seed);
  sp.step = Field<uint64_t>(dev, L.step);
  sp.token = Field<int32_t>(dev, L.token);
  sp.chosen_logit = Field<float>(dev, L.chosen);
  if (!processed.empty()) {
    sp.processed = scratch_.processed.as<float>();
    sp.processed_row = Field<int32_t>(dev, L.processed_row);
  }
  Launched(k::sampling_forward(sp, stream_), "sampling");
  k::ArgmaxParams ap;
  ap.logits = logits;
  ap.token = Field<int32_t>(dev, L.argmax);
  ap.max_logit = Field<float>(dev, L.max_logit);
  ap.rows = n;
  ap.vocab = cfg_.vocab_size;
  Launched(k::argmax_forward(ap, stream_), "argmax");
  k::ExitConfidenceParams ep;
  ep.logits = logits;
  ep.threshold = Field<float>(dev, L.threshold);
  ep.exit = Field<int32_t>(dev, L.exit);
  ep.max_prob = Field<double>(dev, L.max_prob);
  ep.rows = n;
  ep.vocab = cfg_.vocab_size;
  Launched(k::exit_confidence_forward(ep, stream_), "exit_confidence");
  std::vector<char> results(L.end - L.inputs_end);
  Download(static_cast<char*>(dev) + L.inputs_end, results.size(), results.data());
  auto result = [&](size_t offset) { return results.data() + (offset - L.inputs_end); };
  for (int i = 0; i < n; ++i) {
    const int token = Field<int32_t>(result(L.token), 0)[i];
    MORSERVE_CHECK(token >= 0 && token < cfg_.vocab_size,
                   "device sampling found no finite logit in a row");
    const double log_z = static_cast<double>(Field<float>(result(L.max_logit), 0)[i]) -
                         std::log(Field<double>(result(L.max_prob), 0)[i]);
    out[i] = SampleResult{};
    out[i].token = token;
    const double chosen = Field<float>(result(L.chosen), 0)[i];
    out[i].logprob = static_cast<float>(chosen - log_z);
  }
  counters_.sampled_rows += n;
}

}  // namespace

absl::StatusOr<std::unique_ptr<ModelRunner>> CreateCudaModelRunner(
    std::shared_ptr<const ModelWeights> weights, const EngineConfig& config, int num_kv_blocks) {
  int count = 0;
  if (cudaError_t e = cudaGetDeviceCount(&count); e != cudaSuccess || count == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("--device cuda: no CUDA device (",
                     e == cudaSuccess ? "none found" : cudaGetErrorString(e), ")"));
  }
  cudaDeviceProp prop{};
  CudaCheck(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  if (prop.major != 9) {
    return absl::FailedPreconditionError(
        absl::StrCat("--device cuda: ", prop.name, " is compute capability ", prop.major, ".",
                     prop.minor, "; the kernels are built for Hopper (sm_90a)"));
  }
  // Row states live: the pass's rows, the tokens entering, rows waiting for the tail, and a
  // second state for token-choice and Huginn rows; the pool grows beyond this if it must.
  const int64_t states = 2 * (int64_t{config.max_batch_rows} + config.max_step_tokens) + 64;
  // Rows per call: a pass's rows (the loop's rows, the entered tokens that join them, and with
  // early exit up to as many K/V-only rows) or a step's entering tokens; logits: a pass's rows
  // (early exit, Huginn's check), the requests sampled with host logits, or a prompt-scoring
  // chunk of 64.
  const int rows = 2 * config.max_batch_rows + config.max_step_tokens;
  const int logit_rows = std::max({config.max_batch_rows, config.max_running, 64});
  // Decode-sized passes are captured in CUDA graphs (cuda_step_graphs.h); larger ones (prefill)
  // launch eagerly, as vLLM's do beyond its largest captured batch.
  const int graph_rows = config.cuda_graphs ? std::min(kMaxGraphRows, config.max_batch_rows) : 0;
  // Huginn adaptive: the previous-logits rows (HuginnExitKl, SampleKept).
  const int huginn_rows =
      weights->config.recursion.exit_rule == LoopExitRule::kHuginnKl ? HuginnKeptRows(config) : 0;
  auto runner = std::make_unique<CudaModelRunner>(
      std::move(weights), num_kv_blocks, config.block_size, config.recurrent_prefill, states, rows,
      logit_rows, huginn_rows, graph_rows, config.cuda_gemm, config.cuda_attention_fold);
  if (absl::Status st = runner->Init(); !st.ok()) return st;
  return std::unique_ptr<ModelRunner>(std::move(runner));
}

namespace {
// Linked into a program (an object library: morserve_cuda_runner, or the emulated
// morserve_cuda_runner_emu), this runner serves the engine's --device cuda.
[[maybe_unused]] const bool kRegistered = RegisterCudaRunner(&CreateCudaModelRunner);
}  // namespace

}  // namespace morserve
