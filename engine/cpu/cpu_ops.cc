// Row-wise fp32 ops (see cpu_ops.h for the precision conventions). The formulas are written
// exactly as engine/reference writes them so that the CPU path and the reference agree bit for
// bit wherever the reference does the same operation.
#include "engine/cpu/cpu_ops.h"

#include <cmath>
#include <cstring>
#include <vector>

#include "engine/core/check.h"
#include "engine/model/dtype.h"

namespace morserve {
void RmsNormRows(const float* x, const float* w, int rows, int dim, float eps, float* out) {
  for (int r = 0; r < rows; ++r) {
    const float* xr = x + static_cast<size_t>(r) * dim;
    float* orow = out + static_cast<size_t>(r) * dim;
    double ss = 0;
    for (int i = 0; i < dim; ++i) ss += static_cast<double>(xr[i]) * xr[i];
    const double inv = 1.0 / std::sqrt(ss / static_cast<double>(dim) + eps);
    for (int i = 0; i < dim; ++i) orow[i] = static_cast<float>(w[i] * (xr[i] * inv));
  }
}

void AddRows(const float* a, const float* b, int rows, int dim, float* out) {
  const size_t n = static_cast<size_t>(rows) * dim;
  for (size_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

void ScaleAddRows(float* h, const float* b, const float* scale_per_row, int rows, int dim) {
  for (int r = 0; r < rows; ++r) {
    const double s = scale_per_row[r];
    float* hr = h + static_cast<size_t>(r) * dim;
    const float* br = b + static_cast<size_t>(r) * dim;
    for (int i = 0; i < dim; ++i) hr[i] = static_cast<float>(hr[i] + s * br[i]);
  }
}

void GeluErf(float* x, int64_t n) {
  const double inv_sqrt2 = 1.0 / std::sqrt(2.0);
  for (int64_t i = 0; i < n; ++i) {
    const double v = x[i];
    x[i] = static_cast<float>(0.5 * v * (1.0 + std::erf(v * inv_sqrt2)));
  }
}

namespace {

// Rotates dims (a(i), b(i)) of every head by positions[r] * theta^(-2i/head_dim): halves
// (i, i + half) or adjacent pairs (2i, 2i + 1).
void RotatePairs(float* x, const int32_t* positions, int rows, int n_heads, int head_dim,
                 float theta, bool adjacent) {
  MORSERVE_CHECK(head_dim % 2 == 0, "RoPE needs an even head_dim");
  const int half = head_dim / 2;
  std::vector<double> inv_freq(half), cos_v(half), sin_v(half);
  for (int i = 0; i < half; ++i) {
    inv_freq[i] = std::pow(static_cast<double>(theta), -2.0 * i / head_dim);
  }
  for (int r = 0; r < rows; ++r) {
    for (int i = 0; i < half; ++i) {
      const double angle = positions[r] * inv_freq[i];
      cos_v[i] = std::cos(angle);
      sin_v[i] = std::sin(angle);
    }
    float* row = x + static_cast<size_t>(r) * n_heads * head_dim;
    for (int h = 0; h < n_heads; ++h) {
      float* v = row + static_cast<size_t>(h) * head_dim;
      for (int i = 0; i < half; ++i) {
        const int ia = adjacent ? 2 * i : i, ib = adjacent ? 2 * i + 1 : i + half;
        const double a = v[ia], b = v[ib];
        v[ia] = static_cast<float>(a * cos_v[i] - b * sin_v[i]);
        v[ib] = static_cast<float>(b * cos_v[i] + a * sin_v[i]);
      }
    }
  }
}

}  // namespace

void RopeRows(float* x, const int32_t* positions, int rows, int n_heads, int head_dim,
              float theta) {
  RotatePairs(x, positions, rows, n_heads, head_dim, theta, /*adjacent=*/false);
}

void RopePairsRows(float* x, const int32_t* positions, int rows, int n_heads, int head_dim,
                   float theta) {
  RotatePairs(x, positions, rows, n_heads, head_dim, theta, /*adjacent=*/true);
}

void EmbeddingGather(const float* table, int64_t vocab, const int32_t* ids, int rows, int dim,
                     float* out) {
  for (int r = 0; r < rows; ++r) {
    MORSERVE_CHECK(ids[r] >= 0 && ids[r] < vocab, "token id outside the embedding table");
    std::memcpy(out + static_cast<size_t>(r) * dim, table + static_cast<size_t>(ids[r]) * dim,
                static_cast<size_t>(dim) * sizeof(float));
  }
}

void EmbeddingGather(const TensorView& table, const int32_t* ids, int rows, float* out) {
  MORSERVE_CHECK(table.shape.size() == 2, "embedding table must be 2-D [vocab, dim]");
  const int64_t vocab = table.shape[0];
  const int64_t dim = table.shape[1];
  const size_t row_bytes = static_cast<size_t>(dim) * DTypeSize(table.dtype);
  const auto* base = static_cast<const uint8_t*>(table.data);
  for (int r = 0; r < rows; ++r) {
    MORSERVE_CHECK(ids[r] >= 0 && ids[r] < vocab, "token id outside the embedding table");
    ToF32(table.dtype, base + static_cast<size_t>(ids[r]) * row_bytes, static_cast<size_t>(dim),
          out + static_cast<size_t>(r) * dim);
  }
}

}  // namespace morserve
