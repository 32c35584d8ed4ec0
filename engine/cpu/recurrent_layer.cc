// Recurrent layer attention over one batch (see recurrent_layer.h).
#include "engine/cpu/recurrent_layer.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "engine/core/check.h"
#include "engine/cpu/chunk_attention.h"
#include "engine/cpu/recurrent_prefill.h"

namespace morserve {
namespace {

// Rows that each attend over their cache plus their temporary pair, gathered into one batch.
void Singles(const RecurrentLayerParams& rp, const std::vector<int>& rows) {
  const LayerBatch& b = *rp.batch;
  const LayerKvPlan& kv = *b.kv;
  const float *q = rp.q, *k = rp.k, *v = rp.v;
  const int m = static_cast<int>(rows.size()), hs = rp.hidden, qd = rp.n_heads * rp.head_dim;
  const int kvd = rp.n_kv_heads * rp.head_dim;
  std::vector<float> qs(static_cast<size_t>(m) * qd), ks(static_cast<size_t>(m) * kvd), vs(static_cast<size_t>(m) * kvd);
  std::vector<float> h(static_cast<size_t>(m) * hs), attn(static_cast<size_t>(m) * qd);
  std::vector<int> loops(m), positions(m);
  std::vector<int32_t> write_slot(m), kv_len(m), indptr(1, 0), blocks;
  for (int j = 0; j < m; ++j) {
    const int i = rows[j];
    std::copy_n(&q[static_cast<size_t>(i) * qd], qd, &qs[static_cast<size_t>(j) * qd]);
    std::copy_n(&k[static_cast<size_t>(i) * kvd], kvd, &ks[static_cast<size_t>(j) * kvd]);
    std::copy_n(&v[static_cast<size_t>(i) * kvd], kvd, &vs[static_cast<size_t>(j) * kvd]);
    std::copy_n(b.h + static_cast<size_t>(i) * hs, hs, &h[static_cast<size_t>(j) * hs]);
    loops[j] = b.loops[i];
    positions[j] = b.positions[i];
    write_slot[j] = kv.write_slot[i];
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
  p.scale = 1.0f / std::sqrt(static_cast<float>(rp.head_dim));
  PagedAttention(p, rp.threads);
  rp.finish(loops.data(), positions.data(), write_slot.data(), m, attn.data(), h.data());
  for (int j = 0; j < m; ++j) {
    std::copy_n(&h[static_cast<size_t>(j) * hs], hs, b.h + static_cast<size_t>(rows[j]) * hs);
  }
}

// The naive schedule: each position attends over the whole cache, then finishes.
void NaiveChunk(const RecurrentLayerParams& rp, int begin, int end, const FinishPosition& finish) {
  const LayerKvPlan& kv = *rp.batch->kv;
  const int qd = rp.n_heads * rp.head_dim, kvd = rp.n_kv_heads * rp.head_dim;
  std::vector<float> attn(qd);
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
    p.scale = 1.0f / std::sqrt(static_cast<float>(rp.head_dim));
    PagedAttention(p, rp.threads);
    finish(r - begin, attn.data());
  }
}

void TiledChunk(const RecurrentLayerParams& rp, int begin, int end, const FinishPosition& finish) {
  const LayerKvPlan& kv = *rp.batch->kv;
  const int qd = rp.n_heads * rp.head_dim, kvd = rp.n_kv_heads * rp.head_dim;
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
  p.scale = 1.0f / std::sqrt(static_cast<float>(rp.head_dim));
  ChunkAttention attention(p);
  RunTiledPrefill(attention, rp.threads, finish);
}

// One request's prefill chunk, rows [begin, end): consecutive entries of one cache slot,
// each seeing the cached entries and the chunk's earlier rows (recurrent_prefill.h).
void Chunk(const RecurrentLayerParams& rp, int begin, int end) {
  const LayerBatch& b = *rp.batch;
  const LayerKvPlan& kv = *b.kv;
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
  const FinishPosition finish = [&](int i, const float* attn) {
    const int r = begin + i;
    rp.finish(b.loops + r, b.positions + r, &kv.write_slot[r], 1, attn,
              b.h + static_cast<size_t>(r) * rp.hidden);
  };
  if (rp.schedule == RecurrentPrefill::kNaive) {
    NaiveChunk(rp, begin, end, finish);
  } else {
    TiledChunk(rp, begin, end, finish);
  }
}

}  // namespace

// Rows of a recurrent layer come in chunks (LayerKvPlan::chunk_indptr). Chunks of one row
// (decode rows, or one position of a prefill) run together as one batch; a longer chunk is a
// request's prefill and runs by its schedule. Chunks are independent of each other.
void RunRecurrentLayer(const RecurrentLayerParams& p) {
  const LayerBatch& b = *p.batch;
  const std::vector<int32_t>& chunks = b.kv->chunk_indptr;
  std::vector<int> singles;
  if (chunks.empty()) {  // no chunks given: every row is a chunk of one
    for (int i = 0; i < b.n; ++i) singles.push_back(i);
  } else {
    MORSERVE_CHECK(chunks.front() == 0 && chunks.back() == b.n, "chunk_indptr must cover the rows");
    for (size_t c = 0; c + 1 < chunks.size(); ++c) {
      if (chunks[c + 1] - chunks[c] == 1) singles.push_back(chunks[c]);
    }
  }
  if (!singles.empty()) Singles(p, singles);
  for (size_t c = 0; c + 1 < chunks.size(); ++c) {
    if (chunks[c + 1] - chunks[c] > 1) Chunk(p, chunks[c], chunks[c + 1]);
  }
}

}  // namespace morserve
