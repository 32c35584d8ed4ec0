// The recurrent-attention kernels (kernels/recurrent_attention_kernels.cuh, the GPU build's
// source) on the CPU emulator, driven by the GPU schedule (engine/runtime/recurrent_schedule.h,
// merges cut into kRecurrentRange ranges as the runner cuts them) wave by wave with each
// chunk's own entries hidden (NaN) until their position finishes. Checked for prefill chunks of
// several lengths (powers of two and not, cached prefixes on and off tile and range boundaries,
// decode rows up to entry 1100), GQA groups 1/3/4/8, head_dim 64/96/128, block sizes 5/16:
//   - bit for bit against paged attention with chunk_len kRecurrentRange (split and combine
//     kernels: the naive GPU path's) on the complete cache, per row: so the result does not
//     depend on the schedule, the batch or the chunking;
//   - long decode rows: one merge item (CTA per kv head) per range of their cached prefix, all
//     in one launch, and rows of several ranges equal to the paged split kernel's range
//     partials combined on the host in range order (so a change of the combine's order fails
//     here even though both kernels share it);
//   - against the CPU tiled prefill (engine/cpu/chunk_attention, RunTiledPrefill) in fp32:
//     relative error per (row, head) under 1e-5 (the fold order differs: CPU groups of a KV
//     block with exp, GPU tiles of 32 keys with exp2);
//   - against the double reference (1e-2 for bf16 out, 1e-4 for fp32 out);
//   - one prefill in one chunk, in two chunks, and in a batch with another request: the same
//     bytes.
// Plus: a bad block id (in a row's first or a later range) and a bad merge range (past the own
// tile, or across a range edge) poison only their row (NaN).
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

// CTAs of each launch an emulated run made, in launch order.
struct Launches {
  std::vector<int64_t> merge, finish;
};

