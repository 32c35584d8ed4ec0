// TensorView helpers (see tensor_view.h).
#include "engine/model/tensor_view.h"

#include <cstring>

#include "absl/strings/str_join.h"

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

}  // namespace morserve
