// LtGemm (cuBLASLt, bf16 in, fp32 accumulate) against a CPU GEMM in double on fresh random
// inputs with poisoned outputs, for the engine's shapes (SmolLM-360M: hidden 960, fused QKV
// 1600, fused gate/up 5120, down from 2560, a vocab-wide lm_head) at decode and prefill row
// counts. The problem and the check (|got - ref| <= tol * sum_k |x_k w_k|, tol 1e-2 for bf16
// output, 1e-3 for fp32) are tests/gpu/gemm_problem.h, shared with the test on the CPU
// cuBLASLt emulation (kernel_gemm_emu_test). The algorithm cache, batch invariance across m
// (rows bitwise equal at m = 1, 7, 64), graph capture and parameter validation are tested too.
#include <cstring>
#include <string>
#include <vector>

#include "engine/model/dtype.h"
#include "kernels/gemm.cuh"
#include "tests/gpu/gemm_problem.h"
#include "tests/gpu/gpu_testutil.h"

namespace morserve::kernels {
namespace {

using ::morserve::testing::CheckAlgorithmsAreCachedPerShape;
using ::morserve::testing::DeviceBuffer;
using ::morserve::testing::ForEachEngineGemmShape;
using ::morserve::testing::FreshSeed;
using ::morserve::testing::GemmProblem;

class GemmTest : public ::testing::Test {
 protected:
  void SetUp() override {
    MORSERVE_SKIP_WITHOUT_GPU();
    MORSERVE_LT_EXPECT_OK(gemm_.Init());
  }

  // Runs y = x · w^T for one shape and dtype into poisoned memory; y's bytes in *raw.
  void Compute(const DeviceBuffer<uint16_t>& x, const DeviceBuffer<uint16_t>& w, int m, int n,
               int k, DType y_dtype, std::vector<uint8_t>* raw) {
    const size_t esize = y_dtype == DType::kBF16 ? 2 : 4;
    DeviceBuffer<uint8_t> dy(static_cast<size_t>(m) * n * esize);
    ASSERT_TRUE(dy.ok());
    MORSERVE_CUDA_OK(dy.Poison());
    const GemmParams p{
        .x = x.get(), .w = w.get(), .y = dy.get(), .y_dtype = y_dtype, .m = m, .n = n, .k = k};
    MORSERVE_LT_EXPECT_OK(gemm_.Run(p, nullptr));
    MORSERVE_CUDA_OK(cudaDeviceSynchronize());
    MORSERVE_CUDA_OK(dy.Download(raw));
  }

  // Uploads a problem's x and w.
  void Upload(const GemmProblem& pr, DeviceBuffer<uint16_t>* dx, DeviceBuffer<uint16_t>* dw) {
    ASSERT_TRUE(dx->ok() && dw->ok());
    MORSERVE_CUDA_OK(dx->Upload(pr.x.bits));
    MORSERVE_CUDA_OK(dw->Upload(pr.w.bits));
  }

  void CheckShape(int m, int n, int k) {
    const uint64_t seed = FreshSeed();
    const GemmProblem pr = GemmProblem::Make(seed, m, n, k);
    SCOPED_TRACE(pr.Describe(seed));
    DeviceBuffer<uint16_t> dx(pr.x.bits.size()), dw(pr.w.bits.size());
    ASSERT_NO_FATAL_FAILURE(Upload(pr, &dx, &dw));
    for (DType y_dtype : {DType::kBF16, DType::kF32}) {
      std::vector<uint8_t> raw;
      ASSERT_NO_FATAL_FAILURE(Compute(dx, dw, m, n, k, y_dtype, &raw));
      ASSERT_NO_FATAL_FAILURE(pr.Check(y_dtype, raw));
    }
  }

