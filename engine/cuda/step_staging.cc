// Row metadata staging for the CUDA backend (see step_staging.h).
#include "engine/cuda/step_staging.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace morserve {
namespace {

// Appends `n` values at a 16-byte (4 x int32) boundary; returns their offset.
size_t Append(std::vector<int32_t>* data, const int32_t* v, size_t n) {
  while (data->size() % 4 != 0) data->push_back(0);
  const size_t at = data->size();
  if (n > 0) data->insert(data->end(), v, v + n);
  return at;
}

// A layer batch's arrays grown by padding rows (StagePaddedLayerBatch).
struct PaddedRows {
  std::vector<int> loops, positions;
  LayerKvPlan kv;
};

}  // namespace

StagedRows StageLoops(const int* loops, int n) {
  StagedRows s;
  std::vector<int32_t> l(n, 0);
  if (loops != nullptr) std::copy(loops, loops + n, l.begin());
  s.loops = Append(&s.data, l.data(), l.size());
  s.groups = LoopGroups(loops, n);
  std::vector<int32_t> indptr = {0}, seg_loop;
  for (const LoopGroup& g : s.groups) {
    indptr.push_back(g.begin + g.count);
    seg_loop.push_back(g.loop);
  }
  s.seg_indptr = Append(&s.data, indptr.data(), indptr.size());
  s.seg_loop = Append(&s.data, seg_loop.data(), seg_loop.size());
  return s;
}

absl::StatusOr<StagedRows> StageLayerBatch(const LayerBatch& b, int num_loops, int block_size,
                                           size_t table_capacity) {
  const int n = b.n;
  if (n < 0 || b.kv == nullptr || b.loops == nullptr || b.positions == nullptr) {
    return absl::InvalidArgumentError("layer batch: missing rows, loops, positions or KV plan");
  }
  const LayerKvPlan& kv = *b.kv;
  if (static_cast<int>(kv.write_slot.size()) != n || static_cast<int>(kv.kv_len.size()) != n ||
      static_cast<int>(kv.table_indptr.size()) != n + 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("layer batch: KV plan arrays do not match ", n, " rows"));
  }
  if (kv.table_indptr[0] != 0 ||
      kv.table_indptr[n] != static_cast<int32_t>(kv.table_blocks.size())) {
    return absl::InvalidArgumentError("layer batch: table_indptr does not span table_blocks");
  }
  StagedRows s = StageLoops(b.loops, n);
  for (int i = 0; i < n; ++i) {
    if (b.loops[i] < 0 || b.loops[i] >= num_loops) {
      return absl::InvalidArgumentError(absl::StrCat("layer batch: row ", i, " at loop ",
                                                     b.loops[i], " outside [0, ", num_loops, ")"));
    }
    const int32_t blocks = kv.table_indptr[i + 1] - kv.table_indptr[i];
    if (blocks < 0) return absl::InvalidArgumentError("layer batch: table_indptr decreases");
    if (kv.kv_len[i] < 0 ||
        static_cast<int64_t>(kv.kv_len[i]) > static_cast<int64_t>(blocks) * block_size) {
      return absl::InvalidArgumentError(absl::StrCat(
          "layer batch: row ", i, " kv_len ", kv.kv_len[i], " beyond its ", blocks, " blocks"));
    }
    s.max_kv_len = std::max(s.max_kv_len, static_cast<int>(kv.kv_len[i]));
  }
  s.positions = Append(&s.data, b.positions, n);
  s.write_slot = Append(&s.data, kv.write_slot.data(), n);
  s.table_indptr = Append(&s.data, kv.table_indptr.data(), n + 1);
  if (kv.table_blocks.size() > table_capacity && table_capacity > 0) {
    return absl::InvalidArgumentError(absl::StrCat("layer batch: ", kv.table_blocks.size(),
                                                   " table blocks beyond ", table_capacity));
  }
  s.table_blocks = Append(&s.data, kv.table_blocks.data(), kv.table_blocks.size());
  s.data.resize(s.table_blocks + std::max(table_capacity, kv.table_blocks.size()), 0);
  s.kv_len = Append(&s.data, kv.kv_len.data(), n);
  return s;
}

