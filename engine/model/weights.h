// Model weights resolved against the layer plan. Tensors are views into the checkpoint
// storage (TensorStore), never copies. A weight of a looped segment may differ per loop:
// `LoopTensor` holds one view (tied: every loop uses it) or one per loop (untied copies
// found to differ at load time). LoRA deltas (Relaxed Recursive) are per loop.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model/config.h"
#include "engine/model/layer_plan.h"
#include "engine/model/tensor_view.h"

namespace morserve {

class TensorStore;

struct LoraDelta {  // delta = scale * B * A
  TensorView a;     // [rank, in]
  TensorView b;     // [out, rank]
  float scale = 0.0f;
};

struct LoopTensor {
  std::vector<TensorView> per_loop;  // size 1 (shared by all loops) or `loops`
  std::vector<LoraDelta> lora;       // empty, or one per loop
  const TensorView& At(int loop) const {
    return per_loop.size() == 1 ? per_loop[0] : per_loop[loop];
  }
  bool untied() const { return per_loop.size() > 1; }
};

enum class Proj { kQ, kK, kV, kO, kGate, kUp, kDown };
inline constexpr int kNumProj = 7;
const char* ProjName(Proj p);  // "q_proj" ... "down_proj"

struct LayerWeights {
  LoopTensor input_norm;  // [H]
  LoopTensor post_norm;   // [H]
  // Sandwich blocks (config.sandwich_norm, Ouro): the norms on the attention output
  // (input_layernorm_2) and on the MLP output (post_attention_layernorm_2); empty otherwise.
  // Huginn's SandwichBlock (config.huginn.residual_norm) puts norm_2 / norm_4 here: applied
  // to the residual sum instead (docs/models.md#huginn-0125).
  LoopTensor attn_out_norm;  // [H]
  LoopTensor mlp_out_norm;   // [H]
  // Huginn's attn.qk_bias (config.huginn.qk_bias): added to q and k before RoPE.
  LoopTensor q_bias;          // [q_dim]
  LoopTensor k_bias;          // [kv_dim]
  LoopTensor proj[kNumProj];  // q [Hq, H], k/v [Hkv, H], o [H, Hq], gate/up [I, H], down [H, I]
  const LoopTensor& P(Proj p) const { return proj[static_cast<int>(p)]; }
};

// Expert-choice router of one loop: linear [1, H], or mlp: w1 [2H, H], w2 [1, 2H].
struct LoopRouter {
  TensorView w1;
  TensorView w2;  // mlp only
};

struct RouterWeights {
  std::vector<LoopRouter> expert;        // expert_choice: one per loop
  std::vector<LoopRouter> aux;           // expert_choice with aux_router: one per loop
  TensorView token_choice;               // token_choice: linear [Nr, H] (mlp: w1 [2H,H])
  TensorView token_choice_w2;            // token_choice mlp: [Nr, 2H]
  std::vector<float> token_choice_bias;  // [Nr], zeros when absent
};

struct DedupReport {  // what the loader learned comparing copies of shared layers
  std::vector<std::string> deduplicated;  // "segment 1 layer 0 self_attn.q_proj: 3 copies equal"
  std::vector<std::string> untied;        // tensors kept per loop
};

struct ModelWeights {
  ModelConfig config;
  LayerPlan plan;
  TensorView embed;       // [V, H]
  TensorView final_norm;  // [H]
  TensorView lm_head;     // [V, H]; == embed when tied or absent
  bool lm_head_tied = false;
  std::vector<LayerWeights> layers;  // indexed by layer slot
  RouterWeights router;
  // Ouro's exit gate (docs/models.md#ouro): lambda = sigmoid(w . h + b); empty otherwise.
  TensorView exit_gate_w;  // [1, H]
  TensorView exit_gate_b;  // [1]
  // Huginn's input injection: s = adapter . concat(s, e) before each recurrence; empty
  // otherwise.
  TensorView adapter;  // [H, 2H]
  DedupReport dedup;
  std::shared_ptr<const TensorStore> store;  // keeps the bytes alive

  const LayerWeights& Layer(int segment, int k) const {
    return layers[plan.segments[segment].first_layer_slot + k];
  }
};

// Loads DIR: config, plan, checkpoint files, layout resolution and validation.
absl::StatusOr<std::shared_ptr<const ModelWeights>> LoadModel(const std::string& dir);

// Resolves the tensors of `store` (any supported layout) against config and plan.
absl::StatusOr<std::shared_ptr<const ModelWeights>> ResolveWeights(
    const ModelConfig& config, const LayerPlan& plan, std::shared_ptr<const TensorStore> store);

}  // namespace morserve
