// Expert-choice (MoR) router decision for rows about to run a loop
// (docs/models.md#mixture-of-recursions-expert-choice, ModelExecutor::DecideExpert):
// score -> gate -> continue/exit, one row per CTA.
//
//   score_r  = router_w[loop] · (h_r / temperature)       (linear router, computed here)
//              or score_in[r]                              (mlp routers: scores computed by GEMMs)
//   decide_r = aux_w[loop] · (h_r / temperature) when an aux router is given, decide_in[r]
//              when given, else score_r
//   active_r = capacity[loop] >= 1  ||  decide_r > threshold          (int32 1 / 0)
//   gate_r   = float(alpha * act(score_r)), act = sigmoid or tanh, in double     (active rows)
//
// Precision: h / temperature rounded to fp32 per element (as the CPU backend divides), the
// dot product accumulated in fp32 in a fixed order (each thread a strided subset in index
// order, a shuffle tree, warps in order); act and the gate in double as the executor does.
// With given scores the decision is the same float comparison as the CPU, so it is exact.
//
// Batch invariance: one CTA per row with a fixed block size and reduction order.
//
// Faults: a loop index outside [0, num_loops) gives active 0 and a NaN gate.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "engine/model/dtype.h"

namespace morserve::kernels {

enum class GateActivation { kSigmoid, kTanh };

struct ExpertRouterParams {
  // Linear router: h and router_w set, score_in null. Precomputed: score_in set, h null.
  const float* h = nullptr;          // [rows, hidden] fp32 (the residual stream)
  const void* router_w = nullptr;    // [num_loops, hidden], w_dtype
  const void* aux_w = nullptr;       // optional [num_loops, hidden], w_dtype
  DType w_dtype = DType::kF32;       // kF32 or kBF16
  const float* score_in = nullptr;   // [rows]
  const float* decide_in = nullptr;  // optional [rows] (with score_in only)
  const int32_t* loops = nullptr;    // [rows], the loop each row is about to run
  const float* capacity = nullptr;   // [num_loops], device memory
  float* score_out = nullptr;        // optional [rows]
  int32_t* active = nullptr;         // [rows]: 1 runs the loop, 0 leaves the segment
  float* gate = nullptr;             // [rows]
  int rows = 0;                      // 0 is allowed (nothing is launched)
  int hidden = 0;
  int num_loops = 0;
  float temperature = 1.0f;
  float threshold = 0.0f;
  float alpha = 1.0f;
  GateActivation activation = GateActivation::kSigmoid;
};

// Launches on `stream`. Returns cudaErrorInvalidValue for an inconsistent mode (both or
// neither of h / score_in, aux_w without h, decide_in without score_in), a null required
// pointer, a bad dtype, non-positive sizes or a non-positive temperature; otherwise the
// launch's error.
cudaError_t expert_router_forward(const ExpertRouterParams& p, cudaStream_t stream);

}  // namespace morserve::kernels
