// The recurrent-attention kernels (kernels/recurrent_attention.cuh) on the GPU, driven by the
// GPU schedule (engine/runtime/recurrent_schedule.h) wave by wave with each chunk's own entries
// NaN in the cache until their position finishes (a premature read fails the test):
//   - against the double reference: relative error per (row, head) under 1e-2 for bf16 out,
//     1e-4 for fp32 out (kernel README rule);
//   - bit for bit against paged_attention_forward with chunk_len kRecurrentRange (the naive
//     GPU path) on the complete cache: the tiled result is independent of schedule, batch and
//     chunking exactly when this holds;
//   - prompt-sized chunks (up to 1100 positions, not powers of two and powers of two) and
//     decode rows, GQA 1/3/4/5/8, head_dim 64/96/128.
// Skips with "no CUDA device: kernel test skipped" where no sm_90 device is present.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/paged_attention.cuh"
#include "kernels/recurrent_attention.cuh"
#include "tests/gpu/gpu_testutil.h"
#include "tests/gpu/recurrent_attention_problem.h"

namespace morserve::kernels {
namespace {

using namespace ::morserve::kernels::attention_test;  // NOLINT: the shared problem helpers
using namespace ::morserve::kernels::recurrent_test;  // NOLINT
using ::morserve::testing::DeviceBuffer;

class RecurrentAttentionTest : public ::testing::Test {
 protected:
  void SetUp() override { MORSERVE_SKIP_WITHOUT_GPU(); }
};

template <typename T>
std::vector<uint8_t> ToBytes(const std::vector<T>& v) {
  std::vector<uint8_t> b(v.size() * sizeof(T));
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

// Device copies of a problem's inputs (the cache as given).
struct DeviceProblem {
  explicit DeviceProblem(const Problem& p, const std::vector<uint16_t>& k,
                         const std::vector<uint16_t>& v)
      : q(p.q.size()),
        k_cache(k.size()),
        v_cache(v.size()),
        indptr(p.indptr.size()),
        blocks(p.blocks.size()),
        kv_len(p.kv_len.size()),
        extra_k(p.extra_k.size()),
        extra_v(p.extra_v.size()) {
    ok = q.Upload(p.q) == cudaSuccess && k_cache.Upload(k) == cudaSuccess &&
         v_cache.Upload(v) == cudaSuccess && indptr.Upload(p.indptr) == cudaSuccess &&
         blocks.Upload(p.blocks) == cudaSuccess && kv_len.Upload(p.kv_len) == cudaSuccess &&
         extra_k.Upload(p.extra_k) == cudaSuccess && extra_v.Upload(p.extra_v) == cudaSuccess;
  }
  DeviceBuffer<uint16_t> q, k_cache, v_cache;
  DeviceBuffer<int32_t> indptr, blocks, kv_len;
  DeviceBuffer<uint16_t> extra_k, extra_v;
  bool ok = false;

  AttentionInputs Inputs() const {
    return {q.get(),       k_cache.get(), v_cache.get(), extra_k.get(),
            extra_v.get(), indptr.get(),  blocks.get(),  kv_len.get()};
  }
};

// Output of the tiled schedule on the GPU, raw bytes.
std::vector<uint8_t> RunTiled(const Problem& p, const Items& it, DType t) {
  std::vector<uint16_t> k = p.k_cache, v = p.v_cache;
  HideChunkEntries(p, &k, &v);
  DeviceProblem d(p, k, v);
  EXPECT_TRUE(d.ok);
  const size_t esize = t == DType::kBF16 ? 2 : 4;
  DeviceBuffer<float> partials(PartialFloats(p));
  DeviceBuffer<uint8_t> out(static_cast<size_t>(p.rows) * p.q_dim() * esize);
  DeviceBuffer<RecurrentFoldItem> merge(std::max<size_t>(it.merge.size(), 1)),
      finish(it.finish.size());
  EXPECT_EQ(partials.Poison(), cudaSuccess);
  EXPECT_EQ(out.Poison(), cudaSuccess);
  if (!it.merge.empty()) EXPECT_EQ(merge.Upload(it.merge), cudaSuccess);
  EXPECT_EQ(finish.Upload(it.finish), cudaSuccess);
  const RecurrentAttentionParams rp =
      RecurrentLaunchParams(p, d.Inputs(), partials.get(), out.get(), t);
  const size_t kvd = p.kv_dim();
  Backend b;
  b.run = [&](bool fin, int begin, int count) {
    RecurrentAttentionParams q = rp;
    q.items = (fin ? finish.get() : merge.get()) + begin;
    q.num_items = count;
    EXPECT_EQ(fin ? recurrent_attention_finish(q, nullptr) : recurrent_attention_merge(q, nullptr),
              cudaSuccess);
  };
  b.write = [&](size_t slot, const uint16_t* kk, const uint16_t* vv) {
    EXPECT_EQ(cudaMemcpy(d.k_cache.get() + slot * kvd, kk, kvd * 2, cudaMemcpyHostToDevice),
              cudaSuccess);
    EXPECT_EQ(cudaMemcpy(d.v_cache.get() + slot * kvd, vv, kvd * 2, cudaMemcpyHostToDevice),
              cudaSuccess);
  };
  Drive(p, it, b);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<uint8_t> host;
  EXPECT_EQ(out.Download(&host), cudaSuccess);
  return host;
}

std::vector<uint8_t> RunPagedRanges(const Problem& p, DType t) {
  DeviceProblem d(p, p.k_cache, p.v_cache);
  EXPECT_TRUE(d.ok);
  const size_t esize = t == DType::kBF16 ? 2 : 4;
  DeviceBuffer<uint8_t> out(static_cast<size_t>(p.rows) * p.q_dim() * esize);
  EXPECT_EQ(out.Poison(), cudaSuccess);
  PagedAttentionParams pp = PagedRangeParams(p, d.Inputs(), t);
  pp.out = out.get();
  DeviceBuffer<float> ws(
      std::max<size_t>(PagedAttentionWorkspaceFloats(p.rows, p.shape.n_heads, p.shape.head_dim,
                                                     p.max_kv_len, true, pp.chunk_len),
                       1));
  pp.workspace = ws.get();
  EXPECT_EQ(paged_attention_forward(pp, nullptr), cudaSuccess);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<uint8_t> host;
  EXPECT_EQ(out.Download(&host), cudaSuccess);
  return host;
}

void Check(const Shape& shape, const std::vector<RequestSpec>& reqs) {
  const uint64_t seed = ::morserve::testing::FreshSeed();
  SCOPED_TRACE(Describe(shape) + " seed=" + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const Problem p = Build(shape, reqs, rng);
  const Items it = ScheduleItems(p, ChunkIndptr(reqs));
  const std::vector<double> ref = Reference(p);
  for (DType t : {DType::kBF16, DType::kF32}) {
    SCOPED_TRACE(t == DType::kBF16 ? "out=bf16" : "out=f32");
    const std::vector<uint8_t> tiled = RunTiled(p, it, t);
    const std::vector<uint8_t> paged = RunPagedRanges(p, t);
    ASSERT_EQ(tiled.size(), paged.size());
    const size_t row_bytes = tiled.size() / p.rows;
    int differ = 0;
    for (int r = 0; r < p.rows; ++r) {
      if (std::memcmp(tiled.data() + r * row_bytes, paged.data() + r * row_bytes, row_bytes) != 0 &&
          ++differ <= 5) {
        ADD_FAILURE() << "row " << r << " (entry " << p.kv_len[r]
                      << ") differs from paged attention";
      }
    }
    ASSERT_EQ(differ, 0);
    ASSERT_NO_FATAL_FAILURE(ExpectMatches(p, Decode(tiled, t), ref, t));
  }
}

TEST_F(RecurrentAttentionTest, LongPromptsGroup3Hd64) {  // the SmolLM-360M head shape
  ASSERT_NO_FATAL_FAILURE(
      Check({15, 5, 64, 16, 32, true, 1.0f}, {{1100, 1100}, {300, 300}, {513, 1}, {77, 13}}));
}

TEST_F(RecurrentAttentionTest, PowersOfTwoGroup4Hd128) {
  ASSERT_NO_FATAL_FAILURE(
      Check({8, 2, 128, 16, 32, true, 2.0f}, {{1024, 1024}, {256, 128}, {64, 1}}));
}

TEST_F(RecurrentAttentionTest, OffTileChunksGroup1Block5) {
  ASSERT_NO_FATAL_FAILURE(Check({4, 4, 64, 5, 32, true, 1.0f}, {{700, 333}, {41, 41}, {5, 2}}));
}

TEST_F(RecurrentAttentionTest, LargestGroup) {
  ASSERT_NO_FATAL_FAILURE(Check({8, 1, 128, 16, 32, true, 1.0f}, {{200, 150}, {32, 1}}));
}

TEST_F(RecurrentAttentionTest, HeadDim96) {  // Huginn-0125: 55 heads of 96, no GQA
  ASSERT_NO_FATAL_FAILURE(
      Check({55, 55, 96, 16, 32, true, 1.0f}, {{700, 700}, {300, 129}, {513, 1}, {77, 13}}));
  ASSERT_NO_FATAL_FAILURE(Check({10, 2, 96, 5, 32, true, 2.0f}, {{1024, 1024}, {41, 41}, {5, 2}}));
  ASSERT_NO_FATAL_FAILURE(Check({16, 2, 96, 16, 32, true, 1.0f}, {{200, 150}, {32, 1}}));
}

TEST_F(RecurrentAttentionTest, BadParamsAreInvalidValue) {
  RecurrentAttentionParams p;
  p.num_items = 1;
  p.rows = 1;
  p.n_heads = 4;
  p.n_kv_heads = 4;
  p.block_size = 16;
  p.num_blocks = 1;
  p.scale = 1.0f;
  for (int hd : {0, 32, 80, 100, 256}) {  // unsupported: not 64, 96 or 128
    p.head_dim = hd;
    EXPECT_EQ(recurrent_attention_merge(p, nullptr), cudaErrorInvalidValue) << hd;
    EXPECT_EQ(recurrent_attention_finish(p, nullptr), cudaErrorInvalidValue) << hd;
  }
  for (int hd : {64, 96, 128}) {
    p.head_dim = hd;
    EXPECT_EQ(recurrent_attention_merge(p, nullptr), cudaErrorInvalidValue) << hd;  // null ptrs
    p.num_items = 0;
    EXPECT_EQ(recurrent_attention_merge(p, nullptr), cudaSuccess) << hd;  // nothing to launch
    p.num_items = 1;
  }
  p.head_dim = 64;
  p.num_items = 0;
  EXPECT_EQ(recurrent_attention_finish(p, nullptr), cudaSuccess);  // nothing to launch
  p.n_heads = 18;
  p.n_kv_heads = 2;  // group 9
  EXPECT_EQ(recurrent_attention_finish(p, nullptr), cudaErrorInvalidValue);
}

}  // namespace
}  // namespace morserve::kernels
