// The recurrent layer's tiled schedule on the CPU (see recurrent_prefill.h).
#include "engine/cpu/recurrent_prefill.h"

#include <algorithm>
#include <string>

#include "engine/core/check.h"

namespace morserve {
namespace {

// Runs the merges [begin, end) of one wave: consecutive items of one chunk with the same key
// range and consecutive queries are one dense FoldKeys rectangle.
void RunMerges(const RecurrentSchedule& s, const TiledRows& rows, int begin, int end,
               ThreadPool* threads) {
  for (int m = begin; m < end;) {
    const RecurrentFold& f = s.merge[m];
    const int row = s.order[f.row];
    ChunkAttention* attention = rows.attention[row];
    int e = m + 1;
    if (attention == nullptr) {
      m = e;
      continue;
    }
    const int q_begin = rows.query[row];
    int q_end = q_begin + 1;
    for (; e < end; ++e, ++q_end) {
      const RecurrentFold& g = s.merge[e];
      const int next = s.order[g.row];
      if (g.key_begin != f.key_begin || g.key_end != f.key_end ||
          rows.attention[next] != attention || rows.query[next] != q_end) {
        break;
      }
    }
    attention->FoldKeys(f.key_begin, f.key_end, q_begin, q_end, threads);
    m = e;
  }
}

}  // namespace

void RunTiledSchedule(const RecurrentSchedule& s, const TiledRows& rows, int attn_width,
                      ThreadPool* threads, const FinishWave& finish) {
  std::vector<float> attn;
  for (int w = 0; w < s.waves(); ++w) {
    RunMerges(s, rows, s.merge_begin[w], s.merge_begin[w + 1], threads);
    const int begin = s.wave_begin[w], n = s.wave_begin[w + 1] - begin;
    attn.assign(static_cast<size_t>(n) * attn_width, 0.0f);
    for (int j = 0; j < n; ++j) {
      const int row = s.order[begin + j];
      if (rows.attention[row] != nullptr) {
        rows.attention[row]->Finish(rows.query[row], &attn[static_cast<size_t>(j) * attn_width]);
      }
    }
    finish(s.order.data() + begin, n, attn.data());
  }
}

void RunTiledPrefill(ChunkAttention& attention, ThreadPool* threads, const FinishPosition& finish) {
  const int n = attention.n();
  if (n == 0) return;
  std::vector<int32_t> kv_len(n);
  for (int i = 0; i < n; ++i) kv_len[i] = attention.first() + i;
  RecurrentSchedule s;
  std::string error;
  MORSERVE_CHECK(BuildRecurrentSchedule({0, n}, kv_len.data(), n, attention.group(), &s, &error),
                 error.c_str());
  TiledRows rows;
  rows.attention.assign(n, &attention);
  rows.query.resize(n);
  for (int i = 0; i < n; ++i) rows.query[i] = i;
  RunTiledSchedule(s, rows, attention.attn_width(), threads,
                   [&](const int* wave_rows, int count, float* attn) {
                     for (int j = 0; j < count; ++j) {
                       finish(wave_rows[j], attn + static_cast<size_t>(j) * attention.attn_width());
                     }
                   });
}

}  // namespace morserve
