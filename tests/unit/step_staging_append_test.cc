// AppendStaged (engine/cuda/step_staging.h): a staging appended to another's upload keeps its
// values at rebased, 16-byte aligned offsets, its host-side groups, and leaves the target's
// own arrays untouched (the recurrent GPU layer stages each wave's loop runs this way).
#include <gtest/gtest.h>

#include <vector>

#include "engine/cuda/step_staging.h"

namespace morserve {
namespace {

TEST(StepStagingAppendTest, AppendedStagingIsRebased) {
  std::vector<int32_t> write_slot = {9, 16, 17}, kv_len = {10, 1, 2};
  LayerKvPlan kv;
  kv.write_slot = write_slot;
  kv.table_indptr = {0, 3, 4, 5};
  kv.table_blocks = {7, 1, 2, 4, 4};
  kv.kv_len = kv_len;
  std::vector<int> loops = {0, 1, 1}, positions = {5, 0, 1};
  LayerBatch b;
  b.n = 3;
  b.loops = loops.data();
  b.positions = positions.data();
  b.kv = &kv;
  auto staged = StageLayerBatch(b, /*num_loops=*/2, /*block_size=*/4);
  ASSERT_TRUE(staged.ok()) << staged.status();
  StagedRows s = *staged;
  s.data.push_back(77);  // an odd length: the part must start aligned anyway
  const std::vector<int32_t> before(s.data.begin(), s.data.end());
  const int tail_loops[] = {1, 1, 0, 1};
  const StagedRows part = AppendStaged(StageLoops(tail_loops, 4), &s);
  EXPECT_EQ(part.loops % 4, 0u);
  EXPECT_GE(part.loops, before.size());
  EXPECT_EQ(std::vector<int32_t>(s.data.begin() + part.loops, s.data.begin() + part.loops + 4),
            (std::vector<int32_t>{1, 1, 0, 1}));
  EXPECT_TRUE(part.data.empty());
  ASSERT_EQ(part.groups.size(), 3u);
  EXPECT_EQ(part.groups[2].begin, 3);
  EXPECT_EQ(part.groups[2].loop, 1);
  EXPECT_EQ(std::vector<int32_t>(s.data.begin(), s.data.begin() + before.size()), before);
  // A whole layer staging appended: every array rebased.
  const StagedRows again = AppendStaged(*staged, &s);
  EXPECT_EQ(s.data[again.kv_len], 10);
  EXPECT_EQ(s.data[again.write_slot + 2], 17);
  EXPECT_EQ(s.data[again.table_blocks + 4], 4);
  EXPECT_EQ(s.data[again.table_indptr + 3], 5);
  EXPECT_EQ(s.data[again.positions], 5);
  EXPECT_EQ(again.max_kv_len, 10);
}

}  // namespace
}  // namespace morserve
