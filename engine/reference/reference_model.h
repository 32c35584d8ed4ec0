// The reference implementation of docs/models.md: one sequence, one token at a time, fp32
// values with fp64 accumulation in every reduction, no batching, no paging. Every other
// execution path (CPU engine, CUDA engine, any batching mode) is tested against it, so it is
// written for clarity, straight from the spec: each loop of each segment is an explicit
// step, routing decisions are made per token as the token arrives, and the KV cache is a
// plain list of (position, k, v) entries per cache slot.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <tuple>
#include <vector>

#include "engine/model/weights.h"

namespace morserve {

// What happened to one token inside the looped segment.
struct TokenTrace {
  int loops = 0;                        // loops of the looped segment the token ran
  std::vector<double> router_scores;    // expert_choice: s_r of each loop it was a candidate for;
                                        // token_choice: the router's Nr outputs
  std::vector<double> exit_confidence;  // early_exit: max prob after each loop it ran (< Nr)
  std::vector<double> exit_cumulative;  // Ouro adaptive: cumulative exit probability c after
                                        // each loop whose gate was read (< T)
  std::vector<double> exit_kl;          // Huginn adaptive: KL_k after each recurrence k read
};

struct StepOutput {
  std::vector<float> logits;  // [vocab]
  TokenTrace trace;
};

struct ReferenceOptions {
  // Overrides recursion.early_exit.threshold, or Ouro's loop_exit_threshold.
  std::optional<float> exit_threshold;
  // Looped models with an exit rule: overrides the model's default mode (looped.json).
  std::optional<LoopMode> loop_mode;
  // Huginn: the recurrences of full mode and the most of adaptive (<= the plan's loops;
  // default: all of them), the initial state's scale (default: the config's, from looped.json)
  // and the seed it is drawn from (with init_scale > 0).
  std::optional<int> num_steps;
  std::optional<float> init_scale;
  uint64_t seed = 0;
};

class ReferenceModel {
 public:
  struct KvEntry {
    int position;
    std::vector<float> k, v;  // [kv_dim], keys after RoPE
  };

  explicit ReferenceModel(std::shared_ptr<const ModelWeights> weights,
                          ReferenceOptions options = {});
  ~ReferenceModel();

  // Clears the KV state: the next Step is position 0 of a new sequence.
  void Reset();
  // Feeds the next token of the sequence and returns the logits that predict the one after.
  // `prompt`: the token is part of the prompt (in adaptive mode prompt tokens run full depth,
  // docs/models.md#serving-looped-checkpoints); other families ignore it.
  StepOutput Step(int token, bool prompt = true);
  // Reset, then Step every token as a prompt token.
  std::vector<StepOutput> Forward(const std::vector<int>& tokens);
  // Reset, feed the prompt, then generate `n` tokens greedily (argmax, lowest id on ties);
  // generated tokens are fed as decode tokens.
  std::vector<int> GenerateGreedy(const std::vector<int>& prompt, int n,
                                  std::vector<StepOutput>* outputs = nullptr);

  int position() const { return position_; }
  // Number of entries currently held by a KV cache slot (tests of recursion-wise caching).
  int SlotEntries(int cache_slot) const;
  // The entries of a KV cache slot in the order they were written (tests compare contents).
  const std::vector<KvEntry>& SlotContents(int cache_slot) const { return slots_[cache_slot]; }
  const ModelWeights& weights() const { return *weights_; }

 private:
  using Vec = std::vector<float>;

  const Vec& Weight(int layer_slot, int loop, Proj p);
  const Vec& Norm(const LoopTensor& t, int loop);
  Vec Layer(int segment, int loop, int k, const Vec& x);
  Vec Block(int segment, int loop, const Vec& h);
  Vec RunLoopedSegment(int segment, const Vec& x, TokenTrace* trace);
  Vec ExpertChoice(int segment, Vec h, TokenTrace* trace);
  Vec TokenChoice(int segment, const Vec& x0, TokenTrace* trace);
  Vec EarlyExit(int segment, Vec h, TokenTrace* trace);
  Vec OuroLoops(int segment, Vec h, TokenTrace* trace);
  void CopyOnExit(int segment, int exit_loop, int loops);
  // Huginn-0125 (engine/reference/huginn_reference.cc, docs/models.md#huginn-0125).
  StepOutput HuginnStep(int token);
  Vec HuginnRecurrences(int segment, const Vec& e, StepOutput* out);
  Vec HuginnCodaLogits(const Vec& s);
  void PushKv(int cache_slot, KvEntry entry);
  void WriteKvFromState(int segment, int loop, int k, const Vec& h);
  void ProjectKv(int layer_slot, int loop, const Vec& a, Vec* k, Vec* v) const;
  Vec Attend(const Vec& q, int cache_slot, const KvEntry* extra) const;
  Vec Logits(const Vec& h);
  double RouterScore(const LoopRouter& r, const Vec& h, int out_row);

  std::shared_ptr<const ModelWeights> weights_;
  ReferenceOptions options_;
  const ModelConfig& cfg_;
  int position_ = 0;
  bool prompt_token_ = true;  // the token Step is running is a prompt token
  std::vector<std::vector<KvEntry>> slots_;
  std::map<std::tuple<int, int, int>, Vec> weight_cache_;  // (layer slot, loop, proj) -> fp32
  std::map<const void*, Vec> tensor_cache_;                // any view -> fp32
  const Vec& F32(const TensorView& t);
};

// Building blocks shared with tests: exact definitions of docs/models.md#the-block in fp64.
std::vector<float> RmsNorm(const std::vector<float>& x, const std::vector<float>& w, float eps);
// y[o] = sum_i W[o, i] x[i]; W row-major [out, in].
std::vector<float> MatVec(const std::vector<float>& w, const std::vector<float>& x, int out,
                          int in);
// Rotates each head of x (n_heads * head_dim) in place, rotate_half convention.
void ApplyRope(std::vector<float>* x, int n_heads, int head_dim, int position, float theta);
// The same rotation on pairs of dims (2i, 2i+1) (Huginn's RoPE-pair).
void ApplyRopePairs(std::vector<float>* x, int n_heads, int head_dim, int position, float theta);
// Huginn's exit statistic HuginnKl: engine/model/huginn_state.h (the engine computes it too).

}  // namespace morserve
