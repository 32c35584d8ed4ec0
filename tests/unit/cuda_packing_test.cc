// Host-side logic of the CUDA backend, checked without a GPU: fused bf16 projections (tied,
// untied per loop), LoRA deltas packed as one block-diagonal A/B pair per loop, stacked over
// loops for the segmented LoRA kernels (any rank, no padding), stacked linear routers, and
// the staging of a layer batch's row metadata (with its loop segments) into one int32 array.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>

#include "engine/cuda/step_staging.h"
#include "engine/cuda/weight_packing.h"
#include "tests/engine_harness.h"

namespace morserve {
namespace {

using ::testing::HasSubstr;

std::shared_ptr<const ModelWeights> Model(const std::string& family, testing::TempDir* dir) {
  TinyModelSpec s;
  s.family = family;  // bf16 weights (the default), as the device holds them
  return testing::MakeModel(s, dir);
}

// The sum of the parts' LoRA ranks (0 when none has LoRA).
int PartsRank(const LayerWeights& lw, std::initializer_list<Proj> parts) {
  int rank = 0;
  for (Proj p : parts) {
    if (!lw.P(p).lora.empty()) rank += static_cast<int>(lw.P(p).lora[0].a.shape[0]);
  }
  return rank;
}

// y = x W^T (+ scale B A x) for one loop, straight from the checkpoint's tensors, in double.
std::vector<double> DirectForward(const LayerWeights& lw, std::initializer_list<Proj> parts,
                                  int loop, const std::vector<float>& x) {
  std::vector<double> y;
  for (Proj p : parts) {
    const LoopTensor& t = lw.P(p);
    const std::vector<float> w = t.At(loop).ToF32Vector();
    const int out = static_cast<int>(t.At(loop).shape[0]),
              in = static_cast<int>(t.At(loop).shape[1]);
    for (int j = 0; j < out; ++j) {
      double s = 0;
      for (int c = 0; c < in; ++c) s += static_cast<double>(w[j * in + c]) * x[c];
      if (!t.lora.empty()) {
        const LoraDelta& d = t.lora[loop];
        const std::vector<float> a = d.a.ToF32Vector(), b = d.b.ToF32Vector();
        const int rank = static_cast<int>(d.a.shape[0]);
        for (int i = 0; i < rank; ++i) {
          double ax = 0;
          for (int c = 0; c < in; ++c) ax += static_cast<double>(a[i * in + c]) * x[c];
          s += static_cast<double>(d.scale) * b[j * rank + i] * ax;
        }
      }
      y.push_back(s);
    }
  }
  return y;
}

void ExpectPackedMatchesDirect(const ModelWeights& w, std::initializer_list<Proj> parts,
                               bool want_lora) {
  bool saw_lora = false;
  for (const Segment& seg : w.plan.segments) {
    for (int k = 0; k < seg.num_layers; ++k) {
      const LayerWeights& lw = w.layers[seg.first_layer_slot + k];
      const PackedLinear p = PackFusedLinear(lw, parts, seg.loops);
      // Stacked over loops, rank unpadded: [loops, rank, in] and [loops, out, rank].
      EXPECT_EQ(p.lora_rank, PartsRank(lw, parts));
      if (p.lora_rank > 0) {
        EXPECT_EQ(p.lora_loops, seg.loops);
        EXPECT_EQ(p.lora_a.size(), static_cast<size_t>(seg.loops) * p.lora_rank * p.in);
        EXPECT_EQ(p.lora_b.size(), static_cast<size_t>(seg.loops) * p.out * p.lora_rank);
      }
      saw_lora |= p.lora_rank > 0;
      std::vector<float> x(p.in);
      for (int c = 0; c < p.in; ++c) x[c] = std::sin(0.37 * c + seg.first_layer_slot + k);
      for (int loop = 0; loop < seg.loops; ++loop) {
        const std::vector<double> got = PackedLinearForwardHost(p, loop, x, 1);
        const std::vector<double> want = DirectForward(lw, parts, loop, x);
        ASSERT_EQ(got.size(), want.size());
        for (size_t j = 0; j < got.size(); ++j) {
          ASSERT_NEAR(got[j], want[j], 1e-9 + 1e-6 * std::abs(want[j]))
              << "layer " << k << " loop " << loop << " out " << j;
        }
      }
    }
  }
  EXPECT_EQ(saw_lora, want_lora);
}

TEST(CudaPackingTest, RelaxedLoraFoldsIntoOneGemmPairPerLoop) {
  testing::TempDir dir;
  auto w = Model("relaxed-lora", &dir);
  ASSERT_NE(w, nullptr);
  ExpectPackedMatchesDirect(*w, {Proj::kQ, Proj::kK, Proj::kV},
                            /*want_lora=*/true);  // q, v targets
  ExpectPackedMatchesDirect(*w, {Proj::kGate, Proj::kUp}, /*want_lora=*/false);
}

// Rank 13 on every projection: fused ranks 39 (q|k|v) and 26 (gate|up), not multiples of 8.
TEST(CudaPackingTest, OddRankLoraOnEveryProjectionStacksUnpadded) {
  testing::TempDir dir;
  TinyModelSpec s;
  s.family = "relaxed-lora";
  s.lora_rank = 13;
  s.lora_targets = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
  auto w = testing::MakeModel(s, &dir);
  ASSERT_NE(w, nullptr);
  const int looped = w->plan.looped_segment;
  ASSERT_GE(looped, 0);
  const Segment& seg = w->plan.segments[looped];
  const LayerWeights& lw = w->layers[seg.first_layer_slot];
  EXPECT_EQ(PackFusedLinear(lw, {Proj::kQ, Proj::kK, Proj::kV}, seg.loops).lora_rank, 39);
  EXPECT_EQ(PackFusedLinear(lw, {Proj::kGate, Proj::kUp}, seg.loops).lora_rank, 26);
  ExpectPackedMatchesDirect(*w, {Proj::kQ, Proj::kK, Proj::kV}, true);
  ExpectPackedMatchesDirect(*w, {Proj::kO}, true);
  ExpectPackedMatchesDirect(*w, {Proj::kGate, Proj::kUp}, true);
  ExpectPackedMatchesDirect(*w, {Proj::kDown}, true);
}

TEST(CudaPackingTest, UntiedCopiesGetOneVariantPerLoop) {
  testing::TempDir dir;
  auto w = Model("recursive-untied-attn", &dir);
  ASSERT_NE(w, nullptr);
  bool saw_untied = false;
  for (const Segment& seg : w->plan.segments) {
    const LayerWeights& lw = w->layers[seg.first_layer_slot];
    const PackedLinear p = PackFusedLinear(lw, {Proj::kQ, Proj::kK, Proj::kV}, seg.loops);
    if (lw.P(Proj::kQ).untied()) {
      saw_untied = true;
      EXPECT_EQ(static_cast<int>(p.variants.size()), seg.loops);
      // Loop r's block of rows is q_r | k_r | v_r, bit for bit.
      for (int r = 0; r < seg.loops; ++r) {
        std::vector<uint16_t> want;
        for (Proj q : {Proj::kQ, Proj::kK, Proj::kV}) {
          const auto part = ToBf16Bits(lw.P(q).At(r));
          want.insert(want.end(), part.begin(), part.end());
        }
        EXPECT_EQ(p.At(r), want) << "loop " << r;
      }
    } else {
      EXPECT_EQ(p.variants.size(), 1u);
    }
  }
  EXPECT_TRUE(saw_untied);
  ExpectPackedMatchesDirect(*w, {Proj::kQ, Proj::kK, Proj::kV}, false);
  ExpectPackedMatchesDirect(*w, {Proj::kO}, false);
  ExpectPackedMatchesDirect(*w, {Proj::kDown}, false);
}

TEST(CudaPackingTest, ToBf16BitsRoundsFp32ToNearestEven) {
  std::vector<float> v = {1.0f, 1.00390625f /* halfway: rounds to even 1.0 */,
                          1.01171875f /* halfway: up */, -2.5f};
  TensorView t;
  t.dtype = DType::kF32;
  t.shape = {4};
  t.data = v.data();
  const std::vector<uint16_t> b = ToBf16Bits(t);
  EXPECT_EQ(b, (std::vector<uint16_t>{0x3f80, 0x3f80, 0x3f82, 0xc020}));
}

TEST(CudaPackingTest, LinearRoutersStackPerLoop) {
  testing::TempDir dir;
  auto w = Model("mor-ec", &dir);
  ASSERT_NE(w, nullptr);
  const int hs = w->config.hidden_size;
  const std::vector<float> s = StackLinearRouters(w->router.expert, hs);
  ASSERT_EQ(s.size(), w->router.expert.size() * hs);
  for (size_t r = 0; r < w->router.expert.size(); ++r) {
    const std::vector<float> row = w->router.expert[r].w1.ToF32Vector();
    EXPECT_TRUE(std::equal(row.begin(), row.end(), s.begin() + r * hs)) << "loop " << r;
  }
}

TEST(CudaStagingTest, LoopGroupsAreContiguousRuns) {
  const int loops[] = {0, 0, 2, 2, 2, 1, 0};
  const std::vector<LoopGroup> g = LoopGroups(loops, 7);
  ASSERT_EQ(g.size(), 4u);
  EXPECT_EQ(g[1].loop, 2);
  EXPECT_EQ(g[1].begin, 2);
  EXPECT_EQ(g[1].count, 3);
  EXPECT_EQ(g[3].begin, 6);
  EXPECT_TRUE(LoopGroups(loops, 0).empty());
  EXPECT_EQ(LoopGroups(nullptr, 5).size(), 1u);
}

struct Batch {
  LayerKvPlan kv;
  std::vector<int> loops, positions;
  std::vector<float> h;
  LayerBatch b;
};

Batch ThreeRows() {
  Batch t;
  t.loops = {0, 1, 1};
  t.positions = {5, 0, 1};
  t.kv.write_slot = {9, 16, 17};
  t.kv.table_indptr = {0, 3, 4, 5};
  t.kv.table_blocks = {7, 1, 2, 4, 4};
  t.kv.kv_len = {10, 1, 2};
  t.b.n = 3;
  return t;
}

// Points t.b at t's own arrays (after any copy of t).
const LayerBatch& Bind(Batch& t) {
  t.b.loops = t.loops.data();
  t.b.positions = t.positions.data();
  t.b.h = t.h.empty() ? nullptr : t.h.data();
  t.b.kv = &t.kv;
  return t.b;
}

TEST(CudaStagingTest, LayerBatchIsOneAlignedArray) {
  Batch t = ThreeRows();
  auto s = StageLayerBatch(Bind(t), /*num_loops=*/2, /*block_size=*/4);
  ASSERT_TRUE(s.ok()) << s.status();
  auto at = [&](size_t off, size_t n) {
    return std::vector<int32_t>(s->data.begin() + off, s->data.begin() + off + n);
  };
  for (size_t off :
       {s->loops, s->positions, s->write_slot, s->table_indptr, s->table_blocks, s->kv_len}) {
    EXPECT_EQ(off % 4, 0u);  // 16-byte aligned on the device
  }
  EXPECT_EQ(at(s->loops, 3), (std::vector<int32_t>{0, 1, 1}));
  EXPECT_EQ(at(s->positions, 3), (std::vector<int32_t>{5, 0, 1}));
  EXPECT_EQ(at(s->write_slot, 3), (std::vector<int32_t>{9, 16, 17}));
  EXPECT_EQ(at(s->table_indptr, 4), (std::vector<int32_t>{0, 3, 4, 5}));
  EXPECT_EQ(at(s->table_blocks, 5), (std::vector<int32_t>{7, 1, 2, 4, 4}));
  EXPECT_EQ(at(s->kv_len, 3), (std::vector<int32_t>{10, 1, 2}));
  EXPECT_EQ(s->max_kv_len, 10);
  ASSERT_EQ(s->groups.size(), 2u);
  EXPECT_EQ(s->groups[1].begin, 1);
  EXPECT_EQ(s->groups[1].count, 2);
  // The groups again as the LoRA kernels' segments: row bounds and loops.
  EXPECT_EQ(s->seg_indptr % 4, 0u);
  EXPECT_EQ(s->seg_loop % 4, 0u);
  EXPECT_EQ(at(s->seg_indptr, 3), (std::vector<int32_t>{0, 1, 3}));
  EXPECT_EQ(at(s->seg_loop, 2), (std::vector<int32_t>{0, 1}));
}

// A captured pass's layout (StagePaddedLayerBatch): padded to 8 rows and a table of 16
// blocks, a batch of 3 rows and one of 2 (different tables) put every array at the same
// offsets; the padding rows join the last loop group, write nothing and see nothing.
TEST(CudaStagingTest, PaddedLayerBatchHasAFixedLayout) {
  Batch three = ThreeRows();
  auto s = StagePaddedLayerBatch(Bind(three), 2, 4, /*rows=*/8, /*table_capacity=*/16);
  ASSERT_TRUE(s.ok()) << s.status();
  Batch two = ThreeRows();
  two.loops = {1, 1};
  two.positions = {3, 4};
  two.kv.write_slot = {20, 21};
  two.kv.table_indptr = {0, 2, 4};
  two.kv.table_blocks = {5, 6, 5, 6};
  two.kv.kv_len = {7, 8};
  two.b.n = 2;
  auto t = StagePaddedLayerBatch(Bind(two), 2, 4, 8, 16);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(s->data.size(), t->data.size());
  for (auto field : {&StagedRows::loops, &StagedRows::positions, &StagedRows::write_slot,
                     &StagedRows::table_indptr, &StagedRows::table_blocks, &StagedRows::kv_len,
                     &StagedRows::seg_indptr, &StagedRows::seg_loop}) {
    EXPECT_EQ((*s).*field, (*t).*field);
  }
  auto at = [&](size_t off, size_t n) {
    return std::vector<int32_t>(s->data.begin() + off, s->data.begin() + off + n);
  };
  EXPECT_EQ(at(s->loops, 8), (std::vector<int32_t>{0, 1, 1, 1, 1, 1, 1, 1}));
  EXPECT_EQ(at(s->positions, 8), (std::vector<int32_t>{5, 0, 1, 0, 0, 0, 0, 0}));
  EXPECT_EQ(at(s->write_slot, 8), (std::vector<int32_t>{9, 16, 17, -1, -1, -1, -1, -1}));
  EXPECT_EQ(at(s->table_indptr, 9), (std::vector<int32_t>{0, 3, 4, 5, 5, 5, 5, 5, 5}));
  EXPECT_EQ(at(s->table_blocks, 16),
            (std::vector<int32_t>{7, 1, 2, 4, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}));
  EXPECT_EQ(at(s->kv_len, 8), (std::vector<int32_t>{10, 1, 2, 0, 0, 0, 0, 0}));
  EXPECT_EQ(s->max_kv_len, 10);
  ASSERT_EQ(s->groups.size(), 2u);  // the padding rows joined loop 1's group
  EXPECT_EQ(s->groups[1].count, 7);
  ASSERT_EQ(t->groups.size(), 1u);
  EXPECT_EQ(t->groups[0].count, 8);
  // More rows than the bucket, or more blocks than the capacity: errors.
  EXPECT_FALSE(StagePaddedLayerBatch(Bind(three), 2, 4, 2, 16).ok());
  auto small = StagePaddedLayerBatch(Bind(three), 2, 4, 8, 4);
  ASSERT_FALSE(small.ok());
  EXPECT_THAT(std::string(small.status().message()), HasSubstr("5 table blocks beyond 4"));
}

TEST(CudaStagingTest, BadPlansAreErrors) {
  {
    Batch t = ThreeRows();
    t.kv.kv_len[0] = 13;  // 3 blocks of 4 hold 12
    auto s = StageLayerBatch(Bind(t), 2, 4);
    ASSERT_FALSE(s.ok());
    EXPECT_THAT(std::string(s.status().message()), HasSubstr("kv_len 13 beyond its 3 blocks"));
  }
  {
    Batch t = ThreeRows();
    t.loops[2] = 2;
    auto s = StageLayerBatch(Bind(t), 2, 4);
    ASSERT_FALSE(s.ok());
    EXPECT_THAT(std::string(s.status().message()), HasSubstr("outside [0, 2)"));
  }
  {
    Batch t = ThreeRows();
    t.kv.write_slot.pop_back();
    EXPECT_FALSE(StageLayerBatch(Bind(t), 2, 4).ok());
  }
  {
    Batch t = ThreeRows();
    t.kv.table_indptr = {0, 3, 2, 5};
    EXPECT_FALSE(StageLayerBatch(Bind(t), 2, 4).ok());
  }
  {
    Batch t = ThreeRows();
    t.kv.table_indptr.back() = 4;
    EXPECT_FALSE(StageLayerBatch(Bind(t), 2, 4).ok());
  }
}

TEST(CudaStagingTest, RecurrentChunksRunOnePositionPerWave) {
  // Chunks: rows 0-2 (one request's prefill), row 3 (decode), rows 4-5.
  const std::vector<std::vector<int>> w = RecurrentWaves({0, 3, 4, 6}, 6);
  ASSERT_EQ(w.size(), 3u);
  EXPECT_EQ(w[0], (std::vector<int>{0, 3, 4}));
  EXPECT_EQ(w[1], (std::vector<int>{1, 5}));
  EXPECT_EQ(w[2], (std::vector<int>{2}));
  const std::vector<std::vector<int>> one = RecurrentWaves({}, 3);
  ASSERT_EQ(one.size(), 1u);
  EXPECT_EQ(one[0], (std::vector<int>{0, 1, 2}));
  EXPECT_TRUE(RecurrentWaves({}, 0).empty());
}

TEST(CudaStagingTest, SubBatchCopiesRowsAndRebasesTables) {
  Batch t = ThreeRows();
  t.kv.recurrent = true;
  t.h = {0, 1, 10, 11, 20, 21};  // hidden 2
  SubBatch sub;
  MakeSubBatch(Bind(t), {2, 0}, 2, &sub);
  EXPECT_EQ(sub.b.n, 2);
  EXPECT_TRUE(sub.kv.recurrent);
  EXPECT_EQ(sub.loops, (std::vector<int>{1, 0}));
  EXPECT_EQ(sub.positions, (std::vector<int>{1, 5}));
  EXPECT_EQ(sub.h, (std::vector<float>{20, 21, 0, 1}));
  EXPECT_EQ(sub.kv.write_slot, (std::vector<int32_t>{17, 9}));
  EXPECT_EQ(sub.kv.kv_len, (std::vector<int32_t>{2, 10}));
  EXPECT_EQ(sub.kv.table_indptr, (std::vector<int32_t>{0, 1, 4}));
  EXPECT_EQ(sub.kv.table_blocks, (std::vector<int32_t>{4, 7, 1, 2}));
  auto staged = StageLayerBatch(sub.b, 2, 4);
  EXPECT_TRUE(staged.ok()) << staged.status();
  sub.h = {-20, -21, -1, -2};
  ScatterSubBatch(sub, {2, 0}, 2, t.h.data());
  EXPECT_EQ(t.h, (std::vector<float>{-1, -2, 10, 11, -20, -21}));
}

}  // namespace
}  // namespace morserve
