// Model configuration: the Hugging Face Llama config.json fields the engine uses, plus the
// "recursion" object of docs/checkpoints.md#the-recursion-object (from config.json or
// recursion.json). Parsing is strict for the recursion object (unknown keys and impossible
// combinations are errors naming the field) and tolerant of the many other keys HF configs carry.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace morserve {

enum class Sharing { kNone, kCycle, kSequence, kMiddleCycle, kMiddleSequence };
enum class Routing { kNone, kExpertChoice, kTokenChoice, kEarlyExit };
enum class RouterArch { kLinear, kMlp };
enum class RouterActivation { kSigmoid, kTanh, kSoftmax };  // softmax: token-choice only
enum class Gating { kWeighted, kAdditive };
enum class KvMode { kRecursionWise, kShared };
enum class ExitKv { kPropagate, kSkip };
enum class LayerKind { kStandard, kRecurrent };
// How a looped checkpoint's own exit rule is used (docs/models.md#serving-looped-checkpoints):
// full runs every loop for every token; adaptive lets generated tokens stop at the rule.
enum class LoopMode { kFull, kAdaptive };
// The exit rule a looped checkpoint ships with: none, Ouro's learned exit gate, or Huginn's
// KL between successive recurrences' output distributions.
enum class LoopExitRule { kNone, kOuroGate, kHuginnKl };

struct RouterConfig {
  RouterArch arch = RouterArch::kLinear;
  RouterActivation activation = RouterActivation::kSigmoid;
  float alpha = 1.0f;
  float temperature = 1.0f;
  float threshold = 0.0f;
  Gating gating = Gating::kWeighted;
  std::vector<float> capacity;  // one per loop, first loop first; filled with defaults
  bool aux_router = false;
};

struct LoraConfig {
  int rank = 0;  // 0: no LoRA
  float alpha = 0.0f;
  std::vector<std::string>
      targets;  // subset of q_proj k_proj v_proj o_proj gate_proj up_proj down_proj
  float scale() const { return rank > 0 ? alpha / static_cast<float>(rank) : 0.0f; }
  bool Targets(const std::string& proj) const;
};

struct EarlyExitConfig {
  float threshold = 1.0f;
  ExitKv exit_kv = ExitKv::kPropagate;
};

struct RecursionConfig {
  bool present = false;  // false: vanilla model (no recursion object)
  int num_recursions = 1;
  Sharing sharing = Sharing::kNone;
  Routing routing = Routing::kNone;
  RouterConfig router;
  KvMode kv = KvMode::kRecursionWise;
  LoraConfig lora;
  EarlyExitConfig early_exit;
  LayerKind layer_kind = LayerKind::kStandard;
  // x = RMSNorm(x, model.norm) after every loop of the looped segment but the last
  // (Nanbeige4.2 without skip_loop_final_norm; not a key of the recursion object).
  bool norm_between_loops = false;
  // Ouro (docs/models.md#ouro): the exit gate's rule, its threshold (config.json's
  // early_exit_threshold, overridden by looped.json), and the default mode (looped.json).
  LoopExitRule exit_rule = LoopExitRule::kNone;
  float loop_exit_threshold = 1.0f;
  LoopMode default_loop_mode = LoopMode::kFull;
  // middle_cycle / middle_sequence: the unique layers before and after the looped ones (1 in
  // the MoR papers; Huginn's prelude and coda: n_layers_in_prelude / n_layers_in_coda).
  int middle_first = 1;
  int middle_last = 1;
};

// Huginn-0125 (docs/models.md#huginn-0125), model_type huginn_raven: what its block and step
// add to the Llama math. All off for every other model type.
struct HuginnConfig {
  bool enabled = false;
  float embed_scale = 1.0f;  // e = wte[tok] * sqrt(H)
  // SandwichBlock: x = N(x + proj(Attn(N(x, n1))), n2); x = N(x + mlp(N(x, n3)), n4).
  bool residual_norm = false;
  bool qk_bias = false;     // attn.qk_bias added to q and k before RoPE
  bool rope_pairs = false;  // RoPE rotates dims (2i, 2i+1) instead of halves
  // Each recurrence starts with s = adapter . concat(s, e) (state first), e the prelude's
  // output, s0 = zeros (init_scale 0) or a seeded truncated normal; ln_f on the state before
  // the coda and again before the head.
  bool input_injection = false;
  float init_scale = 0.0f;  // looped.json / request init_scale; 0: s0 = zeros
};

struct ModelConfig {
  int hidden_size = 0;
  int num_layers = 0;  // unrolled depth (num_hidden_layers)
  int num_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;  // hidden_size / num_heads unless config.json says head_dim
  int intermediate_size = 0;
  int vocab_size = 0;
  int max_position_embeddings = 2048;
  float rms_norm_eps = 1e-5f;
  float rope_theta = 10000.0f;
  bool tie_word_embeddings = false;
  std::string model_type = "llama";  // llama | nanbeige | ouro | huginn_raven
  // Ouro's sandwich block: input_layernorm_2 on the attention output and
  // post_attention_layernorm_2 on the MLP output before each residual add.
  bool sandwich_norm = false;
  HuginnConfig huginn;
  std::string torch_dtype = "bfloat16";
  std::vector<std::string> architectures;
  std::vector<int> bos_token_ids;
  std::vector<int> eos_token_ids;
  RecursionConfig recursion;

  int q_dim() const { return num_heads * head_dim; }
  int kv_dim() const { return num_kv_heads * head_dim; }
};

// Parses config.json (already read) and an optional recursion.json object
// (nullptr when absent). Validates everything; errors name the offending field.
absl::StatusOr<ModelConfig> ParseModelConfig(const nlohmann::json& config,
                                             const nlohmann::json* recursion_sidecar);

// Applies a looped.json object (docs/checkpoints.md#loopedjson): the default `mode` and
// `exit_threshold` of a looped checkpoint's requests. Errors name the field.
absl::Status ApplyLoopedDefaults(const nlohmann::json& looped, ModelConfig* config);

// Reads DIR/config.json, DIR/recursion.json and DIR/looped.json (each if present).
absl::StatusOr<ModelConfig> LoadModelConfig(const std::string& dir);

// Serialises the recursion object back to JSON (mkmodel, inspect).
nlohmann::json RecursionToJson(const RecursionConfig& r);

const char* SharingName(Sharing s);
const char* RoutingName(Routing r);
const char* KvModeName(KvMode k);
const char* LoopModeName(LoopMode m);  // "full", "adaptive"

}  // namespace morserve
