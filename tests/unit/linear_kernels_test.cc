// The CPU linear kernels (engine/cpu/linear_kernels.h) and their weight formats
// (linear_weights.h): every kernel set the host runs equals the scalar set bit for bit (same
// L8 order by design) for every format, odd shapes, m = 1..64 and both write modes; the scalar
// set follows the order as written (checked against a hand-written L8 sum); int8 quantization
// stays within its bound; bf16/f16 checkpoint rows are read in place; bf16-quads hold the bf16
// values in their documented layout and give in-place bf16's bits on every set.
#include "engine/cpu/linear_kernels.h"

#include <cpuid.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "engine/cpu/linear_weights.h"
#include "engine/model/dtype.h"
#include "tests/linear_kernel_run.h"
#include "tests/random_values.h"

namespace morserve {
namespace {

using testing::UniformRandom;

constexpr WeightFormat kFormats[] = {WeightFormat::kF32, WeightFormat::kBF16, WeightFormat::kF16,
                                     WeightFormat::kQ8};

std::vector<const LinearKernelSet*> VectorSets() {
  std::vector<const LinearKernelSet*> sets;
  if (Avx2LinearKernels() != nullptr) sets.push_back(Avx2LinearKernels());
  if (Avx512LinearKernels() != nullptr) sets.push_back(Avx512LinearKernels());
  return sets;
}

std::vector<float> RunSet(const LinearKernelSet& set, const LinearWeights& w,
                          const std::vector<float>& x, int m, const std::vector<float>& y0,
                          bool accumulate, int n0, int n1) {
  return testing::RunLinearKernelSet(set, w, x, m, y0, accumulate, n0, n1);
}

TEST(LinearKernelsTest, HostHasAVectorSetOrSaysSo) {
  // f16c from cpuid leaf 1 (ECX bit 29), apart from the kernel's own check.
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  const bool f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & (1u << 29)) != 0;
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c;
  EXPECT_EQ(Avx2LinearKernels() != nullptr, avx2);
  const bool avx512 = avx2 && __builtin_cpu_supports("avx512f") &&
                      __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
                      __builtin_cpu_supports("avx512vl");
  EXPECT_EQ(Avx512LinearKernels() != nullptr, avx512);
  if (avx512) EXPECT_EQ(&BestLinearKernels(), Avx512LinearKernels());
  std::printf("best kernel set on this host: %s\n", std::string(BestLinearKernels().name).c_str());
  if (!avx2) GTEST_SKIP() << "host has no AVX2+FMA+F16C: only the scalar set runs here";
}

// Every vector set equals the scalar set bitwise: formats x shapes x m x modes x column ranges.
TEST(LinearKernelsTest, VectorSetsEqualScalarBitwise) {
  if (VectorSets().empty()) GTEST_SKIP() << "no vector kernel set on this host";
  struct Shape {
    int n, k;
  };
  int compared = 0;
  for (const LinearKernelSet* set : VectorSets()) {
    for (WeightFormat f : kFormats) {
      for (const Shape s : {Shape{1, 1}, Shape{13, 7}, Shape{37, 203}, Shape{64, 96}, Shape{29, 33},
                            Shape{50, 256}, Shape{9, 1000}}) {
        const auto wf = UniformRandom(static_cast<size_t>(s.n) * s.k, 11 + s.k);
        const LinearWeights w = LinearWeights::FromF32(wf.data(), s.n, s.k, f);
        for (int m : {1, 2, 3, 4, 5, 7, 8, 13, 16, 17, 20, 64}) {
          const auto x = UniformRandom(static_cast<size_t>(m) * s.k, 100 + m);
          const auto y0 = UniformRandom(static_cast<size_t>(m) * s.n, 200 + m, 4.0f);
          for (bool acc : {false, true}) {
            for (auto [n0, n1] : {std::pair{0, s.n}, std::pair{s.n / 3, s.n}}) {
              const auto want = RunSet(ScalarLinearKernels(), w, x, m, y0, acc, n0, n1);
              const auto got = RunSet(*set, w, x, m, y0, acc, n0, n1);
              ASSERT_EQ(0, std::memcmp(want.data(), got.data(), want.size() * sizeof(float)))
                  << set->name << " " << WeightFormatName(f) << " n=" << s.n << " k=" << s.k
                  << " m=" << m << " accumulate=" << acc << " columns " << n0 << ".." << n1;
              ++compared;
            }
          }
        }
      }
    }
  }
  EXPECT_GT(compared, 1000);
}

// The scalar set computes the documented L8 order: eight lane sums in k order, then
// ((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7)); accumulation adds once more.
TEST(LinearKernelsTest, ScalarSetFollowsTheL8Order) {
  const int n = 5, k = 21, m = 3;
  const auto wf = UniformRandom(n * k, 1);
  const auto x = UniformRandom(m * k, 2);
  const LinearWeights w = LinearWeights::FromF32(wf.data(), n, k, WeightFormat::kF32);
  const std::vector<float> y0(m * n, 0.5f);
  const auto got = RunSet(ScalarLinearKernels(), w, x, m, y0, /*accumulate=*/true, 0, n);
  for (int i = 0; i < m; ++i) {
    for (int j = 0; j < n; ++j) {
      volatile float a[8] = {};
      for (int p = 0; p < k; ++p) a[p % 8] = std::fma(x[i * k + p], wf[j * k + p], a[p % 8]);
      volatile float s = ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]));
      volatile float want = 0.5f + s;
      EXPECT_EQ(got[i * n + j], want) << i << "," << j;
    }
  }
}

