// qkv_rope_forward against a CPU reference in double (the RopeRows convention), on fresh
// random inputs with poisoned outputs and a poisoned cache: q_out, the cache entries at the
// write slots, the optional k_out/v_out, that slot -1 writes nothing and that every other
// cache slot keeps its poison. v is a copy, so it is checked bitwise; rotated values within a
// relative 1e-2 (one bf16 rounding) plus a tiny absolute term for values that cancel.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include "engine/model/dtype.h"
#include "kernels/qkv_rope.cuh"
#include "tests/gpu/gpu_testutil.h"

namespace morserve::kernels {
namespace {

using ::morserve::testing::DeviceBuffer;
using ::morserve::testing::FreshSeed;

constexpr uint16_t kPoison = 0xFFFF;

struct Shape {
  int n_heads, n_kv_heads, head_dim;
  float theta;
  DType in;
  bool side_outputs;  // k_out / v_out
};

class QkvRopeTest : public ::testing::Test {
 protected:
  void SetUp() override { MORSERVE_SKIP_WITHOUT_GPU(); }

  void Run(const Shape& s, int rows) {
    const uint64_t seed = FreshSeed();
    SCOPED_TRACE("heads=" + std::to_string(s.n_heads) + "/" + std::to_string(s.n_kv_heads) +
                 " head_dim=" + std::to_string(s.head_dim) +
                 " in=" + (s.in == DType::kBF16 ? "bf16" : "f32") +
                 " rows=" + std::to_string(rows) + " seed=" + std::to_string(seed));
    std::mt19937_64 rng(seed);
    const int hd = s.head_dim, q_dim = s.n_heads * hd, kv_dim = s.n_kv_heads * hd;
    const int width = q_dim + 2 * kv_dim;
    const int64_t num_slots = 3 * rows + 7;

    // Inputs: values as the kernel reads them (fp32, or bf16-rounded).
    std::normal_distribution<float> dist(0.0f, 2.0f);
    std::vector<float> values(static_cast<size_t>(rows) * width);
    std::vector<float> in_f32;
    std::vector<uint16_t> in_bf16;
    for (float& v : values) {
      v = dist(rng);
      if (s.in == DType::kBF16) {
        in_bf16.push_back(F32ToBf16(v));
        v = Bf16ToF32(in_bf16.back());
      } else {
        in_f32.push_back(v);
      }
    }
    std::uniform_int_distribution<int32_t> pos_dist(0, 40000);
    std::vector<int32_t> positions(rows), slots(rows);
    std::vector<int32_t> perm(num_slots);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    for (int r = 0; r < rows; ++r) {
      positions[r] = r == 0 ? 0 : pos_dist(rng);  // position 0: identity rotation
      slots[r] = r % 4 == 3 ? -1 : perm[r];       // distinct slots, some rows do not write
    }

    // Reference rotation in double.
    auto rotate = [&](const float* x, int heads, int pos, std::vector<double>* out) {
      out->assign(static_cast<size_t>(heads) * hd, 0.0);
      const int half = hd / 2;
      for (int i = 0; i < half; ++i) {
        const double inv_freq = std::pow(static_cast<double>(s.theta), -2.0 * i / hd);
        const double c = std::cos(pos * inv_freq), sn = std::sin(pos * inv_freq);
        for (int h = 0; h < heads; ++h) {
          const double a = x[h * hd + i], b = x[h * hd + i + half];
          (*out)[h * hd + i] = a * c - b * sn;
          (*out)[h * hd + i + half] = b * c + a * sn;
        }
      }
    };

    const size_t in_bytes = values.size() * (s.in == DType::kBF16 ? 2 : 4);
    DeviceBuffer<uint8_t> dqkv(in_bytes);
    DeviceBuffer<int32_t> dpos(rows), dslot(rows);
    DeviceBuffer<uint16_t> dq(static_cast<size_t>(rows) * q_dim);
    DeviceBuffer<uint16_t> dk_cache(num_slots * kv_dim), dv_cache(num_slots * kv_dim);
    DeviceBuffer<uint16_t> dk_out(s.side_outputs ? static_cast<size_t>(rows) * kv_dim : 0);
    DeviceBuffer<uint16_t> dv_out(s.side_outputs ? static_cast<size_t>(rows) * kv_dim : 0);
    ASSERT_TRUE(dqkv.ok() && dpos.ok() && dslot.ok() && dq.ok() && dk_cache.ok() && dv_cache.ok() &&
                dk_out.ok() && dv_out.ok());
    const void* host_in = s.in == DType::kBF16 ? static_cast<const void*>(in_bf16.data())
                                               : static_cast<const void*>(in_f32.data());
    MORSERVE_CUDA_OK(cudaMemcpy(dqkv.get(), host_in, in_bytes, cudaMemcpyHostToDevice));
    MORSERVE_CUDA_OK(dpos.Upload(positions));
    MORSERVE_CUDA_OK(dslot.Upload(slots));
    MORSERVE_CUDA_OK(dq.Poison());
    MORSERVE_CUDA_OK(dk_cache.Poison());
    MORSERVE_CUDA_OK(dv_cache.Poison());
    if (s.side_outputs) {
      MORSERVE_CUDA_OK(dk_out.Poison());
      MORSERVE_CUDA_OK(dv_out.Poison());
    }

    QkvRopeParams p;
    p.qkv = dqkv.get();
    p.qkv_dtype = s.in;
    p.positions = dpos.get();
    p.write_slot = dslot.get();
    p.q_out = dq.get();
    p.k_cache = dk_cache.get();
    p.v_cache = dv_cache.get();
    p.num_slots = num_slots;
    p.k_out = s.side_outputs ? dk_out.get() : nullptr;
    p.v_out = s.side_outputs ? dv_out.get() : nullptr;
    p.rows = rows;
    p.n_heads = s.n_heads;
    p.n_kv_heads = s.n_kv_heads;
    p.head_dim = hd;
    p.theta = s.theta;
    MORSERVE_CUDA_OK(qkv_rope_forward(p, nullptr));
    MORSERVE_CUDA_OK(cudaDeviceSynchronize());

    std::vector<uint16_t> q, kc, vc, ko, vo;
    MORSERVE_CUDA_OK(dq.Download(&q));
    MORSERVE_CUDA_OK(dk_cache.Download(&kc));
    MORSERVE_CUDA_OK(dv_cache.Download(&vc));
    if (s.side_outputs) {
      MORSERVE_CUDA_OK(dk_out.Download(&ko));
      MORSERVE_CUDA_OK(dv_out.Download(&vo));
    }

    auto expect_close = [](uint16_t got_bits, double want, const std::string& what) {
      const double got = Bf16ToF32(got_bits);
      ASSERT_TRUE(std::abs(got - want) <= 1e-2 * std::abs(want) + 1e-5)
          << what << ": got " << got << " want " << want;
    };
    std::vector<bool> written(num_slots, false);
    std::vector<double> qr, kr;
    for (int r = 0; r < rows; ++r) {
      const float* x = &values[static_cast<size_t>(r) * width];
      rotate(x, s.n_heads, positions[r], &qr);
      rotate(x + q_dim, s.n_kv_heads, positions[r], &kr);
      for (int i = 0; i < q_dim; ++i) {
        ASSERT_NO_FATAL_FAILURE(
            expect_close(q[static_cast<size_t>(r) * q_dim + i], qr[i],
                         "row " + std::to_string(r) + " q " + std::to_string(i)));
      }
      for (int i = 0; i < kv_dim; ++i) {
        const uint16_t want_v = F32ToBf16(x[q_dim + kv_dim + i]);
        const std::string where = "row " + std::to_string(r) + " kv element " + std::to_string(i);
        if (slots[r] >= 0) {
          ASSERT_NO_FATAL_FAILURE(expect_close(kc[static_cast<size_t>(slots[r]) * kv_dim + i],
                                               kr[i], "cache k " + where));
          ASSERT_EQ(vc[static_cast<size_t>(slots[r]) * kv_dim + i], want_v) << "cache v " << where;
        }
        if (s.side_outputs) {
          ASSERT_NO_FATAL_FAILURE(
              expect_close(ko[static_cast<size_t>(r) * kv_dim + i], kr[i], "k_out " + where));
          ASSERT_EQ(vo[static_cast<size_t>(r) * kv_dim + i], want_v) << "v_out " << where;
          if (slots[r] >= 0) {
            ASSERT_EQ(ko[static_cast<size_t>(r) * kv_dim + i],
                      kc[static_cast<size_t>(slots[r]) * kv_dim + i]);
          }
        }
      }
      if (slots[r] >= 0) written[slots[r]] = true;
    }
    for (int64_t sl = 0; sl < num_slots; ++sl) {
      if (written[sl]) continue;
      for (int i = 0; i < kv_dim; ++i) {
        ASSERT_EQ(kc[sl * kv_dim + i], kPoison) << "slot " << sl << " was written";
        ASSERT_EQ(vc[sl * kv_dim + i], kPoison) << "slot " << sl << " was written";
      }
    }
  }
};

TEST_F(QkvRopeTest, MatchesReference) {
  for (DType in : {DType::kBF16, DType::kF32}) {
    for (bool side : {false, true}) {
      ASSERT_NO_FATAL_FAILURE(Run({15, 5, 64, 10000.0f, in, side}, 37));   // SmolLM-360M
      ASSERT_NO_FATAL_FAILURE(Run({32, 8, 64, 500000.0f, in, side}, 19));  // Llama-3.2-1B
      ASSERT_NO_FATAL_FAILURE(Run({8, 2, 128, 1000000.0f, in, side}, 5));  // head_dim 128
      ASSERT_NO_FATAL_FAILURE(Run({3, 1, 10, 10000.0f, in, side}, 64));    // odd shapes
    }
  }
}

// A slot outside the cache or a negative position: q_out of that row is NaN, no cache write.
TEST_F(QkvRopeTest, FaultyRowsBecomeNan) {
  const int rows = 3, hd = 64, q_dim = 2 * hd, kv_dim = hd, width = q_dim + 2 * kv_dim;
  std::vector<uint16_t> in(static_cast<size_t>(rows) * width, F32ToBf16(0.5f));
  std::vector<int32_t> positions = {4, -1, 7}, slots = {0, 1, 5};  // 5 >= num_slots (2)
  DeviceBuffer<uint16_t> dqkv(in.size()), dq(rows * q_dim), dk(2 * kv_dim), dv(2 * kv_dim);
  DeviceBuffer<int32_t> dpos(rows), dslot(rows);
  ASSERT_TRUE(dqkv.ok() && dq.ok() && dk.ok() && dv.ok() && dpos.ok() && dslot.ok());
  MORSERVE_CUDA_OK(dqkv.Upload(in));
  MORSERVE_CUDA_OK(dpos.Upload(positions));
  MORSERVE_CUDA_OK(dslot.Upload(slots));
  MORSERVE_CUDA_OK(dk.Poison());
  MORSERVE_CUDA_OK(dv.Poison());
  MORSERVE_CUDA_OK(cudaMemset(dq.get(), 0, rows * q_dim * 2));
  QkvRopeParams p;
  p.qkv = dqkv.get();
  p.positions = dpos.get();
  p.write_slot = dslot.get();
  p.q_out = dq.get();
  p.k_cache = dk.get();
  p.v_cache = dv.get();
  p.num_slots = 2;
  p.rows = rows;
  p.n_heads = 2;
  p.n_kv_heads = 1;
  p.head_dim = hd;
  MORSERVE_CUDA_OK(qkv_rope_forward(p, nullptr));
  std::vector<uint16_t> q, k;
  MORSERVE_CUDA_OK(dq.Download(&q));
  MORSERVE_CUDA_OK(dk.Download(&k));
  for (int i = 0; i < q_dim; ++i) {
    EXPECT_FALSE(std::isnan(Bf16ToF32(q[i])));
    EXPECT_TRUE(std::isnan(Bf16ToF32(q[q_dim + i])));
    EXPECT_TRUE(std::isnan(Bf16ToF32(q[2 * q_dim + i])));
  }
  for (int i = 0; i < kv_dim; ++i) {
    EXPECT_NE(k[i], kPoison);           // row 0 wrote slot 0
    EXPECT_EQ(k[kv_dim + i], kPoison);  // row 1 (bad position) did not write slot 1
  }
}

TEST(QkvRopeParamsTest, RejectsBadParams) {
  QkvRopeParams p;
  p.n_heads = 4;
  p.n_kv_heads = 2;
  p.head_dim = 64;
  EXPECT_EQ(qkv_rope_forward(p, nullptr), cudaSuccess);  // rows 0
  QkvRopeParams bad = p;
  bad.head_dim = 63;
  EXPECT_EQ(qkv_rope_forward(bad, nullptr), cudaErrorInvalidValue);
  bad = p;
  bad.theta = 0.0f;
  EXPECT_EQ(qkv_rope_forward(bad, nullptr), cudaErrorInvalidValue);
  bad = p;
  bad.qkv_dtype = DType::kF16;
  EXPECT_EQ(qkv_rope_forward(bad, nullptr), cudaErrorInvalidValue);
  bad = p;
  bad.rows = 1;  // null pointers
  EXPECT_EQ(qkv_rope_forward(bad, nullptr), cudaErrorInvalidValue);
}

}  // namespace
}  // namespace morserve::kernels
