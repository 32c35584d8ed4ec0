// The backend interface: the tensor work of one engine step, one op over a batch of rows.
// The CPU backend (engine/cpu/cpu_model_runner.h) and the CUDA backend implement it; the
// ModelExecutor drives it with the same rows, plans and routing decisions for both.
// Rows of one call may be at different loops: `loops[i]` picks row i's weights (untied
// copies, LoRA) and its KV cache slot, so depth is a field on a row, not a code path.
// The runner holds the rows' hidden states (host memory on the CPU, device memory on the GPU),
// one [hidden] fp32 vector per state slot (state_slots.h hands the ids out; a negative id is no
// state: read as zeros, never written): its ops take slot ids, so a state stays where it is
// computed from one call to the next, and the host sees it only through ReadStates. Layers run
// a segment at a time (RunSegment). Rows may also be
// K/V-only (early exit with exit_kv propagate, docs/models.md#early-exit): such a row only
// writes its K/V entry from its h, which is the exit state.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/types/span.h"
#include "engine/runtime/sampler.h"

namespace morserve {

// Where one layer's rows write and read KV (FlashInfer-style flat arrays).
struct LayerKvPlan {
  std::vector<int32_t> write_slot;    // [n] flat entry (block * block_size + offset), -1: none
  std::vector<int32_t> table_indptr;  // [n + 1] into table_blocks
  std::vector<int32_t> table_blocks;  // block ids of each row's (request, cache slot)
  std::vector<int32_t> kv_len;        // [n] entries each row attends to, from index 0
  bool recurrent = false;  // attend to kv_len entries plus the row's own temporary pair, and
                           // write the persistent pair from the layer output afterwards
  // Recurrent layers: rows [chunk_indptr[c], chunk_indptr[c + 1]) are consecutive entries of
  // one request's cache slot in position order (a prefill chunk; a decode row is a chunk of
  // one). kv_len of a chunk's row counts the chunk's earlier rows, whose persistent pairs the
  // runner must produce first. Different chunks are independent. Empty: chunks of one row.
  std::vector<int32_t> chunk_indptr;
};

// A run of `count` consecutive KV entries copied from flat slot `src` to flat slot `dst`
// (block * block_size + offset; a run never crosses a block): a prefix-cache hit copies the
// entries of a partial cached block into a block the new request owns.
struct KvCopy {
  int32_t src = 0;
  int32_t dst = 0;
  int32_t count = 0;
};

// True when no copy's destination range overlaps another copy's source or destination range,
// nor its own source unless the two coincide: the condition under which CopyKv's copies give
// the same cache in any order.
bool KvCopiesDisjoint(const KvCopy* copies, int n);

// One layer over rows of one kind (all full, or all K/V-only): the unit the runners' ops
// take (engine/runtime/layer_batch.h cuts it from a SegmentBatch).
struct LayerBatch {
  int segment = 0;
  int k = 0;  // layer inside the segment
  int n = 0;
  const int* loops = nullptr;      // [n]
  const int* positions = nullptr;  // [n]
  float* h = nullptr;              // [n, hidden], updated in place (where the runner keeps it)
  const LayerKvPlan* kv = nullptr;
};

// Layer k's KV plan of a segment batch: over its K/V-only rows and over its full rows.
struct SegmentLayerKv {
  LayerKvPlan kv_only;  // rows [0, num_kv_only)
  LayerKvPlan full;     // rows [num_kv_only, n)
};

// Every layer of one segment over the same rows, grouped by loop within each kind. Rows
// [0, num_kv_only) are K/V-only: at each layer the runner computes RMSNorm_in, the layer's
// K/V projection (no Q) and RoPE from the row's h and writes the entry at write_slot, before
// any full row of that layer attends; their h is left unchanged. Never on recurrent layers.
// Rows [num_kv_only, n) run the whole layer.
struct SegmentBatch {
  int segment = 0;
  int n = 0;
  int num_kv_only = 0;
  const int* loops = nullptr;               // [n]
  const int* positions = nullptr;           // [n]
  const int32_t* slots = nullptr;           // [n] the rows' states: the full rows' updated in place
  absl::Span<const SegmentLayerKv> layers;  // [the segment's num_layers]
};

// Layer rows the runner computed since it was made, by kind (tests and benchmarks read
// them to see which path rows took).
struct RunnerCounters {
  int64_t full_rows = 0;
  int64_t kv_only_rows = 0;
  // Bytes of projection / LM-head / router weights the runner's linear calls read, each call
  // counting its weight matrix once in its resident dtype (benchmarks divide it by time to get
  // the achieved weight bandwidth).
  int64_t weight_bytes = 0;
  // Rows whose next token the runner sampled (Sample): their logits never left it.
  int64_t sampled_rows = 0;
  // Huginn adaptive: rows sampled or given logits from the logits their last exit check kept
  // (SampleKept, KeptLogits), with no second final norm and LM head.
  int64_t kept_logit_rows = 0;
  // The CUDA runner's step path (zero on the CPU): kernel launcher calls made directly (a
  // cuBLASLt GEMM, or split attention with its combine, counts one; those inside a CUDA graph
  // do not), CUDA graph launches and captures, host<->device copies and their bytes, stream
  // synchronisations, and allocations of its step buffers (they grow on demand), since the runner
  // was made; fixed_gemm_calls: GEMMs run on the fixed-order kernel (kernels/fixed_gemm.cuh),
  // those of graph replays included.
  struct Device {
    int64_t launches = 0, graph_launches = 0, graph_captures = 0, h2d_copies = 0, h2d_bytes = 0,
            d2h_copies = 0, d2h_bytes = 0, syncs = 0, allocations = 0, fixed_gemm_calls = 0;
  } device;
};

class ModelRunner {
 public:
  virtual ~ModelRunner() = default;
  // states[slots[i]] = the embedding of tokens[i].
  virtual void Embed(const int* tokens, int n, const int32_t* slots) = 0;
  virtual void RunSegment(const SegmentBatch& batch) = 0;
  // Expert-choice router of loop loops[i] on h / temperature: the gate score s and the
  // score that decides (the aux router's when the checkpoint has one).
  virtual void ExpertRouter(const int* loops, const int32_t* slots, int n, float* score,
                            float* decide) = 0;
  // Token-choice router on the segment input: [n, num_recursions] raw scores.
  virtual void TokenChoiceRouter(const int32_t* slots, int n, float* scores) = 0;
  // lm_head(RMSNorm_final(h)): [n, vocab].
  virtual void Logits(const int32_t* slots, int n, float* logits) = 0;
  // The next token of rows.size() rows sampled from lm_head(RMSNorm_final(h)) by the sampler's
  // rule (sampler.h), every stage, for rows whose request needs no logits on the host
  // (RunnerSamples in sampling_params.h: no top-n alternatives): out[i]'s token and its raw
  // logprob; rows[i].logits is ignored (the runner's own). The CUDA runner samples on the
  // device (penalties, bias, allowed ids and min_tokens bans applied there too) and downloads
  // only the results.
  virtual void Sample(const int32_t* slots, absl::Span<const SampleInput> rows,
                      SampleResult* out) = 0;
  // Huginn-0125's input injection before each recurrence (docs/models.md#huginn-0125):
  // s = adapter · concat(s, e), the state first, in place. Called only for models with the
  // adapter.
  virtual void InjectInput(const int32_t* s, const int32_t* e, int n) = 0;
  // The states of n slots to and from the host ([n, hidden] fp32), and from slot to slot
  // (src[i] -> dst[i]; no dst is a src): for the math the executor does on the host.
  virtual void ReadStates(const int32_t* slots, int n, float* h) = 0;
  virtual void WriteStates(const int32_t* slots, int n, const float* h) = 0;
  virtual void CopyStates(const int32_t* src, const int32_t* dst, int n) = 0;
  // states[slots[i]] = states[base[i]] + scale[i] * states[slots[i]], each element
  // float(double(base) + double(scale) * double(h)) (ScaleAddRows, kernels/scale_add.cuh: the
  // same bits on both backends): MoR's gated residual after a pass, h_in + g * Block(h_in), and
  // token choice's output, x0 + p * h.
  virtual void GatedAdd(const int32_t* base, const int32_t* slots, const float* scale, int n) = 0;
  // The norm between loops (docs/models.md#ouro, #nanbeige42), and Huginn's ln_f before the
  // coda (docs/models.md#huginn-0125), for models that norm there:
  // states[dst[i]] = RMSNorm(states[src[i]]) with the final norm's weights (no dst is a src);
  // with gate_logit set, also Ouro's exit gate logit b + w · normed of each row in fp64 (the
  // CPU in index order from b, as the reference; the CUDA runner sums w · normed in fp32 in a
  // fixed order). Only a call with gate_logit returns data (the CUDA runner's one download).
  virtual void NormBetweenLoops(const int32_t* src, const int32_t* dst, int n,
                                double* gate_logit) = 0;
  // Huginn-0125's adaptive exit statistic (docs/models.md#huginn-0125) after a recurrence, for
  // n rows whose coda outputs are the states slots[i]: the logits lm_head(RMSNorm_final(h)),
  // their log-partition in fp64, and kl[i] = KL(P_prev || P) against the logits the runner kept
  // in its previous-logits row prev[i] (HuginnKl's rule; has_prev[i] == 0: P_prev uniform, the
  // first check); then this check's logits and log-partition are kept there, the next check's
  // previous (a row that exits never reads them again). The rows (ids in [0, max_batch_rows),
  // one per row in the loop, handed out by the executor) are reserved when the runner is made
  // for models with the KL exit rule. Only the n doubles come back: the logits stay where they are
  // computed. The CPU computes HuginnNormalize + HuginnKl in index order; the CUDA runner's
  // huginn_kl kernel sums the same fp64 terms in a fixed tree order (kernels/huginn_kl.cuh).
  virtual void HuginnExitKl(const int32_t* slots, const int32_t* prev, const int32_t* has_prev,
                            int n, double* kl) = 0;
  // Logits and Sample for rows that left Huginn's loop at an exit check: their logits are the
  // ones that check kept in previous-logits row kept[i], bit for bit lm_head(RMSNorm_final(h))
  // of the row's state (its coda output; the same kernels on the same row), so no second final
  // norm and LM head runs. A kept row is read before any later HuginnExitKl writes it.
  virtual void KeptLogits(const int32_t* kept, int n, float* logits) = 0;
  virtual void SampleKept(const int32_t* kept, absl::Span<const SampleInput> rows,
                          SampleResult* out) = 0;
  virtual int block_size() const = 0;
  virtual RunnerCounters counters() const = 0;
  // Copies the K and V ([kv_dim] each, keys after RoPE) stored at a flat KV slot (block *
  // block_size + offset): for tests that compare cache contents with the reference.
  virtual void ReadKv(int32_t slot, float* k, float* v) const = 0;
  // Copies K and V exactly (bit for bit), before any later call reads or writes the cache.
  // The copies of one call may run in any order: no destination range overlaps another
  // copy's source or destination (KvCopiesDisjoint).
  virtual void CopyKv(const KvCopy* copies, int n) = 0;
};

}  // namespace morserve
