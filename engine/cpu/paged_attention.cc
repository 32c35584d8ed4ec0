// Paged KV writes and fp32 paged attention (see paged_attention.h for layout and invariants).
#include "engine/cpu/paged_attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string_view>
#include <vector>

#include "engine/core/check.h"
#include "engine/cpu/kernel_choice.h"
#include "engine/cpu/online_softmax.h"
#include "engine/cpu/paged_attention_lanes.h"
#include "engine/cpu/simd_target.h"

namespace morserve {
namespace {

// Scratch for one (row, kv head) unit, reused across units on a thread.
struct UnitScratch {
  std::vector<float> acc;            // [group][head_dim]
  std::vector<float> scores;         // [block_size]
  std::vector<const float*> keys;    // [block_size]
  std::vector<const float*> values;  // [block_size]
};

// Asks for the K and V rows of the next block while this one is folded: a decode row's
// attention reads its whole context from the pool each step, far beyond the caches, and the
// rows of one KV head are strided by the other heads'. A prefetch changes no result.
inline void PrefetchBlock(const PagedKvPool& kv, int32_t block, int count, int kv_head) {
  const int64_t base = static_cast<int64_t>(block) * kv.block_size;
  const int bytes = kv.head_dim * static_cast<int>(sizeof(float));
  for (int j = 0; j < count; ++j) {
    const char* k = reinterpret_cast<const char*>(kv.KeyAt(base + j, kv_head));
    const char* v = reinterpret_cast<const char*>(kv.ValueAt(base + j, kv_head));
    for (int b = 0; b < bytes; b += 64) {
      __builtin_prefetch(k + b);
      __builtin_prefetch(v + b);
    }
  }
}

// The unit's body, compiled once per instruction set below: the compiler vectorises the 8
// partial sums of AttentionDot and the value accumulation across head_dim lanes, which changes
// no rounding (no reassociation, no contraction: this file is built with -ffp-contract=off),
// so every build gives the baseline's bits (cpu_attention_test compares them).
[[gnu::always_inline]] inline void AttendUnitBody(const PagedAttentionParams& p, int row,
                                                  int kv_head, UnitScratch& s) {
  const PagedKvPool& kv = *p.pool;
  const int group = p.n_heads / p.n_kv_heads;
  const int hd = p.head_dim;
  const int bs = kv.block_size;
  s.acc.assign(static_cast<size_t>(group) * hd, 0.0f);
  s.scores.resize(std::max(bs, 1));
  s.keys.resize(std::max(bs, 1));
  s.values.resize(std::max(bs, 1));
  std::vector<SoftmaxState> states(group);
  for (int g = 0; g < group; ++g) states[g].acc = s.acc.data() + static_cast<size_t>(g) * hd;
  const size_t q_stride = static_cast<size_t>(p.n_heads) * hd;
  const float* q_row = p.q + row * q_stride;

  const int len = p.kv_len[row];
  const int32_t* blocks = p.table_blocks + p.table_indptr[row];  // covers len (RowBlocks checks)
  for (int start = 0; start < len; start += bs) {
    const int count = std::min(bs, len - start);
    const int64_t base = static_cast<int64_t>(blocks[start / bs]) * bs;
    MORSERVE_CHECK(base >= 0 && base + count <= kv.num_slots(), "block id outside the pool");
    for (int j = 0; j < count; ++j) {
      s.keys[j] = kv.KeyAt(base + j, kv_head);
      s.values[j] = kv.ValueAt(base + j, kv_head);
    }
    if (start + bs < len)
      PrefetchBlock(kv, blocks[start / bs + 1], std::min(bs, len - start - bs), kv_head);
    for (int g = 0; g < group; ++g) {
      const float* q = q_row + static_cast<size_t>(kv_head * group + g) * hd;
      for (int j = 0; j < count; ++j) s.scores[j] = AttentionDot(q, s.keys[j], hd) * p.scale;
      FoldChunk(states[g], s.scores.data(), s.values.data(), count, hd);
    }
  }
  if (p.extra_k != nullptr) {
    const size_t kv_stride = static_cast<size_t>(p.n_kv_heads) * hd;
    const float* k = p.extra_k + row * kv_stride + static_cast<size_t>(kv_head) * hd;
    const float* v = p.extra_v + row * kv_stride + static_cast<size_t>(kv_head) * hd;
    for (int g = 0; g < group; ++g) {
      const float* q = q_row + static_cast<size_t>(kv_head * group + g) * hd;
      const float score = AttentionDot(q, k, hd) * p.scale;
      FoldChunk(states[g], &score, &v, 1, hd);
    }
  }
  for (int g = 0; g < group; ++g) {
    float* out = p.out + row * q_stride + static_cast<size_t>(kv_head * group + g) * hd;
    NormaliseState(states[g], hd, out);
  }
}

void AttendUnitBaseline(const PagedAttentionParams& p, int row, int kv_head, UnitScratch& s) {
  AttendUnitBody(p, row, kv_head, s);
}

MORSERVE_BEGIN_TARGET("avx2")
void AttendUnitAvx2(const PagedAttentionParams& p, int row, int kv_head, UnitScratch& s) {
  AttendUnitBody(p, row, kv_head, s);
}
MORSERVE_END_TARGET

MORSERVE_BEGIN_TARGET("avx512f")
void AttendUnitAvx512(const PagedAttentionParams& p, int row, int kv_head, UnitScratch& s) {
  AttendUnitBody(p, row, kv_head, s);
}
MORSERVE_END_TARGET

using AttendUnitFn = void (*)(const PagedAttentionParams&, int, int, UnitScratch&);

using AttendLanesFn = void (*)(const PagedAttentionParams&, const AttentionLaneRows&, int);

// A build: the per-row unit, and the kernel (with its lane count) that runs of rows sharing a
// block table go to (paged_attention_lanes.h), or none.
struct Build {
  AttendUnitFn unit;
  AttendLanesFn lanes = nullptr;
  int lane_count = 0;
};

Build BuildFor(std::string_view isa) {
  if (isa == "avx512-lanes") return {&AttendUnitAvx512, &AttendLanesAvx512, kAttentionLanes};
  if (isa == "avx512") return {&AttendUnitAvx512};
  if (isa == "avx2-lanes") return {&AttendUnitAvx2, &AttendLanesAvx2, kAttentionLanesAvx2};
  if (isa == "avx2") return {&AttendUnitAvx2};
  MORSERVE_CHECK(isa == "baseline", "paged attention: unknown instruction set");
  return {&AttendUnitBaseline};
}

// The widest build the host runs; "scalar" in $MORSERVE_CPU_KERNELS pins the baseline, "avx2"
// the AVX2 build.
std::string_view BestIsa() {
  const std::vector<std::string_view> isas = PagedAttentionIsas();
  const std::string_view want = RequestedCpuKernels();
  if (want == "scalar") return "baseline";
  if (want == "avx2" && __builtin_cpu_supports("avx2")) return "avx2-lanes";
  return isas.back();
}

// From this many rows on, a run of rows sharing a table goes to the lanes kernel (it computes
// every lane whatever the rows; shorter runs take the per-row unit).
constexpr int kMinLaneRows = 4;

// Blocks of rows, in order: runs of up to `lanes` consecutive rows whose entries all lie in one
// table (each row's needed blocks a prefix of the run's longest table), or single rows
// (blocks == nullptr: the per-row unit). lanes == 0: single rows only.
std::vector<AttentionLaneRows> RowBlocks(const PagedAttentionParams& p, int lanes) {
  const int bs = p.pool->block_size;
  auto table = [&](int r) { return p.table_blocks + p.table_indptr[r]; };
  auto need = [&](int r) { return (p.kv_len[r] + bs - 1) / bs; };
  for (int r = 0; r < p.num_rows; ++r) {
    MORSERVE_CHECK(p.kv_len[r] <= (p.table_indptr[r + 1] - p.table_indptr[r]) * bs,
                   "kv_len exceeds the row's block table");
  }
  std::vector<AttentionLaneRows> out;
  for (int r = 0; r < p.num_rows;) {
    int e = r + 1, ref = r;
    if (lanes > 0 && p.extra_k == nullptr) {
      for (; e < p.num_rows && e - r < lanes; ++e) {
        const int common = std::min(need(e), need(ref));
        if (!std::equal(table(e), table(e) + common, table(ref))) break;
        if (need(e) > need(ref)) ref = e;
      }
    }
    if (e - r >= kMinLaneRows) {
      out.push_back({r, e, table(ref)});
    } else {
      for (int i = r; i < e; ++i) out.push_back({i, i + 1, nullptr});
    }
    r = e;
  }
  return out;
}

void Run(const PagedAttentionParams& p, ThreadPool* threads, const Build& build) {
  if (p.num_rows <= 0) return;
  MORSERVE_CHECK(p.n_kv_heads > 0 && p.n_heads % p.n_kv_heads == 0,
                 "n_kv_heads must divide n_heads");
  MORSERVE_CHECK(p.pool->kv_heads == p.n_kv_heads && p.pool->head_dim == p.head_dim,
                 "attention params do not match the KV pool shape");
  MORSERVE_CHECK((p.extra_k == nullptr) == (p.extra_v == nullptr),
                 "extra_k and extra_v go together");
  const std::vector<AttentionLaneRows> blocks = RowBlocks(p, build.lane_count);
  const int64_t units = static_cast<int64_t>(blocks.size()) * p.n_kv_heads;
  auto body = [&](int64_t begin, int64_t end) {
    thread_local UnitScratch scratch;
    for (int64_t u = begin; u < end; ++u) {
      const AttentionLaneRows& rows = blocks[u / p.n_kv_heads];
      const int kv_head = static_cast<int>(u % p.n_kv_heads);
      if (rows.blocks != nullptr) {
        build.lanes(p, rows, kv_head);
      } else {
        build.unit(p, rows.row_begin, kv_head, scratch);
      }
    }
  };
  if (threads == nullptr) {
    body(0, units);
  } else {
    threads->ParallelFor(units, body);
  }
}

}  // namespace

std::vector<std::string_view> PagedAttentionIsas() {
  std::vector<std::string_view> isas = {"baseline"};
  if (__builtin_cpu_supports("avx2")) {
    isas.push_back("avx2");
    isas.push_back("avx2-lanes");
  }
  if (__builtin_cpu_supports("avx512f")) isas.push_back("avx512");
  if (CpuHasAttentionLanes()) isas.push_back("avx512-lanes");
  return isas;
}

void PagedAttentionWithIsa(const PagedAttentionParams& p, ThreadPool* threads,
                           std::string_view isa) {
  Run(p, threads, BuildFor(isa));
}

PagedKvPool MakePagedKvPool(int num_blocks, int block_size, int kv_heads, int head_dim) {
  PagedKvPool pool;
  pool.num_blocks = num_blocks;
  pool.block_size = block_size;
  pool.kv_heads = kv_heads;
  pool.head_dim = head_dim;
  const size_t n = static_cast<size_t>(num_blocks) * block_size * kv_heads * head_dim;
  pool.k.assign(n, 0.0f);
  pool.v.assign(n, 0.0f);
  return pool;
}

void KvWrite(PagedKvPool& pool, const float* k_rows, const float* v_rows,
             const int32_t* slot_mapping, int rows) {
  const size_t dim = static_cast<size_t>(pool.kv_dim());
  for (int r = 0; r < rows; ++r) {
    const int64_t slot = slot_mapping[r];
    if (slot == -1) continue;
    MORSERVE_CHECK(slot >= 0 && slot < pool.num_slots(), "slot outside the KV pool");
    std::memcpy(pool.k.data() + slot * dim, k_rows + r * dim, dim * sizeof(float));
    std::memcpy(pool.v.data() + slot * dim, v_rows + r * dim, dim * sizeof(float));
  }
}

void PagedAttention(const PagedAttentionParams& p, ThreadPool* threads) {
  static const Build build = BuildFor(BestIsa());
  Run(p, threads, build);
}

}  // namespace morserve
