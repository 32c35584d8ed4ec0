// swiglu_forward against a CPU reference in double (SiluMulRows' definition) on fresh random
// inputs with poisoned outputs: every dtype pair, per-element relative error under 1e-2 for
// bf16 output (one rounding) and 1e-5 for fp32 output (fp32 evaluation).
#include <cmath>
#include <string>
#include <vector>

#include "engine/model/dtype.h"
#include "kernels/swiglu.cuh"
#include "tests/gpu/gpu_testutil.h"

namespace morserve::kernels {
namespace {

using ::morserve::testing::DeviceBuffer;
using ::morserve::testing::FreshSeed;

class SwigluTest : public ::testing::Test {
 protected:
  void SetUp() override { MORSERVE_SKIP_WITHOUT_GPU(); }

  void Run(DType in_t, DType out_t, int rows, int inter) {
    const uint64_t seed = FreshSeed();
    SCOPED_TRACE(std::string("in=") + (in_t == DType::kBF16 ? "bf16" : "f32") + " out=" +
                 (out_t == DType::kBF16 ? "bf16" : "f32") + " rows=" + std::to_string(rows) +
                 " inter=" + std::to_string(inter) + " seed=" + std::to_string(seed));
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> dist(0.0f, 3.0f);
    const size_t n_in = static_cast<size_t>(rows) * 2 * inter, n_out = n_in / 2;
    std::vector<float> values(n_in), in_f32;
    std::vector<uint16_t> in_bf16;
    for (float& v : values) {
      v = dist(rng);
      if (in_t == DType::kBF16) {
        in_bf16.push_back(F32ToBf16(v));
        v = Bf16ToF32(in_bf16.back());
      } else {
        in_f32.push_back(v);
      }
    }
    const size_t in_bytes = n_in * (in_t == DType::kBF16 ? 2 : 4);
    const size_t out_size = out_t == DType::kBF16 ? 2 : 4;
    DeviceBuffer<uint8_t> din(in_bytes), dout(n_out * out_size);
    ASSERT_TRUE(din.ok() && dout.ok());
    const void* host = in_t == DType::kBF16 ? static_cast<const void*>(in_bf16.data())
                                            : static_cast<const void*>(in_f32.data());
    MORSERVE_CUDA_OK(cudaMemcpy(din.get(), host, in_bytes, cudaMemcpyHostToDevice));
    MORSERVE_CUDA_OK(dout.Poison());
    SwigluParams p;
    p.gate_up = din.get();
    p.out = dout.get();
    p.rows = rows;
    p.inter = inter;
    p.in_dtype = in_t;
    p.out_dtype = out_t;
    MORSERVE_CUDA_OK(swiglu_forward(p, nullptr));
    MORSERVE_CUDA_OK(cudaDeviceSynchronize());
    std::vector<uint8_t> raw;
    MORSERVE_CUDA_OK(dout.Download(&raw));
    const double tol = out_t == DType::kBF16 ? 1e-2 : 1e-5;
    for (int r = 0; r < rows; ++r) {
      for (int i = 0; i < inter; ++i) {
        const double g = values[static_cast<size_t>(r) * 2 * inter + i];
        const double u = values[static_cast<size_t>(r) * 2 * inter + inter + i];
        const double want = g / (1.0 + std::exp(-g)) * u;
        const size_t e = static_cast<size_t>(r) * inter + i;
        double got;
        if (out_t == DType::kBF16) {
          uint16_t b;
          std::memcpy(&b, raw.data() + 2 * e, 2);
          got = Bf16ToF32(b);
        } else {
          float f;
          std::memcpy(&f, raw.data() + 4 * e, 4);
          got = f;
        }
        ASSERT_TRUE(std::abs(got - want) <= tol * std::abs(want) + 1e-30)
            << "row " << r << " element " << i << ": got " << got << " want " << want;
      }
    }
  }
};

TEST_F(SwigluTest, MatchesReference) {
  for (DType in_t : {DType::kBF16, DType::kF32}) {
    for (DType out_t : {DType::kBF16, DType::kF32}) {
      ASSERT_NO_FATAL_FAILURE(Run(in_t, out_t, 33, 2560));  // SmolLM-360M intermediate
      ASSERT_NO_FATAL_FAILURE(Run(in_t, out_t, 3, 1000));
      ASSERT_NO_FATAL_FAILURE(Run(in_t, out_t, 1, 1));
    }
  }
}

TEST(SwigluParamsTest, RejectsBadParams) {
  SwigluParams p;
  p.inter = 8;
  EXPECT_EQ(swiglu_forward(p, nullptr), cudaSuccess);  // rows 0
  p.in_dtype = DType::kF16;
  EXPECT_EQ(swiglu_forward(p, nullptr), cudaErrorInvalidValue);
  p.in_dtype = DType::kBF16;
  p.rows = 2;  // null pointers
  EXPECT_EQ(swiglu_forward(p, nullptr), cudaErrorInvalidValue);
  p.inter = 0;
  EXPECT_EQ(swiglu_forward(p, nullptr), cudaErrorInvalidValue);
}

}  // namespace
}  // namespace morserve::kernels
