// Row-wise CPU ops against direct double-precision formulas. The ops compute in double and
// round once, so the tolerance is a couple of fp32 ulps: |out - ref| <= 4e-7 * |ref| + 1e-30
// (RoPE gets 1e-6 of the row scale because cos/sin terms cancel).
#include "engine/cpu/cpu_ops.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "engine/cpu/silu_mul.h"
#include "engine/model/dtype.h"
#include "tests/random_values.h"

namespace morserve {
namespace {

using testing::UniformRandom;

void ExpectNear(double ref, float got, double tol_scale, const char* what, size_t i) {
  ASSERT_LE(std::fabs(got - ref), 4e-7 * tol_scale + 1e-30) << what << " at " << i;
}

TEST(CpuOpsTest, RmsNormRows) {
  const int rows = 7, dim = 576;
  const float eps = 1e-5f;
  auto x = UniformRandom(rows * dim, 1, 3.0f);
  x[5] = 0;  // zeros are fine
  const auto w = UniformRandom(dim, 2);
  std::vector<float> out(rows * dim);
  RmsNormRows(x.data(), w.data(), rows, dim, eps, out.data());
  for (int r = 0; r < rows; ++r) {
    double ss = 0;
    for (int i = 0; i < dim; ++i) ss += std::pow(static_cast<double>(x[r * dim + i]), 2);
    const double rms = std::sqrt(ss / dim + eps);
    for (int i = 0; i < dim; ++i) {
      const double ref = static_cast<double>(x[r * dim + i]) / rms * w[i];
      ExpectNear(ref, out[r * dim + i], std::fabs(ref), "rmsnorm", r * dim + i);
    }
  }
  // In place gives the same bits, and a row alone gives the same bits as in the batch.
  std::vector<float> in_place = x;
  RmsNormRows(in_place.data(), w.data(), rows, dim, eps, in_place.data());
  EXPECT_EQ(in_place, out);
  std::vector<float> alone(dim);
  RmsNormRows(&x[3 * dim], w.data(), 1, dim, eps, alone.data());
  EXPECT_EQ(alone, std::vector<float>(out.begin() + 3 * dim, out.begin() + 4 * dim));
}

TEST(CpuOpsTest, AddAndScaleAdd) {
  const int rows = 4, dim = 33;
  const auto a = UniformRandom(rows * dim, 3), b = UniformRandom(rows * dim, 4);
  std::vector<float> out(rows * dim);
  AddRows(a.data(), b.data(), rows, dim, out.data());
  for (size_t i = 0; i < out.size(); ++i)
    EXPECT_EQ(out[i], static_cast<float>(double(a[i]) + b[i]));

  const std::vector<float> scale = {0.5f, -1.25f, 0.0f, 3.0f};
  std::vector<float> h = a;
  ScaleAddRows(h.data(), b.data(), scale.data(), rows, dim);
  for (int r = 0; r < rows; ++r) {
    for (int i = 0; i < dim; ++i) {
      const size_t j = r * dim + i;
      const double ref = static_cast<double>(a[j]) + static_cast<double>(scale[r]) * b[j];
      ExpectNear(ref, h[j], std::fabs(ref), "scale_add", j);
    }
  }
  for (int i = 0; i < dim; ++i) EXPECT_EQ(h[2 * dim + i], a[2 * dim + i]);  // scale 0
}

TEST(CpuOpsTest, SiluMulAndGelu) {
  const int rows = 3, n = 1536;
  const auto gate = UniformRandom(rows * n, 5, 8.0f), up = UniformRandom(rows * n, 6, 2.0f);
  std::vector<float> out(rows * n);
  SiluMulRows(gate.data(), up.data(), rows, n, out.data());
  for (size_t i = 0; i < out.size(); ++i) {
    const double g = gate[i];
    const double ref = g / (1.0 + std::exp(-g)) * up[i];
    ExpectNear(ref, out[i], std::fabs(ref), "silu_mul", i);
  }
  std::vector<float> x = UniformRandom(1000, 7, 6.0f);
  const std::vector<float> x0 = x;
  GeluErf(x.data(), static_cast<int64_t>(x.size()));
  for (size_t i = 0; i < x.size(); ++i) {
    const double v = x0[i];
    const double ref = 0.5 * v * (1.0 + std::erf(v / std::sqrt(2.0)));
    ExpectNear(ref, x[i], std::fabs(ref), "gelu", i);
  }
}

TEST(CpuOpsTest, RopeRotateHalf) {
  const int rows = 5, n_heads = 3, head_dim = 64;
  const float theta = 10000.0f;
  const std::vector<int32_t> pos = {0, 1, 17, 1000, 8191};
  const int width = n_heads * head_dim;
  const auto x0 = UniformRandom(rows * width, 8, 2.0f);
  std::vector<float> x = x0;
  RopeRows(x.data(), pos.data(), rows, n_heads, head_dim, theta);
  const int half = head_dim / 2;
  for (int r = 0; r < rows; ++r) {
    for (int h = 0; h < n_heads; ++h) {
      const size_t base = r * width + h * head_dim;
      for (int i = 0; i < head_dim; ++i) {
        const int j = i % half;
        const double freq = std::pow(static_cast<double>(theta), -2.0 * j / head_dim);
        const double c = std::cos(pos[r] * freq), s = std::sin(pos[r] * freq);
        const double rot = i < half ? -static_cast<double>(x0[base + i + half])
                                    : static_cast<double>(x0[base + i - half]);
        const double ref = x0[base + i] * c + rot * s;
        ExpectNear(ref, x[base + i], 2.5 * 2.0, "rope", base + i);
      }
    }
  }
  // Position 0 is the identity.
  for (int i = 0; i < width; ++i) EXPECT_EQ(x[i], x0[i]);
}

TEST(CpuOpsTest, EmbeddingGatherF32AndBf16) {
  const int vocab = 11, dim = 24;
  const auto table = UniformRandom(vocab * dim, 9);
  const std::vector<int32_t> ids = {3, 0, 10, 3};
  std::vector<float> out(ids.size() * dim);
  EmbeddingGather(table.data(), vocab, ids.data(), static_cast<int>(ids.size()), dim, out.data());
  for (size_t r = 0; r < ids.size(); ++r) {
    for (int i = 0; i < dim; ++i) EXPECT_EQ(out[r * dim + i], table[ids[r] * dim + i]);
  }
  std::vector<uint16_t> bf(table.size());
  for (size_t i = 0; i < bf.size(); ++i) bf[i] = F32ToBf16(table[i]);
  TensorView view;
  view.dtype = DType::kBF16;
  view.shape = {vocab, dim};
  view.data = bf.data();
  std::vector<float> out_bf(out.size());
  EmbeddingGather(view, ids.data(), static_cast<int>(ids.size()), out_bf.data());
  for (size_t r = 0; r < ids.size(); ++r) {
    for (int i = 0; i < dim; ++i) {
      EXPECT_EQ(out_bf[r * dim + i], Bf16ToF32(bf[ids[r] * dim + i]));
    }
  }
}

TEST(CpuOpsDeathTest, EmbeddingRejectsBadId) {
  const std::vector<float> table(4 * 2, 1.0f);
  const int32_t id = 4;
  float out[2];
  EXPECT_DEATH(EmbeddingGather(table.data(), 4, &id, 1, 2, out), "outside the embedding table");
}

}  // namespace
}  // namespace morserve
