// paged_attention_forward against a CPU reference in double, on fresh random inputs (the seed
// is in every failure message): random block tables over a shuffled pool, prefill chunks
// (many rows of one request, kv_len growing by one per row) mixed with decode rows, GQA
// groups 1, 3, 4, 5 and 8, head_dim 64, 96 and 128, block sizes that do and do not divide the tile,
// contexts up to several thousand tokens (several split-KV chunks), kv_len 0, the optional
// extra pair, bf16 and fp32 output. Every cache slot no row may read holds NaN, and outputs
// and the workspace are poisoned, so a stray read or a missed write fails.
//
// Tolerance per (row, head): ||got - ref|| / ||ref|| < 1e-2 for bf16 output, 1e-4 for fp32;
// a row that sees nothing must be exactly zero. Batch invariance is checked bitwise: every
// row launched alone (own table, own max_kv_len, own workspace) equals its row in the batch.
// Every case runs with both folds (AttentionFold::kCta and kWarp).
#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include "engine/model/dtype.h"
#include "kernels/paged_attention.cuh"
#include "tests/gpu/gpu_testutil.h"
#include "tests/gpu/paged_attention_problem.h"

namespace morserve::kernels {
namespace {

using ::morserve::testing::DeviceBuffer;
using ::morserve::testing::FreshSeed;
using namespace ::morserve::kernels::attention_test;  // NOLINT: the shared problem helpers

// The problem on the device; Run() launches it (or a one-row slice of it).
class DeviceProblem {
 public:
  explicit DeviceProblem(const Problem& p)
      : p_(p),
        q_(p.q.size()),
        k_(p.k_cache.size()),
        v_(p.v_cache.size()),
        ek_(p.extra_k.size()),
        ev_(p.extra_v.size()),
        indptr_(p.indptr.size()),
        blocks_(p.blocks.size()),
        kv_len_(p.kv_len.size()) {}

  void Upload() {
    ASSERT_TRUE(q_.ok() && k_.ok() && v_.ok() && ek_.ok() && ev_.ok() && indptr_.ok() &&
                blocks_.ok() && kv_len_.ok());
    MORSERVE_CUDA_OK(q_.Upload(p_.q));
    MORSERVE_CUDA_OK(k_.Upload(p_.k_cache));
    MORSERVE_CUDA_OK(v_.Upload(p_.v_cache));
    if (p_.shape.extra) {
      MORSERVE_CUDA_OK(ek_.Upload(p_.extra_k));
      MORSERVE_CUDA_OK(ev_.Upload(p_.extra_v));
    }
    MORSERVE_CUDA_OK(indptr_.Upload(p_.indptr));
    MORSERVE_CUDA_OK(blocks_.Upload(p_.blocks));
    MORSERVE_CUDA_OK(kv_len_.Upload(p_.kv_len));
  }

  PagedAttentionParams Params(DType out_dtype) const {
    const AttentionInputs in = {q_.get(),  k_.get(),      v_.get(),      ek_.get(),
                                ev_.get(), indptr_.get(), blocks_.get(), kv_len_.get()};
    return LaunchParams(p_, in, out_dtype);
  }

  // Launches `a` with poisoned output and workspace; returns the output as raw bytes.
  static void Launch(PagedAttentionParams a, size_t out_elems, std::vector<uint8_t>* raw) {
    const size_t esize = a.out_dtype == DType::kBF16 ? 2 : 4;
    DeviceBuffer<uint8_t> out(out_elems * esize);
    const size_t ws_floats = PagedAttentionWorkspaceFloats(
        a.rows, a.n_heads, a.head_dim, a.max_kv_len, a.extra_k != nullptr, a.chunk_len);
    DeviceBuffer<float> ws(ws_floats);
    ASSERT_TRUE(out.ok() && ws.ok());
    MORSERVE_CUDA_OK(out.Poison());
    if (ws_floats > 0) MORSERVE_CUDA_OK(ws.Poison());
    a.out = out.get();
    a.workspace = ws.get();
    MORSERVE_CUDA_OK(paged_attention_forward(a, nullptr));
    MORSERVE_CUDA_OK(cudaGetLastError());
    MORSERVE_CUDA_OK(cudaDeviceSynchronize());
    MORSERVE_CUDA_OK(out.Download(raw));
  }

