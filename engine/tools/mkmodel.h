// Deterministic random tiny models for tests and benchmarks (`morserve mkmodel`).
// A tiny model is a full checkpoint directory: config.json (with the "recursion" object) and
// model.safetensors (or N shards + model.safetensors.index.json), written in the layout a
// user would get from the training code of its family (docs/checkpoints.md). The bytes
// depend only on the spec: values come from std::mt19937_64 and an explicit Box-Muller
// transform, seeded per tensor from (seed, tensor role), so equal specs give equal files.
//
// Families (TinyModelSpec::family) and what they write:
//   vanilla                     plain Llama, no recursion object
//   recursive-cycle             Recursive, sharing cycle; plain per-unrolled-layer keys,
//   recursive-sequence          ... sequence        every copy of a shared layer stored
//   recursive-middle-cycle      ... middle_cycle    (equal bytes)
//   recursive-middle-sequence   ... middle_sequence
//   recursive-untied-attn       cycle; attention copies differ per loop, MLP/norm copies equal
//   relaxed-lora                cycle; PEFT LoRA keys on the shared layers (q_proj, v_proj)
//   mor-ec                      MoR expert-choice, middle_cycle, official layout
//   mor-tc                      MoR token-choice, middle_cycle, official layout + router_bias
//   early-exit                  Recursive middle_cycle with routing early_exit
//   recurrent                   vanilla plan with layer_kind recurrent
//   nanbeige                    Nanbeige4.2's layout: model_type nanbeige, num_hidden_layers L
//                               stored layers (HF Llama names, once), num_loops = recursions,
//                               skip_loop_final_norm, layer_types; no recursion object
//   ouro                        Ouro's layout: model_type ouro, num_hidden_layers L stored
//                               sandwich layers (input_layernorm_2, post_attention_layernorm_2),
//                               total_ut_steps = recursions, early_exit_threshold =
//                               exit_threshold, model.early_exit_gate (bias = router_bias)
//   huginn                      Huginn-0125's layout: model_type huginn_raven, prelude P /
//                               core C x mean_recurrence (= recursions) / coda D
//                               SandwichBlocks under transformer.*, fused Wqkv and fc,
//                               qk_bias, the adapter, ln_f, a stored freqs_cis; MHA
// Most knobs apply to every family (sharing, kv, LoRA rank, untied attention...); the
// combination is validated by ParseModelConfig, so impossible ones are errors.
//
// router_bias B shifts the router scores towards deeper recursion (positive) or earlier
// exits (negative):
//   - mor-ec: hidden channel 0 is held at 1.0 (every embedding row has 1.0 there and no
//     o_proj/down_proj writes to it), and every router (and aux router) reads B from it:
//     linear w[0] = B; mlp: hidden unit 0 reads channel 0 alone and w2[0][0] = B / gelu(1).
//     The score of loop 1 is exactly s + B (up to the weight dtype's rounding); with
//     weighted gating later loops see h[0] = prod(1 + g) so the shift is B times that
//     (within alpha per loop: ~10% at the default alpha 0.1).
//   - mor-tc: router_bias[i] = B * i (the bias is added to p before the argmax), so B > 0
//     favours deeper tokens.
//   - ouro: the exit gate's bias (lambda = sigmoid(w . h_t + B)): B > 0 exits earlier.
//   - other families: no effect.
//
// depth_mix (`--depth-mix f1,...,fR`, mor-ec / mor-tc / early-exit): f_d is the fraction of
// token ids whose tokens leave the loop after d loops, built into the router (or exit head)
// weights and a few reserved hidden channels; depth_mix.h says how for each family and what
// the mix controls there (for mor-ec it also sets the capacities). Excludes router_bias and
// capacity.
//
// With a tokenizer (UseTokenizer, `--tokenizer-dir DIR`): vocab_size, bos_token_id and
// eos_token_id come from DIR's tokenizer (tokenizer.json + tokenizer_config.json), and
// WriteTinyModel copies DIR's tokenizer files next to the weights, so `serve` and
// `tokenize` take text for the random model.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/io/safetensors_writer.h"
#include "engine/model/config.h"
#include "engine/model/dtype.h"

