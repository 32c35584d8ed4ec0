// StageRecurrentLayer (engine/cuda/recurrent_staging.h), the host half of the GPU's tiled
// recurrent layer: from the one int32 array the runner uploads, every wave-major row carries
// its original row's position, h, entry index, table and write slot; the merge and finish
// items decode at their offsets to the schedule's (its merges cut into ranges: a long decode
// row's cached prefix is one item per range); each wave's loop runs decode to that wave's rows'
// loops; all arrays are 16-byte aligned. Malformed chunks are errors.
#include "engine/cuda/recurrent_staging.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace morserve {
namespace {

constexpr int kBlock = 16, kHidden = 4;

struct Batch {
  LayerKvPlan kv;
  std::vector<int> loops, positions;
  std::vector<float> h;
  LayerBatch b;
};

// Chunks (first entry, rows, loop, first block id): tables of consecutive block ids.
void AddChunk(Batch* t, int first, int n, int loop, int block0) {
  const int blocks = (first + n + kBlock - 1) / kBlock;
  for (int i = 0; i < n; ++i) {
    const int e = first + i;
    t->loops.push_back(loop);
    t->positions.push_back(1000 * loop + e);
    for (int c = 0; c < kHidden; ++c)
      t->h.push_back(static_cast<float>(t->positions.back() * 10 + c));
    t->kv.kv_len.push_back(e);
    t->kv.write_slot.push_back((block0 + e / kBlock) * kBlock + e % kBlock);
    if (t->kv.table_indptr.empty()) t->kv.table_indptr.push_back(0);
    for (int k = 0; k < blocks; ++k) t->kv.table_blocks.push_back(block0 + k);
    t->kv.table_indptr.push_back(static_cast<int32_t>(t->kv.table_blocks.size()));
  }
  if (t->kv.chunk_indptr.empty()) t->kv.chunk_indptr.push_back(0);
  t->kv.chunk_indptr.push_back(static_cast<int32_t>(t->loops.size()));
}

const LayerBatch& Bind(Batch& t) {
  t.kv.recurrent = true;
  t.b.n = static_cast<int>(t.loops.size());
  t.b.loops = t.loops.data();
  t.b.positions = t.positions.data();
  t.b.h = t.h.data();
  t.b.kv = &t.kv;
  return t.b;
}

TEST(RecurrentStagingTest, WaveMajorRowsItemsAndWavesDecodeFromOneArray) {
  Batch t;
  AddChunk(&t, 10, 40, 0, 0);  // a prefill chunk after a cached prefix
  AddChunk(&t, 70, 1, 1, 10);  // a decode row
  AddChunk(&t, 0, 5, 1, 20);   // a short prompt
  const LayerBatch& b = Bind(t);
  RecurrentStaging st;
  std::string error;
  ASSERT_TRUE(StageRecurrentLayer(b, /*num_loops=*/2, kBlock, kHidden, &st, &error)) << error;
  const StagedRows& s = st.rows;
  const std::vector<int32_t>& d = s.data;
  const int n = b.n;
  ASSERT_EQ(st.sub.b.n, n);
  for (size_t off : {s.loops, s.positions, s.write_slot, s.table_indptr, s.table_blocks, s.kv_len,
                     st.merge_at, st.finish_at}) {
    EXPECT_EQ(off % 4, 0u);
  }
  for (int j = 0; j < n; ++j) {
    const int old = st.sched.order[j];
    EXPECT_EQ(d[s.positions + j], t.positions[old]) << j;
    EXPECT_EQ(d[s.loops + j], t.loops[old]) << j;
    EXPECT_EQ(d[s.kv_len + j], t.kv.kv_len[old]) << j;
    EXPECT_EQ(d[s.write_slot + j], t.kv.write_slot[old]) << j;
    for (int c = 0; c < kHidden; ++c) EXPECT_EQ(st.sub.h[j * kHidden + c], t.h[old * kHidden + c]);
    const int e = d[s.kv_len + j];  // the own entry through the staged table
    const int32_t* table = &d[s.table_blocks + d[s.table_indptr + j]];
    EXPECT_EQ(table[e / kBlock] * kBlock + e % kBlock, d[s.write_slot + j]) << j;
  }
  auto item = [&](size_t at, size_t i) {
    return std::vector<int32_t>(d.begin() + at + 4 * i, d.begin() + at + 4 * i + 4);
  };
  ASSERT_FALSE(st.sched.merge.empty());
  for (size_t i = 0; i < st.sched.merge.size(); ++i) {
    const RecurrentFold& f = st.sched.merge[i];
    EXPECT_EQ(item(st.merge_at, i), (std::vector<int32_t>{f.row, f.key_begin, f.key_end, f.flags}));
  }
  for (int j = 0; j < n; ++j) EXPECT_EQ(item(st.finish_at, j)[0], j);
  ASSERT_EQ(static_cast<int>(st.waves.size()), 40);               // the longest chunk
  EXPECT_EQ(st.sched.wave_begin[1] - st.sched.wave_begin[0], 3);  // a row of every chunk
  for (int w = 0; w < st.sched.waves(); ++w) {
    const int wb = st.sched.wave_begin[w], m = st.sched.wave_begin[w + 1] - wb;
    const StagedRows& ws = st.waves[w];
    EXPECT_EQ(ws.loops % 4, 0u);
    int covered = 0;
    for (const LoopGroup& g : ws.groups) {
      EXPECT_EQ(g.begin, covered);
      covered += g.count;
      for (int i = g.begin; i < g.begin + g.count; ++i) EXPECT_EQ(d[s.loops + wb + i], g.loop);
    }
    EXPECT_EQ(covered, m);
    for (int i = 0; i < m; ++i) EXPECT_EQ(d[ws.loops + i], d[s.loops + wb + i]) << w;
  }
}

// A decode row at entry 1100 merges its cached prefix [0, 1088) as one item per range of
// kRecurrentGpuRange keys (parallel CTAs on the GPU), all before its finish.
TEST(RecurrentStagingTest, LongDecodeRowMergesOneItemPerRange) {
  Batch t;
  AddChunk(&t, 1100, 1, 0, 0);
  RecurrentStaging st;
  std::string error;
  ASSERT_TRUE(StageRecurrentLayer(Bind(t), 1, kBlock, kHidden, &st, &error)) << error;
  ASSERT_EQ(st.sched.waves(), 1);
  ASSERT_EQ(st.sched.merge.size(), 5u);
  for (int i = 0; i < 5; ++i) {
    const int32_t* item = &st.rows.data[st.merge_at + 4 * i];
    EXPECT_EQ(item[0], 0);
    EXPECT_EQ(item[1], i * kRecurrentGpuRange);
    EXPECT_EQ(item[2], i < 4 ? (i + 1) * kRecurrentGpuRange : 1088);
  }
}

TEST(RecurrentStagingTest, MalformedChunksAreErrors) {
  Batch t;
  AddChunk(&t, 10, 4, 0, 0);
  t.kv.kv_len[2] = 30;  // not consecutive
  RecurrentStaging st;
  std::string error;
  EXPECT_FALSE(StageRecurrentLayer(Bind(t), 2, kBlock, kHidden, &st, &error));
  EXPECT_NE(error.find("consecutive"), std::string::npos) << error;
  Batch u;
  AddChunk(&u, 0, 3, 5, 0);  // loop 5 of 2
  EXPECT_FALSE(StageRecurrentLayer(Bind(u), 2, kBlock, kHidden, &st, &error));
  EXPECT_NE(error.find("loop"), std::string::npos) << error;
}

}  // namespace
}  // namespace morserve
