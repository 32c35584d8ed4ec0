// row_copy_forward against the same copies made by a host loop, bitwise, on fresh random rows:
// gathers (src_rows set, dst_rows null), scatters (src_rows null, dst_rows set), permutations
// (both set, also within one buffer), dims 4, 8 and 2052 (float4 copies) and 5 and 2051
// (float copies, as for a vocabulary that is not a multiple of 4), up to 300 rows and one launch of
// more rows than CTAs (the grid-stride loop); every row outside the destinations unchanged.
// An index outside its buffer (negative or >= capacity) copies nothing; n = 0 launches
// nothing; the launcher's validation. Also built as kernel_row_copy_emu_test: the same checks
// on the emulated kernels and CUDA runtime (kernels/emu), without a GPU.
#include <algorithm>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kernels/row_copy.cuh"
#include "tests/gpu/gpu_testutil.h"

namespace morserve::kernels {
namespace {

using ::morserve::testing::DeviceBuffer;
using ::morserve::testing::FloatBits;
using ::morserve::testing::FreshSeed;

class RowCopyTest : public ::testing::Test {
 protected:
  void SetUp() override { MORSERVE_SKIP_WITHOUT_GPU(); }
};

// One launch: `src` rows to `dst` rows (both [capacity, dim]); an empty index vector is a null
// index array. `dst` is uploaded, copied into and downloaded again.
struct Copy {
  std::vector<int32_t> src_rows, dst_rows;
  int64_t src_capacity = 0, dst_capacity = 0;
  int n = 0, dim = 0;
};

std::vector<float> RandomRows(int64_t rows, int dim, std::mt19937_64& rng) {
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(rows) * dim);
  for (float& x : v) x = dist(rng);
  return v;
}

// The host loop the kernel must match: dst[d] = src[s], nothing where s or d is out of range.
void HostCopy(const Copy& c, const std::vector<float>& src, std::vector<float>* dst) {
  for (int i = 0; i < c.n; ++i) {
    const int64_t s = c.src_rows.empty() ? i : c.src_rows[i];
    const int64_t d = c.dst_rows.empty() ? i : c.dst_rows[i];
    if (s < 0 || s >= c.src_capacity || d < 0 || d >= c.dst_capacity) continue;
    std::copy_n(&src[s * c.dim], c.dim, &(*dst)[d * c.dim]);
  }
}

// `in_place`: src and dst are one buffer, `dst` (src is then ignored).
void RunRowCopy(const Copy& c, const std::vector<float>& src, std::vector<float>* dst,
                bool in_place = false) {
  DeviceBuffer<float> dsrc(in_place ? 0 : src.size()), ddst(dst->size());
  DeviceBuffer<int32_t> dsrc_rows(c.src_rows.size()), ddst_rows(c.dst_rows.size());
  ASSERT_TRUE(dsrc.ok() && ddst.ok() && dsrc_rows.ok() && ddst_rows.ok());
  if (!in_place) MORSERVE_CUDA_OK(dsrc.Upload(src));
  MORSERVE_CUDA_OK(ddst.Upload(*dst));
  if (!c.src_rows.empty()) MORSERVE_CUDA_OK(dsrc_rows.Upload(c.src_rows));
  if (!c.dst_rows.empty()) MORSERVE_CUDA_OK(ddst_rows.Upload(c.dst_rows));
  RowCopyParams p;
  p.src = in_place ? ddst.get() : dsrc.get();
  p.dst = ddst.get();
  p.src_rows = dsrc_rows.get();  // null when empty
  p.dst_rows = ddst_rows.get();
  p.src_capacity = c.src_capacity;
  p.dst_capacity = c.dst_capacity;
  p.n = c.n;
  p.dim = c.dim;
  MORSERVE_CUDA_OK(row_copy_forward(p, nullptr));
  MORSERVE_CUDA_OK(cudaDeviceSynchronize());
  MORSERVE_CUDA_OK(ddst.Download(dst));
}

// Runs `c` on random src and dst rows and compares dst bitwise with the host loop's.
void CheckCopy(const Copy& c, std::mt19937_64& rng) {
  const std::vector<float> src = RandomRows(c.src_capacity, c.dim, rng);
  std::vector<float> dst = RandomRows(c.dst_capacity, c.dim, rng), want = dst;
  HostCopy(c, src, &want);
  RunRowCopy(c, src, &dst);
  ASSERT_EQ(dst.size(), want.size());
  for (size_t e = 0; e < dst.size(); ++e) {
    ASSERT_EQ(FloatBits(dst[e]), FloatBits(want[e]))
        << "dst element " << e << " (row " << e / c.dim << ")";
  }
}

// `count` distinct rows of [0, capacity) in random order.
std::vector<int32_t> DistinctRows(int count, int64_t capacity, std::mt19937_64& rng) {
  std::vector<int32_t> rows(capacity);
  std::iota(rows.begin(), rows.end(), 0);
  std::shuffle(rows.begin(), rows.end(), rng);
  rows.resize(count);
  return rows;
}

TEST_F(RowCopyTest, GathersScattersAndPermutesExactly) {
  for (int dim : {4, 8, 2052, 5, 2051}) {
    for (int n : {1, 37, 300}) {
      const uint64_t seed = FreshSeed();
      SCOPED_TRACE("dim=" + std::to_string(dim) + " n=" + std::to_string(n) +
                   " seed=" + std::to_string(seed));
      std::mt19937_64 rng(seed);
      const int64_t pool = n + 17;  // a state pool larger than the batch
      std::uniform_int_distribution<int32_t> any_row(0, static_cast<int32_t>(pool - 1));
      {
        SCOPED_TRACE("gather");  // pool rows (repeats allowed) into a batch with spare rows
        Copy c;
        c.n = n;
        c.dim = dim;
        c.src_capacity = pool;
        c.dst_capacity = n + 3;
        for (int i = 0; i < n; ++i) c.src_rows.push_back(any_row(rng));
        CheckCopy(c, rng);
      }
      {
        SCOPED_TRACE("scatter");  // a batch back into distinct pool rows
        Copy c;
        c.n = n;
        c.dim = dim;
        c.src_capacity = n;
        c.dst_capacity = pool;
        c.dst_rows = DistinctRows(n, pool, rng);
        CheckCopy(c, rng);
      }
      {
        SCOPED_TRACE("both");  // pool rows to distinct rows of another pool
        Copy c;
        c.n = n;
        c.dim = dim;
        c.src_capacity = pool;
        c.dst_capacity = pool + 5;
        for (int i = 0; i < n; ++i) c.src_rows.push_back(any_row(rng));
        c.dst_rows = DistinctRows(n, c.dst_capacity, rng);
        CheckCopy(c, rng);
      }
      {
        SCOPED_TRACE("in place");  // one buffer: n rows to n other rows, no row both
        Copy c;
        c.n = n;
        c.dim = dim;
        c.src_capacity = c.dst_capacity = 2 * n + 7;
        const std::vector<int32_t> rows = DistinctRows(2 * n, c.src_capacity, rng);
        c.src_rows.assign(rows.begin(), rows.begin() + n);
        c.dst_rows.assign(rows.begin() + n, rows.end());
        std::vector<float> buf = RandomRows(c.src_capacity, dim, rng), want = buf;
        HostCopy(c, buf, &want);  // sources are never destinations: reading `buf` is the same
        RunRowCopy(c, {}, &buf, /*in_place=*/true);
        for (size_t e = 0; e < buf.size(); ++e) {
          ASSERT_EQ(FloatBits(buf[e]), FloatBits(want[e]))
              << "element " << e << " (row " << e / dim << ")";
        }
      }
    }
  }
}

// More rows than the launcher's CTAs (4096): the grid-stride loop covers the rest.
TEST_F(RowCopyTest, MoreRowsThanCtas) {
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE("seed=" + std::to_string(seed));
  std::mt19937_64 rng(seed);
  Copy c;
  c.n = 5000;
  c.dim = 4;
  c.src_capacity = c.dst_capacity = c.n;
  c.dst_rows = DistinctRows(c.n, c.dst_capacity, rng);
  CheckCopy(c, rng);
}

TEST_F(RowCopyTest, OutOfRangeIndicesCopyNothing) {
  for (int dim : {4, 8, 2052, 7}) {
    const uint64_t seed = FreshSeed();
    SCOPED_TRACE("dim=" + std::to_string(dim) + " seed=" + std::to_string(seed));
    std::mt19937_64 rng(seed);
    const int32_t kMin = std::numeric_limits<int32_t>::min();
    const int32_t kMax = std::numeric_limits<int32_t>::max();
    Copy c;
    c.dim = dim;
    c.src_capacity = 10;
    c.dst_capacity = 12;
    // Valid copies to dst rows 0, 2, 4, 6 among sources -1, 10 (= capacity), kMin, kMax and
    // destinations -1, 12 (= capacity), kMin, kMax.
    c.src_rows = {3, -1, 5, 10, 0, kMin, 9, kMax, 2, 4, 6, 7};
    c.dst_rows = {0, 1, 2, 3, 4, 5, 6, 7, -1, 12, kMin, kMax};
    c.n = static_cast<int>(c.src_rows.size());
    const std::vector<float> src = RandomRows(c.src_capacity, dim, rng);
    const std::vector<float> before = RandomRows(c.dst_capacity, dim, rng);
    std::vector<float> dst = before;
    RunRowCopy(c, src, &dst);
    const int32_t copied_from[] = {3, -1, 5, -1, 0, -1, 9, -1, -1, -1, -1, -1};  // per dst row
    for (int64_t r = 0; r < c.dst_capacity; ++r) {
      for (int j = 0; j < dim; ++j) {
        const float want = copied_from[r] < 0 ? before[r * dim + j] : src[copied_from[r] * dim + j];
        ASSERT_EQ(FloatBits(dst[r * dim + j]), FloatBits(want))
            << "row " << r << " element " << j << (copied_from[r] < 0 ? " (written)" : "");
      }
    }
  }
  {
    // Null index arrays with capacities below n: rows i >= capacity copy nothing.
    SCOPED_TRACE("null indices, small capacities");
    std::mt19937_64 rng(FreshSeed());
    Copy c;
    c.dim = 8;
    c.n = 20;
    c.src_capacity = 15;
    c.dst_capacity = 12;
    CheckCopy(c, rng);
    c.src_capacity = 25;
    c.dst_capacity = 7;
    CheckCopy(c, rng);
  }
}

TEST_F(RowCopyTest, ZeroRowsLaunchNothing) {
  std::mt19937_64 rng(FreshSeed());
  Copy c;
  c.dim = 8;
  c.src_capacity = c.dst_capacity = 4;
  std::vector<float> src = RandomRows(4, 8, rng), dst = RandomRows(4, 8, rng);
  const std::vector<float> before = dst;
  RunRowCopy(c, src, &dst);  // n = 0
  for (size_t e = 0; e < dst.size(); ++e) ASSERT_EQ(FloatBits(dst[e]), FloatBits(before[e]));
}

// Validation happens on the host before any launch, so it runs without a device too (the
// pointers are host memory: nothing may be launched on them).
TEST(RowCopyParamsTest, RejectsBadParams) {
  alignas(16) float a[16] = {}, b[16] = {};
  RowCopyParams p;
  p.src = a;
  p.dst = b;
  p.src_capacity = p.dst_capacity = 2;
  p.dim = 4;
  EXPECT_EQ(row_copy_forward(p, nullptr), cudaSuccess);  // n 0
  p.n = -1;
  EXPECT_EQ(row_copy_forward(p, nullptr), cudaErrorInvalidValue);
  p.n = 0;
  for (int dim : {0, -4}) {
    p.dim = dim;  // invalid even with n 0
    EXPECT_EQ(row_copy_forward(p, nullptr), cudaErrorInvalidValue) << "dim " << dim;
  }
  p.n = 1;
  p.dim = 4;
  p.src = nullptr;
  EXPECT_EQ(row_copy_forward(p, nullptr), cudaErrorInvalidValue);
  p.src = a;
  p.dst = nullptr;
  EXPECT_EQ(row_copy_forward(p, nullptr), cudaErrorInvalidValue);
  p.dst = b;
  p.src_capacity = 0;
  EXPECT_EQ(row_copy_forward(p, nullptr), cudaErrorInvalidValue);
  p.src_capacity = 2;
  p.dst_capacity = 0;
  EXPECT_EQ(row_copy_forward(p, nullptr), cudaErrorInvalidValue);
  // n 0 accepts null pointers and zero capacities (nothing is launched).
  RowCopyParams empty;
  empty.dim = 4;
  EXPECT_EQ(row_copy_forward(empty, nullptr), cudaSuccess);
}

}  // namespace
}  // namespace morserve::kernels
