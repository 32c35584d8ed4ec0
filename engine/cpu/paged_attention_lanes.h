// Paged attention for a run of rows that read one block table (the rows of a sequence's
// prefill chunk), one row per vector lane: 16 on AVX-512 (paged_attention_lanes_avx512.cc), 8
// on AVX2 (chunk_attention_avx2.cc, beside ChunkAttention's lanes, whose helpers it shares).
//
// The per-row unit (paged_attention.cc) scores one key at a time with a horizontal dot product
// and a scalar exp: at a 512-token prefill of the 360M shape it was a third of the prefill's
// time (perf). Here up to 16 (or 8) rows run together: each key's element is broadcast against
// a register holding that element of every row's query, the exp runs on every lane, and each
// value element is broadcast against the rows' weights.
//
// Invariant (bits): every lane performs exactly the operations of AttentionDot, FoldChunk and
// NormaliseState (online_softmax.h) for its own row, in the same order and with separate
// multiplies and adds (this file is built with -ffp-contract=off), on the same block-aligned
// chunks of its own kv_len; a lane whose chunk is shorter, or past its kv_len, is masked off
// (its state does not change; AVX2 blends where AVX-512 masks). So a row's output is
// bit-identical to the per-row unit's,
// whichever rows share its run (tests/unit/cpu_attention_test.cc).
#pragma once

#include <cstdint>

#include "engine/cpu/paged_attention.h"

namespace morserve {

constexpr int kAttentionLanes = 16;  // AVX-512
constexpr int kAttentionLanesAvx2 = 8;

// Rows [row_begin, row_end) of the params (at most the kernel's lanes), every one of which reads
// its kv_len entries through a prefix of `blocks` (the longest of their tables).
struct AttentionLaneRows {
  int row_begin = 0;
  int row_end = 0;
  const int32_t* blocks = nullptr;
};

// The host runs AttendLanesAvx512 (AVX-512 F).
bool CpuHasAttentionLanes();

// Attention of the rows for the query heads of one kv head, written to p.out. p.extra_k must
// be null (the recurrent layers' extra pair is left to the per-row unit).
void AttendLanesAvx512(const PagedAttentionParams& p, const AttentionLaneRows& rows, int kv_head);
// The same on AVX2, at most 8 rows (the host runs AVX2).
void AttendLanesAvx2(const PagedAttentionParams& p, const AttentionLaneRows& rows, int kv_head);

}  // namespace morserve
