// Host side of the paged-attention tests (GPU and CPU-emulated): random problems over a
// shuffled paged KV pool, the launch parameters over either variant's buffers (and a row's
// own, for batch invariance), the double-precision reference, and the comparisons.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "engine/model/dtype.h"
#include "kernels/paged_attention.cuh"

namespace morserve::kernels::attention_test {

constexpr uint16_t kNanBits = 0xFFFF;

// A request: its final context length and how many of its last tokens are query rows.
struct RequestSpec {
  int context;
  int query_rows;
};

struct Shape {
  int n_heads, n_kv_heads, head_dim, block_size, chunk_len;
  bool extra;
  float q_scale;  // larger values give sharper softmax distributions
  AttentionFold fold = AttentionFold::kCta;
};

// The shape with the other fold.
inline Shape WithFold(Shape s, AttentionFold fold) {
  s.fold = fold;
  return s;
}

inline std::string Describe(const Shape& s) {
  return "heads=" + std::to_string(s.n_heads) + "/" + std::to_string(s.n_kv_heads) +
         " head_dim=" + std::to_string(s.head_dim) + " block=" + std::to_string(s.block_size) +
         " chunk=" + std::to_string(s.chunk_len) + " extra=" + (s.extra ? "yes" : "no") +
         " q_scale=" + std::to_string(s.q_scale) +
         (s.fold == AttentionFold::kWarp ? " fold=warp" : " fold=cta");
}

// Host copy of one launch's inputs.
struct Problem {
  Shape shape;
  int rows = 0;
  int num_blocks = 0;
  int max_kv_len = 0;
  std::vector<int32_t> indptr, blocks, kv_len;
  std::vector<uint16_t> q, k_cache, v_cache, extra_k, extra_v;

  int kv_dim() const { return shape.n_kv_heads * shape.head_dim; }
  int q_dim() const { return shape.n_heads * shape.head_dim; }
};

inline uint16_t RandomBf16(std::mt19937_64& rng, float stddev) {
  std::normal_distribution<float> dist(0.0f, stddev);
  return F32ToBf16(dist(rng));
}

// Rows of request i are the last query_rows tokens of its context: row j of n sees
// context - n + j + 1 cache entries (its own included), or one fewer plus its extra pair.
inline Problem Build(const Shape& s, const std::vector<RequestSpec>& requests,
                     std::mt19937_64& rng) {
  Problem p;
  p.shape = s;
  std::vector<int> need(requests.size());
  int total_blocks = 0;
  for (size_t i = 0; i < requests.size(); ++i) {
    // One spare block on some requests: capacity beyond the entries must not be read.
    need[i] = (requests[i].context + s.block_size - 1) / s.block_size + static_cast<int>(i % 2);
    total_blocks += need[i];
  }
  p.num_blocks = total_blocks + 5;  // some blocks belong to nobody
  std::vector<int32_t> ids(p.num_blocks);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);

  const size_t slots = static_cast<size_t>(p.num_blocks) * s.block_size;
  p.k_cache.assign(slots * p.kv_dim(), kNanBits);
  p.v_cache.assign(slots * p.kv_dim(), kNanBits);
  p.indptr.push_back(0);
  int next = 0;
  for (size_t i = 0; i < requests.size(); ++i) {
    const RequestSpec& req = requests[i];
    std::vector<int32_t> table(ids.begin() + next, ids.begin() + next + need[i]);
    next += need[i];
    // Entries [0, context) get random values; everything else stays NaN.
    for (int e = 0; e < req.context; ++e) {
      const size_t slot =
          static_cast<size_t>(table[e / s.block_size]) * s.block_size + e % s.block_size;
      for (int d = 0; d < p.kv_dim(); ++d) {
        p.k_cache[slot * p.kv_dim() + d] = RandomBf16(rng, 1.0f);
        p.v_cache[slot * p.kv_dim() + d] = RandomBf16(rng, 1.0f);
      }
    }
    for (int j = 0; j < req.query_rows; ++j) {
      const int visible = req.context - req.query_rows + j + (s.extra ? 0 : 1);
      p.kv_len.push_back(visible);
      p.max_kv_len = std::max(p.max_kv_len, visible);
      p.blocks.insert(p.blocks.end(), table.begin(), table.end());
      p.indptr.push_back(static_cast<int32_t>(p.blocks.size()));
      for (int d = 0; d < p.q_dim(); ++d) p.q.push_back(RandomBf16(rng, s.q_scale));
      if (s.extra) {
        for (int d = 0; d < p.kv_dim(); ++d) {
          p.extra_k.push_back(RandomBf16(rng, 1.0f));
          p.extra_v.push_back(RandomBf16(rng, 1.0f));
        }
      }
    }
  }
  p.rows = static_cast<int>(p.kv_len.size());
  if (p.blocks.empty()) p.blocks.push_back(0);  // a valid device pointer even if unused
  return p;
}

