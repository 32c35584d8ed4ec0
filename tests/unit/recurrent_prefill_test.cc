// The tiled recurrent prefill schedule (engine/cpu/recurrent_prefill.h, chunk_attention.h) on
// random inputs: a chunk of n queries after `first` cached entries in a shuffled block table,
// where each finished position's persistent pair is a nonlinear function of its attention
// output (as in a recurrent layer, later positions depend on earlier outputs). Checked
// against a direct O(n^2) sequential computation in double (1e-4 absolute on outputs of
// magnitude ~1), and bitwise against: the one-position-at-a-time schedule over
// PagedAttention, the same schedule serial instead of on 2 threads, and the scalar code
// instead of the AVX2 lanes. Chunk starts and lengths are and are not multiples of the block
// size (1, 4, 16) and of the lane count (8). And several chunks in one schedule (the shared
// engine/runtime/recurrent_schedule.h) against each chunk alone, bitwise.
#include "engine/cpu/recurrent_prefill.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "engine/cpu/chunk_attention.h"
#include "engine/cpu/paged_attention.h"

namespace morserve {
namespace {

constexpr int kHeads = 4, kKvHeads = 2;

std::vector<float> Random(size_t n, std::mt19937& rng, float scale) {
  std::uniform_real_distribution<float> dist(-scale, scale);
  std::vector<float> v(n);
  for (float& f : v) f = dist(rng);
  return v;
}

struct Case {
  int first, n, block_size, head_dim;
};

// Inputs of one chunk: a pool with `first` cached entries, queries and temporary pairs.
struct Chunk {
  Case c;
  PagedKvPool pool;
  std::vector<int32_t> blocks;
  std::vector<float> q, tk, tv;
  int kv_dim() const { return kKvHeads * c.head_dim; }
  int q_dim() const { return kHeads * c.head_dim; }
  int64_t Slot(int index) const {
    return static_cast<int64_t>(blocks[index / c.block_size]) * c.block_size + index % c.block_size;
  }
};

Chunk MakeChunk(const Case& c, uint32_t seed) {
  std::mt19937 rng(seed);
  Chunk ch{c};
  const int num_blocks = (c.first + c.n + c.block_size - 1) / c.block_size + 3;
  ch.pool = MakePagedKvPool(num_blocks + 5, c.block_size, kKvHeads, c.head_dim);
  ch.pool.k = Random(ch.pool.k.size(), rng, 2.0f);  // garbage where nothing is written yet
  ch.pool.v = Random(ch.pool.v.size(), rng, 1.0f);
  ch.blocks.resize(num_blocks + 5);
  std::iota(ch.blocks.begin(), ch.blocks.end(), 0);
  std::shuffle(ch.blocks.begin(), ch.blocks.end(), rng);
  ch.blocks.resize(num_blocks);
  ch.q = Random(static_cast<size_t>(c.n) * ch.q_dim(), rng, 2.0f);
  ch.tk = Random(static_cast<size_t>(c.n) * ch.kv_dim(), rng, 2.0f);
  ch.tv = Random(static_cast<size_t>(c.n) * ch.kv_dim(), rng, 1.0f);
  return ch;
}

// The persistent pair of position i from its attention output (stands in for Wo, MLP and the
// K/V projection): k = 2 tanh(3 a + 0.1 i), v = sin(2 a') on the outputs of two heads.
template <typename T>
void PersistentPair(int i, const T* attn, int head_dim, T* k, T* v) {
  const int group = kHeads / kKvHeads;
  for (int h = 0; h < kKvHeads; ++h) {
    for (int d = 0; d < head_dim; ++d) {
      const T a = attn[(h * group) * head_dim + d],
              b = attn[(h * group + group - 1) * head_dim + (d + 1) % head_dim];
      k[h * head_dim + d] = static_cast<T>(2 * std::tanh(3 * a + T(0.1) * i));
      v[h * head_dim + d] = static_cast<T>(std::sin(2 * b));
    }
  }
}

using Outputs = std::vector<std::vector<float>>;

// Runs a schedule over a copy of the chunk; returns every position's attention output.
Outputs RunSchedule(Chunk ch, bool tiled, ThreadPool* threads, bool allow_avx2 = true) {
  const Case& c = ch.c;
  Outputs outs(c.n);
  auto finish = [&](int i, const float* attn) {
    outs[i].assign(attn, attn + ch.q_dim());
    std::vector<float> k(ch.kv_dim()), v(ch.kv_dim());
    PersistentPair(i, attn, c.head_dim, k.data(), v.data());
    const int32_t slot = static_cast<int32_t>(ch.Slot(c.first + i));
    KvWrite(ch.pool, k.data(), v.data(), &slot, 1);
  };
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  if (tiled) {
    ChunkAttentionParams p;
    p.pool = &ch.pool;
    p.blocks = ch.blocks.data();
    p.num_blocks = static_cast<int>(ch.blocks.size());
    p.first = c.first;
    p.n = c.n;
    p.q = ch.q.data();
    p.extra_k = ch.tk.data();
    p.extra_v = ch.tv.data();
    p.n_heads = kHeads;
    p.n_kv_heads = kKvHeads;
    p.head_dim = c.head_dim;
    p.scale = scale;
    p.allow_avx2 = allow_avx2;
    ChunkAttention att(p);
    RunTiledPrefill(att, threads, finish);
    return outs;
  }
  const int32_t indptr[2] = {0, static_cast<int32_t>(ch.blocks.size())};
  std::vector<float> attn(ch.q_dim());
  for (int i = 0; i < c.n; ++i) {
    const int32_t kv_len = c.first + i;
    PagedAttentionParams p;
    p.num_rows = 1;
    p.q = &ch.q[static_cast<size_t>(i) * ch.q_dim()];
    p.out = attn.data();
    p.pool = &ch.pool;
    p.table_indptr = indptr;
    p.table_blocks = ch.blocks.data();
    p.kv_len = &kv_len;
    p.extra_k = &ch.tk[static_cast<size_t>(i) * ch.kv_dim()];
    p.extra_v = &ch.tv[static_cast<size_t>(i) * ch.kv_dim()];
    p.n_heads = kHeads;
    p.n_kv_heads = kKvHeads;
    p.head_dim = c.head_dim;
    p.scale = scale;
    PagedAttention(p, threads);
    finish(i, attn.data());
  }
  return outs;
}

// Direct sequential definition in double: softmax over cached keys, the chunk's earlier
// persistent keys and the own temporary key, per head.
std::vector<std::vector<double>> Direct(const Chunk& ch) {
  const Case& c = ch.c;
  const int hd = c.head_dim, kvd = ch.kv_dim(), group = kHeads / kKvHeads;
  std::vector<std::vector<double>> keys, values, outs(c.n);
  for (int j = 0; j < c.first; ++j) {
    const int64_t s = ch.Slot(j);
    keys.emplace_back(ch.pool.k.begin() + s * kvd, ch.pool.k.begin() + (s + 1) * kvd);
    values.emplace_back(ch.pool.v.begin() + s * kvd, ch.pool.v.begin() + (s + 1) * kvd);
  }
  for (int i = 0; i < c.n; ++i) {
    std::vector<std::vector<double>> k = keys, v = values;
    k.emplace_back(ch.tk.begin() + i * kvd, ch.tk.begin() + (i + 1) * kvd);
    v.emplace_back(ch.tv.begin() + i * kvd, ch.tv.begin() + (i + 1) * kvd);
    outs[i].assign(ch.q_dim(), 0.0);
    for (int h = 0; h < kHeads; ++h) {
      const int kvh = h / group;
      std::vector<double> s(k.size());
      for (size_t j = 0; j < k.size(); ++j) {
        double dot = 0;
        for (int d = 0; d < hd; ++d)
          dot += ch.q[static_cast<size_t>(i) * ch.q_dim() + h * hd + d] * k[j][kvh * hd + d];
        s[j] = dot / std::sqrt(static_cast<double>(hd));
      }
      const double m = *std::max_element(s.begin(), s.end());
      double sum = 0;
      for (double& x : s) sum += (x = std::exp(x - m));
      for (size_t j = 0; j < k.size(); ++j) {
        for (int d = 0; d < hd; ++d) outs[i][h * hd + d] += s[j] / sum * v[j][kvh * hd + d];
      }
    }
    std::vector<double> pk(kvd), pv(kvd);
    PersistentPair(i, outs[i].data(), hd, pk.data(), pv.data());
    keys.push_back(pk);
    values.push_back(pv);
  }
  return outs;
}

class RecurrentPrefillTest : public ::testing::TestWithParam<Case> {};

TEST_P(RecurrentPrefillTest, TiledEqualsDirectAndNaive) {
  const Chunk ch = MakeChunk(GetParam(), 17 + GetParam().first * 31 + GetParam().n);
  ThreadPool two(2);
  const Outputs tiled = RunSchedule(ch, /*tiled=*/true, &two);
  const Outputs tiled_serial = RunSchedule(ch, /*tiled=*/true, nullptr);
  const Outputs tiled_scalar = RunSchedule(ch, /*tiled=*/true, &two, /*allow_avx2=*/false);
  const Outputs naive = RunSchedule(ch, /*tiled=*/false, &two);
  const auto direct = Direct(ch);
  double worst = 0;
  for (int i = 0; i < GetParam().n; ++i) {
    ASSERT_EQ(tiled[i].size(), direct[i].size()) << "position " << i << " never finished";
    for (size_t d = 0; d < direct[i].size(); ++d)
      worst = std::max(worst, std::abs(tiled[i][d] - direct[i][d]));
    EXPECT_EQ(tiled[i], naive[i]) << "position " << i << ": tiled and naive folds differ";
    EXPECT_EQ(tiled[i], tiled_serial[i]) << "position " << i << ": depends on threads";
    EXPECT_EQ(tiled[i], tiled_scalar[i]) << "position " << i << ": AVX2 lanes and scalar differ";
  }
  EXPECT_LE(worst, 1e-4);
}

std::vector<Case> Cases() {
  std::vector<Case> v;
  for (int bs : {1, 4, 16}) {
    for (int first : {0, 3, 16, 37}) {
      for (int n : {1, 2, 7, 16, 33, 100}) v.push_back({first, n, bs, bs == 4 ? 12 : 16});
    }
  }
  return v;
}

INSTANTIATE_TEST_SUITE_P(Chunks, RecurrentPrefillTest, ::testing::ValuesIn(Cases()),
                         [](const auto& info) {
                           const Case& c = info.param;
                           return "first" + std::to_string(c.first) + "_n" + std::to_string(c.n) +
                                  "_bs" + std::to_string(c.block_size) + "_hd" +
                                  std::to_string(c.head_dim);
                         });

// Several chunks and chunks of one in one schedule (the CPU runner's batch): each chunk's
// outputs are bitwise those it gives alone, and a wave's rows finish together, one position of
// every chunk still pending.
TEST(RecurrentScheduleOnCpuTest, ChunksInOneScheduleMatchEachAlone) {
  const std::vector<Case> cases = {{37, 100, 16, 16}, {0, 1, 16, 16},  {3, 33, 16, 16},
                                   {16, 2, 16, 16},   {64, 1, 16, 16}, {5, 70, 16, 16}};
  std::vector<Chunk> chunks;
  std::vector<Outputs> alone;
  ThreadPool two(2);
  for (size_t c = 0; c < cases.size(); ++c) {
    chunks.push_back(MakeChunk(cases[c], 101 + static_cast<uint32_t>(c)));
    alone.push_back(RunSchedule(chunks.back(), /*tiled=*/true, &two));
  }
  std::vector<int32_t> indptr = {0}, kv_len;
  std::vector<std::unique_ptr<ChunkAttention>> attentions;
  TiledRows rows;
  std::vector<std::pair<int, int>> chunk_pos;  // per row: (chunk, position)
  for (size_t c = 0; c < chunks.size(); ++c) {
    const Case& k = chunks[c].c;
    ChunkAttentionParams p;
    p.pool = &chunks[c].pool;
    p.blocks = chunks[c].blocks.data();
    p.num_blocks = static_cast<int>(chunks[c].blocks.size());
    p.first = k.first;
    p.n = k.n;
    p.q = chunks[c].q.data();
    p.extra_k = chunks[c].tk.data();
    p.extra_v = chunks[c].tv.data();
    p.n_heads = kHeads;
    p.n_kv_heads = kKvHeads;
    p.head_dim = k.head_dim;
    p.scale = 1.0f / std::sqrt(static_cast<float>(k.head_dim));
    attentions.push_back(std::make_unique<ChunkAttention>(p));
    for (int i = 0; i < k.n; ++i) {
      kv_len.push_back(k.first + i);
      rows.attention.push_back(attentions.back().get());
      rows.query.push_back(i);
      chunk_pos.push_back({static_cast<int>(c), i});
    }
    indptr.push_back(static_cast<int32_t>(kv_len.size()));
  }
  RecurrentSchedule s;
  std::string error;
  ASSERT_TRUE(BuildRecurrentSchedule(indptr, kv_len.data(), static_cast<int>(kv_len.size()), 16, &s,
                                     &error))
      << error;
  std::vector<Outputs> together(chunks.size());
  for (size_t c = 0; c < chunks.size(); ++c) together[c].resize(cases[c].n);
  int waves = 0;
  const int width = kHeads * 16;
  RunTiledSchedule(s, rows, width, &two, [&](const int* wave_rows, int n, float* attn) {
    ++waves;
    for (int j = 0; j < n; ++j) {
      auto [c, i] = chunk_pos[wave_rows[j]];
      Chunk& ch = chunks[c];
      const float* a = attn + static_cast<size_t>(j) * width;
      ASSERT_TRUE(together[c][i].empty()) << "position finished twice";
      together[c][i].assign(a, a + width);
      std::vector<float> k(ch.kv_dim()), v(ch.kv_dim());
      PersistentPair(i, a, ch.c.head_dim, k.data(), v.data());
      const int32_t slot = static_cast<int32_t>(ch.Slot(ch.c.first + i));
      KvWrite(ch.pool, k.data(), v.data(), &slot, 1);
    }
  });
  EXPECT_EQ(waves, 100);  // the longest chunk
  for (size_t c = 0; c < chunks.size(); ++c) {
    for (int i = 0; i < cases[c].n; ++i) {
      EXPECT_EQ(together[c][i], alone[c][i]) << "chunk " << c << " position " << i;
    }
  }
}

// Folding keys that are not yet causal for every query of the range is a programming error.
TEST(ChunkAttentionDeathTest, RefusesKeysAfterTheQueries) {
  const Chunk ch = MakeChunk({8, 16, 4, 8}, 3);
  ChunkAttentionParams p;
  p.pool = &ch.pool;
  p.blocks = ch.blocks.data();
  p.num_blocks = static_cast<int>(ch.blocks.size());
  p.first = 8;
  p.n = 16;
  p.q = ch.q.data();
  p.extra_k = ch.tk.data();
  p.extra_v = ch.tv.data();
  p.n_heads = kHeads;
  p.n_kv_heads = kKvHeads;
  p.head_dim = 8;
  ChunkAttention att(p);
  EXPECT_DEATH(att.FoldKeys(8, 16, 0, 16, nullptr), "keys must precede");
  EXPECT_DEATH(att.FoldKeys(0, 6, 4, 16, nullptr), "whole groups");
}

}  // namespace
}  // namespace morserve
