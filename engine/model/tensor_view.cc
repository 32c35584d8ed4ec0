// TensorView helpers (see tensor_view.h).
#include "engine/model/tensor_view.h"

#include <cstring>

#include "absl/strings/str_join.h"
#include "engine/core/check.h"

namespace morserve {

std::vector<float> TensorView::ToF32Vector() const {
  std::vector<float> out(static_cast<size_t>(numel()));
  ToF32(dtype, data, out.size(), out.data());
  return out;
}

bool TensorView::SameContents(const TensorView& other) const {
  if (dtype != other.dtype || shape != other.shape) return false;
  if (data == other.data || nbytes() == 0) return true;  // empty: data may be null
  return std::memcmp(data, other.data, nbytes()) == 0;
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  return "[" + absl::StrJoin(shape, ", ") + "]";
}

TensorView RowBlock(const TensorView& v, int64_t first, int64_t rows,
                    const std::vector<int64_t>& shape, const std::string& part) {
  const int64_t row_len = v.shape.empty() || v.shape[0] == 0 ? 0 : v.numel() / v.shape[0];
  TensorView out = v;
  out.name = v.name + "[" + part + "]";
  out.shape = shape;
  out.data =
      static_cast<const char*>(v.data) + static_cast<size_t>(first * row_len) * DTypeSize(v.dtype);
  MORSERVE_CHECK(first >= 0 && rows >= 0 && first + rows <= (v.shape.empty() ? 0 : v.shape[0]) &&
                     out.numel() == rows * row_len,
                 "RowBlock outside its tensor");
  return out;
}

}  // namespace morserve