// out[r][h][d] in double.
inline std::vector<double> Reference(const Problem& p) {
  const Shape& s = p.shape;
  const int hd = s.head_dim, group = s.n_heads / s.n_kv_heads;
  const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
  std::vector<double> out(static_cast<size_t>(p.rows) * p.q_dim(), 0.0);
  for (int r = 0; r < p.rows; ++r) {
    for (int h = 0; h < s.n_heads; ++h) {
      const int kvh = h / group;
      std::vector<const uint16_t*> ks, vs;
      for (int e = 0; e < p.kv_len[r]; ++e) {
        const size_t slot =
            static_cast<size_t>(p.blocks[p.indptr[r] + e / s.block_size]) * s.block_size +
            e % s.block_size;
        ks.push_back(&p.k_cache[(slot * s.n_kv_heads + kvh) * hd]);
        vs.push_back(&p.v_cache[(slot * s.n_kv_heads + kvh) * hd]);
      }
      if (s.extra) {
        ks.push_back(&p.extra_k[(static_cast<size_t>(r) * s.n_kv_heads + kvh) * hd]);
        vs.push_back(&p.extra_v[(static_cast<size_t>(r) * s.n_kv_heads + kvh) * hd]);
      }
      if (ks.empty()) continue;
      const uint16_t* q = &p.q[(static_cast<size_t>(r) * s.n_heads + h) * hd];
      std::vector<double> score(ks.size());
      double m = -INFINITY;
      for (size_t j = 0; j < ks.size(); ++j) {
        double dot = 0;
        for (int d = 0; d < hd; ++d)
          dot += static_cast<double>(Bf16ToF32(q[d])) * Bf16ToF32(ks[j][d]);
        score[j] = dot * scale;
        m = std::max(m, score[j]);
      }
      double sum = 0;
      double* o = &out[(static_cast<size_t>(r) * s.n_heads + h) * hd];
      for (size_t j = 0; j < ks.size(); ++j) {
        const double w = std::exp(score[j] - m);
        sum += w;
        for (int d = 0; d < hd; ++d) o[d] += w * Bf16ToF32(vs[j][d]);
      }
      for (int d = 0; d < hd; ++d) o[d] /= sum;
    }
  }
  return out;
}

inline std::vector<float> Decode(const std::vector<uint8_t>& raw, DType t) {
  const size_t esize = t == DType::kBF16 ? 2 : 4;
  std::vector<float> out(raw.size() / esize);
  for (size_t i = 0; i < out.size(); ++i) {
    if (t == DType::kBF16) {
      uint16_t b;
      std::memcpy(&b, raw.data() + 2 * i, 2);
      out[i] = Bf16ToF32(b);
    } else {
      std::memcpy(&out[i], raw.data() + 4 * i, 4);
    }
  }
  return out;
}

// Checks every (row, head) of `got` against `ref`; rows listed in `skip` are not checked.
inline void ExpectMatches(const Problem& p, const std::vector<float>& got,
                          const std::vector<double>& ref, DType t,
                          const std::vector<int>& skip = {}) {
  const double tol = t == DType::kBF16 ? 1e-2 : 1e-4;
  const int hd = p.shape.head_dim;
  int failures = 0;
  for (int r = 0; r < p.rows && failures < 10; ++r) {
    if (std::find(skip.begin(), skip.end(), r) != skip.end()) continue;
    for (int h = 0; h < p.shape.n_heads && failures < 10; ++h) {
      const size_t base = (static_cast<size_t>(r) * p.shape.n_heads + h) * hd;
      double err2 = 0, ref2 = 0;
      bool all_zero_ok = true;
      for (int d = 0; d < hd; ++d) {
        const double diff = got[base + d] - ref[base + d];
        err2 += diff * diff;
        ref2 += ref[base + d] * ref[base + d];
        all_zero_ok = all_zero_ok && got[base + d] == 0.0f;
      }
      const bool sees_nothing = p.kv_len[r] == 0 && !p.shape.extra;
      if (sees_nothing) {
        if (!all_zero_ok) {
          ADD_FAILURE() << "row " << r << " head " << h << " sees nothing but is not zero";
          ++failures;
        }
        continue;
      }
      const double rel = std::sqrt(err2) / std::sqrt(ref2);
      if (!(rel < tol)) {
        ADD_FAILURE() << "row " << r << " (kv_len " << p.kv_len[r] << ") head " << h
                      << ": relative error " << rel << " (tolerance " << tol << "), first got "
                      << got[base] << " want " << ref[base];
        ++failures;
      }
    }
  }
  ASSERT_EQ(failures, 0);
}

