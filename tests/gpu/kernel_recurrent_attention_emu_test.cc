// The recurrent-attention kernels (kernels/recurrent_attention_kernels.cuh, the GPU build's
// source) on the CPU emulator, driven by the GPU schedule (engine/runtime/recurrent_schedule.h)
// wave by wave with each chunk's own entries hidden (NaN) until their position finishes.
// Checked for prefill chunks of several lengths (powers of two and not, cached prefixes on and
// off tile boundaries, decode rows), GQA groups 1/3/4/8, head_dim 64/96/128, block sizes 5/16:
//   - bit for bit against the paged-attention split kernel with one chunk (the naive GPU
//     path's kernel) on the complete cache, per row: so the result does not depend on the
//     schedule, the batch or the chunking;
//   - against the CPU tiled prefill (engine/cpu/chunk_attention, RunTiledPrefill) in fp32:
//     relative error per (row, head) under 1e-5 (the fold order differs: CPU groups of a KV
//     block with exp, GPU tiles of 32 keys with exp2);
//   - against the double reference (1e-2 for bf16 out, 1e-4 for fp32 out);
//   - one prefill in one chunk, in two chunks, and in a batch with another request: the same
//     bytes.
// Plus: a bad block id and a bad merge range poison only their row (NaN).
#include "kernels/emu/cuda_emu.h"
// cuda_emu.h first: it defines the CUDA keywords the kernel headers use.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "engine/cpu/chunk_attention.h"
#include "engine/cpu/recurrent_prefill.h"
#include "kernels/paged_attention_kernels.cuh"  // the kernel the fold must equal
#include "kernels/recurrent_attention_kernels.cuh"
#include "tests/gpu/recurrent_attention_problem.h"

