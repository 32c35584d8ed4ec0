// Loop groups, segment-batch layer calls and KV plan row selection (see layer_batch.h).
#include "engine/runtime/layer_batch.h"

#include "engine/core/check.h"

namespace morserve {

std::vector<LoopGroup> LoopGroups(const int* loops, int n) {
  std::vector<LoopGroup> groups;
  for (int begin = 0; begin < n;) {
    const int loop = loops == nullptr ? 0 : loops[begin];
    int end = begin + 1;
    while (end < n && (loops == nullptr ? 0 : loops[end]) == loop) ++end;
    groups.push_back({loop, begin, end - begin});
    begin = end;
  }
  return groups;
}

namespace {

LayerBatch Part(const SegmentBatch& b, int k, int begin, int count, const LayerKvPlan& kv,
                float* h) {
  MORSERVE_CHECK(k >= 0 && k < static_cast<int>(b.layers.size()), "layer outside the segment");
  LayerBatch out;
  out.segment = b.segment;
  out.k = k;
  out.n = count;
  out.loops = b.loops + begin;
  out.positions = b.positions + begin;
  out.h = h;
  out.kv = &kv;
  return out;
}

}  // namespace

LayerBatch KvOnlyLayer(const SegmentBatch& b, int k, float* h) {
  const LayerKvPlan& kv = b.layers[k].kv_only;
  MORSERVE_CHECK(b.num_kv_only == 0 || !kv.recurrent, "K/V-only rows on a recurrent layer");
  return Part(b, k, 0, b.num_kv_only, kv, h);
}

LayerBatch FullLayer(const SegmentBatch& b, int k, float* h) {
  return Part(b, k, b.num_kv_only, b.n - b.num_kv_only, b.layers[k].full, h);
}

LayerKvPlan SelectPlanRows(const LayerKvPlan& kv, const std::vector<int>& keep) {
  const int n = static_cast<int>(kv.write_slot.size());
  bool identity = static_cast<int>(keep.size()) == n;
  for (int i = 0; identity && i < n; ++i) identity = keep[i] == i;
  if (identity) return kv;
  MORSERVE_CHECK(!kv.recurrent, "a recurrent layer's rows split across calls");
  LayerKvPlan out;
  out.table_indptr.assign(1, 0);
  for (int i : keep) {
    out.write_slot.push_back(kv.write_slot[i]);
    out.kv_len.push_back(kv.kv_len[i]);
    out.table_blocks.insert(out.table_blocks.end(), kv.table_blocks.begin() + kv.table_indptr[i],
                            kv.table_blocks.begin() + kv.table_indptr[i + 1]);
    out.table_indptr.push_back(static_cast<int32_t>(out.table_blocks.size()));
  }
  return out;
}

}  // namespace morserve
