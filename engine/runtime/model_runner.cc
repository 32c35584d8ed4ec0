// KvCopiesDisjoint: the condition under which a ModelRunner::CopyKv call's copies may run in
// any order (the CUDA runner's one kv_copy launch) and give the in-order result.
#include "engine/runtime/model_runner.h"

#include <algorithm>
#include <utility>
#include <vector>

namespace morserve {

bool KvCopiesDisjoint(const KvCopy* copies, int n) {
  std::vector<std::pair<int64_t, int64_t>> dst;  // [start, end), sorted by start
  for (int i = 0; i < n; ++i) {
    if (copies[i].count > 0)
      dst.push_back({copies[i].dst, int64_t{copies[i].dst} + copies[i].count});
  }
  std::sort(dst.begin(), dst.end());
  for (size_t j = 1; j < dst.size(); ++j) {
    if (dst[j].first < dst[j - 1].second) return false;
  }
  // Disjoint destinations sorted by start are sorted by end too: if any overlaps a source,
  // the first one ending after the source's start does.
  for (int i = 0; i < n; ++i) {
    const KvCopy& c = copies[i];
    if (c.count <= 0) continue;
    const int64_t start = c.src, end = int64_t{c.src} + c.count;
    auto it = std::partition_point(
        dst.begin(), dst.end(),
        [&](const std::pair<int64_t, int64_t>& d) { return d.second <= start; });
    if (it == dst.end() || it->first >= end) continue;
    if (c.src == c.dst && it->first == c.dst) continue;  // a copy onto itself
    return false;
  }
  return true;
}

}  // namespace morserve