// Close to the exact product of x and the decoded weights: |y - ref| <= 1e-5 sum |x w|.
TEST(LinearKernelsTest, BestSetMatchesDoubleOnDecodedWeights) {
  const int n = 70, k = 333, m = 9;
  const auto wf = UniformRandom(n * k, 3);
  const auto x = UniformRandom(m * k, 4);
  for (WeightFormat f : kFormats) {
    const LinearWeights w = LinearWeights::FromF32(wf.data(), n, k, f);
    const auto y = RunSet(BestLinearKernels(), w, x, m, std::vector<float>(m * n), false, 0, n);
    std::vector<float> row(k);
    for (int j = 0; j < n; ++j) {
      w.DecodeRow(j, row.data());
      for (int i = 0; i < m; ++i) {
        double ref = 0, mag = 0;
        for (int p = 0; p < k; ++p) {
          ref += static_cast<double>(x[i * k + p]) * row[p];
          mag += std::fabs(static_cast<double>(x[i * k + p]) * row[p]);
        }
        ASSERT_LE(std::fabs(y[i * n + j] - ref), 1e-5 * mag) << WeightFormatName(f);
      }
    }
  }
}

// Q8: per group of 32, d = fp16(max|w| / 127) and |w - q d| <= d / 2 (plus the clamp at 127
// when fp16 rounding made d smaller: then |w| - 127 d <= 127 * |d - amax/127|).
TEST(LinearKernelsTest, Q8QuantizationErrorBound) {
  const int k = 100;  // 4 groups, the last zero-padded
  for (uint32_t seed = 0; seed < 20; ++seed) {
    auto w = UniformRandom(k, seed, 0.05f + seed);
    w[7] = 0.0f;
    int8_t q[128];
    uint16_t scales[4];
    QuantizeRowQ8(w.data(), k, q, scales);
    for (int g = 0; g < 4; ++g) {
      float amax = 0;
      for (int i = g * 32; i < std::min(k, g * 32 + 32); ++i)
        amax = std::max(amax, std::fabs(w[i]));
      const float d = F16ToF32(scales[g]);
      EXPECT_LE(std::fabs(d - amax / 127) / (amax / 127), 1.0f / 1024) << "fp16 scale rounding";
      for (int i = g * 32; i < g * 32 + 32; ++i) {
        if (i >= k) {
          EXPECT_EQ(q[i], 0) << "padding";
          continue;
        }
        const float err = std::fabs(w[i] - q[i] * d);
        EXPECT_LE(err, d / 2 + 127 * std::fabs(d - amax / 127) + 1e-12f)
            << "seed " << seed << " i " << i;
        EXPECT_LE(std::abs(static_cast<int>(q[i])), 127);
      }
    }
  }
  // All-zero group: scale 0, values 0.
  std::vector<float> zeros(40, 0.0f);
  int8_t q[64];
  uint16_t s[2];
  QuantizeRowQ8(zeros.data(), 40, q, s);
  EXPECT_EQ(F16ToF32(s[0]), 0.0f);
  for (int i = 0; i < 64; ++i) EXPECT_EQ(q[i], 0);
}

