// state_join_forward (Huginn's adapter input) against the host's join, bitwise: each row's s and
// e rows of a random fp32 pool rounded to bf16 by F32ToBf16 (round to nearest even), rows
// repeated and in any order, dims 8, 96 and 2052, 1..300 rows, and more rows than CTAs (the
// grid-stride loop); values at bf16 rounding ties and beyond bf16's range; an index outside the
// pool writes that half as NaN; n = 0 launches nothing; the launcher's validation. Also built as
// kernel_state_join_emu_test: the same checks on the emulated kernels and CUDA runtime.
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "engine/model/dtype.h"
#include "kernels/state_join.cuh"
#include "tests/gpu/gpu_testutil.h"

namespace morserve::kernels {
namespace {

using ::morserve::testing::DeviceBuffer;
using ::morserve::testing::FreshSeed;

class StateJoinTest : public ::testing::Test {
 protected:
  void SetUp() override { MORSERVE_SKIP_WITHOUT_GPU(); }
};

constexpr uint16_t kNan = 0x7FC0;

// Random pool rows; every 7th element a bf16 rounding tie (low half 0x8000) or an odd one.
std::vector<float> RandomPool(int64_t rows, int dim, std::mt19937_64& rng) {
  std::normal_distribution<float> dist(0.0f, 4.0f);
  std::vector<float> v(static_cast<size_t>(rows) * dim);
  for (size_t i = 0; i < v.size(); ++i) {
    v[i] = dist(rng);
    if (i % 7 == 0) {
      uint32_t bits;
      std::memcpy(&bits, &v[i], 4);
      bits = (bits & 0xFFFF0000u) | (i % 14 == 0 ? 0x8000u : 0x7FFFu);
      std::memcpy(&v[i], &bits, 4);
    }
  }
  if (v.size() > 2) v[1] = std::numeric_limits<float>::max();  // rounds to bf16 infinity
  return v;
}

// The join by the host, as the runner made it before the kernel: F32ToBf16 of each half.
std::vector<uint16_t> HostJoin(const std::vector<float>& pool, int64_t capacity,
                               const std::vector<int32_t>& s, const std::vector<int32_t>& e,
                               int dim) {
  std::vector<uint16_t> out(s.size() * 2 * dim);
  for (size_t i = 0; i < s.size(); ++i) {
    for (int half = 0; half < 2; ++half) {
      const int64_t r = half == 0 ? s[i] : e[i];
      for (int j = 0; j < dim; ++j) {
        out[(i * 2 + half) * dim + j] =
            r < 0 || r >= capacity ? kNan : F32ToBf16(pool[r * dim + j]);
      }
    }
  }
  return out;
}

std::vector<uint16_t> RunJoin(const std::vector<float>& pool, int64_t capacity,
                              const std::vector<int32_t>& s, const std::vector<int32_t>& e,
                              int dim) {
  const int n = static_cast<int>(s.size());
  DeviceBuffer<float> dpool(pool.size());
  DeviceBuffer<int32_t> ds(s.size()), de(e.size());
  DeviceBuffer<uint16_t> dout(s.size() * 2 * dim);
  EXPECT_TRUE(dpool.ok() && ds.ok() && de.ok() && dout.ok());
  std::vector<uint16_t> out;
  if (n == 0) return out;
  EXPECT_EQ(dpool.Upload(pool), cudaSuccess);
  EXPECT_EQ(ds.Upload(s), cudaSuccess);
  EXPECT_EQ(de.Upload(e), cudaSuccess);
  StateJoinParams p;
  p.states = dpool.get();
  p.capacity = capacity;
  p.s_rows = ds.get();
  p.e_rows = de.get();
  p.out = dout.get();
  p.n = n;
  p.dim = dim;
  EXPECT_EQ(state_join_forward(p, nullptr), cudaSuccess);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(dout.Download(&out), cudaSuccess);
  return out;
}

TEST_F(StateJoinTest, JoinsAndRoundsLikeTheHost) {
  for (int dim : {8, 96, 2052}) {
    for (int n : {1, 7, 300}) {
      const uint64_t seed = FreshSeed();
      SCOPED_TRACE("dim=" + std::to_string(dim) + " n=" + std::to_string(n) +
                   " seed=" + std::to_string(seed));
      std::mt19937_64 rng(seed);
      const int64_t capacity = 2 * n + 3;
      const std::vector<float> pool = RandomPool(capacity, dim, rng);
      std::uniform_int_distribution<int32_t> row(0, static_cast<int32_t>(capacity - 1));
      std::vector<int32_t> s(n), e(n);
      for (int i = 0; i < n; ++i) {
        s[i] = row(rng);
        e[i] = i % 5 == 0 ? s[i] : row(rng);  // a row joined with itself too
      }
      ASSERT_EQ(RunJoin(pool, capacity, s, e, dim), HostJoin(pool, capacity, s, e, dim));
    }
  }
}

TEST_F(StateJoinTest, MoreRowsThanCtas) {
  std::mt19937_64 rng(FreshSeed());
  const int n = 5000, dim = 8;
  const std::vector<float> pool = RandomPool(n, dim, rng);
  std::vector<int32_t> s(n), e(n);
  for (int i = 0; i < n; ++i) s[i] = i, e[i] = n - 1 - i;
  ASSERT_EQ(RunJoin(pool, n, s, e, dim), HostJoin(pool, n, s, e, dim));
}

TEST_F(StateJoinTest, OutOfRangeIndicesWriteNan) {
  std::mt19937_64 rng(FreshSeed());
  const int dim = 8;
  const int64_t capacity = 10;
  const std::vector<float> pool = RandomPool(capacity, dim, rng);
  const int32_t kMin = std::numeric_limits<int32_t>::min();
  const std::vector<int32_t> s = {3, -1, 10, kMin, 9};
  const std::vector<int32_t> e = {12, 4, 0, 2, std::numeric_limits<int32_t>::max()};
  const std::vector<uint16_t> got = RunJoin(pool, capacity, s, e, dim);
  ASSERT_EQ(got, HostJoin(pool, capacity, s, e, dim));
  EXPECT_EQ(got[1 * dim], kNan);  // row 0's e half (12 >= capacity)
  EXPECT_NE(got[0], kNan);        // row 0's s half (row 3)
}

TEST_F(StateJoinTest, ZeroRowsAndValidation) {
  StateJoinParams p;
  p.dim = 8;
  EXPECT_EQ(state_join_forward(p, nullptr), cudaSuccess);  // n = 0: nothing, no pointer needed
  p.n = -1;
  EXPECT_EQ(state_join_forward(p, nullptr), cudaErrorInvalidValue);
  p.n = 1;
  EXPECT_EQ(state_join_forward(p, nullptr), cudaErrorInvalidValue);  // null pointers
  DeviceBuffer<float> pool(8);
  DeviceBuffer<int32_t> rows(1);
  DeviceBuffer<uint16_t> out(16);
  p.states = pool.get();
  p.s_rows = p.e_rows = rows.get();
  p.out = out.get();
  p.capacity = 0;
  EXPECT_EQ(state_join_forward(p, nullptr), cudaErrorInvalidValue);
  p.capacity = 1;
  p.dim = 0;
  EXPECT_EQ(state_join_forward(p, nullptr), cudaErrorInvalidValue);
}

}  // namespace
}  // namespace morserve::kernels
