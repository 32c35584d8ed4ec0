// scale_add_forward against the CPU backend's arithmetic (ScaleAddRows: h + scale * b in
// double, rounded once), bitwise, on fresh random inputs: per-row scales, no scale (plain
// residual add, checked against the fp32 sum), fp32 and bf16 b.
#include <string>
#include <vector>

#include "engine/model/dtype.h"
#include "kernels/scale_add.cuh"
#include "tests/gpu/gpu_testutil.h"

namespace morserve::kernels {
namespace {

using ::morserve::testing::DeviceBuffer;
using ::morserve::testing::FloatBits;
using ::morserve::testing::FreshSeed;

class ScaleAddTest : public ::testing::Test {
 protected:
  void SetUp() override { MORSERVE_SKIP_WITHOUT_GPU(); }

  void Run(DType b_t, bool with_scale, int rows, int dim) {
    const uint64_t seed = FreshSeed();
    SCOPED_TRACE(std::string("b=") + (b_t == DType::kBF16 ? "bf16" : "f32") +
                 " scale=" + (with_scale ? "yes" : "no") + " rows=" + std::to_string(rows) +
                 " dim=" + std::to_string(dim) + " seed=" + std::to_string(seed));
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> dist(0.0f, 4.0f);
    std::uniform_real_distribution<float> gate(-1.0f, 1.0f);
    const size_t n = static_cast<size_t>(rows) * dim;
    std::vector<float> h(n), b(n), scale(rows);
    std::vector<uint16_t> b_bf16;
    for (float& v : h) v = dist(rng);
    for (float& v : b) {
      v = dist(rng);
      if (b_t == DType::kBF16) {
        b_bf16.push_back(F32ToBf16(v));
        v = Bf16ToF32(b_bf16.back());
      }
    }
    for (float& s : scale) s = gate(rng);
    DeviceBuffer<float> dh(n), dscale(rows);
    DeviceBuffer<uint8_t> db(n * (b_t == DType::kBF16 ? 2 : 4));
    ASSERT_TRUE(dh.ok() && dscale.ok() && db.ok());
    MORSERVE_CUDA_OK(dh.Upload(h));
    MORSERVE_CUDA_OK(dscale.Upload(scale));
    const void* host_b = b_t == DType::kBF16 ? static_cast<const void*>(b_bf16.data())
                                             : static_cast<const void*>(b.data());
    MORSERVE_CUDA_OK(
        cudaMemcpy(db.get(), host_b, n * (b_t == DType::kBF16 ? 2 : 4), cudaMemcpyHostToDevice));
    ScaleAddParams p;
    p.h = dh.get();
    p.b = db.get();
    p.scale = with_scale ? dscale.get() : nullptr;
    p.rows = rows;
    p.dim = dim;
    p.b_dtype = b_t;
    MORSERVE_CUDA_OK(scale_add_forward(p, nullptr));
    MORSERVE_CUDA_OK(cudaDeviceSynchronize());
    std::vector<float> got;
    MORSERVE_CUDA_OK(dh.Download(&got));
    for (size_t i = 0; i < n; ++i) {
      volatile double prod = with_scale ? static_cast<double>(scale[i / dim]) * b[i] : b[i];
      const float want = with_scale ? static_cast<float>(h[i] + prod) : h[i] + b[i];
      ASSERT_EQ(FloatBits(got[i]), FloatBits(want))
          << "element " << i << ": got " << got[i] << " want " << want;
    }
  }
};

TEST_F(ScaleAddTest, BitwiseEqualToCpuArithmetic) {
  for (DType b_t : {DType::kF32, DType::kBF16}) {
    for (bool with_scale : {true, false}) {
      ASSERT_NO_FATAL_FAILURE(Run(b_t, with_scale, 37, 960));
      ASSERT_NO_FATAL_FAILURE(Run(b_t, with_scale, 1, 7));
    }
  }
}

TEST(ScaleAddParamsTest, RejectsBadParams) {
  ScaleAddParams p;
  p.dim = 8;
  EXPECT_EQ(scale_add_forward(p, nullptr), cudaSuccess);  // rows 0
  p.b_dtype = DType::kF16;
  EXPECT_EQ(scale_add_forward(p, nullptr), cudaErrorInvalidValue);
  p.b_dtype = DType::kF32;
  p.rows = 2;  // null pointers
  EXPECT_EQ(scale_add_forward(p, nullptr), cudaErrorInvalidValue);
}

}  // namespace
}  // namespace morserve::kernels
