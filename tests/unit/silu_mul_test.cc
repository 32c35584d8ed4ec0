// SwiGLU's activation (engine/cpu/silu_mul.h): ExpDouble within 1 ulp of libm's exp, the
// AVX2 and AVX-512 builds bit for bit equal to the scalar build (specials and tails included), and
// the rounded SiLU * up equal to the reference's formula (libm exp) on 2^22 fixed samples.
#include "engine/cpu/silu_mul.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

namespace morserve {
namespace {

double UlpOf(double v) { return std::nextafter(std::fabs(v), INFINITY) - std::fabs(v); }

TEST(SiluMulTest, ExpDoubleIsWithinAnUlpOfLibm) {
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> wide(-708.0, 700.0), near(-2.0, 2.0);
  std::vector<double> xs = {0.0, -0.0, 1e-300, -1e-300, 0.5, -0.5, 1.0, -1.0, -708.0, 700.0};
  for (int n = -1021; n <= 1009; ++n) {  // where the nearest n flips: (n + 1/2) ln 2
    const double edge = (n + 0.5) * 0.6931471805599453;
    xs.insert(xs.end(), {edge, std::nextafter(edge, -INFINITY), std::nextafter(edge, INFINITY)});
  }
  for (int i = 0; i < 1 << 20; ++i) xs.push_back(i % 2 ? wide(rng) : near(rng));
  int worst = 0;
  for (double x : xs) {
    const double want = std::exp(x), got = ExpDouble(x);
    const double ulps = std::fabs(got - want) / UlpOf(want);
    ASSERT_LE(ulps, 1.0) << "x = " << x << ": " << got << " vs libm " << want;
    worst = std::max(worst, static_cast<int>(ulps));
  }
  EXPECT_LE(worst, 1);
}

TEST(SiluMulTest, ExpDoubleClampsOutsideItsRange) {
  EXPECT_EQ(ExpDouble(0.0), 1.0);
  EXPECT_EQ(ExpDouble(-1000.0), ExpDouble(-708.0));
  EXPECT_EQ(ExpDouble(1e300), ExpDouble(700.0));
  EXPECT_EQ(ExpDouble(INFINITY), ExpDouble(700.0));
  EXPECT_TRUE(std::isnan(ExpDouble(std::nan(""))));
}

uint32_t Bits(float f) { return std::bit_cast<uint32_t>(f); }

std::vector<float> Inputs(uint32_t seed, size_t n, float scale) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-scale, scale);
  std::vector<float> v(n);
  for (float& f : v) f = dist(rng);
  return v;
}

// Every vector build the host runs.
TEST(SiluMulTest, VectorBuildsEqualScalarBitwise) {
  std::vector<std::pair<const char*, SiluMulFn>> builds;
  if (SiluMulAvx2() != nullptr) builds.emplace_back("avx2", SiluMulAvx2());
  if (SiluMulAvx512() != nullptr) builds.emplace_back("avx512", SiluMulAvx512());
  if (builds.empty()) GTEST_SKIP() << "no AVX2 or AVX-512 on this host";
  const float inf = std::numeric_limits<float>::infinity();
  const float specials[] = {0.0f,   -0.0f,   1e-40f, -1e-40f, inf,     -inf,
                            NAN,    -800.0f, 800.0f, -710.0f, 710.0f,  88.0f,
                            -88.0f, 3e38f,   -3e38f, 1e-30f,  -1e-30f, 0.5f};
  for (float scale : {1.0f, 8.0f, 100.0f, 1000.0f}) {
    for (int count : {1, 7, 8, 9, 37, 4096}) {
      std::vector<float> gate = Inputs(11 + count, count, scale), up = Inputs(12 + count, count, 4);
      for (int i = 0; i < count && i < 18; i += 2) gate[i] = specials[(i + count) % 18];
      if (count > 3) up[3] = inf;
      std::vector<float> want(count);
      SiluMulScalar(gate.data(), up.data(), count, want.data());
      for (const auto& [name, fn] : builds) {
        std::vector<float> got(count + 1, 7.0f);  // one past the end: never written
        fn(gate.data(), up.data(), count, got.data());
        for (int i = 0; i < count; ++i) {
          ASSERT_EQ(Bits(want[i]), Bits(got[i]))
              << name << " scale " << scale << " count " << count << " i " << i << ": gate "
              << gate[i] << " up " << up[i] << " -> " << want[i] << " vs " << got[i];
        }
        EXPECT_EQ(got[count], 7.0f) << name;
      }
    }
  }
}

// The reference (engine/reference) writes float(g / (1 + exp(-g)) * u) with libm's exp.
TEST(SiluMulTest, RoundsToTheReferencesFloats) {
  const size_t n = size_t{1} << 22;
  const std::vector<float> gate = Inputs(21, n, 12.0f), up = Inputs(22, n, 4.0f);
  std::vector<float> got(n);
  SiluMulRows(gate.data(), up.data(), 1 << 11, 1 << 11, got.data());
  size_t differ = 0;
  for (size_t i = 0; i < n; ++i) {
    const double g = gate[i];
    const float want = static_cast<float>(g / (1.0 + std::exp(-g)) * up[i]);
    differ += Bits(want) != Bits(got[i]);
  }
  EXPECT_EQ(differ, 0u) << "of " << n;
  // Beyond the clamp: the same float (a zero of the same sign, or g itself), and -inf's NaN.
  const float big[] = {-705.0f, -720.0f, -1e30f, 705.0f, 720.0f, 1e30f};
  for (float g : big) {
    for (float u : {2.0f, -3.0f, 0.0f}) {
      float out;
      SiluMulRows(&g, &u, 1, 1, &out);
      const float want = static_cast<float>(g / (1.0 + std::exp(-static_cast<double>(g))) * u);
      EXPECT_EQ(Bits(want), Bits(out)) << g << " * " << u;
    }
  }
  const float minus_inf = -INFINITY, u = 1.0f;
  float out;
  SiluMulRows(&minus_inf, &u, 1, 1, &out);
  EXPECT_TRUE(std::isnan(out));
}

}  // namespace
}  // namespace morserve
