// A chosen depth mix built into a tiny model's weights (`mkmodel --depth-mix f1,...,fR`):
// f_d is the fraction of tokens that leave the looped segment after d loops. Each token id
// gets a depth D(id) (TokenDepths: ids ranked by a hash of (seed, id), the first f_1 of the
// ranks take depth 1, the next f_2 depth 2, ...), so over the whole vocabulary the counts
// match the mix to one token, and any prompt text gets it in expectation. The routers still
// run in the engine; only their weights (and the hidden channels they read) are chosen.
//
// Control channels of the hidden state: no o_proj / down_proj row (nor LoRA B row) writes
// them, so they carry the embedding's values through every layer.
//   mor-ec, mor-tc: channel 0 = 1.0, channel 1 = code v = (D - 0.5) / R.
//   early-exit:     channel 0 = S (a power of two >= 8 sqrt(hidden)), channel 1 = D,
//                   channel 2 = a loop counter (0 in the embedding, see below).
//
// mor-ec (expert choice). The engine decides loop r+1 (0-based r) for a token still active
// with router_r when capacity[r] < 1 (docs/models.md#mixture-of-recursions-expert-choice), so
// the mix sets both:
//   - capacity[r] = f_{r+1} + ... + f_R, the fraction of tokens that run loop r+1 (1 for
//     loop 1; a loop no token reaches gets 1e-6, since the config requires fractions > 0).
//     A loop whose capacity is 1 is run by every active token without asking the router.
//   - router_r (and the aux router) scores s = 4 P (D - 0.5 - r) exactly: linear
//     w[0] = -4r, w[1] = 4R, every other weight 0; mlp: hidden units 0..3 read +ch0, -ch0,
//     +ch1, -ch1 (GELU(x) - GELU(-x) = x makes the readout linear) and only those units
//     reach the output. P = prod(1 + g) of the loops run (weighted gating; 2^r additive)
//     scales both channels alike, so s > 0 iff D > r: a token of depth D runs exactly D
//     loops. Over the whole vocabulary the capacities are then the realized continuing
//     fractions (to one token); the router scores, not the capacity, decide (the engine's
//     capacity only says whether the router is asked, and caps nothing).
// mor-tc (token choice). Router row j scores -(2j+1)^2 + 4R(2j+1) v on the segment input,
// which is -((2j+1) - (2D-1))^2 + const: the argmax is j = D - 1 with a margin of 4 for
// any activation (softmax or sigmoid keep the order); router_bias is all zeros.
// early-exit. The exit after loop r < R fires iff max softmax prob >= exit_threshold. The
// model is built so that this is the sign of q = r - D + 0.5:
//   - every q/k/v/gate/up weight reading channels 0..2 is 0, except MLP unit 0 of every
//     layer: gate and up read only channel 0 (G, U: powers of two), and down_proj sends unit
//     0 only to channel 2. S dominates the RMS of h, so RMSNorm gives channel 0 about
//     sqrt(hidden) and unit 0 adds a near-constant amount: each loop of the looped segment
//     adds kappa (~1) to channel 2; layers before it add nothing; each layer after it
//     subtracts (R + 1) kappa, so the sampled logits never favour the exit token.
//   - lm_head row E (exit_token(): the highest id that is neither bos nor eos) reads only
//     channels 0..2: A (0.5 ch0 / S - ch1 + ch2 / kappa) = A q; every other row has zero
//     weight on channels 0..2. With A sized for |logit_E| >= 40, a token exits (prob of E
//     ~1) iff q > 0, and otherwise the flat remaining logits stay far below the threshold.
//   Needs a unique last layer (the tail reset), untied embeddings, and exit_threshold in
//   [0.5, 0.999]. The random part of the network sees the other channels at ~1/8 of their
//   usual normalized size (S dominates the norm): the compute is unchanged, the logits are
//   flatter than mkmodel's usual.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model/config.h"

namespace morserve {

// Checks a mix for a model of `recursions` loops: one fraction per loop, each >= 0, summing
// to 1 within 1e-6 (errors name --depth-mix).
absl::Status CheckDepthMix(const std::vector<float>& mix, int recursions);

// The depth (1..R) of every token id (see the file comment).
std::vector<int> TokenDepths(const std::vector<float>& mix, int vocab, uint64_t seed);

// mor-ec capacities for a mix (see the file comment).
std::vector<float> DepthMixCapacity(const std::vector<float>& mix);

// Where a layer copy sits relative to the looped segment.
enum class LayerPlace { kBefore, kLooped, kAfter };

// What the mix needs to know of the model.
struct DepthMixModel {
  Routing routing = Routing::kNone;
  int recursions = 1;
  int hidden = 0;
  int vocab = 0;
  int layers_per_loop = 1;         // K of the looped segment
  bool last_layer_unique = false;  // a unique segment follows the looped one
  bool tied_embeddings = false;
  float exit_threshold = 0.9f;
  std::vector<int> special_ids;  // bos and eos: never the exit token
  uint64_t seed = 1;
};

// Edits the random tensors of a tiny model so that it realizes a mix. Every edit takes a
// row-major [rows, cols] tensor of the model's shape.
class DepthMix {
 public:
  static absl::StatusOr<DepthMix> Make(const std::vector<float>& mix, const DepthMixModel& m);

  const std::vector<int>& depths() const { return depths_; }
  int exit_token() const { return exit_token_; }

  void Embedding(std::vector<float>* e) const;
  // p: 0 q, 1 k, 2 v, 3 o, 4 gate, 5 up, 6 down ([rows, cols] = [out, in]).
  void Projection(int p, LayerPlace place, int64_t rows, int64_t cols,
                  std::vector<float>* w) const;
  void LoraA(int p, int64_t rank, int64_t cols, std::vector<float>* a) const;
  void LoraB(int p, int64_t rows, int64_t rank, std::vector<float>* b) const;
  void PostAttentionNorm(std::vector<float>* w) const;
  void FinalNorm(std::vector<float>* w) const;
  void LmHead(std::vector<float>* w) const;
  // Expert-choice router of 0-based loop `loop`: linear [1, H], or mlp [2H, H] and [1, 2H].
  void ExpertRouter(int loop, std::vector<float>* w) const;
  void ExpertRouter(int loop, std::vector<float>* w1, std::vector<float>* w2) const;
  // Token-choice router: linear [R, H], or mlp [2H, H] and [R, 2H].
  void TokenRouter(std::vector<float>* w) const;
  void TokenRouter(std::vector<float>* w1, std::vector<float>* w2) const;

 private:
  int Reserved() const { return m_.routing == Routing::kEarlyExit ? 3 : 2; }
  // The linear readout (bias * ch0 + code * ch1) through an mlp router's units 0..3.
  void MlpReadout(std::vector<float>* w1, std::vector<float>* w2,
                  const std::vector<std::pair<float, float>>& rows) const;

  DepthMixModel m_;
  std::vector<int> depths_;
  int exit_token_ = -1;
  // early-exit constants (file comment).
  float s_ = 1, gate_ = 1, up_ = 1, down_ = 1, kappa_ = 1, a_ = 1;
};

}  // namespace morserve
