// fixed_gemm_forward (kernels/fixed_gemm.cuh) against a CPU GEMM in double (the cuBLASLt
// test's problem and bound, tests/gpu/gemm_problem.h: fp32 output within 1e-3 of sum |x w|),
// into poisoned memory, and its contract: an element's bits do not depend on m, on the tile
// shape (8, 16 or 32 rows per warp) or on the schedule (one pass, or k split in chunks with a
// second kernel adding the partials in order). Also its graph capture and its parameter
// checks. Also built as kernel_fixed_gemm_emu_test: the same checks on the emulated kernels
// (mma.sync emulated per warp, kernels/emu/cuda_emu.h) and runtime, at smaller shapes.
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "engine/model/dtype.h"
#include "kernels/fixed_gemm.cuh"
#include "tests/gpu/gemm_problem.h"
#include "tests/gpu/gpu_testutil.h"

namespace morserve::kernels {
namespace {

using ::morserve::testing::DeviceBuffer;
using ::morserve::testing::FreshSeed;
using ::morserve::testing::GemmProblem;

constexpr FixedGemmSchedule kSchedules[] = {
    FixedGemmSchedule::kAuto, FixedGemmSchedule::kOnePass8, FixedGemmSchedule::kOnePass16,
    FixedGemmSchedule::kOnePass32, FixedGemmSchedule::kSplit};

std::string Name(FixedGemmSchedule s) {
  switch (s) {
    case FixedGemmSchedule::kAuto:
      return "auto";
    case FixedGemmSchedule::kOnePass8:
      return "one-pass/8";
    case FixedGemmSchedule::kOnePass16:
      return "one-pass/16";
    case FixedGemmSchedule::kOnePass32:
      return "one-pass/32";
    case FixedGemmSchedule::kSplit:
      return "split";
  }
  return "?";
}

// Rows 0..m-1 of a problem on the device, y poisoned, with the workspace `schedule` wants, and
// the call's parameters.
struct OnDevice {
  DeviceBuffer<uint16_t> x, w;
  DeviceBuffer<float> y;
  DeviceBuffer<uint8_t> ws;
  FixedGemmParams p;

  OnDevice(const GemmProblem& pr, int m, FixedGemmSchedule schedule)
      : x(static_cast<size_t>(m) * pr.k),
        w(pr.w.bits.size()),
        y(static_cast<size_t>(m) * pr.n),
        ws(FixedGemmWorkspaceBytes(m, pr.n, pr.k, schedule)) {
    p.x = x.get();
    p.w = w.get();
    p.y = y.get();
    p.m = m;
    p.n = pr.n;
    p.k = pr.k;
    p.workspace = reinterpret_cast<float*>(ws.get());
    p.workspace_bytes = FixedGemmWorkspaceBytes(m, pr.n, pr.k, schedule);
    p.schedule = schedule;
  }

  void Upload(const GemmProblem& pr) {
    ASSERT_TRUE(x.ok() && w.ok() && y.ok() && ws.ok());
    MORSERVE_CUDA_OK(x.Upload(std::vector<uint16_t>(
        pr.x.bits.begin(), pr.x.bits.begin() + static_cast<ptrdiff_t>(p.m) * pr.k)));
    MORSERVE_CUDA_OK(w.Upload(pr.w.bits));
    MORSERVE_CUDA_OK(y.Poison());
    if (p.workspace_bytes > 0) MORSERVE_CUDA_OK(ws.Poison());
  }

  // y's bytes.
  void Download(std::vector<uint8_t>* raw) const {
    std::vector<float> values;
    MORSERVE_CUDA_OK(y.Download(&values));
    raw->resize(values.size() * sizeof(float));
    std::memcpy(raw->data(), values.data(), raw->size());
  }
};

class FixedGemmTest : public ::testing::Test {
 protected:
  void SetUp() override { MORSERVE_SKIP_WITHOUT_GPU(); }