  // Row r alone: its q, its own table (RowTableOf), kv_len, extra pair, max_kv_len.
  void LaunchRow(int r, DType out_dtype, std::vector<uint8_t>* raw) {
    const RowTable table = RowTableOf(p_, r);
    DeviceBuffer<int32_t> dtable(table.blocks.size()), dindptr(2), dlen(1);
    ASSERT_TRUE(dtable.ok() && dindptr.ok() && dlen.ok());
    MORSERVE_CUDA_OK(dtable.Upload(table.blocks));
    MORSERVE_CUDA_OK(dindptr.Upload(table.indptr));
    MORSERVE_CUDA_OK(dlen.Upload(table.kv_len));
    PagedAttentionParams a = RowParams(p_, Params(out_dtype), r);
    a.table_indptr = dindptr.get();
    a.table_blocks = dtable.get();
    a.kv_len = dlen.get();
    ASSERT_NO_FATAL_FAILURE(Launch(a, p_.q_dim(), raw));
  }

  DeviceBuffer<int32_t>& kv_len() { return kv_len_; }
  DeviceBuffer<int32_t>& blocks() { return blocks_; }

 private:
  const Problem& p_;
  DeviceBuffer<uint16_t> q_, k_, v_, ek_, ev_;
  DeviceBuffer<int32_t> indptr_, blocks_, kv_len_;
};

class PagedAttentionTest : public ::testing::Test {
 protected:
  void SetUp() override { MORSERVE_SKIP_WITHOUT_GPU(); }

  // RunFold with each fold (AttentionFold: the CTA on one tile at a time, per-warp keys).
  void Run(const Shape& shape, const std::vector<RequestSpec>& requests) {
    for (AttentionFold fold : {AttentionFold::kCta, AttentionFold::kWarp}) {
      ASSERT_NO_FATAL_FAILURE(RunFold(WithFold(shape, fold), requests));
    }
  }

  // Builds, runs (bf16 and fp32 out), compares with the reference, checks batch invariance.
  void RunFold(const Shape& shape, const std::vector<RequestSpec>& requests) {
    const uint64_t seed = FreshSeed();
    SCOPED_TRACE(Describe(shape) + " seed=" + std::to_string(seed));
    std::mt19937_64 rng(seed);
    const Problem p = Build(shape, requests, rng);
    const std::vector<double> ref = Reference(p);
    DeviceProblem dev(p);
    ASSERT_NO_FATAL_FAILURE(dev.Upload());
    for (DType t : {DType::kBF16, DType::kF32}) {
      SCOPED_TRACE(t == DType::kBF16 ? "out=bf16" : "out=f32");
      std::vector<uint8_t> raw;
      ASSERT_NO_FATAL_FAILURE(
          DeviceProblem::Launch(dev.Params(t), static_cast<size_t>(p.rows) * p.q_dim(), &raw));
      ASSERT_NO_FATAL_FAILURE(ExpectMatches(p, Decode(raw, t), ref, t));
      for (int r = 0; r < p.rows; ++r) {
        std::vector<uint8_t> alone;
        ASSERT_NO_FATAL_FAILURE(dev.LaunchRow(r, t, &alone));
        ASSERT_NO_FATAL_FAILURE(ExpectRowMatchesBatch(p, r, alone, raw));
      }
    }
  }