absl::StatusOr<StagedRows> StagePaddedLayerBatch(const LayerBatch& b, int num_loops, int block_size,
                                                 int rows, size_t table_capacity) {
  if (b.n < 1 || b.n > rows || b.kv == nullptr || b.loops == nullptr || b.positions == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("padded layer batch: ", b.n, " rows do not fit ", rows));
  }
  const LayerKvPlan& kv = *b.kv;
  if (static_cast<int>(kv.table_indptr.size()) != b.n + 1) {
    return absl::InvalidArgumentError("padded layer batch: table_indptr does not match its rows");
  }
  PaddedRows pad;
  pad.loops.assign(b.loops, b.loops + b.n);
  pad.loops.resize(rows, b.loops[b.n - 1]);  // the last group grows: the group count stays
  pad.positions.assign(b.positions, b.positions + b.n);
  pad.positions.resize(rows, 0);
  pad.kv = kv;
  pad.kv.write_slot.resize(rows, -1);
  pad.kv.kv_len.resize(rows, 0);
  pad.kv.table_indptr.resize(rows + 1, kv.table_indptr[b.n]);
  LayerBatch padded = b;
  padded.n = rows;
  padded.loops = pad.loops.data();
  padded.positions = pad.positions.data();
  padded.kv = &pad.kv;
  return StageLayerBatch(padded, num_loops, block_size, table_capacity);
}

StagedRows AppendStaged(StagedRows part, StagedRows* into) {
  // Tripwire: a new offset field must be rebased below (then update the size).
  static_assert(sizeof(StagedRows) == 120, "StagedRows changed: rebase its new offsets here");
  while (into->data.size() % 4 != 0) into->data.push_back(0);
  const size_t base = into->data.size();
  into->data.insert(into->data.end(), part.data.begin(), part.data.end());
  for (size_t* offset : {&part.loops, &part.positions, &part.write_slot, &part.table_indptr,
                         &part.table_blocks, &part.kv_len, &part.seg_indptr, &part.seg_loop}) {
    *offset += base;
  }
  part.data.clear();
  return part;
}

std::vector<std::vector<int>> RecurrentWaves(const std::vector<int32_t>& chunk_indptr, int n) {
  std::vector<std::vector<int>> waves;
  if (chunk_indptr.empty()) {
    if (n > 0) waves.emplace_back();
    for (int i = 0; i < n; ++i) waves[0].push_back(i);
    return waves;
  }
  for (size_t c = 0; c + 1 < chunk_indptr.size(); ++c) {
    for (int32_t r = chunk_indptr[c]; r < chunk_indptr[c + 1]; ++r) {
      const size_t j = static_cast<size_t>(r - chunk_indptr[c]);
      if (waves.size() <= j) waves.resize(j + 1);
      waves[j].push_back(r);
    }
  }
  return waves;
}

void MakeSubBatch(const LayerBatch& b, const std::vector<int>& rows, int hidden, SubBatch* out) {
  const LayerKvPlan& kv = *b.kv;
  SubBatch& s = *out;
  s.kv = LayerKvPlan();
  s.kv.recurrent = kv.recurrent;
  s.kv.table_indptr.push_back(0);
  s.loops.clear();
  s.positions.clear();
  s.h.clear();
  for (int r : rows) {
    s.loops.push_back(b.loops[r]);
    s.positions.push_back(b.positions[r]);
    if (b.h != nullptr) {
      s.h.insert(s.h.end(), b.h + static_cast<size_t>(r) * hidden,
                 b.h + static_cast<size_t>(r + 1) * hidden);
    }
    s.kv.write_slot.push_back(kv.write_slot[r]);
    s.kv.kv_len.push_back(kv.kv_len[r]);
    s.kv.table_blocks.insert(s.kv.table_blocks.end(), kv.table_blocks.begin() + kv.table_indptr[r],
                             kv.table_blocks.begin() + kv.table_indptr[r + 1]);
    s.kv.table_indptr.push_back(static_cast<int32_t>(s.kv.table_blocks.size()));
  }
  s.b = b;
  s.b.n = static_cast<int>(rows.size());
  s.b.loops = s.loops.data();
  s.b.positions = s.positions.data();
  s.b.h = b.h == nullptr ? nullptr : s.h.data();
  s.b.kv = &s.kv;
}

void ScatterSubBatch(const SubBatch& sub, const std::vector<int>& rows, int hidden, float* h) {
  for (size_t i = 0; i < rows.size(); ++i) {
    std::copy(sub.h.begin() + i * hidden, sub.h.begin() + (i + 1) * hidden,
              h + static_cast<size_t>(rows[i]) * hidden);
  }
}

}  // namespace morserve