  // y = x · w^T for rows 0..m-1 of the problem into poisoned memory; y's bytes in *raw.
  void Compute(const GemmProblem& pr, int m, FixedGemmSchedule schedule,
               std::vector<uint8_t>* raw) {
    OnDevice d(pr, m, schedule);
    ASSERT_NO_FATAL_FAILURE(d.Upload(pr));
    MORSERVE_CUDA_OK(fixed_gemm_forward(d.p, nullptr));
    MORSERVE_CUDA_OK(cudaDeviceSynchronize());
    ASSERT_NO_FATAL_FAILURE(d.Download(raw));
  }
};

// (m, n, k): decode and prefill row counts, n not a multiple of 16, k with a short last chunk
// and a short last span (k % 32 == 8), k under one span. A GPU runs the engine's shapes
// (gemm_problem.h); the emulator runs smaller ones of the same kinds.
std::vector<std::tuple<int, int, int>> Shapes() {
#ifdef MORSERVE_EMULATED_KERNELS
  return {{1, 24, 40}, {3, 40, 264}, {8, 200, 520}, {17, 24, 136}, {40, 72, 264}, {100, 16, 8}};
#else
  std::vector<std::tuple<int, int, int>> shapes;
  morserve::testing::ForEachEngineGemmShape(
      [&](int m, int n, int k) { shapes.emplace_back(m, n, k); });
  shapes.emplace_back(1, 32000, 960);  // the 360M model's lm_head at batch 1
  shapes.emplace_back(5, 200, 1064);   // short last chunk and span
  shapes.emplace_back(300, 1608, 960);
  return shapes;
#endif
}

TEST_F(FixedGemmTest, MatchesCpuGemm) {
  for (auto [m, n, k] : Shapes()) {
    const uint64_t seed = FreshSeed();
    const GemmProblem pr = GemmProblem::Make(seed, m, n, k);
    SCOPED_TRACE(pr.Describe(seed));
    std::vector<uint8_t> raw;
    ASSERT_NO_FATAL_FAILURE(Compute(pr, m, FixedGemmSchedule::kAuto, &raw));
    ASSERT_NO_FATAL_FAILURE(pr.Check(DType::kF32, raw));
  }
}

// Rows 0..m-1 at every m and every schedule equal the same rows of the largest m run with
// kAuto, bit for bit; kAuto itself must split at some m and run in one pass at another.
TEST_F(FixedGemmTest, RowsAreTheSameAtEveryMAndSchedule) {
#ifdef MORSERVE_EMULATED_KERNELS
  const std::vector<std::pair<int, int>> nks = {{40, 264}, {24, 520}};
  const int max_m = 72;  // over the split schedule's largest m (64)
#else
  const std::vector<std::pair<int, int>> nks = {{960, 960}, {1600, 960}, {960, 2560}, {5120, 960}};
  const int max_m = 96;
#endif
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE("seed=" + std::to_string(seed));
  for (auto [n, k] : nks) {
    const GemmProblem pr = GemmProblem::Make(seed + n + k, max_m, n, k);
    SCOPED_TRACE(pr.Describe(seed + n + k));
    std::vector<uint8_t> full;
    ASSERT_NO_FATAL_FAILURE(Compute(pr, max_m, FixedGemmSchedule::kAuto, &full));
    ASSERT_NO_FATAL_FAILURE(pr.Check(DType::kF32, full));
    bool auto_split = false, auto_one_pass = false;
    for (int m : {1, 3, 8, 9, 17, 33, max_m}) {
      for (FixedGemmSchedule s : kSchedules) {
        if (s == FixedGemmSchedule::kAuto) {
          const bool split = FixedGemmSplits(m, n, k, FixedGemmWorkspaceBytes(m, n, k));
          auto_split = auto_split || split;
          auto_one_pass = auto_one_pass || !split;
        }
        std::vector<uint8_t> part;
        ASSERT_NO_FATAL_FAILURE(Compute(pr, m, s, &part));
        ASSERT_EQ(0, std::memcmp(part.data(), full.data(), part.size()))
            << "rows 0.." << m - 1 << " with the " << Name(s)
            << " schedule differ from m = " << max_m;
      }
    }
    EXPECT_TRUE(auto_split) << "kAuto never split k for n = " << n << ", k = " << k;
    EXPECT_TRUE(auto_one_pass) << "kAuto never ran in one pass for n = " << n << ", k = " << k;
  }
}

// The split schedule's two launches are captured in a graph; the replay equals a direct run.
TEST_F(FixedGemmTest, CapturedInGraphMatchesDirectRun) {
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE("seed=" + std::to_string(seed));
  const int m = 5, n = 40, k = 264;
  const GemmProblem pr = GemmProblem::Make(seed, m, n, k);
  std::vector<uint8_t> direct, replayed;
  ASSERT_NO_FATAL_FAILURE(Compute(pr, m, FixedGemmSchedule::kSplit, &direct));
  OnDevice d(pr, m, FixedGemmSchedule::kSplit);
  ASSERT_GT(d.p.workspace_bytes, 0u);
  ASSERT_NO_FATAL_FAILURE(d.Upload(pr));
  cudaStream_t stream;
  MORSERVE_CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  MORSERVE_CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  const cudaError_t launched = fixed_gemm_forward(d.p, stream);
  MORSERVE_CUDA_OK(cudaStreamEndCapture(stream, &graph));
  MORSERVE_CUDA_OK(launched);
  MORSERVE_CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  MORSERVE_CUDA_OK(cudaGraphLaunch(exec, stream));
  MORSERVE_CUDA_OK(cudaStreamSynchronize(stream));
  ASSERT_NO_FATAL_FAILURE(d.Download(&replayed));
  EXPECT_EQ(replayed, direct);
  MORSERVE_CUDA_OK(cudaGraphExecDestroy(exec));
  MORSERVE_CUDA_OK(cudaGraphDestroy(graph));
  MORSERVE_CUDA_OK(cudaStreamDestroy(stream));
}

TEST_F(FixedGemmTest, RejectsBadParameters) {
  DeviceBuffer<uint16_t> x(64 * 64), w(64 * 64);
  DeviceBuffer<float> y(64 * 64);
  ASSERT_TRUE(x.ok() && w.ok() && y.ok());
  auto params = [&](int m, int n, int k) {
    FixedGemmParams p;
    p.x = x.get();
    p.w = w.get();
    p.y = y.get();
    p.m = m;
    p.n = n;
    p.k = k;
    return p;
  };
  EXPECT_EQ(fixed_gemm_forward(params(0, 16, 16), nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(fixed_gemm_forward(params(1, 0, 16), nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(fixed_gemm_forward(params(1, 16, 12), nullptr), cudaErrorInvalidValue);  // k % 8
  FixedGemmParams p = params(1, 16, 16);
  p.x = x.get() + 1;  // 2-byte aligned
  EXPECT_EQ(fixed_gemm_forward(p, nullptr), cudaErrorInvalidValue);
  p = params(1, 16, 16);
  p.y = nullptr;
  EXPECT_EQ(fixed_gemm_forward(p, nullptr), cudaErrorInvalidValue);
  p = params(2, 16, 256);
  p.schedule = FixedGemmSchedule::kSplit;  // no workspace
  EXPECT_EQ(fixed_gemm_forward(p, nullptr), cudaErrorInvalidValue);
  p = params(2, 16, 64);
  p.schedule = FixedGemmSchedule::kSplit;  // one chunk: nothing to split
  EXPECT_EQ(fixed_gemm_forward(p, nullptr), cudaErrorInvalidValue);
  MORSERVE_CUDA_OK(cudaGetLastError());
}

}  // namespace
}  // namespace morserve::kernels
