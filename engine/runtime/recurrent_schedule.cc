// The recurrent layer's wave and merge schedule (see recurrent_schedule.h).
#include "engine/runtime/recurrent_schedule.h"

#include <algorithm>
#include <bit>
#include <utility>

namespace morserve {
namespace {

struct Chunk {
  int begin = 0;  // old row of position 0
  int n = 0;
  int first = 0;  // entry index of position 0
};

bool Chunks(const std::vector<int32_t>& indptr, const int32_t* kv_len, int n,
            std::vector<Chunk>* out, std::string* error) {
  if (indptr.empty()) {
    for (int r = 0; r < n; ++r) out->push_back({r, 1, kv_len[r]});
  } else {
    if (indptr.front() != 0 || indptr.back() != n) {
      *error = "recurrent schedule: chunk_indptr does not cover the rows";
      return false;
    }
    for (size_t c = 0; c + 1 < indptr.size(); ++c) {
      if (indptr[c + 1] <= indptr[c]) {
        *error = "recurrent schedule: empty or decreasing chunk";
        return false;
      }
      out->push_back({indptr[c], indptr[c + 1] - indptr[c], kv_len[indptr[c]]});
    }
  }
  for (const Chunk& c : *out) {
    for (int i = 0; i < c.n; ++i) {
      if (kv_len[c.begin + i] != c.first + i || c.first < 0) {
        *error = "recurrent schedule: a chunk's rows are not consecutive entries";
        return false;
      }
    }
  }
  return true;
}

}  // namespace

bool BuildRecurrentSchedule(const std::vector<int32_t>& chunk_indptr, const int32_t* kv_len, int n,
                            int tile, RecurrentSchedule* out, std::string* error) {
  if (tile <= 0) {
    *error = "recurrent schedule: the tile must be positive";
    return false;
  }
  std::vector<Chunk> chunks;
  if (!Chunks(chunk_indptr, kv_len, n, &chunks, error)) return false;
  RecurrentSchedule& s = *out;
  s = RecurrentSchedule();
  int waves = 0;
  for (const Chunk& c : chunks) waves = std::max(waves, c.n);
  // new_row[c][i]: chunk c's position i in the wave-major order.
  std::vector<std::vector<int>> new_row(chunks.size());
  for (int w = 0; w < waves; ++w) {
    s.wave_begin.push_back(static_cast<int>(s.order.size()));
    for (size_t c = 0; c < chunks.size(); ++c) {
      if (chunks[c].n <= w) continue;
      new_row[c].push_back(static_cast<int>(s.order.size()));
      s.order.push_back(chunks[c].begin + w);
    }
  }
  s.wave_begin.push_back(static_cast<int>(s.order.size()));
  std::vector<bool> has_state(s.order.size(), false);
  auto merge = [&](int row, int key_begin, int key_end) {
    const int32_t flags = has_state[row] ? 0 : kRecurrentScheduleFresh;
    s.merge.push_back({row, key_begin, key_end, flags});
    has_state[row] = true;
  };
  for (int w = 0; w < waves; ++w) {
    s.merge_begin.push_back(static_cast<int>(s.merge.size()));
    for (size_t c = 0; c < chunks.size(); ++c) {
      const Chunk& ch = chunks[c];
      if (ch.n <= w) continue;
      const int u0 = ch.first / tile;
      if (w == 0) {  // the cached whole tiles, into every query of the chunk
        if (u0 > 0) {
          for (int i = 0; i < ch.n; ++i) merge(new_row[c][i], 0, u0 * tile);
        }
        continue;
      }
      // Did wave w - 1 complete a tile (write the last entry of tile u0 + u)?
      const int written = ch.first + w;  // entries [0, written) exist now
      if (written % tile != 0) continue;
      const int u = written / tile - 1 - u0;
      const int k = std::countr_zero(static_cast<unsigned>(u + 1));
      const int key_begin = (u0 + u + 1 - (1 << k)) * tile, key_end = written;
      const int q_end = std::min(ch.n, (u0 + u + 1 + (1 << k)) * tile - ch.first);
      for (int i = w; i < q_end; ++i) merge(new_row[c][i], key_begin, key_end);
    }
  }
  s.merge_begin.push_back(static_cast<int>(s.merge.size()));
  for (size_t j = 0; j < s.order.size(); ++j) {
    const int32_t flags = has_state[j] ? 0 : kRecurrentScheduleFresh;
    s.finish.push_back({static_cast<int32_t>(j), 0, 0, flags});
  }
  return true;
}

void SplitRecurrentMerges(int range, RecurrentSchedule* s) {
  std::vector<RecurrentFold> merge;
  std::vector<int> merge_begin;
  for (size_t w = 0; w + 1 < s->merge_begin.size(); ++w) {
    merge_begin.push_back(static_cast<int>(merge.size()));
    for (int m = s->merge_begin[w]; m < s->merge_begin[w + 1]; ++m) {
      RecurrentFold piece = s->merge[m];
      const int32_t end = piece.key_end;
      while (piece.key_begin < end) {
        piece.key_end = std::min(end, (piece.key_begin / range + 1) * range);
        merge.push_back(piece);
        piece.key_begin = piece.key_end;
        piece.flags = 0;
      }
    }
  }
  merge_begin.push_back(static_cast<int>(merge.size()));
  s->merge = std::move(merge);
  s->merge_begin = std::move(merge_begin);
}

}  // namespace morserve