TensorView View(const std::string& name, DType t, int64_t rows, int64_t cols, const void* data) {
  TensorView v;
  v.name = name;
  v.dtype = t;
  v.shape = {rows, cols};
  v.data = data;
  return v;
}

// bf16 rows are read where they lie; fused parts keep their order; an f32 part under a bf16
// format is packed (rounded to nearest even); mismatched k is an error naming the tensor.
TEST(LinearKernelsTest, FromViewsReadsInPlaceAndPacksTheRest) {
  const int k = 10;
  std::vector<uint16_t> a(3 * k), b(2 * k);
  for (size_t i = 0; i < a.size(); ++i) a[i] = F32ToBf16(0.01f * i);
  const auto bf32 = UniformRandom(2 * k, 5);
  const TensorView va = View("q_proj.weight", DType::kBF16, 3, k, a.data());
  const TensorView vb = View("k_proj.weight", DType::kF32, 2, k, bf32.data());
  const TensorView* parts[] = {&va, &vb};
  auto w = LinearWeights::FromViews(parts, WeightFormat::kBF16);
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(w->n(), 5);
  EXPECT_EQ(w->row(0).data, a.data());
  EXPECT_EQ(w->row(2).data, a.data() + 2 * k);
  EXPECT_EQ(w->owned_bytes(), 2 * k * 2);
  EXPECT_EQ(w->bytes(), 5 * k * 2);
  std::vector<float> row(k);
  w->DecodeRow(4, row.data());
  for (int i = 0; i < k; ++i) EXPECT_EQ(row[i], Bf16ToF32(F32ToBf16(bf32[k + i])));
  // Everything in place: nothing owned.
  const TensorView* only_a[] = {&va};
  EXPECT_EQ(LinearWeights::FromViews(only_a, WeightFormat::kBF16)->owned_bytes(), 0);
  // Q8 bytes: k rounded up to 32, plus one f16 scale per group.
  EXPECT_EQ(LinearWeights::FromViews(only_a, WeightFormat::kQ8)->bytes(), 3 * (32 + 2));
  const TensorView vc = View("v_proj.weight", DType::kBF16, 2, k + 1, a.data());
  const TensorView* bad[] = {&va, &vc};
  auto err = LinearWeights::FromViews(bad, WeightFormat::kBF16);
  ASSERT_FALSE(err.ok());
  EXPECT_NE(std::string(err.status().message()).find("v_proj.weight"), std::string::npos);
}

