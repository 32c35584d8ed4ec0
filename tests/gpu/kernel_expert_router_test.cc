// expert_router_forward against the executor's decision rule (ModelExecutor::DecideExpert)
// on fresh random inputs with poisoned outputs. Decisions (int32) must be exact. With given
// scores the gate is checked to 1e-6 relative (double math on both sides); with the linear
// router computed in the kernel, rows whose reference decide score lies within 1e-3 of the
// threshold (relative to the dot product's magnitude) are redrawn, so an exact decision is
// a fair demand of an fp32 dot product, and the score and gate are checked to 1e-5 of the
// dot product's magnitude (sum of |x_i w_i|).
// Batch invariance: every row alone gives the same bits as in the batch.
#include <cmath>
#include <string>
#include <vector>

#include "engine/model/dtype.h"
#include "kernels/expert_router.cuh"
#include "tests/gpu/gpu_testutil.h"

namespace morserve::kernels {
namespace {

using ::morserve::testing::DeviceBuffer;
using ::morserve::testing::FloatBits;
using ::morserve::testing::FreshSeed;

struct Config {
  int num_loops = 3;
  float temperature = 1.0f, threshold = 0.0f, alpha = 1.0f;
  GateActivation act = GateActivation::kSigmoid;
  std::vector<float> capacity;
};

double Act(const Config& c, double s) {
  return c.act == GateActivation::kTanh ? std::tanh(s) : 1.0 / (1.0 + std::exp(-s));
}

struct Outputs {
  std::vector<int32_t> active;
  std::vector<float> gate, score;
};

// Runs the kernel on device buffers already filled by the caller (p's pointers) and
// downloads the outputs.
void Launch(ExpertRouterParams p, int rows, Outputs* out) {
  DeviceBuffer<int32_t> active(rows);
  DeviceBuffer<float> gate(rows), score(rows);
  ASSERT_TRUE(active.ok() && gate.ok() && score.ok());
  MORSERVE_CUDA_OK(active.Poison());
  MORSERVE_CUDA_OK(gate.Poison());
  MORSERVE_CUDA_OK(score.Poison());
  p.active = active.get();
  p.gate = gate.get();
  p.score_out = score.get();
  MORSERVE_CUDA_OK(expert_router_forward(p, nullptr));
  MORSERVE_CUDA_OK(cudaDeviceSynchronize());
  MORSERVE_CUDA_OK(active.Download(&out->active));
  MORSERVE_CUDA_OK(gate.Download(&out->gate));
  MORSERVE_CUDA_OK(score.Download(&out->score));
}

class ExpertRouterTest : public ::testing::Test {
 protected:
  void SetUp() override { MORSERVE_SKIP_WITHOUT_GPU(); }
};

TEST_F(ExpertRouterTest, GivenScoresDecideExactly) {
  for (GateActivation act : {GateActivation::kSigmoid, GateActivation::kTanh}) {
    for (bool with_decide : {false, true}) {
      const uint64_t seed = FreshSeed();
      SCOPED_TRACE("seed=" + std::to_string(seed));
      std::mt19937_64 rng(seed);
      Config c;
      c.act = act;
      c.threshold = 0.25f;
      c.alpha = 0.7f;
      c.capacity = {1.0f, 0.5f, 0.25f, 2.0f};
      c.num_loops = 4;
      const int rows = 300;
      std::normal_distribution<float> dist(0.0f, 2.0f);
      std::uniform_int_distribution<int32_t> loop_dist(0, c.num_loops - 1);
      std::vector<float> score(rows), decide(rows);
      std::vector<int32_t> loops(rows);
      for (int r = 0; r < rows; ++r) {
        score[r] = dist(rng);
        decide[r] = with_decide ? dist(rng) : score[r];
        loops[r] = loop_dist(rng);
      }
      decide[0] = c.threshold;  // equal to the threshold: not active (strict >)
      loops[0] = 1;
      if (!with_decide) score[0] = decide[0];
      DeviceBuffer<float> dscore(rows), ddecide(rows), dcap(c.num_loops);
      DeviceBuffer<int32_t> dloops(rows);
      ASSERT_TRUE(dscore.ok() && ddecide.ok() && dcap.ok() && dloops.ok());
      MORSERVE_CUDA_OK(dscore.Upload(score));
      MORSERVE_CUDA_OK(ddecide.Upload(decide));
      MORSERVE_CUDA_OK(dcap.Upload(c.capacity));
      MORSERVE_CUDA_OK(dloops.Upload(loops));
      ExpertRouterParams p;
      p.score_in = dscore.get();
      p.decide_in = with_decide ? ddecide.get() : nullptr;
      p.loops = dloops.get();
      p.capacity = dcap.get();
      p.rows = rows;
      p.num_loops = c.num_loops;
      p.threshold = c.threshold;
      p.alpha = c.alpha;
      p.activation = act;
      Outputs out;
      ASSERT_NO_FATAL_FAILURE(Launch(p, rows, &out));
      for (int r = 0; r < rows; ++r) {
        const bool active = c.capacity[loops[r]] >= 1.0f || decide[r] > c.threshold;
        ASSERT_EQ(out.active[r], active ? 1 : 0) << "row " << r;
        const double gate = c.alpha * Act(c, score[r]);
        ASSERT_NEAR(out.gate[r], gate, 1e-6 * std::abs(gate) + 1e-30) << "row " << r;
        ASSERT_EQ(FloatBits(out.score[r]), FloatBits(score[r])) << "row " << r;
      }
    }
  }
}

TEST_F(ExpertRouterTest, LinearRouterMatchesReferenceAndIsBatchInvariant) {
  for (DType w_t : {DType::kF32, DType::kBF16}) {
    for (bool aux : {false, true}) {
      const uint64_t seed = FreshSeed();
      SCOPED_TRACE(std::string(w_t == DType::kBF16 ? "w=bf16" : "w=f32") + (aux ? " aux" : "") +
                   " seed=" + std::to_string(seed));
      std::mt19937_64 rng(seed);
      Config c;
      c.num_loops = 3;
      c.temperature = 1.7f;
      c.threshold = 0.1f;
      c.alpha = 1.3f;
      c.capacity = {0.67f, 0.33f, 1.0f};
      const int rows = 64, hidden = 960;
      std::normal_distribution<float> dist(0.0f, 1.0f);
      auto draw_weights = [&](std::vector<float>* values, std::vector<uint16_t>* bits) {
        values->resize(static_cast<size_t>(c.num_loops) * hidden);
        for (float& v : *values) {
          v = dist(rng) * 0.05f;
          if (w_t == DType::kBF16) {
            bits->push_back(F32ToBf16(v));
            v = Bf16ToF32(bits->back());
          }
        }
      };
      std::vector<float> w, aw;
      std::vector<uint16_t> w_bits, aw_bits;
      draw_weights(&w, &w_bits);
      draw_weights(&aw, &aw_bits);
      std::uniform_int_distribution<int32_t> loop_dist(0, c.num_loops - 1);
      std::vector<float> h(static_cast<size_t>(rows) * hidden);
      std::vector<int32_t> loops(rows);
      std::vector<double> ref_score(rows), ref_decide(rows);
      auto dot = [&](const std::vector<float>& weights, int loop, const float* x, double* mag) {
        double s = 0;
        *mag = 0;
        for (int i = 0; i < hidden; ++i) {
          const double t = static_cast<double>(x[i] / c.temperature) *
                           weights[static_cast<size_t>(loop) * hidden + i];
          s += t;
          *mag += std::abs(t);
        }
        return s;
      };
      for (int r = 0; r < rows; ++r) {
        float* x = &h[static_cast<size_t>(r) * hidden];
        loops[r] = loop_dist(rng);
        for (;;) {  // redraw rows whose decision sits on the threshold
          for (int i = 0; i < hidden; ++i) x[i] = dist(rng) * 3.0f;
          double mag_s, mag_d;
          ref_score[r] = dot(w, loops[r], x, &mag_s);
          ref_decide[r] = aux ? dot(aw, loops[r], x, &mag_d) : ref_score[r];
          if (!aux) mag_d = mag_s;
          if (std::abs(ref_decide[r] - c.threshold) > 1e-3 * mag_d) break;
        }
      }
      const size_t w_bytes = w.size() * (w_t == DType::kBF16 ? 2 : 4);
      DeviceBuffer<float> dh(h.size()), dcap(c.num_loops);
      DeviceBuffer<uint8_t> dw(w_bytes), daw(w_bytes);
      DeviceBuffer<int32_t> dloops(rows);
      ASSERT_TRUE(dh.ok() && dcap.ok() && dw.ok() && daw.ok() && dloops.ok());
      MORSERVE_CUDA_OK(dh.Upload(h));
      MORSERVE_CUDA_OK(dcap.Upload(c.capacity));
      MORSERVE_CUDA_OK(dloops.Upload(loops));
      const void* hw = w_t == DType::kBF16 ? static_cast<const void*>(w_bits.data()) : w.data();
      const void* haw = w_t == DType::kBF16 ? static_cast<const void*>(aw_bits.data()) : aw.data();
      MORSERVE_CUDA_OK(cudaMemcpy(dw.get(), hw, w_bytes, cudaMemcpyHostToDevice));
      MORSERVE_CUDA_OK(cudaMemcpy(daw.get(), haw, w_bytes, cudaMemcpyHostToDevice));
      ExpertRouterParams p;
      p.h = dh.get();
      p.router_w = dw.get();
      p.aux_w = aux ? daw.get() : nullptr;
      p.w_dtype = w_t;
      p.loops = dloops.get();
      p.capacity = dcap.get();
      p.rows = rows;
      p.hidden = hidden;
      p.num_loops = c.num_loops;
      p.temperature = c.temperature;
      p.threshold = c.threshold;
      p.alpha = c.alpha;
      Outputs out;
      ASSERT_NO_FATAL_FAILURE(Launch(p, rows, &out));
      for (int r = 0; r < rows; ++r) {
        const bool active = c.capacity[loops[r]] >= 1.0f || ref_decide[r] > c.threshold;
        ASSERT_EQ(out.active[r], active ? 1 : 0) << "row " << r;
        double mag;
        dot(w, loops[r], &h[static_cast<size_t>(r) * hidden], &mag);
        ASSERT_NEAR(out.score[r], ref_score[r], 1e-5 * mag) << "row " << r;
        const double gate = c.alpha * Act(c, ref_score[r]);
        ASSERT_NEAR(out.gate[r], gate, 1e-6 * std::abs(gate) + 1e-5 * mag) << "row " << r;
      }
      for (int r = 0; r < rows; ++r) {  // each row alone
        ExpertRouterParams q = p;
        q.h = dh.get() + static_cast<size_t>(r) * hidden;
        q.loops = dloops.get() + r;
        q.rows = 1;
        Outputs one;
        ASSERT_NO_FATAL_FAILURE(Launch(q, 1, &one));
        ASSERT_EQ(FloatBits(one.score[0]), FloatBits(out.score[r])) << "row " << r;
        ASSERT_EQ(FloatBits(one.gate[0]), FloatBits(out.gate[r])) << "row " << r;
        ASSERT_EQ(one.active[0], out.active[r]) << "row " << r;
      }
    }
  }
}

TEST_F(ExpertRouterTest, LoopOutsideRangeExitsWithNanGate) {
  std::vector<float> score = {1.0f, 1.0f, 1.0f}, cap = {1.0f, 1.0f};
  std::vector<int32_t> loops = {0, 2, -1};
  DeviceBuffer<float> dscore(3), dcap(2);
  DeviceBuffer<int32_t> dloops(3);
  ASSERT_TRUE(dscore.ok() && dcap.ok() && dloops.ok());
  MORSERVE_CUDA_OK(dscore.Upload(score));
  MORSERVE_CUDA_OK(dcap.Upload(cap));
  MORSERVE_CUDA_OK(dloops.Upload(loops));
  ExpertRouterParams p;
  p.score_in = dscore.get();
  p.loops = dloops.get();
  p.capacity = dcap.get();
  p.rows = 3;
  p.num_loops = 2;
  Outputs out;
  ASSERT_NO_FATAL_FAILURE(Launch(p, 3, &out));
  EXPECT_EQ(out.active[0], 1);
  EXPECT_FALSE(std::isnan(out.gate[0]));
  for (int r : {1, 2}) {
    EXPECT_EQ(out.active[r], 0);
    EXPECT_TRUE(std::isnan(out.gate[r]));
  }
}

TEST(ExpertRouterParamsTest, RejectsBadParams) {
  ExpertRouterParams p;
  p.num_loops = 2;
  EXPECT_EQ(expert_router_forward(p, nullptr), cudaSuccess);  // rows 0, precomputed mode
  ExpertRouterParams bad = p;
  bad.temperature = 0.0f;
  EXPECT_EQ(expert_router_forward(bad, nullptr), cudaErrorInvalidValue);
  bad = p;
  bad.aux_w = &p;  // aux router without h
  EXPECT_EQ(expert_router_forward(bad, nullptr), cudaErrorInvalidValue);
  bad = p;
  float x = 0;
  bad.h = &x;  // linear mode needs hidden > 0
  EXPECT_EQ(expert_router_forward(bad, nullptr), cudaErrorInvalidValue);
  bad = p;
  bad.rows = 1;  // null pointers
  EXPECT_EQ(expert_router_forward(bad, nullptr), cudaErrorInvalidValue);
}

}  // namespace
}  // namespace morserve::kernels
