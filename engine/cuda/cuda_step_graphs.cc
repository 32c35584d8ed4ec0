// The CUDA runner's cache of captured segment passes (see cuda_step_graphs.h).
#include "engine/cuda/cuda_step_graphs.h"

#include <algorithm>

namespace morserve {

int64_t Pow2Bucket(int64_t v, int64_t floor, int64_t cap) {
  int64_t b = 1;
  while (b < v || b < floor) b *= 2;
  return cap > 0 ? std::min(b, cap) : b;
}

int GraphRows(int n, int max_rows) {
  if (n < 1 || n > max_rows) return 0;
  return static_cast<int>(Pow2Bucket(n, 1, max_rows));
}

const StepGraph* StepGraphs::Find(const StepGraphKey& key) {
  auto it = graphs_.find(key);
  if (it == graphs_.end()) return nullptr;
  it->second.last_use = ++clock_;
  return &it->second.graph;
}

const StepGraph* StepGraphs::Insert(const StepGraphKey& key, StepGraph g) {
  if (graphs_.size() >= capacity_) {
    auto oldest = std::min_element(
        graphs_.begin(), graphs_.end(),
        [](const auto& a, const auto& b) { return a.second.last_use < b.second.last_use; });
    cudaGraphExecDestroy(oldest->second.graph.exec);
    graphs_.erase(oldest);
  }
  Entry& e = graphs_[key];
  if (e.graph.exec != nullptr) cudaGraphExecDestroy(e.graph.exec);
  e.graph = g;
  e.last_use = ++clock_;
  return &e.graph;
}

void StepGraphs::Invalidate() {
  for (auto& [key, e] : graphs_) cudaGraphExecDestroy(e.graph.exec);
  graphs_.clear();
}

}  // namespace morserve