// Where a launch reads the problem: host memory (the emulator) or device memory (the GPU test).
struct AttentionInputs {
  const uint16_t *q, *k_cache, *v_cache, *extra_k, *extra_v;
  const int32_t *indptr, *blocks, *kv_len;
};

// The problem's launch parameters over `in`; out and workspace are the launch's to set.
inline PagedAttentionParams LaunchParams(const Problem& p, const AttentionInputs& in,
                                         DType out_dtype) {
  PagedAttentionParams a;
  a.q = in.q;
  a.k_cache = in.k_cache;
  a.v_cache = in.v_cache;
  a.table_indptr = in.indptr;
  a.table_blocks = in.blocks;
  a.kv_len = in.kv_len;
  a.extra_k = p.shape.extra ? in.extra_k : nullptr;
  a.extra_v = p.shape.extra ? in.extra_v : nullptr;
  a.out_dtype = out_dtype;
  a.rows = p.rows;
  a.n_heads = p.shape.n_heads;
  a.n_kv_heads = p.shape.n_kv_heads;
  a.head_dim = p.shape.head_dim;
  a.block_size = p.shape.block_size;
  a.num_blocks = p.num_blocks;
  a.max_kv_len = p.max_kv_len;
  a.chunk_len = p.shape.chunk_len;
  a.fold = p.shape.fold;
  a.scale = 1.0f / std::sqrt(static_cast<float>(p.shape.head_dim));
  return a;
}

// Row r's own table for a launch of that row alone: indptr {0, n}, its blocks (an empty table
// still needs a valid pointer, so it holds a 0 then) and kv_len.
struct RowTable {
  std::vector<int32_t> indptr, blocks, kv_len;
};
inline RowTable RowTableOf(const Problem& p, int r) {
  const int n = p.indptr[r + 1] - p.indptr[r];
  RowTable t;
  t.blocks = {0};
  if (n > 0) t.blocks.assign(p.blocks.begin() + p.indptr[r], p.blocks.begin() + p.indptr[r + 1]);
  t.indptr = {0, n};
  t.kv_len = {p.kv_len[r]};
  return t;
}

// The batch's parameters narrowed to row r: one row, its q and extra pair, its max_kv_len. The
// table, indptr and kv_len pointers are the caller's to set (to a copy of RowTableOf(p, r)).
inline PagedAttentionParams RowParams(const Problem& p, PagedAttentionParams batch, int r) {
  batch.rows = 1;
  batch.q += static_cast<size_t>(r) * p.q_dim();
  if (p.shape.extra) {
    batch.extra_k += static_cast<size_t>(r) * p.kv_dim();
    batch.extra_v += static_cast<size_t>(r) * p.kv_dim();
  }
  batch.max_kv_len = p.kv_len[r];
  return batch;
}

// Batch invariance: row r launched alone gave, bit for bit, its row of the batch's output.
inline void ExpectRowMatchesBatch(const Problem& p, int r, const std::vector<uint8_t>& alone,
                                  const std::vector<uint8_t>& batch) {
  const size_t row_bytes = batch.size() / p.rows;
  ASSERT_EQ(alone.size(), row_bytes);
  ASSERT_EQ(0, std::memcmp(alone.data(), batch.data() + r * row_bytes, row_bytes))
      << "row " << r << " (kv_len " << p.kv_len[r] << ") differs alone and in the batch of "
      << p.rows;
}

}  // namespace morserve::kernels::attention_test
