// qkv_rope_forward against a CPU reference in double (the RopeRows convention), on fresh
// random inputs with poisoned outputs and a poisoned cache: q_out, the cache entries at the
// write slots, the optional k_out/v_out, that slot -1 writes nothing and that every other
// cache slot keeps its poison. v is a copy, so it is checked bitwise; rotated values within a
// relative 1e-2 (one bf16 rounding) plus a tiny absolute term for values that cancel. The
// problem and the check are tests/gpu/qkv_rope_problem.h, shared with the emulator test.
#include <cmath>
#include <vector>

#include "engine/model/dtype.h"
#include "kernels/qkv_rope.cuh"
#include "tests/gpu/gpu_testutil.h"
#include "tests/gpu/qkv_rope_problem.h"

namespace morserve::kernels {
namespace {

using ::morserve::testing::DeviceBuffer;
using ::morserve::testing::FreshSeed;
using ::morserve::testing::QkvRopeOutputs;
using ::morserve::testing::QkvRopeProblem;
using ::morserve::testing::QkvRopeShape;

constexpr uint16_t kPoison = ::morserve::testing::kQkvPoison;

class QkvRopeTest : public ::testing::Test {
 protected:
  void SetUp() override { MORSERVE_SKIP_WITHOUT_GPU(); }

  void Run(const QkvRopeShape& s, int rows) {
    const uint64_t seed = FreshSeed();
    const QkvRopeProblem pr = QkvRopeProblem::Make(seed, s, rows, /*faulty=*/false);
    SCOPED_TRACE(pr.Describe(seed));
    const size_t side = s.side_outputs ? static_cast<size_t>(rows) * pr.kv_dim() : 0;
    const size_t cache = static_cast<size_t>(pr.num_slots) * pr.kv_dim();
    DeviceBuffer<uint8_t> dqkv(pr.qkv.bytes());
    DeviceBuffer<int32_t> dpos(rows), dslot(rows), dbias_index(s.bias ? rows : 0);
    DeviceBuffer<float> dbias(pr.bias.size());
    DeviceBuffer<uint16_t> dq(static_cast<size_t>(rows) * pr.q_dim());
    DeviceBuffer<uint16_t> dk_cache(cache), dv_cache(cache), dk_out(side), dv_out(side);
    ASSERT_TRUE(dqkv.ok() && dpos.ok() && dslot.ok() && dq.ok() && dk_cache.ok() && dv_cache.ok() &&
                dk_out.ok() && dv_out.ok());
    MORSERVE_CUDA_OK(cudaMemcpy(dqkv.get(), pr.qkv.data(), pr.qkv.bytes(), cudaMemcpyHostToDevice));
    MORSERVE_CUDA_OK(dpos.Upload(pr.positions));
    MORSERVE_CUDA_OK(dslot.Upload(pr.slots));
    if (s.bias) {
      ASSERT_TRUE(dbias.ok() && dbias_index.ok());
      MORSERVE_CUDA_OK(dbias.Upload(pr.bias));
      MORSERVE_CUDA_OK(dbias_index.Upload(pr.bias_index));
    }
    MORSERVE_CUDA_OK(dq.Poison());
    MORSERVE_CUDA_OK(dk_cache.Poison());
    MORSERVE_CUDA_OK(dv_cache.Poison());
    if (s.side_outputs) {
      MORSERVE_CUDA_OK(dk_out.Poison());
      MORSERVE_CUDA_OK(dv_out.Poison());
    }
    QkvRopeParams p = pr.Params();
    p.qkv = dqkv.get();
    p.positions = dpos.get();
    p.write_slot = dslot.get();
    p.q_out = dq.get();
    p.k_cache = dk_cache.get();
    p.v_cache = dv_cache.get();
    p.k_out = s.side_outputs ? dk_out.get() : nullptr;
    p.v_out = s.side_outputs ? dv_out.get() : nullptr;
    p.qk_bias = s.bias ? dbias.get() : nullptr;
    p.bias_index = s.bias ? dbias_index.get() : nullptr;
    MORSERVE_CUDA_OK(qkv_rope_forward(p, nullptr));
    MORSERVE_CUDA_OK(cudaDeviceSynchronize());
    QkvRopeOutputs o;
    MORSERVE_CUDA_OK(dq.Download(&o.q));
    MORSERVE_CUDA_OK(dk_cache.Download(&o.k_cache));
    MORSERVE_CUDA_OK(dv_cache.Download(&o.v_cache));
    if (s.side_outputs) {
      MORSERVE_CUDA_OK(dk_out.Download(&o.k_out));
      MORSERVE_CUDA_OK(dv_out.Download(&o.v_out));
    }
    ASSERT_NO_FATAL_FAILURE(pr.Check(o));
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

// Huginn-0125's options: adjacent-pair RoPE and q/k biases (variants picked per row), at its
// head shape (55 heads of 96, MHA) and at a small GQA one.
TEST_F(QkvRopeTest, PairsAndBiasMatchReference) {
  for (bool bias : {true, false}) {
    ASSERT_NO_FATAL_FAILURE(Run({55, 55, 96, 50000.0f, DType::kF32, false, true, bias}, 9));
    ASSERT_NO_FATAL_FAILURE(Run({8, 2, 128, 10000.0f, DType::kF32, true, true, bias}, 21));
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
  bad.bias_variants = 2;  // variants without a bias
  EXPECT_EQ(qkv_rope_forward(bad, nullptr), cudaErrorInvalidValue);
  bad = p;
  bad.rows = 1;  // null pointers
  EXPECT_EQ(qkv_rope_forward(bad, nullptr), cudaErrorInvalidValue);
}

}  // namespace
}  // namespace morserve::kernels
