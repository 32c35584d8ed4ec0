// Expert-choice router problems for the kernel tests (kernel_expert_router_test on the GPU,
// kernel_expert_router_emu_test on the CPU emulator) and their checks against the executor's
// decision rule (ModelExecutor::DecideExpert). Decisions (int32) must be exact.
//   - given scores (optionally a separate decide score, one row exactly at the threshold):
//     the gate to 1e-6 relative (double math on both sides), the score passed through bitwise;
//   - the linear router computed in the kernel (fp32 h, fp32 or bf16 weights, optionally an
//     aux router for the decision): rows whose reference decide score lies within 1e-3 of the
//     threshold (relative to the dot product's magnitude) are redrawn, so an exact decision is
//     a fair demand of an fp32 dot product; score and gate to 1e-5 of the dot product's
//     magnitude (sum of |x_i w_i|). One row may get a loop index outside the range on purpose:
//     it must come out inactive with a NaN gate.
// Params() fills everything but the pointers, which each variant sets to its own memory.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "kernels/expert_router.cuh"
#include "tests/gpu/gpu_testutil.h"
#include "tests/gpu/host_tensor.h"

namespace morserve::testing {

using kernels::ExpertRouterParams;
using kernels::GateActivation;

struct ExpertRouterOutputs {
  std::vector<int32_t> active;
  std::vector<float> gate, score;
};

struct ExpertRouterConfig {
  int num_loops = 3;
  float temperature = 1.0f, threshold = 0.0f, alpha = 1.0f;
  GateActivation act = GateActivation::kSigmoid;
  std::vector<float> capacity;

  double Act(double s) const {
    return act == GateActivation::kTanh ? std::tanh(s) : 1.0 / (1.0 + std::exp(-s));
  }
  ExpertRouterParams Params(int rows) const {
    ExpertRouterParams p;
    p.rows = rows;
    p.num_loops = num_loops;
    p.temperature = temperature;
    p.threshold = threshold;
    p.alpha = alpha;
    p.activation = act;
    return p;
  }
};

struct ExpertRouterGivenProblem {
  ExpertRouterConfig c;
  int rows = 0;
  bool with_decide = false;
  std::vector<float> score, decide;
  std::vector<int32_t> loops;

  static ExpertRouterGivenProblem Make(uint64_t seed, GateActivation act, bool with_decide,
                                       int rows) {
    ExpertRouterGivenProblem p;
    p.rows = rows;
    p.with_decide = with_decide;
    p.c.act = act;
    p.c.threshold = 0.25f;
    p.c.alpha = 0.7f;
    p.c.capacity = {1.0f, 0.5f, 0.25f, 2.0f};
    p.c.num_loops = 4;
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> dist(0.0f, 2.0f);
    std::uniform_int_distribution<int32_t> loop_dist(0, p.c.num_loops - 1);
    p.score.resize(rows);
    p.decide.resize(rows);
    p.loops.resize(rows);
    for (int r = 0; r < rows; ++r) {
      p.score[r] = dist(rng);
      p.decide[r] = with_decide ? dist(rng) : p.score[r];
      p.loops[r] = loop_dist(rng);
    }
    p.decide[0] = p.c.threshold;  // equal to the threshold: not active (strict >)
    p.loops[0] = 1;
    if (!with_decide) p.score[0] = p.decide[0];
    return p;
  }

  void Check(const ExpertRouterOutputs& out) const {
    for (int r = 0; r < rows; ++r) {
      const bool active = c.capacity[loops[r]] >= 1.0f || decide[r] > c.threshold;
      ASSERT_EQ(out.active[r], active ? 1 : 0) << "row " << r;
      const double gate = c.alpha * c.Act(score[r]);
      ASSERT_NEAR(out.gate[r], gate, 1e-6 * std::abs(gate) + 1e-30) << "row " << r;
      ASSERT_EQ(FloatBits(out.score[r]), FloatBits(score[r])) << "row " << r;
    }
  }
};

struct ExpertRouterLinearProblem {
  ExpertRouterConfig c;
  int rows = 0, hidden = 0;
  bool aux = false;
  int bad_row = -1;      // the row whose loop is outside the range, or -1
  std::vector<float> h;  // [rows, hidden]
  HostTensor w, aw;      // [num_loops, hidden]: router, aux router
  std::vector<int32_t> loops;
  std::vector<double> ref_score, ref_decide;