// bf16-quads: W[j, p] at QuadIndex (the layout of linear_weights.h, spelled out here), zero
// padding past n and k, rounded to nearest even like bf16, and fused parts in order.
TEST(LinearKernelsTest, Bf16QuadsHoldTheBf16ValuesInTheirLayout) {
  const int n = 7, k = 13;
  const auto wf = UniformRandom(n * k, 9);
  const LinearWeights q = LinearWeights::FromF32(wf.data(), n, k, WeightFormat::kBF16Quads);
  EXPECT_EQ(q.owned_bytes(), 8 * 16 * 2);  // 2 quads x 4 columns x 16 (k rounded up to 8)
  EXPECT_EQ(q.bytes(), n * 16 * 2);
  for (int j = 0; j < 8; ++j) {
    for (int p = 0; p < 16; ++p) {
      // Quad j / 4, block p / 8, 32-bit word (j % 4 / 2) * 8 + p % 8, half j % 2.
      const int64_t at = (j / 4) * 4 * 16 + (p / 8) * 32 + ((j % 4) / 2 * 8 + p % 8) * 2 + j % 2;
      ASSERT_EQ(QuadIndex(k, j, p), at) << j << "," << p;
      const uint16_t want = j < n && p < k ? F32ToBf16(wf[j * k + p]) : 0;
      EXPECT_EQ(q.quads()[at], want) << j << "," << p;
    }
  }
  std::vector<float> row(k);
  q.DecodeRow(5, row.data());
  for (int p = 0; p < k; ++p) EXPECT_EQ(row[p], Bf16ToF32(F32ToBf16(wf[5 * k + p])));
  // Fused views: a bf16 part and an f32 part, stacked in order.
  std::vector<uint16_t> a(3 * k);
  for (int i = 0; i < 3 * k; ++i) a[i] = F32ToBf16(wf[i]);
  const TensorView va = View("q_proj.weight", DType::kBF16, 3, k, a.data());
  const TensorView vb = View("k_proj.weight", DType::kF32, 4, k, wf.data() + 3 * k);
  const TensorView* parts[] = {&va, &vb};
  auto fused = LinearWeights::FromViews(parts, WeightFormat::kBF16Quads);
  ASSERT_TRUE(fused.ok()) << fused.status();
  EXPECT_EQ(0, std::memcmp(fused->quads(), q.quads(), q.owned_bytes()));
}

// Every set on `packed` (a layout of `rows`' values) gives the scalar set's bits on `rows`, for
// odd shapes, m = 1..130, both write modes and ranges that start at any multiple of `unit`.
void ExpectPackedEqualsRowsBitwise(WeightFormat rows, WeightFormat packed, int unit,
                                   uint32_t seed) {
  std::vector<const LinearKernelSet*> sets = VectorSets();
  sets.push_back(&ScalarLinearKernels());
  struct Shape {
    int n, k;
  };
  int compared = 0;
  for (const Shape s : {Shape{1, 1}, Shape{13, 7}, Shape{37, 203}, Shape{64, 96}, Shape{29, 33},
                        Shape{50, 256}, Shape{9, 1000}, Shape{130, 40}}) {
    const auto wf = UniformRandom(static_cast<size_t>(s.n) * s.k, seed + s.k);
    const LinearWeights w_rows = LinearWeights::FromF32(wf.data(), s.n, s.k, rows);
    const LinearWeights w_packed = LinearWeights::FromF32(wf.data(), s.n, s.k, packed);
    for (int m : {1, 2, 3, 4, 5, 7, 8, 13, 16, 17, 20, 64, 71, 130}) {
      const auto x = UniformRandom(static_cast<size_t>(m) * s.k, 10 * seed + m);
      const auto y0 = UniformRandom(static_cast<size_t>(m) * s.n, 20 * seed + m, 4.0f);
      for (bool acc : {false, true}) {
        for (auto [n0, n1] : {std::pair{0, s.n}, std::pair{s.n / 3 / unit * unit, s.n}}) {
          const auto want = RunSet(ScalarLinearKernels(), w_rows, x, m, y0, acc, n0, n1);
          for (const LinearKernelSet* set : sets) {
            const auto got = RunSet(*set, w_packed, x, m, y0, acc, n0, n1);
            ASSERT_EQ(0, std::memcmp(want.data(), got.data(), want.size() * sizeof(float)))
                << set->name << " on " << WeightFormatName(packed) << " n=" << s.n << " k=" << s.k
                << " m=" << m << " accumulate=" << acc << " columns " << n0 << ".." << n1;
            ++compared;
          }
        }
      }
    }
  }
  EXPECT_EQ(compared, static_cast<int>(sets.size()) * 8 * 14 * 2 * 2);
}

// bf16-quads: register tiles, blocks of 8 rows, chunks of 64 rows, the AVX2 set's panels.
TEST(LinearKernelsTest, Bf16QuadsEqualBf16InPlaceBitwise) {
  ExpectPackedEqualsRowsBitwise(WeightFormat::kBF16, WeightFormat::kBF16Quads,
                                LinearWeights::kQuadCols, 31);
}

