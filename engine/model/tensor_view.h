// A read-only view of one tensor inside a loaded checkpoint file (mmap'd or read once).
// Views never own their bytes: the TensorStore that produced them keeps the storage alive.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/model/dtype.h"

namespace morserve {

struct TensorView {
  std::string name;  // key in the checkpoint
  std::string file;  // file it came from, for error messages
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  const void* data = nullptr;

  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
  size_t nbytes() const { return static_cast<size_t>(numel()) * DTypeSize(dtype); }
  bool empty() const { return data == nullptr; }
  // Converts the whole tensor to fp32.
  std::vector<float> ToF32Vector() const;
  // True when both views hold the same dtype, shape and bytes.
  bool SameContents(const TensorView& other) const;
};

std::string ShapeString(const std::vector<int64_t>& shape);  // "[2, 3]"

// Rows [first, first + rows) of `v` read as a matrix of v.shape[0] rows (a view of the same
// bytes: fused tensors such as Huginn's Wqkv split into q, k and v), shaped `shape` (its
// element count is rows x the row length); named "<name>[<part>]".
TensorView RowBlock(const TensorView& v, int64_t first, int64_t rows,
                    const std::vector<int64_t>& shape, const std::string& part);

}  // namespace morserve
