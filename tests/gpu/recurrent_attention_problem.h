// Host side of the recurrent-attention kernel tests (GPU and CPU-emulated): a paged-attention
// problem (tests/gpu/paged_attention_problem.h, extra pair on) read as recurrent prefill
// chunks, one per request, and the driver that runs the GPU schedule
// (engine/runtime/recurrent_schedule.h, merges cut into kRecurrentRange ranges as the runner
// cuts them) wave by wave: merges, finishes, then the finished rows' persistent entries are
// written. Until then a chunk's own entries hold NaN in the cache, so a key read before it
// exists poisons the output and fails the comparison.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "engine/runtime/recurrent_schedule.h"
#include "kernels/recurrent_attention.cuh"
#include "tests/gpu/paged_attention_problem.h"

namespace morserve::kernels::recurrent_test {

using attention_test::Problem;

static_assert(sizeof(RecurrentFold) == sizeof(RecurrentFoldItem), "item layout");

// Rows of request i form chunk i (Build puts them consecutively, entries in order).
inline std::vector<int32_t> ChunkIndptr(const std::vector<attention_test::RequestSpec>& reqs) {
  std::vector<int32_t> indptr = {0};
  for (const auto& r : reqs) indptr.push_back(indptr.back() + r.query_rows);
  return indptr;
}

// Cache slot of row r's own entry (its kv_len-th entry).
inline size_t OwnSlot(const Problem& p, int r) {
  const int e = p.kv_len[r], bs = p.shape.block_size;
  return static_cast<size_t>(p.blocks[p.indptr[r] + e / bs]) * bs + e % bs;
}

// The schedule's items with rows mapped back to the problem's rows.
struct Items {
  std::vector<RecurrentFoldItem> merge, finish;
  std::vector<int> merge_begin, wave_begin;
};

// The GPU runner's items (engine/cuda/recurrent_staging.cc): the schedule with tiles of
// kRecurrentTile, its merges cut at multiples of `range` (kRecurrentRange; 0: uncut, the
// schedule as the CPU runs it, which the kernels refuse once a merge crosses a range).
inline Items ScheduleItems(const Problem& p, const std::vector<int32_t>& chunk_indptr,
                           int range = kRecurrentRange) {
  RecurrentSchedule s;
  std::string error;
  const bool ok =
      BuildRecurrentSchedule(chunk_indptr, p.kv_len.data(), p.rows, kRecurrentTile, &s, &error);
  EXPECT_TRUE(ok) << error;
  if (range > 0) SplitRecurrentMerges(range, &s);
  Items it;
  auto map = [&](const RecurrentFold& f) {
    return RecurrentFoldItem{s.order[f.row], f.key_begin, f.key_end, f.flags};
  };
  for (const RecurrentFold& f : s.merge) it.merge.push_back(map(f));
  for (const RecurrentFold& f : s.finish) it.finish.push_back(map(f));
  it.merge_begin = s.merge_begin;
  it.wave_begin = s.wave_begin;
  return it;
}

// What a backend (emulator or GPU) does for the driver.
struct Backend {
  // Runs items [begin, begin + count) of the merge (finish = false) or finish list.
  std::function<void(bool finish, int begin, int count)> run;
  // Writes row r's own entry (k and v: kv_dim bf16 each) at cache slot `slot`.
  std::function<void(size_t slot, const uint16_t* k, const uint16_t* v)> write;
};

// The cache as the driver starts it: every chunk row's own entry is NaN.
inline void HideChunkEntries(const Problem& p, std::vector<uint16_t>* k, std::vector<uint16_t>* v) {
  const size_t kvd = p.kv_dim();
  for (int r = 0; r < p.rows; ++r) {
    const size_t slot = OwnSlot(p, r);
    std::fill_n(k->begin() + slot * kvd, kvd, attention_test::kNanBits);
    std::fill_n(v->begin() + slot * kvd, kvd, attention_test::kNanBits);
  }
}

// Replays the waves: merges, finishes, then the finished rows' entries (from p's cache).
inline void Drive(const Problem& p, const Items& it, const Backend& b) {
  const size_t kvd = p.kv_dim();
  for (size_t w = 0; w + 1 < it.wave_begin.size(); ++w) {
    const int mb = it.merge_begin[w], me = it.merge_begin[w + 1];
    if (me > mb) b.run(false, mb, me - mb);
    const int fb = it.wave_begin[w], fe = it.wave_begin[w + 1];
    b.run(true, fb, fe - fb);
    for (int j = fb; j < fe; ++j) {
      const size_t slot = OwnSlot(p, it.finish[j].row);
      b.write(slot, &p.k_cache[slot * kvd], &p.v_cache[slot * kvd]);
    }
  }
}

// fp32 elements of the range partials of p's rows (RecurrentAttentionWorkspaceFloats).
inline size_t PartialFloats(const Problem& p) {
  return RecurrentAttentionWorkspaceFloats(p.rows, p.shape.n_heads, p.shape.head_dim, p.max_kv_len);
}

// The recurrent kernels' parameters over `in` (device or host pointers, as the backend holds
// them) with the range partials (PartialFloats) and the output; items and num_items are the
// launch's to set.
inline RecurrentAttentionParams RecurrentLaunchParams(const Problem& p,
                                                      const attention_test::AttentionInputs& in,
                                                      float* partials, void* out, DType out_dtype) {
  RecurrentAttentionParams rp;
  rp.q = in.q;
  rp.k_cache = in.k_cache;
  rp.v_cache = in.v_cache;
  rp.table_indptr = in.indptr;
  rp.table_blocks = in.blocks;
  rp.kv_len = in.kv_len;
  rp.extra_k = in.extra_k;
  rp.extra_v = in.extra_v;
  rp.workspace = partials;
  rp.max_kv_len = p.max_kv_len;
  rp.out = out;
  rp.out_dtype = out_dtype;
  rp.rows = p.rows;
  rp.n_heads = p.shape.n_heads;
  rp.n_kv_heads = p.shape.n_kv_heads;
  rp.head_dim = p.shape.head_dim;
  rp.block_size = p.shape.block_size;
  rp.num_blocks = p.num_blocks;
  rp.scale = 1.0f / std::sqrt(static_cast<float>(p.shape.head_dim));
  return rp;
}

// Paged attention over the problem with split chunks of kRecurrentRange entries over the
// complete cache and each row's extra pair (the naive path the tiled fold must equal bit for
// bit); out and workspace (PagedAttentionWorkspaceFloats, 0 when every row has one chunk) are
// the launch's to set.
inline PagedAttentionParams PagedRangeParams(const Problem& p,
                                             const attention_test::AttentionInputs& in,
                                             DType out_dtype) {
  PagedAttentionParams pp = attention_test::LaunchParams(p, in, out_dtype);
  pp.extra_k = in.extra_k;  // recurrent rows always attend to their temporary pair
  pp.extra_v = in.extra_v;
  pp.chunk_len = kRecurrentRange;
  return pp;
}

}  // namespace morserve::kernels::recurrent_test
