// Staging of a tiled recurrent layer call (see recurrent_staging.h).
#include "engine/cuda/recurrent_staging.h"

namespace morserve {
namespace {

size_t AppendItems(const std::vector<RecurrentFold>& items, std::vector<int32_t>* data) {
  while (data->size() % 4 != 0) data->push_back(0);  // 16-byte aligned on the device
  const size_t at = data->size();
  for (const RecurrentFold& f : items)
    data->insert(data->end(), {f.row, f.key_begin, f.key_end, f.flags});
  return at;
}

}  // namespace

bool StageRecurrentLayer(const LayerBatch& b, int num_loops, int block_size, int hidden,
                         RecurrentStaging* out, std::string* error) {
  if (b.kv == nullptr || static_cast<int>(b.kv->kv_len.size()) != b.n) {
    *error = "recurrent batch: kv_len does not match the rows";
    return false;
  }
  RecurrentStaging& r = *out;
  if (!BuildRecurrentSchedule(b.kv->chunk_indptr, b.kv->kv_len.data(), b.n, kRecurrentGpuTile,
                              &r.sched, error)) {
    return false;
  }
  SplitRecurrentMerges(kRecurrentGpuRange, &r.sched);
  MakeSubBatch(b, r.sched.order, hidden, &r.sub);
  auto staged = StageLayerBatch(r.sub.b, num_loops, block_size);
  if (!staged.ok()) {
    *error = std::string(staged.status().message());
    return false;
  }
  r.rows = std::move(*staged);
  r.merge_at = AppendItems(r.sched.merge, &r.rows.data);
  r.finish_at = AppendItems(r.sched.finish, &r.rows.data);
  r.waves.clear();
  for (int w = 0; w < r.sched.waves(); ++w) {
    const int wb = r.sched.wave_begin[w];
    r.waves.push_back(
        AppendStaged(StageLoops(r.sub.loops.data() + wb, r.sched.wave_begin[w + 1] - wb), &r.rows));
  }
  return true;
}

}  // namespace morserve
