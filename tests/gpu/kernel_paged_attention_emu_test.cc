// The paged-attention kernels (the same source as the GPU build: kernels/
// paged_attention_kernels.cuh) run on the CPU emulator (kernels/emu/cuda_emu.h: one fiber per
// CUDA thread, real barriers and warp shuffles) against the double reference, so their index
// arithmetic, tiling, split-KV chunks, combine, extra pair, GQA packing and fault handling are
// checked on machines without a GPU, for both folds (AttentionFold: the CTA on one tile at a
// time, and per-warp keys). Small shapes keep it fast; the GPU test covers the big
// ones. Not skipped without a device: this test needs none.
//
// What it cannot check: the GPU's own rounding (host exp2f), memory-model races beyond the
// barriers, and launch limits; those stay for tests/gpu/kernel_paged_attention_test.
#include "kernels/emu/cuda_emu.h"
// cuda_emu.h first: it defines the CUDA keywords the kernel header uses.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/paged_attention_kernels.cuh"
#include "tests/gpu/paged_attention_problem.h"

namespace morserve::kernels {
namespace {

using namespace ::morserve::kernels::attention_test;  // NOLINT: the shared problem helpers

uint64_t Seed() {
  std::random_device rd;
  return (static_cast<uint64_t>(rd()) << 32) ^ rd();
}

// Runs both kernels on the emulator with poisoned output and workspace; raw output bytes.
template <int HD, typename TO>
void Emulate(const PagedAttentionParams& p, std::vector<uint8_t>* raw) {
  const int max_chunks = PagedAttentionMaxChunks(p.max_kv_len, p.extra_k != nullptr, p.chunk_len);
  std::vector<float> ws(PagedAttentionWorkspaceFloats(p.rows, p.n_heads, p.head_dim, p.max_kv_len,
                                                      p.extra_k != nullptr, p.chunk_len),
                        std::nanf(""));
  raw->assign(static_cast<size_t>(p.rows) * p.n_heads * p.head_dim * sizeof(TO), 0xFF);
  PagedAttentionParams q = p;
  q.out = raw->data();
  q.workspace = ws.empty() ? nullptr : ws.data();
  const Args a = MakeArgs(q, max_chunks);
  cuda_emu::Run({static_cast<unsigned>(p.rows), static_cast<unsigned>(p.n_kv_heads),
                 static_cast<unsigned>(max_chunks)},
                kThreads, [&] {
                  if (p.fold == AttentionFold::kWarp) {
                    AttnWarpChunkKernel<HD, TO>(a);
                  } else {
                    AttnChunkKernel<HD, TO>(a);
                  }
                });
  if (max_chunks > 1) {
    cuda_emu::Run({static_cast<unsigned>(p.rows), static_cast<unsigned>(p.n_heads), 1}, HD,
                  [&] { AttnCombineKernel<HD, TO>(a); });
  }
}

template <int HD>
void EmulateHeadDim(const PagedAttentionParams& p, std::vector<uint8_t>* raw) {
  p.out_dtype == DType::kBF16 ? Emulate<HD, uint16_t>(p, raw) : Emulate<HD, float>(p, raw);
}

void EmulateAny(const PagedAttentionParams& p, std::vector<uint8_t>* raw) {
  ASSERT_TRUE(AttentionHeadDimSupported(p.head_dim)) << p.head_dim;
  switch (p.head_dim) {
    case 64:
      return EmulateHeadDim<64>(p, raw);
    case 96:
      return EmulateHeadDim<96>(p, raw);
    default:
      return EmulateHeadDim<128>(p, raw);
  }
}

PagedAttentionParams HostParams(const Problem& pr, DType out) {
  const AttentionInputs in = {pr.q.data(),       pr.k_cache.data(), pr.v_cache.data(),
                              pr.extra_k.data(), pr.extra_v.data(), pr.indptr.data(),
                              pr.blocks.data(),  pr.kv_len.data()};
  return LaunchParams(pr, in, out);
}

// Batched run vs reference (bf16 and fp32 out), then, for bf16 out, every row alone (own
// table and max_kv_len) bit for bit; with shape's fold.
void CheckFold(const Shape& shape, const std::vector<RequestSpec>& requests) {
  const uint64_t seed = Seed();
  SCOPED_TRACE(Describe(shape) + " seed=" + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const Problem pr = Build(shape, requests, rng);
  const std::vector<double> ref = Reference(pr);
  for (DType t : {DType::kBF16, DType::kF32}) {
    SCOPED_TRACE(t == DType::kBF16 ? "out=bf16" : "out=f32");
    std::vector<uint8_t> raw;
    EmulateAny(HostParams(pr, t), &raw);
    ASSERT_NO_FATAL_FAILURE(ExpectMatches(pr, Decode(raw, t), ref, t));
    if (t != DType::kBF16) continue;  // the emulator is slow: invariance once per problem
    for (int r = 0; r < pr.rows; ++r) {
      const RowTable table = RowTableOf(pr, r);
      PagedAttentionParams p = RowParams(pr, HostParams(pr, t), r);
      p.table_indptr = table.indptr.data();
      p.table_blocks = table.blocks.data();
      p.kv_len = table.kv_len.data();
      std::vector<uint8_t> alone;
      EmulateAny(p, &alone);
      ASSERT_NO_FATAL_FAILURE(ExpectRowMatchesBatch(pr, r, alone, raw));
    }
  }
}

// CheckFold with each fold.
void Check(const Shape& shape, const std::vector<RequestSpec>& requests) {
  for (AttentionFold fold : {AttentionFold::kCta, AttentionFold::kWarp}) {
    ASSERT_NO_FATAL_FAILURE(CheckFold(WithFold(shape, fold), requests));
  }
}

TEST(PagedAttentionEmuTest, MixedPrefillDecodeAndChunks) {
  // chunk 32 with contexts up to 100: several chunks and the combine kernel; block 5 and 16.
  const std::vector<RequestSpec> reqs = {{1, 1}, {33, 1}, {70, 5}, {0, 1}, {100, 1}, {9, 9}};
  ASSERT_NO_FATAL_FAILURE(Check({6, 2, 64, 5, 32, false, 1.0f}, reqs));    // group 3
  ASSERT_NO_FATAL_FAILURE(Check({4, 1, 128, 16, 64, false, 3.0f}, reqs));  // group 4, hd 128
  ASSERT_NO_FATAL_FAILURE(Check({8, 8, 64, 7, 256, false, 1.0f}, reqs));   // group 1, one chunk
}

// The warp fold's tile-to-warp assignment: chunks of 1 to 9 tiles (warps with no tile, one
// tile, two and three tiles), a partial last tile, one chunk and several.
TEST(PagedAttentionEmuTest, WarpFoldTileCounts) {
  const std::vector<RequestSpec> reqs = {{20, 1}, {64, 1}, {130, 1}, {287, 1}, {200, 3}};
  ASSERT_NO_FATAL_FAILURE(Check({4, 2, 64, 16, 288, false, 2.0f}, reqs));  // one chunk
  ASSERT_NO_FATAL_FAILURE(Check({2, 1, 128, 5, 96, true, 1.0f}, reqs));    // 3-tile chunks
}

TEST(PagedAttentionEmuTest, LargestGroup) {  // kAttentionMaxGroup query heads per kv head
  ASSERT_NO_FATAL_FAILURE(Check({8, 1, 128, 16, 32, false, 1.0f}, {{40, 2}, {5, 1}}));
}

TEST(PagedAttentionEmuTest, ExtraPair) {
  const std::vector<RequestSpec> reqs = {{1, 1}, {32, 1}, {64, 3}, {45, 2}};
  ASSERT_NO_FATAL_FAILURE(Check({6, 2, 64, 16, 32, true, 1.0f}, reqs));
  ASSERT_NO_FATAL_FAILURE(Check({3, 3, 128, 5, 32, true, 2.0f}, reqs));
}

// head_dim 96 (Huginn-0125): 12 of a key's 16 lanes hold its row. GQA groups 3, 1 and 8,
// several split-KV chunks and the combine kernel, block sizes that do and do not divide the
// tile, the extra pair.
TEST(PagedAttentionEmuTest, HeadDim96) {
  const std::vector<RequestSpec> reqs = {{1, 1}, {33, 1}, {70, 5}, {0, 1}, {100, 1}, {9, 9}};
  ASSERT_NO_FATAL_FAILURE(Check({6, 2, 96, 5, 32, false, 1.0f}, reqs));    // group 3, 4 chunks
  ASSERT_NO_FATAL_FAILURE(Check({3, 3, 96, 16, 256, false, 3.0f}, reqs));  // group 1, one chunk
  ASSERT_NO_FATAL_FAILURE(Check({8, 1, 96, 16, 32, true, 1.0f}, {{40, 2}, {64, 1}, {5, 1}}));
}

// A kv_len beyond the table and a block id outside the pool fill only their row with NaN.
void CheckFaultyRowsBecomeNan(int hd, AttentionFold fold) {
  std::mt19937_64 rng(Seed());
  Problem pr = Build({6, 2, hd, 16, 32, false, 1.0f}, {{40, 1}, {50, 1}, {90, 1}, {20, 1}}, rng);
  const std::vector<double> ref = Reference(pr);
  pr.kv_len[1] = (pr.indptr[2] - pr.indptr[1]) * 16 + 1;  // beyond the row's table
  pr.max_kv_len = std::max(pr.max_kv_len, pr.kv_len[1]);
  pr.blocks[pr.indptr[2] + 1] = -3;  // row 2 (three chunks) reads a block id outside the pool
  for (DType t : {DType::kBF16, DType::kF32}) {
    std::vector<uint8_t> raw;
    PagedAttentionParams p = HostParams(pr, t);
    p.fold = fold;
    EmulateAny(p, &raw);
    const std::vector<float> got = Decode(raw, t);
    for (int r : {1, 2}) {
      for (int i = 0; i < pr.q_dim(); ++i) {
        ASSERT_TRUE(std::isnan(got[static_cast<size_t>(r) * pr.q_dim() + i]))
            << "row " << r << " element " << i;
      }
    }
    ASSERT_NO_FATAL_FAILURE(ExpectMatches(pr, got, ref, t, {1, 2}));
  }
}

TEST(PagedAttentionEmuTest, FaultyRowsBecomeNan) {
  for (int hd : {64, 96}) {
    for (AttentionFold fold : {AttentionFold::kCta, AttentionFold::kWarp}) {
      SCOPED_TRACE("head_dim=" + std::to_string(hd) +
                   (fold == AttentionFold::kWarp ? " fold=warp" : " fold=cta"));
      ASSERT_NO_FATAL_FAILURE(CheckFaultyRowsBecomeNan(hd, fold));
    }
  }
}

}  // namespace
}  // namespace morserve::kernels
