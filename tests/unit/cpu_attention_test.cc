// Paged attention against naive double-precision softmax attention over the same entries,
// gathered from shuffled block tables. Tolerance per output element:
// |out - ref| <= 1e-5 * sum_j p_j |v_j| (the magnitude of the convex combination).
// Also: KvWrite placement, rows alone vs in a batch (bitwise), threads vs serial (bitwise).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "engine/cpu/paged_attention.h"

namespace morserve {
namespace {

std::vector<float> Random(size_t n, std::mt19937& rng, float scale = 1.0f) {
  std::uniform_real_distribution<float> dist(-scale, scale);
  std::vector<float> v(n);
  for (float& f : v) f = dist(rng);
  return v;
}

// A batch of rows over several sequences, each sequence with a shuffled block table.
struct Batch {
  int n_heads, n_kv_heads, head_dim;
  PagedKvPool pool;
  std::vector<int32_t> indptr{0}, blocks, kv_len;
  std::vector<float> q, extra_k, extra_v, out;
  bool with_extra = false;

  PagedAttentionParams Params() {
    PagedAttentionParams p;
    p.num_rows = static_cast<int>(kv_len.size());
    p.q = q.data();
    p.out = out.data();
    p.pool = &pool;
    p.table_indptr = indptr.data();
    p.table_blocks = blocks.data();
    p.kv_len = kv_len.data();
    p.extra_k = with_extra ? extra_k.data() : nullptr;
    p.extra_v = with_extra ? extra_v.data() : nullptr;
    p.n_heads = n_heads;
    p.n_kv_heads = n_kv_heads;
    p.head_dim = head_dim;
    p.scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
    return p;
  }
};

// Rows of each sequence: their kv_len, in batch order.
using SeqLens = std::vector<std::vector<int>>;

Batch MakeBatch(int group, int head_dim, int block_size, bool with_extra, uint32_t seed,
                const SeqLens& seq_lens, int num_blocks = 40) {
  std::mt19937 rng(seed);
  Batch b{2 * group, 2, head_dim};
  b.pool = MakePagedKvPool(num_blocks, block_size, b.n_kv_heads, head_dim);
  b.pool.k = Random(b.pool.k.size(), rng, 2.0f);
  b.pool.v = Random(b.pool.v.size(), rng);
  std::vector<int32_t> ids(num_blocks);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  size_t next = 0;
  for (const auto& lens : seq_lens) {
    const int nblk = (*std::max_element(lens.begin(), lens.end()) + block_size - 1) / block_size;
    std::vector<int32_t> table(ids.begin() + next, ids.begin() + next + std::max(nblk, 1));
    next += table.size();
    for (int len : lens) {
      b.blocks.insert(b.blocks.end(), table.begin(), table.end());
      b.indptr.push_back(static_cast<int32_t>(b.blocks.size()));
      b.kv_len.push_back(std::min(len, static_cast<int>(table.size()) * block_size));
    }
  }
  const size_t rows = b.kv_len.size();
  b.with_extra = with_extra;
  b.q = Random(rows * b.n_heads * head_dim, rng, 2.0f);
  b.extra_k = Random(rows * b.n_kv_heads * head_dim, rng, 2.0f);
  b.extra_v = Random(rows * b.n_kv_heads * head_dim, rng);
  b.out.assign(rows * b.n_heads * head_dim, NAN);
  return b;
}

// Three sequences of 7, 5 and 1 blocks; several rows per sequence (prefill-like causal
// lengths and decode-like full lengths), including kv_len 0 and 1.
Batch MakeBatch(int group, int head_dim, int block_size, bool with_extra, uint32_t seed) {
  return MakeBatch(group, head_dim, block_size, with_extra, seed,
                   {{1, 2, 37, 7 * block_size - 3},
                    {0, 5 * block_size, 2 * block_size + 1},
                    {block_size / 2 + 1}});
}

std::vector<uint32_t> Bits(const std::vector<float>& v) {
  std::vector<uint32_t> bits(v.size());
  std::memcpy(bits.data(), v.data(), v.size() * sizeof(float));
  return bits;
}

// n consecutive causal rows of a prefill chunk whose first query sits at slot index `first`.
std::vector<int> PrefillRows(int first, int n) {
  std::vector<int> lens(n);
  std::iota(lens.begin(), lens.end(), first + 1);
  return lens;
}

void ExpectMatchesNaive(Batch& b) {
  const PagedAttentionParams p = b.Params();
  const int hd = b.head_dim, group = b.n_heads / b.n_kv_heads, bs = b.pool.block_size;
  for (int r = 0; r < p.num_rows; ++r) {
    for (int h = 0; h < b.n_heads; ++h) {
      const int kvh = h / group;
      std::vector<const float*> ks, vs;
      for (int j = 0; j < b.kv_len[r]; ++j) {
        const int64_t slot = static_cast<int64_t>(b.blocks[b.indptr[r] + j / bs]) * bs + j % bs;
        ks.push_back(b.pool.KeyAt(slot, kvh));
        vs.push_back(b.pool.ValueAt(slot, kvh));
      }
      if (b.with_extra) {
        ks.push_back(&b.extra_k[(r * b.n_kv_heads + kvh) * hd]);
        vs.push_back(&b.extra_v[(r * b.n_kv_heads + kvh) * hd]);
      }
      const float* q = &b.q[(r * b.n_heads + h) * hd];
      const float* out = &b.out[(r * b.n_heads + h) * hd];
      if (ks.empty()) {
        for (int d = 0; d < hd; ++d) EXPECT_EQ(out[d], 0.0f);
        continue;
      }
      std::vector<double> s(ks.size());
      double mx = -INFINITY, sum = 0;
      for (size_t j = 0; j < ks.size(); ++j) {
        double dot = 0;
        for (int d = 0; d < hd; ++d) dot += static_cast<double>(q[d]) * ks[j][d];
        s[j] = dot / std::sqrt(static_cast<double>(hd));
        mx = std::max(mx, s[j]);
      }
      for (double& x : s) sum += (x = std::exp(x - mx));
      for (int d = 0; d < hd; ++d) {
        double ref = 0, mag = 0;
        for (size_t j = 0; j < ks.size(); ++j) {
          ref += s[j] / sum * vs[j][d];
          mag += s[j] / sum * std::fabs(vs[j][d]);
        }
        ASSERT_LE(std::fabs(out[d] - ref), 1e-5 * mag + 1e-30)
            << "row " << r << " head " << h << " dim " << d << " kv_len " << b.kv_len[r];
      }
    }
  }
}

struct Case {
  int group, head_dim, block_size;
};

class PagedAttentionTest : public ::testing::TestWithParam<Case> {};

TEST_P(PagedAttentionTest, MatchesNaiveDouble) {
  const Case c = GetParam();
  for (bool extra : {false, true}) {
    Batch b = MakeBatch(c.group, c.head_dim, c.block_size, extra, 11);
    ThreadPool threads(3);
    PagedAttention(b.Params(), &threads);
    ExpectMatchesNaive(b);
  }
}

TEST_P(PagedAttentionTest, RowAloneEqualsRowInBatchAndThreadsEqualSerial) {
  const Case c = GetParam();
  Batch b = MakeBatch(c.group, c.head_dim, c.block_size, true, 12);
  ThreadPool threads(3);
  PagedAttention(b.Params(), &threads);
  const std::vector<float> batched = b.out;
  PagedAttention(b.Params(), nullptr);
  EXPECT_EQ(0, std::memcmp(batched.data(), b.out.data(), batched.size() * sizeof(float)));

  const size_t q_stride = static_cast<size_t>(b.n_heads) * b.head_dim;
  const size_t kv_stride = static_cast<size_t>(b.n_kv_heads) * b.head_dim;
  for (int r = 0; r < static_cast<int>(b.kv_len.size()); ++r) {
    PagedAttentionParams p = b.Params();
    std::vector<float> out(q_stride, NAN);
    const int32_t indptr[2] = {0, b.indptr[r + 1] - b.indptr[r]};
    p.num_rows = 1;
    p.q += r * q_stride;
    p.out = out.data();
    p.table_indptr = indptr;
    p.table_blocks += b.indptr[r];
    p.kv_len += r;
    p.extra_k += r * kv_stride;
    p.extra_v += r * kv_stride;
    PagedAttention(p, &threads);
    EXPECT_EQ(0, std::memcmp(out.data(), &batched[r * q_stride], q_stride * sizeof(float)))
        << "row " << r;
  }
}

// Every instruction set the unit is built for and the host runs gives the baseline's bits.
TEST_P(PagedAttentionTest, EveryBuildGivesTheBaselinesBits) {
  const Case c = GetParam();
  for (bool extra : {false, true}) {
    Batch b = MakeBatch(c.group, c.head_dim, c.block_size, extra, 13);
    PagedAttentionWithIsa(b.Params(), nullptr, "baseline");
    const std::vector<float> want = b.out;
    for (std::string_view isa : PagedAttentionIsas()) {
      std::fill(b.out.begin(), b.out.end(), NAN);
      PagedAttentionWithIsa(b.Params(), nullptr, isa);
      std::vector<uint32_t> got_bits(want.size()), want_bits(want.size());
      std::memcpy(got_bits.data(), b.out.data(), want.size() * sizeof(float));
      std::memcpy(want_bits.data(), want.data(), want.size() * sizeof(float));
      EXPECT_EQ(got_bits, want_bits) << isa << " extra=" << extra;
    }
    if (PagedAttentionIsas().size() == 1)
      GTEST_SKIP() << "only the baseline build runs on this host";
  }
}

// Prefill chunks (runs of rows over one table, which the -lanes builds fold 16 or 8 rows at a
// time, with partial chunks on the diagonal and lanes past a row's kv_len), a run cut short by
// another sequence's rows, a run of rows that share only a table prefix, and decode rows, the
// last also as 4 rows of equal length: every build gives the baseline's bits, serially and on
// 2 and 3 threads; and the result matches the naive attention.
TEST_P(PagedAttentionTest, PrefillRunsGiveTheBaselinesBits) {
  const Case c = GetParam();
  const int bs = c.block_size;
  const SeqLens seqs = {PrefillRows(0, 40),
                        PrefillRows(3 * bs - 5, 21),
                        {5 * bs},
                        PrefillRows(bs + 2, 3),
                        {2 * bs + 1, 2 * bs + 1, 2 * bs + 1, 2 * bs + 1},
                        {0, 0, 0, 0, 1}};
  Batch b = MakeBatch(c.group, c.head_dim, bs, /*with_extra=*/false, 29, seqs,
                      /*num_blocks=*/60 + 40 / bs);
  PagedAttentionWithIsa(b.Params(), nullptr, "baseline");
  ExpectMatchesNaive(b);
  const std::vector<uint32_t> want = Bits(b.out);
  for (std::string_view isa : PagedAttentionIsas()) {
    for (int threads : {0, 2, 3}) {
      ThreadPool pool(std::max(threads, 1));
      std::fill(b.out.begin(), b.out.end(), NAN);
      PagedAttentionWithIsa(b.Params(), threads == 0 ? nullptr : &pool, isa);
      EXPECT_EQ(Bits(b.out), want) << isa << " threads=" << threads;
    }
  }
  if (PagedAttentionIsas().back() == "baseline") GTEST_SKIP() << "no lanes build runs on this host";
}

// A row of a prefill chunk alone (the per-row unit) and inside its run at every lane (the
// lanes kernel of a -lanes build): the same bits, on every build.
TEST_P(PagedAttentionTest, ARowAloneEqualsTheRowInItsRun) {
  const Case c = GetParam();
  Batch b = MakeBatch(c.group, c.head_dim, c.block_size, false, 31,
                      {PrefillRows(c.block_size - 1, 35)}, 40);
  const size_t width = static_cast<size_t>(b.n_heads) * b.head_dim;
  for (std::string_view isa : PagedAttentionIsas()) {
    PagedAttentionWithIsa(b.Params(), nullptr, isa);
    const std::vector<float> batched = b.out;
    for (int r = 0; r < static_cast<int>(b.kv_len.size()); ++r) {
      PagedAttentionParams p = b.Params();
      p.num_rows = 1;
      p.q += r * width;
      p.kv_len += r;
      p.table_indptr += r;
      std::vector<float> alone(width, NAN);
      p.out = alone.data();
      PagedAttentionWithIsa(p, nullptr, isa);
      EXPECT_EQ(Bits(alone), Bits(std::vector<float>(batched.begin() + r * width,
                                                     batched.begin() + (r + 1) * width)))
          << isa << " row " << r;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, PagedAttentionTest,
                         ::testing::Values(Case{1, 16, 16}, Case{2, 64, 16}, Case{4, 128, 16},
                                           Case{1, 64, 5}, Case{2, 128, 32}, Case{4, 16, 7}),
                         [](const auto& info) {
                           return "g" + std::to_string(info.param.group) + "_hd" +
                                  std::to_string(info.param.head_dim) + "_bs" +
                                  std::to_string(info.param.block_size);
                         });

TEST(KvWriteTest, WritesSlotsAndSkipsMinusOne) {
  PagedKvPool pool = MakePagedKvPool(4, 3, 2, 4);
  std::mt19937 rng(5);
  const auto k = Random(3 * 8, rng), v = Random(3 * 8, rng);
  const int32_t slots[3] = {7, -1, 0};
  KvWrite(pool, k.data(), v.data(), slots, 3);
  for (int d = 0; d < 8; ++d) {
    EXPECT_EQ(pool.k[7 * 8 + d], k[d]);
    EXPECT_EQ(pool.v[7 * 8 + d], v[d]);
    EXPECT_EQ(pool.k[0 * 8 + d], k[16 + d]);
    EXPECT_EQ(pool.v[0 * 8 + d], v[16 + d]);
  }
  EXPECT_EQ(pool.KeyAt(7, 1), &pool.k[7 * 8 + 4]);
  const float nonzero = std::count_if(pool.k.begin(), pool.k.end(), [](float f) { return f != 0; });
  EXPECT_LE(nonzero, 16);
}

}  // namespace
}  // namespace morserve