  // Faulty metadata (a kv_len beyond the row's table, a block id outside the pool) fills only
  // the faulty row with NaN; the others stay correct.
  void CheckFaultyRowsBecomeNan(int hd, AttentionFold fold);
  void CheckCapturedInGraph(AttentionFold fold);
};

// Decode rows, a long-ish decode, a prefill chunk in the middle of a prompt, a prompt's first
// chunk (kv_len 1..40) and a row that sees nothing.
const std::vector<RequestSpec> kMixed = {{1, 1},   {17, 1}, {700, 1}, {300, 24},
                                         {40, 40}, {0, 1},  {129, 1}};

TEST_F(PagedAttentionTest, MixedPrefillAndDecodeHeadDim64) {
  // SmolLM-360M (15/5: group 3), SmolLM-135M (9/3), group 1; block sizes 16 and 7.
  for (int block : {16, 7}) {
    ASSERT_NO_FATAL_FAILURE(Run({15, 5, 64, block, 256, false, 1.0f}, kMixed));
    ASSERT_NO_FATAL_FAILURE(Run({9, 3, 64, block, 64, false, 3.0f}, kMixed));
    ASSERT_NO_FATAL_FAILURE(Run({4, 4, 64, block, 32, false, 1.0f}, kMixed));
  }
}

TEST_F(PagedAttentionTest, MixedPrefillAndDecodeHeadDim128) {
  // Llama-3.2-1B-like group 4, group 3, group 1, group 8 (the largest); block sizes 32 and 5.
  for (int block : {32, 5}) {
    ASSERT_NO_FATAL_FAILURE(Run({16, 4, 128, block, 256, false, 1.0f}, kMixed));
    ASSERT_NO_FATAL_FAILURE(Run({6, 2, 128, block, 96, false, 3.0f}, kMixed));
    ASSERT_NO_FATAL_FAILURE(Run({2, 2, 128, block, 32, false, 1.0f}, kMixed));
    ASSERT_NO_FATAL_FAILURE(Run({16, 2, 128, block, 64, false, 1.0f}, kMixed));  // group 8
  }
}

TEST_F(PagedAttentionTest, MixedPrefillAndDecodeHeadDim96) {
  // Huginn-0125 (55 heads of 96, no GQA), group 5, group 8 (the largest); block sizes 16 and 7;
  // chunk 96 (three tiles) and 32 split the longer rows into many chunks.
  for (int block : {16, 7}) {
    ASSERT_NO_FATAL_FAILURE(Run({55, 55, 96, block, 256, false, 1.0f}, kMixed));
    ASSERT_NO_FATAL_FAILURE(Run({10, 2, 96, block, 96, false, 3.0f}, kMixed));
    ASSERT_NO_FATAL_FAILURE(Run({16, 2, 96, block, 32, false, 1.0f}, kMixed));
  }
}

TEST_F(PagedAttentionTest, KvLenZeroRowsGetZeros) {
  // {0, 1}: a row with kv_len 0 and an empty table (first, middle and last row).
  ASSERT_NO_FATAL_FAILURE(Run({15, 5, 64, 16, 256, false, 1.0f}, {{0, 1}, {1, 1}, {0, 1}}));
  ASSERT_NO_FATAL_FAILURE(Run({8, 2, 128, 16, 64, false, 1.0f}, {{0, 1}, {5, 2}, {0, 1}}));
  ASSERT_NO_FATAL_FAILURE(Run({6, 3, 96, 16, 64, false, 1.0f}, {{0, 1}, {5, 2}, {0, 1}}));
}

TEST_F(PagedAttentionTest, ExtraPairOfRecurrentLayers) {
  // kv_len context - rows + j entries plus the row's own temporary pair; the first token of a
  // prompt (context 1, one row) sees only its extra pair.
  const std::vector<RequestSpec> reqs = {{1, 1}, {2, 2}, {33, 1}, {300, 20}, {600, 1}};
  ASSERT_NO_FATAL_FAILURE(Run({15, 5, 64, 16, 256, true, 1.0f}, reqs));
  ASSERT_NO_FATAL_FAILURE(Run({12, 4, 128, 7, 32, true, 2.0f}, reqs));
  ASSERT_NO_FATAL_FAILURE(Run({3, 3, 64, 16, 32, true, 1.0f}, {{32, 1}, {64, 2}}));  // chunk edges
  ASSERT_NO_FATAL_FAILURE(Run({55, 55, 96, 16, 256, true, 1.0f}, reqs));             // Huginn-0125
  ASSERT_NO_FATAL_FAILURE(Run({8, 2, 96, 5, 32, true, 2.0f}, reqs));
}

TEST_F(PagedAttentionTest, LongContexts) {
  // Several thousand tokens: many split-KV chunks merged by the combine kernel.
  const std::vector<RequestSpec> reqs = {{3000, 1}, {4100, 1}, {5000, 1}, {4096, 16}, {2, 1}};
  ASSERT_NO_FATAL_FAILURE(Run({15, 5, 64, 16, 256, false, 1.0f}, reqs));
  ASSERT_NO_FATAL_FAILURE(Run({32, 8, 128, 32, 512, false, 4.0f}, reqs));
  ASSERT_NO_FATAL_FAILURE(Run({9, 3, 64, 13, 256, true, 1.0f}, {{4500, 2}, {10, 1}}));
  ASSERT_NO_FATAL_FAILURE(Run({12, 3, 96, 16, 256, false, 2.0f}, reqs));
  ASSERT_NO_FATAL_FAILURE(Run({55, 55, 96, 16, 512, true, 1.0f}, {{4500, 2}, {10, 1}}));
}

// The launch captured in a CUDA graph (fixed buffers, metadata in device memory) equals a
// direct launch, also after the metadata in those buffers changes between replays (every
// kv_len shorter), which is how the engine replays one graph per batch size.
TEST_F(PagedAttentionTest, CapturedInGraphMatchesDirectLaunch) {
  for (AttentionFold fold : {AttentionFold::kCta, AttentionFold::kWarp}) {
    ASSERT_NO_FATAL_FAILURE(CheckCapturedInGraph(fold));
  }
}

void PagedAttentionTest::CheckCapturedInGraph(AttentionFold fold) {
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE("seed=" + std::to_string(seed) +
               (fold == AttentionFold::kWarp ? " fold=warp" : " fold=cta"));
  std::mt19937_64 rng(seed);
  Problem p =
      Build({15, 5, 64, 16, 64, false, 1.0f, fold}, {{300, 3}, {90, 1}, {1, 1}, {700, 2}}, rng);
  DeviceProblem dev(p);
  ASSERT_NO_FATAL_FAILURE(dev.Upload());
  const size_t out_elems = static_cast<size_t>(p.rows) * p.q_dim();
  DeviceBuffer<uint16_t> out(out_elems);
  DeviceBuffer<float> ws(PagedAttentionWorkspaceFloats(p.rows, p.shape.n_heads, p.shape.head_dim,
                                                       p.max_kv_len, false, p.shape.chunk_len));
  ASSERT_TRUE(out.ok() && ws.ok());
  PagedAttentionParams a = dev.Params(DType::kBF16);
  a.out = out.get();
  a.workspace = ws.get();
  cudaStream_t stream;
  MORSERVE_CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  MORSERVE_CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  const cudaError_t launch = paged_attention_forward(a, stream);
  MORSERVE_CUDA_OK(cudaStreamEndCapture(stream, &graph));
  MORSERVE_CUDA_OK(launch);
  MORSERVE_CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));