namespace morserve::kernels {
namespace {

using namespace ::morserve::kernels::attention_test;  // NOLINT: the shared problem helpers
using namespace ::morserve::kernels::recurrent_test;  // NOLINT

uint64_t Seed() {
  std::random_device rd;
  return (static_cast<uint64_t>(rd()) << 32) ^ rd();
}

// Calls f(std::integral_constant<int, HD>) for head_dim HD (64, 96 or 128).
template <typename F>
void ForHeadDim(int head_dim, F&& f) {
  ASSERT_TRUE(AttentionHeadDimSupported(head_dim)) << head_dim;
  switch (head_dim) {
    case 64:
      return f(std::integral_constant<int, 64>{});
    case 96:
      return f(std::integral_constant<int, 96>{});
    default:
      return f(std::integral_constant<int, 128>{});
  }
}

template <typename T>
std::vector<uint8_t> Bytes(size_t count) {
  return std::vector<uint8_t>(count * sizeof(T), 0xFF);  // poisoned: NaN in bf16 and fp32
}

// The kernels on the emulator through the schedule; raw output bytes (out_dtype t).
std::vector<uint8_t> EmulateTiled(const Problem& p, const Items& it, DType t) {
  std::vector<uint16_t> k = p.k_cache, v = p.v_cache;
  HideChunkEntries(p, &k, &v);
  std::vector<float> ml(static_cast<size_t>(p.rows) * p.shape.n_heads * 2, std::nanf(""));
  std::vector<float> acc(static_cast<size_t>(p.rows) * p.q_dim(), std::nanf(""));
  std::vector<uint8_t> out = t == DType::kBF16
                                 ? Bytes<uint16_t>(p.rows * static_cast<size_t>(p.q_dim()))
                                 : Bytes<float>(p.rows * static_cast<size_t>(p.q_dim()));
  const AttentionInputs in = {p.q.data(),       k.data(),        v.data(),        p.extra_k.data(),
                              p.extra_v.data(), p.indptr.data(), p.blocks.data(), p.kv_len.data()};
  const RecurrentAttentionParams rp =
      RecurrentLaunchParams(p, in, ml.data(), acc.data(), out.data(), t);
  Backend b;
  b.run = [&](bool finish, int begin, int count) {
    RecurrentAttentionParams q = rp;
    q.items = (finish ? it.finish : it.merge).data() + begin;
    q.num_items = count;
    const RecurrentArgs a = MakeRecurrentArgs(q);
    const EmuDim3 grid{static_cast<unsigned>(count), static_cast<unsigned>(p.shape.n_kv_heads), 1};
    const bool bf16 = t == DType::kBF16;
    ForHeadDim(p.shape.head_dim, [&](auto hd) {
      constexpr int HD = decltype(hd)::value;
      cuda_emu::Run(grid, kThreads, [&] {
        if (!finish) {
          RecurrentFoldKernel<HD, false, float>(a);
        } else if (bf16) {
          RecurrentFoldKernel<HD, true, uint16_t>(a);
        } else {
          RecurrentFoldKernel<HD, true, float>(a);
        }
      });
    });
  };
  b.write = [&](size_t slot, const uint16_t* kk, const uint16_t* vv) {
    std::memcpy(&k[slot * p.kv_dim()], kk, p.kv_dim() * sizeof(uint16_t));
    std::memcpy(&v[slot * p.kv_dim()], vv, p.kv_dim() * sizeof(uint16_t));
  };
  Drive(p, it, b);
  return out;
}

// The paged split kernel with one chunk per row over the complete cache (the naive path).
std::vector<uint8_t> EmulatePagedOneChunk(const Problem& p, DType t) {
  std::vector<uint8_t> out = t == DType::kBF16
                                 ? Bytes<uint16_t>(p.rows * static_cast<size_t>(p.q_dim()))
                                 : Bytes<float>(p.rows * static_cast<size_t>(p.q_dim()));
  const AttentionInputs in = {p.q.data(),       p.k_cache.data(), p.v_cache.data(),
                              p.extra_k.data(), p.extra_v.data(), p.indptr.data(),
                              p.blocks.data(),  p.kv_len.data()};
  PagedAttentionParams pp = PagedOneChunkParams(p, in, t);
  pp.out = out.data();
  EXPECT_EQ(PagedAttentionMaxChunks(pp.max_kv_len, true, pp.chunk_len), 1);
  const Args a = MakeArgs(pp, 1);
  const EmuDim3 grid{static_cast<unsigned>(p.rows), static_cast<unsigned>(p.shape.n_kv_heads), 1};
  const bool bf16 = t == DType::kBF16;
  ForHeadDim(p.shape.head_dim, [&](auto hd) {
    constexpr int HD = decltype(hd)::value;
    cuda_emu::Run(grid, kThreads,
                  [&] { bf16 ? AttnChunkKernel<HD, uint16_t>(a) : AttnChunkKernel<HD, float>(a); });
  });
  return out;
}

// The CPU tiled prefill of each chunk (fp32 pool holding the same bf16 values; each chunk's
// own entries written by `finish` as the schedule reaches them).
std::vector<float> CpuTiled(const Problem& p, const std::vector<int32_t>& chunks) {
  const Shape& s = p.shape;
  PagedKvPool pool = MakePagedKvPool(p.num_blocks, s.block_size, s.n_kv_heads, s.head_dim);
  for (size_t i = 0; i < p.k_cache.size(); ++i) {
    pool.k[i] = Bf16ToF32(p.k_cache[i]);
    pool.v[i] = Bf16ToF32(p.v_cache[i]);
  }
  const size_t kvd = p.kv_dim(), qd = p.q_dim();
  for (int r = 0; r < p.rows; ++r) {  // hidden until written, as on the GPU side
    std::fill_n(pool.k.begin() + OwnSlot(p, r) * kvd, kvd, std::nanf(""));
    std::fill_n(pool.v.begin() + OwnSlot(p, r) * kvd, kvd, std::nanf(""));
  }
  auto widen = [](const std::vector<uint16_t>& v) {
    std::vector<float> f(v.size());
    for (size_t i = 0; i < v.size(); ++i) f[i] = Bf16ToF32(v[i]);
    return f;
  };
  const std::vector<float> q = widen(p.q), ek = widen(p.extra_k), ev = widen(p.extra_v);
  std::vector<float> out(p.rows * qd, std::nanf(""));
  for (size_t c = 0; c + 1 < chunks.size(); ++c) {
    const int begin = chunks[c], n = chunks[c + 1] - chunks[c];
    ChunkAttentionParams cp;
    cp.pool = &pool;
    cp.blocks = p.blocks.data() + p.indptr[begin];
    cp.num_blocks = p.indptr[begin + 1] - p.indptr[begin];
    cp.first = p.kv_len[begin];
    cp.n = n;
    cp.q = q.data() + begin * qd;
    cp.extra_k = ek.data() + begin * kvd;
    cp.extra_v = ev.data() + begin * kvd;
    cp.n_heads = s.n_heads;
    cp.n_kv_heads = s.n_kv_heads;
    cp.head_dim = s.head_dim;
    cp.scale = 1.0f / std::sqrt(static_cast<float>(s.head_dim));
    ChunkAttention att(cp);
    RunTiledPrefill(att, nullptr, [&](int i, const float* attn) {
      const int r = begin + i;
      std::copy_n(attn, qd, out.begin() + r * qd);
      const size_t slot = OwnSlot(p, r);
      for (size_t d = 0; d < kvd; ++d) {
        pool.k[slot * kvd + d] = Bf16ToF32(p.k_cache[slot * kvd + d]);
        pool.v[slot * kvd + d] = Bf16ToF32(p.v_cache[slot * kvd + d]);
      }
    });
  }
  return out;
}

void ExpectCloseToCpu(const Problem& p, const std::vector<float>& got,
                      const std::vector<float>& cpu) {
  const int hd = p.shape.head_dim;
  int failures = 0;
  for (int r = 0; r < p.rows; ++r) {
    for (int h = 0; h < p.shape.n_heads; ++h) {
      const size_t base = (static_cast<size_t>(r) * p.shape.n_heads + h) * hd;
      double err2 = 0, ref2 = 0;
      for (int d = 0; d < hd; ++d) {
        err2 +=
            (got[base + d] - cpu[base + d]) * static_cast<double>(got[base + d] - cpu[base + d]);
        ref2 += cpu[base + d] * static_cast<double>(cpu[base + d]);
      }
      const double rel = std::sqrt(err2 / ref2);
      if (!(rel < 1e-5) && ++failures <= 5) {
        ADD_FAILURE() << "row " << r << " head " << h << ": relative error vs the CPU " << rel;
      }
    }
  }
  ASSERT_EQ(failures, 0);
}

void Check(const Shape& shape, const std::vector<RequestSpec>& reqs) {
  const uint64_t seed = Seed();
  SCOPED_TRACE(Describe(shape) + " seed=" + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const Problem p = Build(shape, reqs, rng);
  const std::vector<int32_t> chunks = ChunkIndptr(reqs);
  const Items it = ScheduleItems(p, chunks);
  const std::vector<double> ref = Reference(p);
  const std::vector<float> cpu = CpuTiled(p, chunks);
  for (DType t : {DType::kBF16, DType::kF32}) {
    SCOPED_TRACE(t == DType::kBF16 ? "out=bf16" : "out=f32");
    const std::vector<uint8_t> tiled = EmulateTiled(p, it, t);
    const std::vector<uint8_t> paged = EmulatePagedOneChunk(p, t);
    const size_t row_bytes = tiled.size() / p.rows;
    for (int r = 0; r < p.rows; ++r) {
      ASSERT_EQ(0,
                std::memcmp(tiled.data() + r * row_bytes, paged.data() + r * row_bytes, row_bytes))
          << "row " << r << " (entry " << p.kv_len[r] << ") differs from one-chunk paged attention";
    }
    const std::vector<float> got = Decode(tiled, t);
    ASSERT_NO_FATAL_FAILURE(ExpectMatches(p, got, ref, t));
    if (t == DType::kF32) ASSERT_NO_FATAL_FAILURE(ExpectCloseToCpu(p, got, cpu));
  }
}

// (context, query rows): a chunk of `rows` positions ending at entry context - 1.
TEST(RecurrentAttentionEmuTest, PrefillChunksGroup3) {
  ASSERT_NO_FATAL_FAILURE(Check({6, 2, 64, 16, 32, true, 1.0f}, {{80, 80}, {70, 21}, {41, 1}}));
}

TEST(RecurrentAttentionEmuTest, PowerOfTwoLengthsGroup4Hd128) {
  ASSERT_NO_FATAL_FAILURE(Check({4, 1, 128, 5, 32, true, 2.0f}, {{64, 64}, {40, 1}}));
}

TEST(RecurrentAttentionEmuTest, OffTileCachedPrefixGroup1) {
  ASSERT_NO_FATAL_FAILURE(Check({2, 2, 64, 5, 32, true, 1.0f}, {{99, 70}, {33, 33}, {7, 3}}));
}

TEST(RecurrentAttentionEmuTest, LargestGroup) {
  ASSERT_NO_FATAL_FAILURE(Check({8, 1, 128, 16, 32, true, 1.0f}, {{40, 12}, {32, 1}}));
}

// head_dim 96 (Huginn-0125): 12 of a key's 16 lanes hold its row. GQA groups 3 and 1 with
// block sizes 16 and 5 (off-tile cached prefixes), and the largest group.
TEST(RecurrentAttentionEmuTest, HeadDim96) {
  ASSERT_NO_FATAL_FAILURE(Check({6, 2, 96, 16, 32, true, 1.0f}, {{80, 80}, {70, 21}, {41, 1}}));
  ASSERT_NO_FATAL_FAILURE(Check({2, 2, 96, 5, 32, true, 2.0f}, {{99, 70}, {33, 33}, {7, 3}}));
  ASSERT_NO_FATAL_FAILURE(Check({8, 1, 96, 16, 32, true, 1.0f}, {{40, 12}, {32, 1}}));
}

// Rows [begin, end) of p as a problem of their own (same cache and pool).
Problem Slice(const Problem& p, int begin, int end) {
  Problem s = p;
  const size_t qd = p.q_dim(), kvd = p.kv_dim();
  s.rows = end - begin;
  s.q.assign(p.q.begin() + begin * qd, p.q.begin() + end * qd);
  s.extra_k.assign(p.extra_k.begin() + begin * kvd, p.extra_k.begin() + end * kvd);
  s.extra_v.assign(p.extra_v.begin() + begin * kvd, p.extra_v.begin() + end * kvd);
  s.kv_len.assign(p.kv_len.begin() + begin, p.kv_len.begin() + end);
  s.blocks.assign(p.blocks.begin() + p.indptr[begin], p.blocks.begin() + p.indptr[end]);
  s.indptr.clear();
  for (int r = begin; r <= end; ++r) s.indptr.push_back(p.indptr[r] - p.indptr[begin]);
  return s;
}

// One request's 70-position prefill as one chunk, as chunks 37 + 33 in two steps, and with its
// first 20 positions alone in one step and the other 50 inside a batch with another
// request's chunk: the same bytes.
TEST(RecurrentAttentionEmuTest, ChunkingAndBatchDoNotChangeBits) {
  std::mt19937_64 rng(Seed());
  const Shape shape{6, 2, 64, 16, 32, true, 1.0f};
  const Problem p = Build(shape, {{80, 70}, {60, 25}}, rng);
  const Problem whole = Slice(p, 0, 70);
  const std::vector<uint8_t> one = EmulateTiled(whole, ScheduleItems(whole, {0, 70}), DType::kBF16);
  const size_t row_bytes = one.size() / 70;
  auto run = [&](const Problem& part, const std::vector<int32_t>& chunks) {
    return EmulateTiled(part, ScheduleItems(part, chunks), DType::kBF16);
  };
  const Problem a = Slice(p, 0, 37), b = Slice(p, 37, 70);
  std::vector<uint8_t> two = run(a, {0, 37});
  const std::vector<uint8_t> second = run(b, {0, 33});
  two.insert(two.end(), second.begin(), second.end());
  EXPECT_EQ(two, one) << "37 + 33 differs from one chunk of 70";
  const Problem first20 = Slice(p, 0, 20), rest = Slice(p, 20, 95);  // rows 70.. the other request
  std::vector<uint8_t> mixed = run(first20, {0, 20});
  const std::vector<uint8_t> batch = run(rest, {0, 50, 75});
  mixed.insert(mixed.end(), batch.begin(), batch.begin() + 50 * row_bytes);
  EXPECT_EQ(mixed, one) << "20 alone + 50 in a batch differs from one chunk of 70";
}

TEST(RecurrentAttentionEmuTest, FaultsPoisonTheirRow) {
  std::mt19937_64 rng(Seed());
  const std::vector<RequestSpec> reqs = {{40, 1}, {70, 1}, {50, 1}};
  Problem p = Build({6, 2, 64, 16, 32, true, 1.0f}, reqs, rng);
  Items it = ScheduleItems(p, ChunkIndptr(reqs));
  const std::vector<double> ref = Reference(p);
  p.blocks[p.indptr[1]] = -3;  // row 1 reads a block id outside the pool
  for (RecurrentFoldItem& m : it.merge) {
    if (m.row == 2) m.key_end = 64;  // row 2 (entry 49) merges its own tile
  }
  const std::vector<float> got = Decode(EmulateTiled(p, it, DType::kF32), DType::kF32);
  for (int r : {1, 2}) {
    for (int i = 0; i < p.q_dim(); ++i) ASSERT_TRUE(std::isnan(got[r * p.q_dim() + i])) << r;
  }
  ASSERT_NO_FATAL_FAILURE(ExpectMatches(p, got, ref, DType::kF32, {1, 2}));
}

}  // namespace
}  // namespace morserve::kernels
