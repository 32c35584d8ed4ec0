// kv_copy_forward against the same copies applied on the host, bitwise, on fresh random pools:
// disjoint random ranges of 1..5 entries copied in one launch (vector and scalar paths), every
// entry outside the destinations unchanged; a source the device finds outside the pool gives
// a NaN destination, a destination outside it writes nothing. Also built as
// kernel_kv_copy_emu_test: the same checks on the emulated kernels and CUDA runtime
// (kernels/emu), without a GPU.
#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "engine/model/dtype.h"
#include "kernels/kv_copy.cuh"
#include "tests/gpu/gpu_testutil.h"

namespace morserve::kernels {
namespace {

using ::morserve::testing::DeviceBuffer;
using ::morserve::testing::FreshSeed;

class KvCopyTest : public ::testing::Test {
 protected:
  void SetUp() override { MORSERVE_SKIP_WITHOUT_GPU(); }
};

// Both pools on the device, filled with `k` / `v`; the launch of `copies`; the pools back.
void RunCopies(const std::vector<int32_t>& copies, int kv_dim, int64_t slots,
               std::vector<uint16_t>* k, std::vector<uint16_t>* v) {
  DeviceBuffer<uint16_t> dk(k->size()), dv(v->size());
  DeviceBuffer<int32_t> dcopies(copies.size());
  ASSERT_TRUE(dk.ok() && dv.ok() && dcopies.ok());
  MORSERVE_CUDA_OK(dk.Upload(*k));
  MORSERVE_CUDA_OK(dv.Upload(*v));
  MORSERVE_CUDA_OK(dcopies.Upload(copies));
  KvCopyParams p;
  p.k_cache = dk.get();
  p.v_cache = dv.get();
  p.copies = dcopies.get();
  p.n = static_cast<int>(copies.size() / 3);
  p.kv_dim = kv_dim;
  p.slots = slots;
  MORSERVE_CUDA_OK(kv_copy_forward(p, nullptr));
  MORSERVE_CUDA_OK(cudaDeviceSynchronize());
  MORSERVE_CUDA_OK(dk.Download(k));
  MORSERVE_CUDA_OK(dv.Download(v));
}

TEST_F(KvCopyTest, CopiesDisjointRangesExactly) {
  for (int kv_dim : {64, 100, 2048}) {  // 100: not a multiple of 8, the scalar path
    const uint64_t seed = FreshSeed();
    SCOPED_TRACE("kv_dim=" + std::to_string(kv_dim) + " seed=" + std::to_string(seed));
    std::mt19937_64 rng(seed);
    const int64_t slots = 240;
    std::vector<uint16_t> k(slots * kv_dim), v(k.size());
    std::normal_distribution<float> dist(0.0f, 1.0f);
    for (uint16_t& x : k) x = F32ToBf16(dist(rng));
    for (uint16_t& x : v) x = F32ToBf16(dist(rng));
    // Cut the pool into ranges of 1..5 slots, shuffle them, pair them up as (src, dst).
    std::vector<std::pair<int64_t, int64_t>> ranges;  // (start, count)
    std::uniform_int_distribution<int64_t> len(1, 5);
    for (int64_t s = 0; s < slots;) {
      const int64_t c = std::min(len(rng), slots - s);
      ranges.push_back({s, c});
      s += c;
    }
    std::shuffle(ranges.begin(), ranges.end(), rng);
    std::vector<int32_t> copies;
    for (size_t i = 0; i + 1 < ranges.size() && copies.size() < 3 * 30; i += 2) {
      const int64_t count = std::min(ranges[i].second, ranges[i + 1].second);
      copies.insert(copies.end(),
                    {static_cast<int32_t>(ranges[i].first),
                     static_cast<int32_t>(ranges[i + 1].first), static_cast<int32_t>(count)});
    }
    std::vector<uint16_t> want_k = k, want_v = v;
    for (size_t c = 0; c < copies.size(); c += 3) {
      const size_t n = static_cast<size_t>(copies[c + 2]) * kv_dim;
      std::copy_n(&k[copies[c] * kv_dim], n, &want_k[copies[c + 1] * kv_dim]);
      std::copy_n(&v[copies[c] * kv_dim], n, &want_v[copies[c + 1] * kv_dim]);
    }
    RunCopies(copies, kv_dim, slots, &k, &v);
    for (size_t i = 0; i < k.size(); ++i) {
      ASSERT_EQ(k[i], want_k[i]) << "K element " << i << " (slot " << i / kv_dim << ")";
      ASSERT_EQ(v[i], want_v[i]) << "V element " << i << " (slot " << i / kv_dim << ")";
    }
  }
}

TEST_F(KvCopyTest, OutOfPoolSourceGivesNanAndOutOfPoolDestinationWritesNothing) {
  for (int kv_dim : {64, 100}) {
    SCOPED_TRACE("kv_dim=" + std::to_string(kv_dim));
    const int64_t slots = 8;
    std::vector<uint16_t> k(slots * kv_dim, F32ToBf16(1.0f)), v(k.size(), F32ToBf16(2.0f));
    // Slot 1 <- slot 9 (outside): NaN; slots 7..8 <- 0..1 (8 outside): nothing; 3 <- -1: NaN;
    // slot 5 <- slot 4 with count 0: nothing.
    const std::vector<int32_t> copies = {9, 1, 1, 0, 7, 2, -1, 3, 1, 4, 5, 0};
    RunCopies(copies, kv_dim, slots, &k, &v);
    for (int64_t s = 0; s < slots; ++s) {
      for (int i = 0; i < kv_dim; ++i) {
        const float gk = Bf16ToF32(k[s * kv_dim + i]), gv = Bf16ToF32(v[s * kv_dim + i]);
        if (s == 1 || s == 3) {
          ASSERT_TRUE(std::isnan(gk) && std::isnan(gv)) << "slot " << s << " element " << i;
        } else {
          ASSERT_EQ(gk, 1.0f) << "slot " << s << " element " << i;
          ASSERT_EQ(gv, 2.0f) << "slot " << s << " element " << i;
        }
      }
    }
  }
}

// Validation happens on the host before any launch, so it runs without a device too.
TEST(KvCopyParamsTest, RejectsBadParams) {
  KvCopyParams p;
  p.kv_dim = 8;
  p.slots = 4;
  EXPECT_EQ(kv_copy_forward(p, nullptr), cudaSuccess);  // n 0
  p.n = -1;
  EXPECT_EQ(kv_copy_forward(p, nullptr), cudaErrorInvalidValue);
  p.n = 1;  // null pointers
  EXPECT_EQ(kv_copy_forward(p, nullptr), cudaErrorInvalidValue);
  p.kv_dim = 0;
  EXPECT_EQ(kv_copy_forward(p, nullptr), cudaErrorInvalidValue);
}

}  // namespace
}  // namespace morserve::kernels
