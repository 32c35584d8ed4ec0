// CUDA graphs of the CUDA runner's segment passes (engine/cuda/cuda_model_runner.cc): a
// segment's every layer over a batch of full rows, captured once per shape and replayed with
// one cudaGraphLaunch, so a decode step costs the host a handful of launches instead of one
// per kernel per layer.
//
// What a captured pass bakes in is its key: the segment, the batch padded to a row bucket
// (GraphRows), each layer's table padded to a block capacity and the attention grid sized
// for a kv length bucket (both powers of two), and the loop groups (their count fixes the
// metadata layout; with per-loop weights, their sizes fix the GEMMs). The rows' metadata
// goes to one device buffer at a fixed address before each replay, laid out the same for
// every batch of the key (StagePaddedLayerBatch). Every buffer the kernels touch is the
// runner's: when one is reallocated (the runner's allocation count moves), every graph is
// dropped (Invalidate) and recaptured on use.
//
// Bits: a padded batch gives each live row the bits of an unpadded one (the GEMMs' cuBLASLt
// algorithm is pinned per shape for every M, attention and every other kernel are per row and
// do not depend on the grid's kv bound), so a row's output does not change with graphs on or
// off (tests/gpu/engine_gpu_test.cc).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <tuple>
#include <vector>

namespace morserve {

// The row bucket a batch of n rows is captured at: the next power of two, or 0 when n is
// beyond max_rows (the pass then runs eagerly).
int GraphRows(int n, int max_rows);

// The next power of two >= v (v >= 1), at least `floor`, at most `cap` (when cap > 0).
int64_t Pow2Bucket(int64_t v, int64_t floor, int64_t cap);

struct StepGraphKey {
  int segment = 0;
  int rows = 0;                 // the padded batch
  int64_t table_blocks = 0;     // each layer's table capacity
  int max_kv_len = 0;           // the attention grid's bound
  std::vector<int32_t> groups;  // (count, loop) per group, or only the group count
  bool operator<(const StepGraphKey& o) const {
    return std::tie(segment, rows, table_blocks, max_kv_len, groups) <
           std::tie(o.segment, o.rows, o.table_blocks, o.max_kv_len, o.groups);
  }
};

// An instantiated capture and what its replay stands for in the runner's counters.
struct StepGraph {
  cudaGraphExec_t exec = nullptr;
  int64_t kernel_launches = 0;   // launches (and cuBLASLt calls) captured in it
  int64_t weight_bytes = 0;      // RunnerCounters::weight_bytes one replay reads
  int64_t fixed_gemm_calls = 0;  // fixed-order GEMMs among them
};

// The runner's graphs by key, at most `capacity` (the least recently used one is destroyed
// beyond that). Not thread-safe (the engine thread owns the runner).
class StepGraphs {
 public:
  explicit StepGraphs(size_t capacity) : capacity_(capacity) {}
  ~StepGraphs() { Invalidate(); }
  StepGraphs(const StepGraphs&) = delete;
  StepGraphs& operator=(const StepGraphs&) = delete;

  // The graph of `key`, or null.
  const StepGraph* Find(const StepGraphKey& key);
  // Takes ownership of g.exec.
  const StepGraph* Insert(const StepGraphKey& key, StepGraph g);
  // Destroys every graph (a buffer they use moved).
  void Invalidate();
  size_t size() const { return graphs_.size(); }

 private:
  struct Entry {
    StepGraph graph;
    uint64_t last_use = 0;
  };
  size_t capacity_;
  uint64_t clock_ = 0;
  std::map<StepGraphKey, Entry> graphs_;
};

}  // namespace morserve
