// Recurrent layer attention over one batch (see recurrent_layer.h).
#include "engine/cpu/recurrent_layer.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/core/check.h"
#include "engine/cpu/chunk_attention.h"
#include "engine/cpu/recurrent_prefill.h"

namespace morserve {
namespace {

float Scale(const RecurrentLayerParams& rp) {
  return 1.0f / std::sqrt(static_cast<float>(rp.head_dim));
}

// Attention of rows that each attend over their cache plus their temporary pair (chunks of
// one), as one paged-attention batch: row rows[j]'s output at out[j * n_heads * head_dim].
std::vector<float> SinglesAttention(const RecurrentLayerParams& rp, const std::vector<int>& rows) {
  const LayerKvPlan& kv = *rp.batch->kv;
  const int m = static_cast<int>(rows.size()), qd = rp.n_heads * rp.head_dim;
  const int kvd = rp.n_kv_heads * rp.head_dim;
  std::vector<float> qs(static_cast<size_t>(m) * qd), ks(static_cast<size_t>(m) * kvd);
  std::vector<float> vs(static_cast<size_t>(m) * kvd), attn(static_cast<size_t>(m) * qd);
  std::vector<int32_t> kv_len(m), indptr(1, 0), blocks;
  for (int j = 0; j < m; ++j) {
    const int i = rows[j];
    std::copy_n(&rp.q[static_cast<size_t>(i) * qd], qd, &qs[static_cast<size_t>(j) * qd]);
    std::copy_n(&rp.k[static_cast<size_t>(i) * kvd], kvd, &ks[static_cast<size_t>(j) * kvd]);
    std::copy_n(&rp.v[static_cast<size_t>(i) * kvd], kvd, &vs[static_cast<size_t>(j) * kvd]);
    kv_len[j] = kv.kv_len[i];
    blocks.insert(blocks.end(), kv.table_blocks.begin() + kv.table_indptr[i],
                  kv.table_blocks.begin() + kv.table_indptr[i + 1]);
    indptr.push_back(static_cast<int32_t>(blocks.size()));
  }
  PagedAttentionParams p;
  p.num_rows = m;
  p.q = qs.data();
  p.out = attn.data();
  p.pool = rp.kv;
  p.table_indptr = indptr.data();
  p.table_blocks = blocks.data();
  p.kv_len = kv_len.data();
  p.extra_k = ks.data();
  p.extra_v = vs.data();
  p.n_heads = rp.n_heads;
  p.n_kv_heads = rp.n_kv_heads;
  p.head_dim = rp.head_dim;
  p.scale = Scale(rp);
  PagedAttention(p, rp.threads);
  return attn;
}

// Completes rows[0..m) (batch rows) from their attention outputs attn[m, n_heads * head_dim]:
// their states and metadata gathered, `finish` run on them together, the states put back.
void FinishRows(const RecurrentLayerParams& rp, const int* rows, int m, const float* attn) {
  const LayerBatch& b = *rp.batch;
  const int hs = rp.hidden;
  std::vector<float> h(static_cast<size_t>(m) * hs);
  std::vector<int> loops(m), positions(m);
  std::vector<int32_t> write_slot(m);
  for (int j = 0; j < m; ++j) {
    const int i = rows[j];
    std::copy_n(b.h + static_cast<size_t>(i) * hs, hs, &h[static_cast<size_t>(j) * hs]);
    loops[j] = b.loops[i];
    positions[j] = b.positions[i];
    write_slot[j] = b.kv->write_slot[i];
  }
  rp.finish(loops.data(), positions.data(), write_slot.data(), m, attn, h.data());
  for (int j = 0; j < m; ++j) {
    std::copy_n(&h[static_cast<size_t>(j) * hs], hs, b.h + static_cast<size_t>(rows[j]) * hs);
  }
}

// A chunk of more than one row, rows [begin, end): one request's consecutive entries, each
// row writing its own entry in order.
void CheckChunk(const RecurrentLayerParams& rp, int begin, int end) {
  const LayerKvPlan& kv = *rp.batch->kv;
  const int bs = rp.kv->block_size;
  const int32_t* table = kv.table_blocks.data() + kv.table_indptr[begin];
  const int first = kv.kv_len[begin];
  for (int r = begin; r < end; ++r) {  // the chunk's entries follow the cached ones, in order
    const int index = first + (r - begin);
    MORSERVE_CHECK(kv.kv_len[r] == index, "a recurrent chunk's rows must be consecutive entries");
    MORSERVE_CHECK(index / bs < kv.table_indptr[begin + 1] - kv.table_indptr[begin] &&
                       kv.write_slot[r] == table[index / bs] * bs + index % bs,
                   "a recurrent chunk's rows must write their own entries in order");
  }
}

// The batch's chunks as (begin, end) row ranges: chunk_indptr, or every row alone.
std::vector<std::pair<int, int>> Chunks(const LayerBatch& b) {
  const std::vector<int32_t>& indptr = b.kv->chunk_indptr;
  std::vector<std::pair<int, int>> chunks;
  if (indptr.empty()) {
    for (int i = 0; i < b.n; ++i) chunks.push_back({i, i + 1});
    return chunks;
  }
  MORSERVE_CHECK(indptr.front() == 0 && indptr.back() == b.n, "chunk_indptr must cover the rows");
  for (size_t c = 0; c + 1 < indptr.size(); ++c) chunks.push_back({indptr[c], indptr[c + 1]});
  return chunks;
}

// The naive schedule: the chunks of one row together, then each longer chunk one position
// at a time, each attending over the whole cache (paged attention) before it finishes.
void RunNaive(const RecurrentLayerParams& rp, const std::vector<std::pair<int, int>>& chunks) {
  std::vector<int> singles;
  for (auto [begin, end] : chunks) {
    if (end - begin == 1) singles.push_back(begin);
  }
  if (!singles.empty()) {
    const std::vector<float> attn = SinglesAttention(rp, singles);
    FinishRows(rp, singles.data(), static_cast<int>(singles.size()), attn.data());
  }
  const LayerKvPlan& kv = *rp.batch->kv;
  const int qd = rp.n_heads * rp.head_dim, kvd = rp.n_kv_heads * rp.head_dim;
  std::vector<float> attn(qd);
  for (auto [begin, end] : chunks) {
    if (end - begin == 1) continue;
    CheckChunk(rp, begin, end);
    for (int r = begin; r < end; ++r) {
      PagedAttentionParams p;
      p.num_rows = 1;
      p.q = rp.q + static_cast<size_t>(r) * qd;
      p.out = attn.data();
      p.pool = rp.kv;
      p.table_indptr = kv.table_indptr.data() + r;
      p.table_blocks = kv.table_blocks.data();
      p.kv_len = kv.kv_len.data() + r;
      p.extra_k = rp.k + static_cast<size_t>(r) * kvd;
      p.extra_v = rp.v + static_cast<size_t>(r) * kvd;
      p.n_heads = rp.n_heads;
      p.n_kv_heads = rp.n_kv_heads;
      p.head_dim = rp.head_dim;
      p.scale = Scale(rp);
      PagedAttention(p, rp.threads);
      FinishRows(rp, &r, 1, attn.data());
    }
  }
}

// The tiled schedule (engine/runtime/recurrent_schedule.h) with tiles of one KV block: the
// chunks of one row attend by paged attention (their only merge, the cached whole tiles, and
// their finish are the same folds), longer chunks through a ChunkAttention each; every wave's
// rows finish together.
void RunTiled(const RecurrentLayerParams& rp, const std::vector<std::pair<int, int>>& chunks) {
  const LayerBatch& b = *rp.batch;
  const LayerKvPlan& kv = *b.kv;
  RecurrentSchedule schedule;
  std::string error;
  MORSERVE_CHECK(BuildRecurrentSchedule(kv.chunk_indptr, kv.kv_len.data(), b.n, rp.kv->block_size,
                                        &schedule, &error),
                 error.c_str());
  const int qd = rp.n_heads * rp.head_dim, kvd = rp.n_kv_heads * rp.head_dim;
  std::vector<int> singles, single_index(b.n, -1);
  std::vector<std::unique_ptr<ChunkAttention>> attentions;
  TiledRows rows;
  rows.attention.assign(b.n, nullptr);
  rows.query.assign(b.n, 0);
  for (auto [begin, end] : chunks) {
    if (end - begin == 1) {
      single_index[begin] = static_cast<int>(singles.size());
      singles.push_back(begin);
      continue;
    }
    CheckChunk(rp, begin, end);
    ChunkAttentionParams p;
    p.pool = rp.kv;
    p.blocks = kv.table_blocks.data() + kv.table_indptr[begin];
    p.num_blocks = kv.table_indptr[begin + 1] - kv.table_indptr[begin];
    p.first = kv.kv_len[begin];
    p.n = end - begin;
    p.q = rp.q + static_cast<size_t>(begin) * qd;
    p.extra_k = rp.k + static_cast<size_t>(begin) * kvd;
    p.extra_v = rp.v + static_cast<size_t>(begin) * kvd;
    p.n_heads = rp.n_heads;
    p.n_kv_heads = rp.n_kv_heads;
    p.head_dim = rp.head_dim;
    p.scale = Scale(rp);
    attentions.push_back(std::make_unique<ChunkAttention>(p));
    for (int r = begin; r < end; ++r) {
      rows.attention[r] = attentions.back().get();
      rows.query[r] = r - begin;
    }
  }
  const std::vector<float> singles_attn =
      singles.empty() ? std::vector<float>() : SinglesAttention(rp, singles);
  RunTiledSchedule(schedule, rows, qd, rp.threads, [&](const int* wave_rows, int n, float* attn) {
    for (int j = 0; j < n; ++j) {
      const int s = single_index[wave_rows[j]];
      if (s >= 0) {
        std::copy_n(&singles_attn[static_cast<size_t>(s) * qd], qd,
                    attn + static_cast<size_t>(j) * qd);
      }
    }
    FinishRows(rp, wave_rows, n, attn);
  });
}

}  // namespace

// Rows of a recurrent layer come in chunks (LayerKvPlan::chunk_indptr): chunks of one row
// (decode rows, or one position of a prefill) and longer chunks, each a request's prefill.
// Chunks are independent of each other; within a chunk, positions finish in order.
void RunRecurrentLayer(const RecurrentLayerParams& p) {
  const std::vector<std::pair<int, int>> chunks = Chunks(*p.batch);
  if (p.schedule == RecurrentPrefill::kNaive) {
    RunNaive(p, chunks);
  } else {
    RunTiled(p, chunks);
  }
}

}  // namespace morserve
