// lora_shrink_forward and lora_expand_forward on the GPU, with the checks of the emulator
// test (tests/gpu/lora_problem.h: the double definition within the fp32 rounding bound, the
// kernels' fixed fp32 order bit for bit, poisoned shrink output, rows outside every segment
// untouched, faulty loops NaN) on fresh random inputs (the seed is printed on failure): mixed
// segments with ranks 1, 8, 13, 64 and 100, SmolLM-360M shapes at batch 1, 32 and 256 over
// 3-4 loops, a row alone vs inside a batch (bitwise), a CUDA graph captured once and replayed
// after the segment buffers changed (no host sync, metadata read on the device), and the
// launchers' argument checks (those run without a device).
#include <cstdint>
#include <string>
#include <vector>

#include "engine/model/dtype.h"
#include "kernels/lora_expand.cuh"
#include "kernels/lora_shrink.cuh"
#include "tests/gpu/gpu_testutil.h"
#include "tests/gpu/lora_problem.h"

namespace morserve::kernels {
namespace {

using ::morserve::testing::DeviceBuffer;
using ::morserve::testing::FreshSeed;
using testing::CheckAll;
using testing::CheckMixedSegmentsEveryRank;
using testing::kLoraMixedSegments;
using testing::LoraExpandLaunch;
using testing::LoraInputs;
using testing::LoraProblem;
using testing::LoraShrinkLaunch;
using testing::MakeFaultyLoopLoraProblem;
using testing::MakeLoraProblem;
using testing::MakeMalformedBoundsLoraProblem;

// A problem's inputs on the device (t and y as the expand's inputs).
struct DeviceProblem {
  explicit DeviceProblem(const LoraProblem& p)
      : x(p.x.size()),
        a(p.a.size()),
        b(p.b.size()),
        indptr(p.seg_indptr.size()),
        loop(p.seg_loop.size()),
        y(p.y.size()) {
    ok = x.ok() && a.ok() && b.ok() && indptr.ok() && loop.ok() && y.ok() &&
         x.Upload(p.x) == cudaSuccess && a.Upload(p.a) == cudaSuccess &&
         b.Upload(p.b) == cudaSuccess && indptr.Upload(p.seg_indptr) == cudaSuccess &&
         loop.Upload(p.seg_loop) == cudaSuccess && y.Upload(p.y) == cudaSuccess;
  }
  LoraInputs Inputs() const { return {x.get(), a.get(), b.get(), indptr.get(), loop.get()}; }
  LoraShrinkParams Shrink(const LoraProblem& p, void* t, DType t_dtype) const {
    return LoraShrinkLaunch(p, Inputs(), t, t_dtype);
  }
  LoraExpandParams Expand(const LoraProblem& p, const void* t, DType t_dtype) const {
    return LoraExpandLaunch(p, Inputs(), t, t_dtype, y.get());
  }
  DeviceBuffer<uint16_t> x, a, b;
  DeviceBuffer<int32_t> indptr, loop;
  DeviceBuffer<float> y;
  bool ok = false;
};

// Runs the launchers on the default stream (the interface of testing::CheckAll). A CUDA
// failure fails the test and returns an empty vector (which the checks then reject).
struct GpuRunner {
  template <typename TT>
  std::vector<TT> Shrink(const LoraProblem& p, DType t_dtype) const {
    DeviceProblem d(p);
    DeviceBuffer<TT> t(static_cast<size_t>(p.rows) * p.rank);
    std::vector<TT> host;
    EXPECT_TRUE(d.ok && t.ok());
    if (!d.ok || !t.ok() || t.Poison() != cudaSuccess) return host;
    EXPECT_EQ(lora_shrink_forward(d.Shrink(p, t.get(), t_dtype), nullptr), cudaSuccess);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(t.Download(&host), cudaSuccess);
    return host;
  }
  std::vector<float> ShrinkF32(const LoraProblem& p) const { return Shrink<float>(p, DType::kF32); }
  std::vector<uint16_t> ShrinkBf16(const LoraProblem& p) const {
    return Shrink<uint16_t>(p, DType::kBF16);
  }
  template <typename TT>
  std::vector<float> Expand(const LoraProblem& p, const std::vector<TT>& t_host) const {
    DeviceProblem d(p);
    DeviceBuffer<TT> t(t_host.size());
    std::vector<float> host;
    EXPECT_TRUE(d.ok && t.ok());
    if (!d.ok || !t.ok() || t.Upload(t_host) != cudaSuccess) return host;
    const DType dt = sizeof(TT) == 4 ? DType::kF32 : DType::kBF16;
    EXPECT_EQ(lora_expand_forward(d.Expand(p, t.get(), dt), nullptr), cudaSuccess);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(d.y.Download(&host), cudaSuccess);
    return host;
  }
};

class LoraTest : public ::testing::Test {
 protected:
  void SetUp() override { MORSERVE_SKIP_WITHOUT_GPU(); }
};

TEST_F(LoraTest, MixedSegmentsEveryRank) {
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE("seed=" + std::to_string(seed));
  ASSERT_NO_FATAL_FAILURE(CheckMixedSegmentsEveryRank(GpuRunner(), seed));
}

// Rows split over `loops` segments as evenly as possible, loops in order.
std::vector<std::pair<int, int>> EvenSegments(int rows, int loops) {
  std::vector<std::pair<int, int>> segs;
  for (int l = 0; l < loops; ++l) segs.push_back({rows / loops + (l < rows % loops ? 1 : 0), l});
  return segs;
}

TEST_F(LoraTest, SmolLmShapesAtServingBatches) {
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE("seed=" + std::to_string(seed));
  uint64_t s = seed;
  struct Shape {
    int in, out, rank, loops;
  };
  // qkv, gate_up and down of SmolLM-360M with ranks 8, 32 and 64 over 3 or 4 loops.
  for (const Shape& sh :
       {Shape{960, 1600, 64, 4}, Shape{960, 5120, 32, 3}, Shape{2560, 960, 8, 4}}) {
    for (int batch : {1, 32, 256}) {
      const LoraProblem p =
          MakeLoraProblem(sh.in, sh.out, sh.rank, sh.loops, EvenSegments(batch, sh.loops), s++);
      ASSERT_NO_FATAL_FAILURE(CheckAll(GpuRunner(), p));
    }
  }
}

TEST_F(LoraTest, FaultyLoopRowsBecomeNanAndMalformedBoundsStayInRange) {
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE("seed=" + std::to_string(seed));
  ASSERT_NO_FATAL_FAILURE(CheckAll(GpuRunner(), MakeFaultyLoopLoraProblem(seed)));
  ASSERT_NO_FATAL_FAILURE(CheckAll(GpuRunner(), MakeMalformedBoundsLoraProblem(seed + 1)));
}

TEST_F(LoraTest, RowAloneAndInBatchAreBitwiseEqual) {
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE("seed=" + std::to_string(seed));
  ASSERT_NO_FATAL_FAILURE(testing::CheckRowsAloneMatchBatch(
      MakeLoraProblem(960, 1600, 13, 3, kLoraMixedSegments, seed, 2, 3), {2, 9, 21, 24, 26},
      GpuRunner()));
  // SmolLM qkv at batch 256: rows at the start, middle and end of segments.
  ASSERT_NO_FATAL_FAILURE(testing::CheckRowsAloneMatchBatch(
      MakeLoraProblem(960, 1600, 64, 4, EvenSegments(256, 4), seed + 1), {0, 63, 64, 100, 255},
      GpuRunner()));
}

// The shrink and expand captured once in a graph; the segment buffers rewritten between
// replays (same row and segment counts): each replay follows the buffers' current contents.
TEST_F(LoraTest, GraphReplayReadsTheSegmentBuffers) {
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE("seed=" + std::to_string(seed));
  LoraProblem p = MakeLoraProblem(960, 1600, 16, 3, {{7, 0}, {9, 2}, {4, 1}}, seed);
  LoraProblem q = MakeLoraProblem(960, 1600, 16, 3, {{2, 1}, {15, 0}, {3, 2}}, seed);
  ASSERT_EQ(p.rows, q.rows);
  ASSERT_EQ(p.x, q.x);  // same seed: same data, other segments
  DeviceProblem d(p);
  ASSERT_TRUE(d.ok);
  DeviceBuffer<float> t(static_cast<size_t>(p.rows) * p.rank), y0(p.y.size());
  ASSERT_TRUE(t.ok() && y0.ok());
  MORSERVE_CUDA_OK(y0.Upload(p.y));
  cudaStream_t stream;
  MORSERVE_CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaGraph_t graph;
  MORSERVE_CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  const size_t y_bytes = p.y.size() * sizeof(float);
  const cudaError_t e0 =
      cudaMemcpyAsync(d.y.get(), y0.get(), y_bytes, cudaMemcpyDeviceToDevice, stream);
  const cudaError_t e1 = lora_shrink_forward(d.Shrink(p, t.get(), DType::kF32), stream);
  const cudaError_t e2 = lora_expand_forward(d.Expand(p, t.get(), DType::kF32), stream);
  MORSERVE_CUDA_OK(cudaStreamEndCapture(stream, &graph));
  MORSERVE_CUDA_OK(e0);
  MORSERVE_CUDA_OK(e1);
  MORSERVE_CUDA_OK(e2);
  cudaGraphExec_t exec;
  MORSERVE_CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  for (const LoraProblem* now : {&p, &q, &p}) {
    MORSERVE_CUDA_OK(d.indptr.Upload(now->seg_indptr));
    MORSERVE_CUDA_OK(d.loop.Upload(now->seg_loop));
    MORSERVE_CUDA_OK(t.Poison());
    MORSERVE_CUDA_OK(cudaGraphLaunch(exec, stream));
    MORSERVE_CUDA_OK(cudaStreamSynchronize(stream));
    std::vector<float> t_host, y_host;
    MORSERVE_CUDA_OK(t.Download(&t_host));
    MORSERVE_CUDA_OK(d.y.Download(&y_host));
    ASSERT_NO_FATAL_FAILURE(testing::CheckShrinkF32(*now, t_host));
    auto t_of = [&](int r, int j) { return t_host[static_cast<size_t>(r) * now->rank + j]; };
    ASSERT_NO_FATAL_FAILURE(testing::CheckExpand(*now, t_of, y_host));
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

// Runs without a device: every rejection happens on the host, before any launch.
TEST(LoraParamsTest, RejectsBadParams) {
  static_assert(alignof(uint16_t) <= 2);
  const auto* fake = reinterpret_cast<const uint16_t*>(uintptr_t{0x1000});  // never read
  const auto* seg = reinterpret_cast<const int32_t*>(uintptr_t{0x2000});
  auto* out = reinterpret_cast<float*>(uintptr_t{0x3000});
  LoraShrinkParams s;
  s.x = fake;
  s.a = fake;
  s.t = out;
  s.seg_indptr = seg;
  s.seg_loop = seg;
  s.num_segments = 2;
  s.in = 64;
  s.rank = 8;
  s.num_loops = 3;
  EXPECT_EQ(lora_shrink_forward(s, nullptr), cudaSuccess);  // rows 0: nothing launched
  s.rows = 4;
  auto bad_shrink = [&](auto mutate) {
    LoraShrinkParams b = s;
    mutate(b);
    return lora_shrink_forward(b, nullptr);
  };
  EXPECT_EQ(bad_shrink([](auto& b) { b.rank = 0; }), cudaErrorInvalidValue);
  EXPECT_EQ(bad_shrink([](auto& b) { b.rank = kLoraMaxRank + 1; }), cudaErrorInvalidValue);
  EXPECT_EQ(bad_shrink([](auto& b) { b.in = 60; }), cudaErrorInvalidValue);  // not a multiple of 8
  EXPECT_EQ(bad_shrink([](auto& b) { b.in = 0; }), cudaErrorInvalidValue);
  EXPECT_EQ(bad_shrink([](auto& b) { b.num_loops = 0; }), cudaErrorInvalidValue);
  EXPECT_EQ(bad_shrink([](auto& b) { b.rows = -1; }), cudaErrorInvalidValue);
  EXPECT_EQ(bad_shrink([](auto& b) { b.num_segments = -1; }), cudaErrorInvalidValue);
  EXPECT_EQ(bad_shrink([](auto& b) { b.t_dtype = DType::kF16; }), cudaErrorInvalidValue);
  EXPECT_EQ(bad_shrink([](auto& b) { b.x = nullptr; }), cudaErrorInvalidValue);
  EXPECT_EQ(bad_shrink([](auto& b) { b.seg_loop = nullptr; }), cudaErrorInvalidValue);
  EXPECT_EQ(bad_shrink([&](auto& b) { b.x = fake + 1; }), cudaErrorInvalidValue);  // unaligned
  EXPECT_EQ(bad_shrink([&](auto& b) { b.a = fake + 4; }), cudaErrorInvalidValue);
  EXPECT_EQ(bad_shrink([](auto& b) { b.num_segments = 0; }), cudaSuccess);  // nothing to do

  LoraExpandParams e;
  e.t = out;
  e.b = fake;
  e.y = out;
  e.seg_indptr = seg;
  e.seg_loop = seg;
  e.num_segments = 2;
  e.out = 48;
  e.rank = 13;
  e.num_loops = 3;
  EXPECT_EQ(lora_expand_forward(e, nullptr), cudaSuccess);  // rows 0
  e.rows = 4;
  auto bad_expand = [&](auto mutate) {
    LoraExpandParams b = e;
    mutate(b);
    return lora_expand_forward(b, nullptr);
  };
  EXPECT_EQ(bad_expand([](auto& b) { b.out = 0; }), cudaErrorInvalidValue);
  EXPECT_EQ(bad_expand([](auto& b) { b.rank = -3; }), cudaErrorInvalidValue);
  EXPECT_EQ(bad_expand([](auto& b) { b.num_loops = 0; }), cudaErrorInvalidValue);
  EXPECT_EQ(bad_expand([](auto& b) { b.t_dtype = DType::kI32; }), cudaErrorInvalidValue);
  EXPECT_EQ(bad_expand([](auto& b) { b.y = nullptr; }), cudaErrorInvalidValue);
  EXPECT_EQ(bad_expand([](auto& b) { b.seg_indptr = nullptr; }), cudaErrorInvalidValue);
  EXPECT_EQ(bad_expand([](auto& b) { b.num_segments = 0; }), cudaSuccess);
}

}  // namespace
}  // namespace morserve::kernels
