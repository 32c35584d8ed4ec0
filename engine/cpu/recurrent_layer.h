// The attention part of a recurrent layer (docs/models.md#recurrent-transformer-layers) over
// one batch on the CPU, and the order in which the rest of the layer must run.
//
// A recurrent row's attention needs the persistent pairs of its request's earlier positions,
// which exist only after those positions finished the layer. Rows arrive in chunks
// (LayerKvPlan::chunk_indptr): a chunk of one row is a decode row or a single position; a
// longer chunk is one request's prefill. With RecurrentPrefill::kTiled the batch runs by the
// schedule both runners share (engine/runtime/recurrent_schedule.h, run on the CPU by
// recurrent_prefill.h): waves of one position per chunk, finished together. With kNaive the
// chunks of one row finish together and each longer chunk runs one position at a time over
// paged attention. Both give the same bits (chunk_attention.h).
#pragma once

#include <cstdint>
#include <functional>

#include "engine/cpu/paged_attention.h"
#include "engine/cpu/thread_pool.h"
#include "engine/runtime/engine_config.h"
#include "engine/runtime/model_runner.h"

namespace morserve {

// Completes n rows from their attention outputs attn[n, n_heads * head_dim]: Wo, MLP (h is
// updated in place, [n, hidden]) and the persistent pair written at write_slot.
using FinishRecurrentRowsFn =
    std::function<void(const int* loops, const int* positions, const int32_t* write_slot, int n,
                       const float* attn, float* h)>;

struct RecurrentLayerParams {
  const LayerBatch* batch = nullptr;  // rows, positions, h, KV plan (recurrent, with chunks)
  const float* q = nullptr;           // [n, n_heads * head_dim], RoPE applied
  const float* k = nullptr;           // [n, n_kv_heads * head_dim]: the temporary pairs
  const float* v = nullptr;
  PagedKvPool* kv = nullptr;
  ThreadPool* threads = nullptr;
  int hidden = 0;
  int n_heads = 0;
  int n_kv_heads = 0;
  int head_dim = 0;
  RecurrentPrefill schedule = RecurrentPrefill::kTiled;
  FinishRecurrentRowsFn finish;
};

void RunRecurrentLayer(const RecurrentLayerParams& p);

}  // namespace morserve