namespace morserve {

struct TinyModelSpec {
  std::string family = "vanilla";
  int hidden = 64;
  int layers = 0;  // 0: family default (vanilla 4; K = 2 layers per loop for recursive plans)
  int heads = 4;
  int kv_heads = 2;
  int intermediate = 128;
  int vocab = 256;
  int recursions = 3;
  uint64_t seed = 1;
  DType dtype = DType::kBF16;
  int max_pos = 512;
  int shards = 1;                // > 1: model-0000i-of-0000N.safetensors + index
  float router_bias = 0.0f;      // see the file comment
  std::vector<float> depth_mix;  // empty: random routers; else one fraction per loop

  // Overrides of the family's defaults (empty / negative: family default).
  std::string sharing;              // none | cycle | sequence | middle_cycle | middle_sequence
  std::string router = "linear";    // linear | mlp
  std::string activation;           // sigmoid | tanh (mor-ec), softmax | sigmoid (mor-tc)
  float alpha = -1.0f;              // router alpha (mor-ec 0.1, mor-tc 1.0)
  std::string gating = "weighted";  // weighted | additive
  bool aux_router = false;
  std::string kv = "recursion_wise";      // recursion_wise | shared
  std::vector<float> capacity;            // mor-ec: one per loop; empty: (Nr - i) / Nr
  int lora_rank = -1;                     // relaxed-lora default 4; other families 0
  float lora_alpha = -1.0f;               // default 2 * rank
  std::vector<std::string> lora_targets;  // default q_proj, v_proj
  float exit_threshold = 0.9f;
  std::string exit_kv = "propagate";  // propagate | skip
  std::string layer_kind;             // standard | recurrent (recurrent family default)
  bool untied_attention = false;      // attention copies differ per loop
  bool first_copy_only = false;       // store only loop 0's copy of each shared layer
  bool tie_embeddings = false;        // tie_word_embeddings, no lm_head.weight
  bool skip_loop_final_norm = false;  // nanbeige: no model.norm between loops
  int head_dim = 0;                   // > 0: config.json head_dim (q/o not square)
  int prelude_layers = 2;             // huginn: n_layers_in_prelude
  int coda_layers = 2;                // huginn: n_layers_in_coda
  std::string loop_mode;  // full | adaptive: written to looped.json (huginn: with exit_threshold)

  int bos_token_id = 1;                  // < 0: null in config.json
  std::vector<int> eos_token_ids = {2};  // one: a number in config.json; several: a list
  std::string tokenizer_dir;             // non-empty: tokenizer files copied from here
};

// Points the spec at DIR's tokenizer: vocab, bos and eos from it (see the file comment).
absl::Status UseTokenizer(const std::string& dir, TinyModelSpec* spec);

// Every family name WriteTinyModel accepts.
const std::vector<std::string>& TinyModelFamilies();

// The config a spec describes (validated like any config.json).
absl::StatusOr<ModelConfig> TinyModelConfig(const TinyModelSpec& spec);

// The tensors WriteTinyModel writes, in file order (tests build in-memory stores from them).
absl::StatusOr<std::vector<OwnedTensor>> TinyModelTensors(const TinyModelSpec& spec);

// Writes the model directory (created if needed; existing model files are overwritten).
absl::Status WriteTinyModel(const TinyModelSpec& spec, const std::string& dir);

// Parses `mkmodel` flags (see MkmodelUsage()); `out_dir` receives --out.
absl::StatusOr<TinyModelSpec> TinyModelSpecFromArgs(const std::vector<std::string>& args,
                                                    std::string* out_dir);
const char* MkmodelUsage();

}  // namespace morserve