  LtGemm gemm_;
};

TEST_F(GemmTest, MatchesCpuGemm) {
  ASSERT_NO_FATAL_FAILURE(
      ForEachEngineGemmShape([&](int m, int n, int k) { CheckShape(m, n, k); }));
}

TEST_F(GemmTest, AlgorithmsAreCachedPerShape) { CheckAlgorithmsAreCachedPerShape(gemm_); }

// A row's bits must not depend on how many rows share the GEMM (the engine's batches change
// every step). Rows 0..m-1 of the same x at m = 1, 7 and 64 against m = 64.
TEST_F(GemmTest, RowsAreBatchInvariantAcrossM) {
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE("seed=" + std::to_string(seed));
  for (auto [n, k] : {std::pair{1600, 960}, std::pair{960, 2560}, std::pair{5120, 960}}) {
    const int max_m = 64;
    const GemmProblem pr = GemmProblem::Make(seed + n + k, max_m, n, k);
    SCOPED_TRACE(pr.Describe(seed + n + k));
    DeviceBuffer<uint16_t> dx(pr.x.bits.size()), dw(pr.w.bits.size());
    ASSERT_NO_FATAL_FAILURE(Upload(pr, &dx, &dw));
    for (DType y_dtype : {DType::kBF16, DType::kF32}) {
      std::vector<uint8_t> full_raw, part_raw;
      ASSERT_NO_FATAL_FAILURE(Compute(dx, dw, max_m, n, k, y_dtype, &full_raw));
      for (int m : {1, 7}) {
        ASSERT_NO_FATAL_FAILURE(Compute(dx, dw, m, n, k, y_dtype, &part_raw));
        ASSERT_EQ(0, std::memcmp(part_raw.data(), full_raw.data(), part_raw.size()))
            << "rows 0.." << m - 1 << " differ between m = " << m << " and m = " << max_m
            << (y_dtype == DType::kBF16 ? " (bf16 out)" : " (fp32 out)");
      }
    }
  }
}

// A prepared shape can be captured in a CUDA graph (Run only launches), and the replay
// equals a direct run bit for bit.
TEST_F(GemmTest, CapturedInGraphMatchesDirectRun) {
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE("seed=" + std::to_string(seed));
  const int m = 16, n = 1600, k = 960;
  const GemmProblem pr = GemmProblem::Make(seed, m, n, k);
  DeviceBuffer<uint16_t> dx(pr.x.bits.size()), dw(pr.w.bits.size()), dy(static_cast<size_t>(m) * n);
  ASSERT_TRUE(dy.ok());
  ASSERT_NO_FATAL_FAILURE(Upload(pr, &dx, &dw));
  MORSERVE_LT_EXPECT_OK(gemm_.Prepare(m, n, k, DType::kBF16));
  const GemmParams p{.x = dx.get(), .w = dw.get(), .y = dy.get(), .m = m, .n = n, .k = k};
  cudaStream_t stream;
  MORSERVE_CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  MORSERVE_CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  const cublasStatus_t st = gemm_.Run(p, stream);
  MORSERVE_CUDA_OK(cudaStreamEndCapture(stream, &graph));
  MORSERVE_LT_EXPECT_OK(st);
  MORSERVE_CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  MORSERVE_CUDA_OK(dy.Poison());
  MORSERVE_CUDA_OK(cudaGraphLaunch(exec, stream));
  MORSERVE_CUDA_OK(cudaStreamSynchronize(stream));
  std::vector<uint16_t> from_graph;
  MORSERVE_CUDA_OK(dy.Download(&from_graph));
  std::vector<uint8_t> direct_raw;
  ASSERT_NO_FATAL_FAILURE(Compute(dx, dw, m, n, k, DType::kBF16, &direct_raw));
  ASSERT_EQ(0, std::memcmp(direct_raw.data(), from_graph.data(), direct_raw.size()));
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

// Validation happens on the host before any cuBLAS call, so it runs without a device too.
TEST(GemmParamsTest, RejectsBadParams) {
  LtGemm gemm;  // not initialised
  alignas(16) uint16_t buf[64] = {};
  const GemmParams p{.x = buf, .w = buf, .y = buf, .m = 1, .n = 8, .k = 8};
  EXPECT_EQ(gemm.Run(p, nullptr), CUBLAS_STATUS_NOT_INITIALIZED);
  GemmParams bad = p;
  bad.k = 12;  // not a multiple of 8
  EXPECT_EQ(gemm.Run(bad, nullptr), CUBLAS_STATUS_INVALID_VALUE);
  bad = p;
  bad.m = 0;
  EXPECT_EQ(gemm.Run(bad, nullptr), CUBLAS_STATUS_INVALID_VALUE);
  bad = p;
  bad.y_dtype = DType::kF16;
  EXPECT_EQ(gemm.Run(bad, nullptr), CUBLAS_STATUS_INVALID_VALUE);
  bad = p;
  bad.x = buf + 1;  // not 16-byte aligned
  EXPECT_EQ(gemm.Run(bad, nullptr), CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(gemm.Prepare(1, 8, 8, DType::kBF16), CUBLAS_STATUS_NOT_INITIALIZED);
}

}  // namespace
}  // namespace morserve::kernels