// int8-octets: W[j, p]'s value and scale at OctetValueIndex / OctetScaleIndex (the layout of
// linear_weights.h, spelled out here), the Q8 rows' numbers, zero padding past n and k, and
// fused parts in order.
TEST(LinearKernelsTest, Q8OctetsHoldTheQ8ValuesInTheirLayout) {
  const int n = 11, k = 45;  // 2 octets, 2 groups of 32
  const auto wf = UniformRandom(n * k, 19);
  const LinearWeights rows = LinearWeights::FromF32(wf.data(), n, k, WeightFormat::kQ8);
  const LinearWeights o = LinearWeights::FromF32(wf.data(), n, k, WeightFormat::kQ8Octets);
  const int64_t stride = 2 * (16 + 4 * 64);
  ASSERT_EQ(OctetStride(k), stride);
  EXPECT_EQ(o.owned_bytes(), 2 * stride);
  EXPECT_EQ(o.bytes(), rows.bytes());  // the same values and scales, padding aside
  for (int j = 0; j < 16; ++j) {
    for (int p = 0; p < 64; ++p) {
      // Octet j / 8, group p / 32 (its 16 bytes of scales first), block p % 32 / 8, pair
      // (j % 8) / 2, the pair's column j % 2, value p % 8.
      const int64_t at =
          (j / 8) * stride + (p / 32) * 272 + 16 + (p % 32 / 8) * 64 + (j % 8) * 8 + p % 8;
      ASSERT_EQ(OctetValueIndex(k, j, p), at) << j << "," << p;
      const int8_t want = j < n ? static_cast<const int8_t*>(rows.row(j).data)[p] : 0;
      EXPECT_EQ(static_cast<int8_t>(o.octets()[at]), want) << j << "," << p;
      if (p % 32 == 0) {
        const int64_t s_at = (j / 8) * stride + (p / 32) * 272 + (j % 8) * 2;
        ASSERT_EQ(OctetScaleIndex(k, j, p), s_at);
        uint16_t d;
        std::memcpy(&d, o.octets() + s_at, 2);
        EXPECT_EQ(d, j < n ? rows.row(j).scales[p / 32] : 0) << j << "," << p;
      }
    }
  }
  std::vector<float> got(k), want(k);
  for (int j = 0; j < n; ++j) {
    o.DecodeRow(j, got.data());
    rows.DecodeRow(j, want.data());
    EXPECT_EQ(got, want) << j;  // the same exact values
  }
  // Fused views: a bf16 part and an f32 part, stacked in order (each quantized from its fp32).
  std::vector<uint16_t> a(3 * k);
  std::vector<float> af(3 * k);
  for (int i = 0; i < 3 * k; ++i) {
    a[i] = F32ToBf16(wf[i]);
    af[i] = Bf16ToF32(a[i]);
  }
  std::vector<float> all = af;
  all.insert(all.end(), wf.begin() + 3 * k, wf.end());
  const LinearWeights whole = LinearWeights::FromF32(all.data(), n, k, WeightFormat::kQ8Octets);
  const TensorView va = View("q_proj.weight", DType::kBF16, 3, k, a.data());
  const TensorView vb = View("k_proj.weight", DType::kF32, n - 3, k, wf.data() + 3 * k);
  const TensorView* parts[] = {&va, &vb};
  auto fused = LinearWeights::FromViews(parts, WeightFormat::kQ8Octets);
  ASSERT_TRUE(fused.ok()) << fused.status();
  ASSERT_EQ(fused->owned_bytes(), whole.owned_bytes());
  EXPECT_EQ(0, std::memcmp(fused->octets(), whole.octets(), whole.owned_bytes()));
}

// int8-octets: tiles of 2 and 1 octets, blocks of 4 rows, chunks of 64 rows, panels from 64
// rows, the AVX2 set's panels.
TEST(LinearKernelsTest, Q8OctetsEqualQ8RowsBitwise) {
  ExpectPackedEqualsRowsBitwise(WeightFormat::kQ8, WeightFormat::kQ8Octets,
                                LinearWeights::kOctetCols, 41);
}

}  // namespace
}  // namespace morserve
