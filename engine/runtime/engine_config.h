// Engine settings: batching mode, batch limits, KV cache size, CPU weight format, device.
#pragma once

#include <cstdint>

namespace morserve {

enum class BatchingMode {
  kDepthWise,     // every step runs the shared block once over rows at any loop; exits refill
  kSequenceWise,  // a step runs all loops of the rows it admitted; the batch waits for its
                  // deepest row (the baseline of every comparison)
};

// The format the CPU backend keeps projection and LM-head weights in (engine/cpu/
// linear_weights.h); activations and accumulation are fp32, except with kAmxBf16 and kW8A8.
enum class CpuWeights {
  kAuto,  // the checkpoint's dtype (bf16 and f16 read in place), fp32 otherwise
  kF32,
  kBF16,  // fp32 checkpoints are rounded to bf16 once at load
  kF16,
  kInt8,  // Q8 groups of 32 with an f16 scale, quantized at load; routers and LoRA stay as stored
  kAmxBf16,  // bf16 in AMX tile order; each projection's input rounded to bf16, fp32 sums on the
             // AMX tile unit (Sapphire Rapids and later) or, without AMX, with AVX-512 BF16's
             // VDPBF16PS (AMD Zen 4 and later); routers and LoRA stay as stored
  kW8A8,     // int8 as kInt8, in VNNI order; each projection's input quantized to int8 per group
             // of 32, integer dot products (AVX-512 VNNI, or AVX2); routers and LoRA stay as stored
};

// How a recurrent layer (docs/models.md#recurrent-transformer-layers) runs a prefill chunk of
// one request.
enum class RecurrentPrefill {
  kTiled,  // online-softmax accumulators, cached pass + divide-and-conquer key tiles
  kNaive,  // one position at a time, each attending over the cache (the reference schedule)
};

// Where the model runs: the CPU backend (engine/cpu) or the CUDA backend (engine/cuda, only in
// builds with MORSERVE_CUDA; Engine::Create errors otherwise or without a device).
enum class Device { kCpu, kCuda };

// --device cuda: which GEMM runs the linear layers. Both give a row the same bits whatever its
// batch (kernels/gemm.cuh, kernels/fixed_gemm.cuh), not the same bits as each other.
enum class CudaGemm {
  kAuto,      // cuBLASLt with one algorithm pinned per shape; a shape it cannot pin runs on the
              // fixed-order kernel (said on stderr at start-up, counted in fixed_gemm_calls)
  kCublasLt,  // cuBLASLt pinned; a shape it cannot pin is an error at start-up
  kFixed,     // the fixed-order tensor-core kernel for every GEMM
};

// --device cuda: how the attention of non-recurrent layers walks a split-KV chunk
// (kernels/paged_attention.cuh AttentionFold). Both give a row the same bits whatever its batch,
// not the same bits as each other. Recurrent layers always use the CTA fold.
enum class CudaAttentionFold {
  kCta,   // the CTA on one tile at a time, pipelined one tile ahead
  kWarp,  // per-warp keys: each warp its own tiles and softmax state, merged in warp order
};

struct EngineConfig {
  BatchingMode mode = BatchingMode::kDepthWise;
  int max_batch_rows = 256;    // rows in one pass of the shared block (the "batch size")
  int max_step_tokens = 2048;  // tokens entering the model per step (prefill chunk budget)
  int max_running = 256;       // requests holding KV at once
  int max_queue = 4096;        // waiting requests; Submit fails with RESOURCE_EXHAUSTED beyond
  int block_size = 16;         // tokens per KV block
  int num_kv_blocks = 0;       // 0: derived from kv_cache_bytes
  int64_t kv_cache_bytes = 256ll << 20;
  CpuWeights weights = CpuWeights::kAuto;
  RecurrentPrefill recurrent_prefill = RecurrentPrefill::kTiled;
  int threads = 0;  // 0: the machine's cores
  // Keep full KV blocks after their request ends and reuse the longest cached prefix of a
  // new prompt (engine/runtime/prefix_cache.h).
  bool prefix_cache = true;
  Device device = Device::kCpu;
  // --device cuda: replay decode-sized segment passes from CUDA graphs (engine/cuda/
  // cuda_step_graphs.h); off: every kernel launched from the host (the same bits).
  bool cuda_graphs = true;
  CudaGemm cuda_gemm = CudaGemm::kAuto;
  CudaAttentionFold cuda_attention_fold = CudaAttentionFold::kCta;
};

// Huginn adaptive: the previous-logits rows a runner keeps (ModelRunner::HuginnExitKl). One per
// row in the loop, plus one per running request for a last known token that left the loop at
// an exit check and keeps its logits until its tail samples it (ModelRunner::SampleKept).
inline int HuginnKeptRows(const EngineConfig& c) { return c.max_batch_rows + c.max_running; }

}  // namespace morserve