// The kernels on the emulator through the schedule; raw output bytes (out_dtype t).
std::vector<uint8_t> EmulateTiled(const Problem& p, const Items& it, DType t,
                                  Launches* launches = nullptr) {
  std::vector<uint16_t> k = p.k_cache, v = p.v_cache;
  HideChunkEntries(p, &k, &v);
  std::vector<float> partials(PartialFloats(p), std::nanf(""));
  std::vector<uint8_t> out = t == DType::kBF16
                                 ? Bytes<uint16_t>(p.rows * static_cast<size_t>(p.q_dim()))
                                 : Bytes<float>(p.rows * static_cast<size_t>(p.q_dim()));
  const AttentionInputs in = {p.q.data(),       k.data(),        v.data(),        p.extra_k.data(),
                              p.extra_v.data(), p.indptr.data(), p.blocks.data(), p.kv_len.data()};
  const RecurrentAttentionParams rp = RecurrentLaunchParams(p, in, partials.data(), out.data(), t);
  Backend b;
  b.run = [&](bool finish, int begin, int count) {
    if (launches != nullptr) {
      (finish ? launches->finish : launches->merge)
          .push_back(static_cast<int64_t>(count) * p.shape.n_kv_heads);
    }
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

// Paged attention in chunks of kRecurrentRange over the complete cache (the naive path): the
// split kernel, then the combine kernel when a row has several chunks (unless `partials` is
// given: then it receives the split kernel's workspace and the combine does not run).
std::vector<uint8_t> EmulatePagedRanges(const Problem& p, DType t,
                                        std::vector<float>* partials = nullptr) {
  std::vector<uint8_t> out = t == DType::kBF16
                                 ? Bytes<uint16_t>(p.rows * static_cast<size_t>(p.q_dim()))
                                 : Bytes<float>(p.rows * static_cast<size_t>(p.q_dim()));
  const AttentionInputs in = {p.q.data(),       p.k_cache.data(), p.v_cache.data(),
                              p.extra_k.data(), p.extra_v.data(), p.indptr.data(),
                              p.blocks.data(),  p.kv_len.data()};
  PagedAttentionParams pp = PagedRangeParams(p, in, t);
  pp.out = out.data();
  const int chunks = PagedAttentionMaxChunks(pp.max_kv_len, true, pp.chunk_len);
  EXPECT_EQ(chunks, RecurrentAttentionMaxRanges(p.max_kv_len));
  std::vector<float> ws(PagedAttentionWorkspaceFloats(p.rows, p.shape.n_heads, p.shape.head_dim,
                                                      p.max_kv_len, true, pp.chunk_len),
                        std::nanf(""));
  pp.workspace = ws.empty() ? nullptr : ws.data();
  const Args a = MakeArgs(pp, chunks);
  const auto rows = static_cast<unsigned>(p.rows);
  const bool bf16 = t == DType::kBF16;
  ForHeadDim(p.shape.head_dim, [&](auto hd) {
    constexpr int HD = decltype(hd)::value;
    cuda_emu::Run({rows, static_cast<unsigned>(p.shape.n_kv_heads), static_cast<unsigned>(chunks)},
                  kThreads,
                  [&] { bf16 ? AttnChunkKernel<HD, uint16_t>(a) : AttnChunkKernel<HD, float>(a); });
    if (chunks > 1 && partials == nullptr) {
      cuda_emu::Run({rows, static_cast<unsigned>(p.shape.n_heads), 1}, HD, [&] {
        bf16 ? AttnCombineKernel<HD, uint16_t>(a) : AttnCombineKernel<HD, float>(a);
      });
    }
  });
  if (partials != nullptr) *partials = std::move(ws);
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
    const std::vector<uint8_t> paged = EmulatePagedRanges(p, t);
    const size_t row_bytes = tiled.size() / p.rows;
    for (int r = 0; r < p.rows; ++r) {
      ASSERT_EQ(0,
                std::memcmp(tiled.data() + r * row_bytes, paged.data() + r * row_bytes, row_bytes))
          << "row " << r << " (entry " << p.kv_len[r] << ") differs from paged attention";
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

// Prefill chunks crossing range edges (256, 512) after cached prefixes of several ranges, and
// decode rows on and off range edges (entries 256, 512, 1100).
TEST(RecurrentAttentionEmuTest, LongContextsAcrossRanges) {
  ASSERT_NO_FATAL_FAILURE(
      Check({6, 2, 64, 16, 32, true, 1.0f}, {{600, 90}, {1101, 1}, {513, 1}, {257, 1}, {300, 45}}));
  ASSERT_NO_FATAL_FAILURE(Check({8, 1, 96, 5, 32, true, 2.0f}, {{530, 40}, {769, 1}}));
}

// Row r's fp32 output from paged attention's chunk partials (the split kernel's workspace)
// combined on the host in chunk order: the largest max first, then l and acc summed chunk by
// chunk with weights exp2(m_c - max), then acc * (1 / l).
std::vector<float> HostCombine(const Problem& p, const std::vector<float>& ws, int r) {
  const int hd = p.shape.head_dim, heads = p.shape.n_heads;
  const int chunks = RecurrentAttentionMaxRanges(p.max_kv_len);
  const int nchunks = p.kv_len[r] / kRecurrentRange + 1;
  const float* ml = ws.data() + static_cast<size_t>(p.rows) * heads * chunks * hd;
  std::vector<float> out(static_cast<size_t>(heads) * hd);
  for (int h = 0; h < heads; ++h) {
    const size_t base = (static_cast<size_t>(r) * heads + h) * chunks;
    float m_all = -INFINITY;
    for (int c = 0; c < nchunks; ++c) m_all = std::fmax(m_all, ml[2 * (base + c)]);
    for (int d = 0; d < hd; ++d) {
      float l_all = 0.0f, o = 0.0f;
      for (int c = 0; c < nchunks; ++c) {
        const float w = std::exp2(ml[2 * (base + c)] - m_all);
        l_all = std::fma(ml[2 * (base + c) + 1], w, l_all);
        o = std::fma(ws[(base + c) * hd + d], w, o);
      }
      out[static_cast<size_t>(h) * hd + d] = o * (1.0f / l_all);
    }
  }
  return out;
}

// Decode rows at entries 1100, 699, 299 and 39: the merge cut at the ranges gives one item per
// range of the cached prefix (5, 3, 2 and 1: 11 items, 11 x kv heads CTAs in one launch, where
// the uncut schedule has one per row), and the output is paged attention's with chunks of
// kRecurrentRange bit for bit, and for the rows of several ranges the split kernel's partials
// combined in range order.
TEST(RecurrentAttentionEmuTest, LongDecodeRowsSplitIntoOneItemPerRange) {
  std::mt19937_64 rng(Seed());
  const Shape shape{6, 2, 64, 16, 32, true, 1.0f};
  const std::vector<RequestSpec> reqs = {{1101, 1}, {700, 1}, {300, 1}, {40, 1}};
  const Problem p = Build(shape, reqs, rng);
  const Items it = ScheduleItems(p, ChunkIndptr(reqs));
  EXPECT_EQ(ScheduleItems(p, ChunkIndptr(reqs), /*range=*/0).merge.size(), 4u);
  ASSERT_EQ(it.merge.size(), 11u);
  const std::vector<int> per_row = {5, 3, 2, 1};
  for (int r = 0; r < p.rows; ++r) {
    int items = 0;
    for (const RecurrentFoldItem& m : it.merge) {
      if (m.row != r) continue;
      EXPECT_EQ(m.key_begin, items * kRecurrentRange) << "row " << r;
      ++items;
    }
    EXPECT_EQ(items, per_row[r]) << "row " << r << " (entry " << p.kv_len[r] << ")";
  }
  Launches launches;
  const std::vector<uint8_t> tiled = EmulateTiled(p, it, DType::kF32, &launches);
  EXPECT_EQ(launches.merge, (std::vector<int64_t>{11 * shape.n_kv_heads}));
  EXPECT_EQ(launches.finish, (std::vector<int64_t>{4 * shape.n_kv_heads}));
  std::vector<float> ws;
  const std::vector<uint8_t> split_only = EmulatePagedRanges(p, DType::kF32, &ws);
  EXPECT_EQ(tiled, EmulatePagedRanges(p, DType::kF32)) << "differs from paged attention";
  const std::vector<float> got = Decode(tiled, DType::kF32);
  const size_t qd = p.q_dim();
  for (int r = 0; r < 3; ++r) {  // entries 1100, 699, 299: several ranges
    const std::vector<float> want = HostCombine(p, ws, r);
    EXPECT_EQ(0, std::memcmp(got.data() + r * qd, want.data(), qd * sizeof(float)))
        << "row " << r << " (entry " << p.kv_len[r] << ") is not its ranges combined in order";
  }
  const std::vector<float> one = Decode(split_only, DType::kF32);
  EXPECT_EQ(0, std::memcmp(got.data() + 3 * qd, one.data() + 3 * qd, qd * sizeof(float)))
      << "a row of one range is the split kernel's own output";
  ASSERT_NO_FATAL_FAILURE(ExpectMatches(p, got, Reference(p), DType::kF32));
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

// A 540-position prompt (three ranges) prefilled as one chunk, and as chunks of 250 and 280
// followed by its last 10 positions as decode rows, one per step: the same bytes.
TEST(RecurrentAttentionEmuTest, LongPrefillChunkingAndDecodeGiveTheSameBits) {
  std::mt19937_64 rng(Seed());
  const Problem p = Build({6, 2, 64, 16, 32, true, 1.0f}, {{540, 540}}, rng);
  auto run = [&](int begin, int end) {
    const Problem part = Slice(p, begin, end);
    return EmulateTiled(part, ScheduleItems(part, {0, end - begin}), DType::kBF16);
  };
  const std::vector<uint8_t> one = run(0, 540);
  std::vector<uint8_t> steps = run(0, 250);
  const std::vector<uint8_t> second = run(250, 530);
  steps.insert(steps.end(), second.begin(), second.end());
  for (int r = 530; r < 540; ++r) {
    const std::vector<uint8_t> decode = run(r, r + 1);
    steps.insert(steps.end(), decode.begin(), decode.end());
  }
  EXPECT_EQ(steps, one) << "250 + 280 + 10 decode steps differ from one chunk of 540";
}

TEST(RecurrentAttentionEmuTest, FaultsPoisonTheirRow) {
  std::mt19937_64 rng(Seed());
  const std::vector<RequestSpec> reqs = {{40, 1}, {70, 1}, {50, 1}, {1101, 1}, {700, 1}};
  Problem p = Build({6, 2, 64, 16, 32, true, 1.0f}, reqs, rng);
  Items it = ScheduleItems(p, ChunkIndptr(reqs));
  const std::vector<double> ref = Reference(p);
  p.blocks[p.indptr[1]] = -3;                 // row 1 reads a block id outside the pool
  p.blocks[p.indptr[3] + 40] = p.num_blocks;  // row 3 too, in its third range (entries 640..)
  for (RecurrentFoldItem& m : it.merge) {
    if (m.row == 2) m.key_end = 64;                       // row 2 (entry 49) merges its own tile
    if (m.row == 4 && m.key_begin == 0) m.key_end = 288;  // row 4's first item crosses a range
  }
  const std::vector<float> got = Decode(EmulateTiled(p, it, DType::kF32), DType::kF32);
  for (int r : {1, 2, 3, 4}) {
    for (int i = 0; i < p.q_dim(); ++i) ASSERT_TRUE(std::isnan(got[r * p.q_dim() + i])) << r;
  }
  ASSERT_NO_FATAL_FAILURE(ExpectMatches(p, got, ref, DType::kF32, {1, 2, 3, 4}));
}

}  // namespace
}  // namespace morserve::kernels
