// The recurrent schedule of both runners (engine/runtime/recurrent_schedule.h) as pure bookkeeping:
// replaying its waves, every (query, key tile) pair below a query's own tile is merged exactly
// once, in increasing key order, only after the key's entries are written, and before the query's
// finish; no launch holds two merges into one row (their CTAs would race on its state); the first
// fold of every row carries the fresh flag and no other does; the waves are a wave-major
// permutation of the rows. Over many chunk layouts (cached prefixes on and off tile boundaries,
// lengths that are and are not powers of two, decode rows mixed in). SplitRecurrentMerges (the
// GPU's cut into ranges): the pieces of a wave cover its merges' keys, in order, each inside one
// range, no launch holds two pieces into one (row, range) partial, and a decode row's cached
// prefix becomes one piece per range.
#include "engine/runtime/recurrent_schedule.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <set>
#include <string>
#include <vector>

namespace morserve {
namespace {

constexpr int kGpuTile = 32;  // the CUDA runner's; the CPU runner's tile is its KV block

struct Layout {
  std::vector<int32_t> indptr;
  std::vector<int32_t> kv_len;
};

Layout MakeLayout(const std::vector<std::pair<int, int>>& chunks) {  // (first, n) each
  Layout l;
  l.indptr.push_back(0);
  for (auto [first, n] : chunks) {
    for (int i = 0; i < n; ++i) l.kv_len.push_back(first + i);
    l.indptr.push_back(static_cast<int32_t>(l.kv_len.size()));
  }
  return l;
}

void Replay(const Layout& l, int tile) {
  const int n = static_cast<int>(l.kv_len.size());
  RecurrentSchedule s;
  std::string error;
  ASSERT_TRUE(BuildRecurrentSchedule(l.indptr, l.kv_len.data(), n, tile, &s, &error)) << error;
  ASSERT_EQ(static_cast<int>(s.order.size()), n);
  ASSERT_EQ(std::set<int>(s.order.begin(), s.order.end()).size(), static_cast<size_t>(n));
  ASSERT_EQ(s.finish.size(), static_cast<size_t>(n));
  ASSERT_EQ(s.merge_begin.size(), s.wave_begin.size());
  // Old row -> (chunk, position), and the entries written so far per chunk.
  const int chunks = static_cast<int>(l.indptr.size()) - 1;
  std::vector<int> chunk_of(n), pos_of(n), written(chunks);
  for (int c = 0; c < chunks; ++c) {
    written[c] = l.kv_len[l.indptr[c]];
    for (int r = l.indptr[c]; r < l.indptr[c + 1]; ++r)
      chunk_of[r] = c, pos_of[r] = r - l.indptr[c];
  }
  std::vector<int> next_tile(n, 0);  // per new row: tiles [0, next_tile) merged, in order
  std::vector<int> folds(n, 0);
  for (int w = 0; w < s.waves(); ++w) {
    std::set<int> rows_this_wave;  // CTAs of one launch must not share a row's state
    for (int m = s.merge_begin[w]; m < s.merge_begin[w + 1]; ++m) {
      const RecurrentFold& f = s.merge[m];
      ASSERT_TRUE(f.row >= s.wave_begin[w] && f.row < n) << "merge into a finished row";
      ASSERT_TRUE(rows_this_wave.insert(f.row).second) << "two merges into one row in a launch";
      const int old = s.order[f.row], c = chunk_of[old];
      ASSERT_EQ(f.key_begin % tile, 0);
      ASSERT_EQ(f.key_end % tile, 0);
      ASSERT_LT(f.key_begin, f.key_end);
      ASSERT_EQ(f.key_begin, next_tile[f.row] * tile) << "a tile skipped or merged twice";
      ASSERT_LE(f.key_end, written[c]) << "a key merged before it was written";
      ASSERT_LE(f.key_end, l.kv_len[old] - l.kv_len[old] % tile)
          << "a key at or after the own tile";
      ASSERT_EQ(f.flags, folds[f.row] == 0 ? kRecurrentScheduleFresh : 0);
      next_tile[f.row] = f.key_end / tile;
      ++folds[f.row];
    }
    for (int j = s.wave_begin[w]; j < s.wave_begin[w + 1]; ++j) {
      const int old = s.order[j];
      ASSERT_EQ(pos_of[old], w) << "wave " << w << " holds another position";
      ASSERT_EQ(s.finish[j].row, j);
      ASSERT_EQ(s.finish[j].flags, folds[j] == 0 ? kRecurrentScheduleFresh : 0);
      ASSERT_EQ(next_tile[j] * tile, l.kv_len[old] - l.kv_len[old] % tile)
          << "row " << old << " finishes without all tiles below its own";
      ASSERT_EQ(written[chunk_of[old]], l.kv_len[old]);
      ++written[chunk_of[old]];  // its persistent pair
    }
  }
}

TEST(RecurrentScheduleTest, EveryPairOnceInOrder) {
  const std::vector<std::vector<std::pair<int, int>>> cases = {
      {{0, 1}},
      {{0, 300}},
      {{0, 256}},
      {{5, 1}},
      {{31, 2}},
      {{32, 64}},
      {{7, 129}},
      {{100, 1}, {0, 77}, {64, 1}},
      {{33, 500}, {0, 33}, {95, 1}, {96, 96}},
      {{1000, 17}, {3, 1}, {0, 1024}},
  };
  for (const auto& c : cases) {
    std::string name;
    for (auto [f, n] : c) name += "(" + std::to_string(f) + "," + std::to_string(n) + ")";
    for (int tile : {kGpuTile, 16, 1}) {
      SCOPED_TRACE(name + " tile " + std::to_string(tile));
      ASSERT_NO_FATAL_FAILURE(Replay(MakeLayout(c), tile));
    }
  }
}

TEST(RecurrentScheduleTest, RandomLayouts) {
  std::mt19937 rng(11);
  for (int t = 0; t < 200; ++t) {
    std::vector<std::pair<int, int>> c;
    const int chunks = 1 + rng() % 5;
    for (int i = 0; i < chunks; ++i) {
      c.push_back(
          {static_cast<int>(rng() % 200), rng() % 3 == 0 ? 1 : 1 + static_cast<int>(rng() % 260)});
    }
    const int tile = std::vector<int>{kGpuTile, 16, 8, 7}[t % 4];
    ASSERT_NO_FATAL_FAILURE(Replay(MakeLayout(c), tile)) << "layout " << t << " tile " << tile;
  }
}

// The merges of s cut at `range`: per wave, each merge's pieces in key order, each inside one
// range, the first keeping the merge's flags; no (row, range) twice in one wave.
void CheckSplit(const Layout& l, int tile, int range) {
  const int n = static_cast<int>(l.kv_len.size());
  RecurrentSchedule s;
  std::string error;
  ASSERT_TRUE(BuildRecurrentSchedule(l.indptr, l.kv_len.data(), n, tile, &s, &error)) << error;
  RecurrentSchedule cut = s;
  SplitRecurrentMerges(range, &cut);
  ASSERT_EQ(cut.merge_begin.size(), s.merge_begin.size());
  EXPECT_EQ(cut.order, s.order);
  EXPECT_EQ(cut.wave_begin, s.wave_begin);
  for (int w = 0; w < s.waves(); ++w) {
    std::set<std::pair<int, int>> partials;  // (row, range) of this launch
    int piece = cut.merge_begin[w];
    for (int m = s.merge_begin[w]; m < s.merge_begin[w + 1]; ++m) {
      const RecurrentFold& f = s.merge[m];
      for (int key = f.key_begin; key < f.key_end; ++piece) {
        ASSERT_LT(piece, cut.merge_begin[w + 1]) << "wave " << w << " lost keys";
        const RecurrentFold& p = cut.merge[piece];
        const int end = std::min(f.key_end, (key / range + 1) * range);
        EXPECT_EQ(p.row, f.row);
        ASSERT_EQ(p.key_begin, key);
        ASSERT_EQ(p.key_end, end);
        EXPECT_EQ(p.flags, key == f.key_begin ? f.flags : 0);
        EXPECT_TRUE(partials.insert({p.row, key / range}).second)
            << "two pieces into one partial in a launch";
        key = end;
      }
    }
    EXPECT_EQ(piece, cut.merge_begin[w + 1]) << "wave " << w << " gained pieces";
  }
}

TEST(RecurrentScheduleTest, SplitMergesCutAtRanges) {
  const std::vector<std::vector<std::pair<int, int>>> cases = {
      {{1100, 1}, {700, 1}, {300, 1}, {40, 1}},  // decode rows
      {{0, 600}},
      {{510, 90}, {255, 2}, {256, 1}},
      {{33, 500}, {0, 33}, {95, 1}, {96, 96}},
      {{1000, 17}, {3, 1}, {0, 1024}},
  };
  for (const auto& c : cases) {
    for (auto [tile, range] : {std::pair{kGpuTile, 256}, {kGpuTile, 64}, {16, 48}}) {
      SCOPED_TRACE("tile " + std::to_string(tile) + " range " + std::to_string(range));
      ASSERT_NO_FATAL_FAILURE(CheckSplit(MakeLayout(c), tile, range));
    }
  }
}

TEST(RecurrentScheduleTest, DecodeRowPrefixIsOnePiecePerRange) {
  const std::vector<int32_t> kv_len = {1100, 40};
  RecurrentSchedule s;
  std::string error;
  ASSERT_TRUE(BuildRecurrentSchedule({}, kv_len.data(), 2, kGpuTile, &s, &error)) << error;
  SplitRecurrentMerges(256, &s);
  ASSERT_EQ(s.merge.size(), 6u);  // [0, 1088) in 5 ranges, then [0, 32)
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(s.merge[i].row, 0);
    EXPECT_EQ(s.merge[i].key_begin, 256 * i);
    EXPECT_EQ(s.merge[i].key_end, i < 4 ? 256 * (i + 1) : 1088);
  }
  EXPECT_EQ(s.merge[5].key_end, 32);
}

TEST(RecurrentScheduleTest, NoChunksMeansRowsOfOne) {
  const std::vector<int32_t> kv_len = {0, 40, 64, 3};
  RecurrentSchedule s;
  std::string error;
  ASSERT_TRUE(BuildRecurrentSchedule({}, kv_len.data(), 4, kGpuTile, &s, &error)) << error;
  EXPECT_EQ(s.waves(), 1);
  EXPECT_EQ(s.order, (std::vector<int>{0, 1, 2, 3}));
  ASSERT_EQ(s.merge.size(), 2u);  // the cached whole tiles of rows 1 and 2
  EXPECT_EQ(s.merge[0].key_end, 32);
  EXPECT_EQ(s.merge[1].key_end, 64);
  EXPECT_EQ(s.finish[0].flags, kRecurrentScheduleFresh);
  EXPECT_EQ(s.finish[1].flags, 0);
}

TEST(RecurrentScheduleTest, BadChunksAreErrors) {
  RecurrentSchedule s;
  std::string error;
  const std::vector<int32_t> gap = {3, 5};  // not consecutive entries
  EXPECT_FALSE(BuildRecurrentSchedule({0, 2}, gap.data(), 2, kGpuTile, &s, &error));
  EXPECT_NE(error.find("consecutive"), std::string::npos);
  const std::vector<int32_t> ok = {3, 4};
  EXPECT_FALSE(BuildRecurrentSchedule({0, 1}, ok.data(), 2, kGpuTile, &s, &error));
  EXPECT_NE(error.find("cover"), std::string::npos);
  EXPECT_FALSE(BuildRecurrentSchedule({0, 0, 2}, ok.data(), 2, kGpuTile, &s, &error));
  EXPECT_FALSE(BuildRecurrentSchedule({0, 2}, ok.data(), 2, 0, &s, &error));
  EXPECT_NE(error.find("tile"), std::string::npos);
}

}  // namespace
}  // namespace morserve