  static ExpertRouterLinearProblem Make(uint64_t seed, DType w_t, bool aux, int rows, int hidden,
                                        int bad_row) {
    ExpertRouterLinearProblem p;
    p.rows = rows;
    p.hidden = hidden;
    p.aux = aux;
    p.bad_row = bad_row;
    p.c.num_loops = 3;
    p.c.temperature = 1.7f;
    p.c.threshold = 0.1f;
    p.c.alpha = 1.3f;
    p.c.capacity = {0.67f, 0.33f, 1.0f};
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    for (HostTensor* t : {&p.w, &p.aw}) {
      std::vector<float> values(static_cast<size_t>(p.c.num_loops) * hidden);
      for (float& v : values) v = dist(rng) * 0.05f;
      *t = HostTensor::Of(w_t, std::move(values));
    }
    std::uniform_int_distribution<int32_t> loop_dist(0, p.c.num_loops - 1);
    p.h.resize(static_cast<size_t>(rows) * hidden);
    p.loops.resize(rows);
    p.ref_score.resize(rows);
    p.ref_decide.resize(rows);
    for (int r = 0; r < rows; ++r) {
      float* x = &p.h[static_cast<size_t>(r) * hidden];
      p.loops[r] = loop_dist(rng);
      for (;;) {  // redraw rows whose decision sits on the threshold
        for (int i = 0; i < hidden; ++i) x[i] = dist(rng) * 3.0f;
        double mag_s, mag_d;
        p.ref_score[r] = p.Dot(p.w, p.loops[r], r, &mag_s);
        p.ref_decide[r] = aux ? p.Dot(p.aw, p.loops[r], r, &mag_d) : p.ref_score[r];
        if (!aux) mag_d = mag_s;
        if (std::abs(p.ref_decide[r] - p.c.threshold) > 1e-3 * mag_d) break;
      }
    }
    if (bad_row >= 0) p.loops[bad_row] = p.c.num_loops + 2;
    return p;
  }

  // Row r's (h / temperature) · weights[loop] in double, with the sum of |products| in *mag.
  double Dot(const HostTensor& weights, int loop, int r, double* mag) const {
    const float* x = &h[static_cast<size_t>(r) * hidden];
    double s = 0;
    *mag = 0;
    for (int i = 0; i < hidden; ++i) {
      const double t = static_cast<double>(x[i] / c.temperature) *
                       weights.values[static_cast<size_t>(loop) * hidden + i];
      s += t;
      *mag += std::abs(t);
    }
    return s;
  }

  ExpertRouterParams Params() const {
    ExpertRouterParams p = c.Params(rows);
    p.hidden = hidden;
    p.w_dtype = w.dtype;
    return p;
  }

  void Check(const ExpertRouterOutputs& out) const {
    for (int r = 0; r < rows; ++r) {
      if (r == bad_row) {
        ASSERT_EQ(out.active[r], 0) << "row " << r;
        ASSERT_TRUE(std::isnan(out.gate[r])) << "row " << r;
        continue;
      }
      const bool active = c.capacity[loops[r]] >= 1.0f || ref_decide[r] > c.threshold;
      ASSERT_EQ(out.active[r], active ? 1 : 0) << "row " << r;
      double mag;
      Dot(w, loops[r], r, &mag);
      ASSERT_NEAR(out.score[r], ref_score[r], 1e-5 * mag) << "row " << r;
      const double gate = c.alpha * c.Act(ref_score[r]);
      ASSERT_NEAR(out.gate[r], gate, 1e-6 * std::abs(gate) + 1e-5 * mag) << "row " << r;
    }
  }
};

// run(problem) on a fresh linear-router problem (rows x hidden, bad_row as in Make) for fp32
// and bf16 router weights, each without and with an aux router, under a trace naming the case
// and its seed; stops at the first fatal failure.
template <typename RunFn>
void ForEachLinearRouterProblem(int rows, int hidden, int bad_row, RunFn run) {
  for (DType w_t : {DType::kF32, DType::kBF16}) {
    for (bool aux : {false, true}) {
      const uint64_t seed = FreshSeed();
      SCOPED_TRACE("w=" + KernelDTypeName(w_t) + (aux ? " aux" : "") +
                   " seed=" + std::to_string(seed));
      const ExpertRouterLinearProblem pr =
          ExpertRouterLinearProblem::Make(seed, w_t, aux, rows, hidden, bad_row);
      ASSERT_NO_FATAL_FAILURE(run(pr));
    }
  }
}

}  // namespace morserve::testing