  for (int round = 0; round < 2; ++round) {
    if (round == 1) {  // new metadata in the same buffers
      for (int32_t& len : p.kv_len) len = std::max(0, len - 1 - static_cast<int>(rng() % 5));
      MORSERVE_CUDA_OK(cudaMemcpyAsync(dev.kv_len().get(), p.kv_len.data(), p.kv_len.size() * 4,
                                       cudaMemcpyHostToDevice, stream));
    }
    MORSERVE_CUDA_OK(out.Poison());
    MORSERVE_CUDA_OK(cudaGraphLaunch(exec, stream));
    MORSERVE_CUDA_OK(cudaStreamSynchronize(stream));
    std::vector<uint16_t> from_graph;
    MORSERVE_CUDA_OK(out.Download(&from_graph));
    std::vector<uint8_t> direct;
    ASSERT_NO_FATAL_FAILURE(DeviceProblem::Launch(dev.Params(DType::kBF16), out_elems, &direct));
    ASSERT_EQ(0, std::memcmp(direct.data(), from_graph.data(), direct.size())) << "round " << round;
    const std::vector<double> ref = Reference(p);
    ASSERT_NO_FATAL_FAILURE(ExpectMatches(p, Decode(direct, DType::kBF16), ref, DType::kBF16));
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

TEST_F(PagedAttentionTest, FaultyRowsBecomeNan) {
  for (int hd : {64, 96}) {
    for (AttentionFold fold : {AttentionFold::kCta, AttentionFold::kWarp}) {
      SCOPED_TRACE("head_dim=" + std::to_string(hd));
      ASSERT_NO_FATAL_FAILURE(CheckFaultyRowsBecomeNan(hd, fold));
    }
  }
}

void PagedAttentionTest::CheckFaultyRowsBecomeNan(int hd, AttentionFold fold) {
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE("seed=" + std::to_string(seed) +
               (fold == AttentionFold::kWarp ? " fold=warp" : " fold=cta"));
  std::mt19937_64 rng(seed);
  Problem p =
      Build({15, 5, hd, 16, 64, false, 1.0f, fold}, {{100, 1}, {50, 1}, {300, 1}, {20, 1}}, rng);
  const std::vector<double> ref = Reference(p);
  p.kv_len[1] = (p.indptr[2] - p.indptr[1]) * 16 + 1;  // beyond the row's table
  p.max_kv_len = std::max(p.max_kv_len, p.kv_len[1]);
  p.blocks[p.indptr[2] + 2] = p.num_blocks;  // row 2 reads a block id outside the pool
  DeviceProblem dev(p);
  ASSERT_NO_FATAL_FAILURE(dev.Upload());
  for (DType t : {DType::kBF16, DType::kF32}) {
    std::vector<uint8_t> raw;
    ASSERT_NO_FATAL_FAILURE(
        DeviceProblem::Launch(dev.Params(t), static_cast<size_t>(p.rows) * p.q_dim(), &raw));
    const std::vector<float> got = Decode(raw, t);
    for (int r : {1, 2}) {
      for (int i = 0; i < p.q_dim(); ++i) {
        ASSERT_TRUE(std::isnan(got[static_cast<size_t>(r) * p.q_dim() + i]))
            << "row " << r << " element " << i;
      }
    }
    ASSERT_NO_FATAL_FAILURE(ExpectMatches(p, got, ref, t, {1, 2}));
  }
}

// Validation happens on the host before any launch, so it runs without a device too.
TEST(PagedAttentionParamsTest, RejectsBadParams) {
  PagedAttentionParams p;
  p.n_heads = 15;
  p.n_kv_heads = 5;
  p.head_dim = 64;
  p.block_size = 16;
  p.num_blocks = 4;
  p.scale = 0.125f;
  EXPECT_EQ(paged_attention_forward(p, nullptr), cudaSuccess);  // rows 0: nothing to do
  PagedAttentionParams bad = p;
  for (int hd : {0, 32, 80, 100, 256}) {  // not 64, 96 or 128
    bad.head_dim = hd;
    EXPECT_EQ(paged_attention_forward(bad, nullptr), cudaErrorInvalidValue) << hd;
  }
  for (int hd : {64, 96, 128}) {
    bad.head_dim = hd;
    EXPECT_EQ(paged_attention_forward(bad, nullptr), cudaSuccess) << hd;  // rows 0
  }
  bad = p;
  bad.n_kv_heads = 4;  // does not divide 15
  EXPECT_EQ(paged_attention_forward(bad, nullptr), cudaErrorInvalidValue);
  bad = p;
  bad.n_heads = 45;  // group 9 > kAttentionMaxGroup
  EXPECT_EQ(paged_attention_forward(bad, nullptr), cudaErrorInvalidValue);
  bad = p;
  bad.chunk_len = 100;  // not a multiple of the tile
  EXPECT_EQ(paged_attention_forward(bad, nullptr), cudaErrorInvalidValue);
  bad = p;
  bad.out_dtype = DType::kF16;
  EXPECT_EQ(paged_attention_forward(bad, nullptr), cudaErrorInvalidValue);
  bad = p;
  bad.extra_k = reinterpret_cast<const uint16_t*>(&p);  // extra_v missing
  EXPECT_EQ(paged_attention_forward(bad, nullptr), cudaErrorInvalidValue);
  bad = p;
  bad.fold = static_cast<AttentionFold>(2);  // not a fold
  EXPECT_EQ(paged_attention_forward(bad, nullptr), cudaErrorInvalidValue);
  bad = p;
  bad.rows = 2;  // null pointers
  EXPECT_EQ(paged_attention_forward(bad, nullptr), cudaErrorInvalidValue);

  EXPECT_EQ(PagedAttentionMaxChunks(0, false, 256), 1);
  EXPECT_EQ(PagedAttentionMaxChunks(256, false, 256), 1);
  EXPECT_EQ(PagedAttentionMaxChunks(256, true, 256), 2);
  EXPECT_EQ(PagedAttentionMaxChunks(5000, false, 256), 20);
  EXPECT_EQ(PagedAttentionWorkspaceFloats(3, 15, 64, 200, false, 256), 0u);
  EXPECT_EQ(PagedAttentionWorkspaceFloats(3, 15, 64, 600, false, 256), 3u * 15 * 3 * 66);
  EXPECT_EQ(PagedAttentionWorkspaceFloats(2, 55, 96, 600, false, 256), 2u * 55 * 3 * 98);
}

}  // namespace
}  // namespace morserve::kernels
