// ResolveWeights on every checkpoint layout of docs/checkpoints.md, from in-memory stores
// built with the tiny-model generator (mutated per test), and its errors on malformed input.
#include "engine/model/weights.h"

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "engine/io/tensor_store.h"
#include "engine/model/layer_plan.h"
#include "engine/tools/mkmodel.h"
#include "gtest/gtest.h"

namespace morserve {
namespace {

constexpr const char* kFile = "mem.safetensors";

using Tensors = std::vector<OwnedTensor>;

// A store whose views point into `tensors` (kept alive by the store).
std::shared_ptr<TensorStore> StoreOf(Tensors tensors) {
  auto owned = std::make_shared<Tensors>(std::move(tensors));
  auto store = std::make_shared<TensorStore>();
  for (const OwnedTensor& t : *owned) {
    TensorView v{t.name, kFile, t.dtype, t.shape, t.bytes.data()};
    EXPECT_TRUE(store->Add(v).ok()) << t.name;
  }
  store->Own(owned);
  return store;
}

struct Built {
  ModelConfig config;
  LayerPlan plan;
  Tensors tensors;
};

Built Make(const TinyModelSpec& spec) {
  Built b;
  auto config = TinyModelConfig(spec);
  EXPECT_TRUE(config.ok()) << config.status();
  b.config = *config;
  auto plan = BuildLayerPlan(b.config);
  EXPECT_TRUE(plan.ok()) << plan.status();
  b.plan = *plan;
  auto tensors = TinyModelTensors(spec);
  EXPECT_TRUE(tensors.ok()) << tensors.status();
  b.tensors = std::move(*tensors);
  return b;
}

TinyModelSpec Spec(const std::string& family) {
  TinyModelSpec s;
  s.family = family;
  s.hidden = 16;
  s.heads = 4;
  s.kv_heads = 2;
  s.intermediate = 32;
  s.vocab = 32;
  return s;
}

absl::StatusOr<std::shared_ptr<const ModelWeights>> Resolve(Built b) {
  return ResolveWeights(b.config, b.plan, StoreOf(std::move(b.tensors)));
}

std::shared_ptr<const ModelWeights> MustResolve(Built b) {
  auto w = Resolve(std::move(b));
  EXPECT_TRUE(w.ok()) << w.status();
  return w.ok() ? *w : nullptr;
}

OwnedTensor* FindTensor(Tensors* t, const std::string& name) {
  for (OwnedTensor& x : *t) {
    if (x.name == name) return &x;
  }
  ADD_FAILURE() << "no tensor " << name;
  return nullptr;
}

void Erase(Tensors* t, const std::string& name) {
  auto it =
      std::remove_if(t->begin(), t->end(), [&](const OwnedTensor& x) { return x.name == name; });
  ASSERT_NE(it, t->end()) << name;
  t->erase(it, t->end());
}

// Makes the copy `name` differ from the others (first element changed).
void Perturb(Tensors* t, const std::string& name) {
  OwnedTensor* x = FindTensor(t, name);
  ASSERT_NE(x, nullptr);
  x->bytes[0] ^= 0x55;
  x->bytes[1] ^= 0x01;
}

int LoopsOf(const LayerPlan& plan) { return plan.segments[plan.looped_segment].loops; }

TEST(Weights, VanillaMapsEveryLayer) {
  auto w = MustResolve(Make(Spec("vanilla")));
  ASSERT_NE(w, nullptr);
  ASSERT_EQ(w->layers.size(), 4u);
  for (int k = 0; k < 4; ++k) {
    const LayerWeights& l = w->Layer(0, k);
    EXPECT_EQ(l.P(Proj::kQ).At(0).name,
              "model.layers." + std::to_string(k) + ".self_attn.q_proj.weight");
    EXPECT_EQ(l.P(Proj::kDown).At(0).shape, (std::vector<int64_t>{16, 32}));
    EXPECT_EQ(l.P(Proj::kK).At(0).shape, (std::vector<int64_t>{8, 16}));
    EXPECT_EQ(l.input_norm.At(0).name,
              "model.layers." + std::to_string(k) + ".input_layernorm.weight");
  }
  EXPECT_FALSE(w->lm_head_tied);
  EXPECT_EQ(w->lm_head.name, "lm_head.weight");
  EXPECT_EQ(w->embed.name, "model.embed_tokens.weight");
  EXPECT_TRUE(w->dedup.deduplicated.empty());
  EXPECT_TRUE(w->dedup.untied.empty());
}

TEST(Weights, RecursiveCycleEqualCopiesAreDeduplicated) {
  auto w = MustResolve(Make(Spec("recursive-cycle")));  // 6 layers, K = 2, Nr = 3
  ASSERT_NE(w, nullptr);
  ASSERT_EQ(w->layers.size(), 2u);
  for (int k = 0; k < 2; ++k) {
    const LayerWeights& l = w->Layer(0, k);
    for (int p = 0; p < kNumProj; ++p) EXPECT_EQ(l.proj[p].per_loop.size(), 1u);
    EXPECT_EQ(l.input_norm.per_loop.size(), 1u);
    EXPECT_EQ(l.P(Proj::kQ).At(2).name,
              "model.layers." + std::to_string(k) + ".self_attn.q_proj.weight");
  }
  EXPECT_EQ(w->dedup.deduplicated.size(), 2u * 9u);
  EXPECT_TRUE(w->dedup.untied.empty());
  EXPECT_NE(w->dedup.deduplicated[0].find("3 copies equal"), std::string::npos);
}

TEST(Weights, SequenceUsesEachLayersOwnRun) {
  auto w = MustResolve(Make(Spec("recursive-sequence")));  // unrolled j -> slot j / 3
  ASSERT_NE(w, nullptr);
  ASSERT_EQ(w->plan.segments.size(), 2u);
  EXPECT_EQ(w->Layer(1, 0).P(Proj::kUp).At(0).name, "model.layers.3.mlp.up_proj.weight");
}

TEST(Weights, DifferingCopiesBecomePerLoop) {
  Built b = Make(Spec("recursive-middle-cycle"));              // 8 layers: 0 | (1 2) x 3 | 7
  Perturb(&b.tensors, "model.layers.5.mlp.gate_proj.weight");  // loop 2, k 0
  auto w = MustResolve(std::move(b));
  ASSERT_NE(w, nullptr);
  const LoopTensor& gate = w->Layer(1, 0).P(Proj::kGate);
  ASSERT_EQ(gate.per_loop.size(), 3u);
  EXPECT_EQ(gate.At(0).name, "model.layers.1.mlp.gate_proj.weight");
  EXPECT_EQ(gate.At(1).name, "model.layers.3.mlp.gate_proj.weight");
  EXPECT_EQ(gate.At(2).name, "model.layers.5.mlp.gate_proj.weight");
  EXPECT_EQ(w->Layer(1, 1).P(Proj::kGate).per_loop.size(), 1u);
  ASSERT_EQ(w->dedup.untied.size(), 1u);
  EXPECT_NE(w->dedup.untied[0].find("segment 1 layer 0 mlp.gate_proj"), std::string::npos);
  EXPECT_EQ(w->Layer(2, 0).P(Proj::kQ).At(0).name, "model.layers.7.self_attn.q_proj.weight");
}

TEST(Weights, UntiedAttentionIsPerLoopAndMlpShared) {
  auto w = MustResolve(Make(Spec("recursive-untied-attn")));
  ASSERT_NE(w, nullptr);
  const int nr = LoopsOf(w->plan);
  for (int k = 0; k < 2; ++k) {
    const LayerWeights& l = w->Layer(0, k);
    for (Proj p : {Proj::kQ, Proj::kK, Proj::kV, Proj::kO}) {
      ASSERT_EQ(static_cast<int>(l.P(p).per_loop.size()), nr) << ProjName(p);
      for (int r = 0; r < nr; ++r) {
        EXPECT_EQ(l.P(p).At(r).name, "model.layers." + std::to_string(r * 2 + k) + ".self_attn." +
                                         ProjName(p) + ".weight");
      }
    }
    for (Proj p : {Proj::kGate, Proj::kUp, Proj::kDown}) EXPECT_EQ(l.P(p).per_loop.size(), 1u);
    EXPECT_EQ(l.input_norm.per_loop.size(), 1u);
  }
  EXPECT_EQ(w->dedup.untied.size(), 8u);
  EXPECT_EQ(w->dedup.deduplicated.size(), 10u);
}

TEST(Weights, FirstCopyOnlyIsTied) {
  TinyModelSpec s = Spec("recursive-middle-cycle");
  s.first_copy_only = true;
  Built b = Make(s);
  EXPECT_EQ(std::count_if(
                b.tensors.begin(), b.tensors.end(),
                [](const OwnedTensor& t) { return t.name.find("layers.3.") != std::string::npos; }),
            0);
  auto w = MustResolve(std::move(b));
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(w->Layer(1, 1).P(Proj::kV).per_loop.size(), 1u);
  EXPECT_EQ(w->Layer(1, 1).P(Proj::kV).At(2).name, "model.layers.2.self_attn.v_proj.weight");
  EXPECT_NE(w->dedup.deduplicated[0].find("stored once"), std::string::npos);
}

TEST(Weights, PartiallyStoredCopiesAreAnError) {
  TinyModelSpec s = Spec("recursive-cycle");
  Built b = Make(s);
  Erase(&b.tensors, "model.layers.4.self_attn.o_proj.weight");
  auto w = Resolve(std::move(b));
  ASSERT_FALSE(w.ok());
  EXPECT_NE(w.status().message().find("model.layers.4.self_attn.o_proj.weight"), std::string::npos);
  EXPECT_NE(w.status().message().find(kFile), std::string::npos);
}

TEST(Weights, RelaxedLoraDeltasPerLoop) {
  TinyModelSpec s = Spec("relaxed-lora");
  s.lora_rank = 2;
  s.lora_alpha = 6;
  auto w = MustResolve(Make(s));
  ASSERT_NE(w, nullptr);
  const int nr = LoopsOf(w->plan);
  for (int k = 0; k < 2; ++k) {
    const LayerWeights& l = w->Layer(0, k);
    for (Proj p : {Proj::kQ, Proj::kV}) {
      const LoopTensor& t = l.P(p);
      EXPECT_EQ(t.per_loop.size(), 1u);  // base copies equal: the shared weight
      EXPECT_EQ(t.At(0).name, "model.layers." + std::to_string(k) + ".self_attn." + ProjName(p) +
                                  ".base_layer.weight");
      ASSERT_EQ(static_cast<int>(t.lora.size()), nr);
      for (int r = 0; r < nr; ++r) {
        EXPECT_FLOAT_EQ(t.lora[r].scale, 3.0f);
        EXPECT_EQ(t.lora[r].a.name, "model.layers." + std::to_string(r * 2 + k) + ".self_attn." +
                                        ProjName(p) + ".lora_A.default.weight");
        EXPECT_EQ(t.lora[r].a.shape, (std::vector<int64_t>{2, 16}));
        EXPECT_EQ(t.lora[r].b.shape, (std::vector<int64_t>{p == Proj::kQ ? 16 : 8, 2}));
      }
      EXPECT_FALSE(t.lora[0].a.SameContents(t.lora[1].a));
    }
    EXPECT_TRUE(l.P(Proj::kK).lora.empty());
    EXPECT_TRUE(l.P(Proj::kO).lora.empty());
  }
}

TEST(Weights, RelaxedDifferingBaseIsUntied) {
  Built b = Make(Spec("relaxed-lora"));
  Perturb(&b.tensors, "model.layers.3.self_attn.v_proj.base_layer.weight");  // loop 1, k 1
  auto w = MustResolve(std::move(b));
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(w->Layer(0, 1).P(Proj::kV).per_loop.size(), 3u);
  EXPECT_EQ(w->Layer(0, 1).P(Proj::kV).lora.size(), 3u);
}

TEST(Weights, RelaxedMissingLoraIsAnError) {
  Built b = Make(Spec("relaxed-lora"));
  Erase(&b.tensors, "model.layers.2.self_attn.q_proj.lora_B.default.weight");
  auto w = Resolve(std::move(b));
  ASSERT_FALSE(w.ok());
  EXPECT_NE(w.status().message().find("model.layers.2.self_attn.q_proj.lora_B.default.weight"),
            std::string::npos);
}

TEST(Weights, MorExpertChoiceMiddleCycle) {
  TinyModelSpec s = Spec("mor-ec");
  s.aux_router = true;
  auto w = MustResolve(Make(s));
  ASSERT_NE(w, nullptr);
  ASSERT_EQ(w->plan.looped_segment, 1);
  EXPECT_EQ(w->Layer(0, 0).P(Proj::kQ).At(0).name, "model.layers.0.self_attn.q_proj.weight");
  EXPECT_EQ(w->Layer(1, 1).P(Proj::kQ).At(0).name,
            "model.layers.1.block.1.self_attn.q_proj.weight");
  EXPECT_EQ(w->Layer(1, 1).P(Proj::kQ).per_loop.size(), 1u);
  EXPECT_EQ(w->Layer(2, 0).P(Proj::kQ).At(0).name, "model.layers.4.self_attn.q_proj.weight");
  ASSERT_EQ(w->router.expert.size(), 3u);
  ASSERT_EQ(w->router.aux.size(), 3u);
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(w->router.expert[r].w1.name,
              "model.layers." + std::to_string(r + 1) + ".mor_router.router.weight");
    EXPECT_EQ(w->router.expert[r].w1.shape, (std::vector<int64_t>{1, 16}));
    EXPECT_TRUE(w->router.expert[r].w2.empty());
    EXPECT_EQ(w->router.aux[r].w1.name,
              "model.layers." + std::to_string(r + 1) + ".mlp_router.weight");
  }
  EXPECT_EQ(w->dedup.deduplicated.size(), 18u);
}

TEST(Weights, MorExpertChoiceCycleMlpRouterUntiedAttention) {
  TinyModelSpec s = Spec("mor-ec");
  s.sharing = "cycle";
  s.router = "mlp";
  s.untied_attention = true;
  auto w = MustResolve(Make(s));
  ASSERT_NE(w, nullptr);
  ASSERT_EQ(w->plan.looped_segment, 0);
  const LoopTensor& q = w->Layer(0, 0).P(Proj::kQ);
  ASSERT_EQ(q.per_loop.size(), 3u);
  EXPECT_EQ(q.At(2).name, "model.layers.2.block.0.self_attn.q_proj.weight");
  EXPECT_EQ(w->Layer(0, 0).P(Proj::kUp).per_loop.size(), 1u);
  ASSERT_EQ(w->router.expert.size(), 3u);
  EXPECT_EQ(w->router.expert[0].w1.name, "model.layers.0.mor_router.router.0.weight");
  EXPECT_EQ(w->router.expert[0].w1.shape, (std::vector<int64_t>{32, 16}));
  EXPECT_EQ(w->router.expert[0].w2.shape, (std::vector<int64_t>{1, 32}));
}

TEST(Weights, MorExpertChoiceFirstCopyOnly) {
  TinyModelSpec s = Spec("mor-ec");
  s.first_copy_only = true;
  auto w = MustResolve(Make(s));
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(w->Layer(1, 0).P(Proj::kQ).At(2).name,
            "model.layers.1.block.0.self_attn.q_proj.weight");
  EXPECT_EQ(w->router.expert.size(), 3u);
}

TEST(Weights, MorTokenChoiceWithRouterBias) {
  TinyModelSpec s = Spec("mor-tc");
  s.router_bias = 0.25f;
  auto w = MustResolve(Make(s));
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(w->Layer(1, 1).P(Proj::kO).At(0).name,
            "model.layers.1.block_list.0.1.self_attn.o_proj.weight");
  EXPECT_EQ(w->Layer(2, 0).P(Proj::kO).At(0).name, "model.layers.2.self_attn.o_proj.weight");
  EXPECT_EQ(w->router.token_choice.name, "model.layers.1.mor_router.router.weight");
  EXPECT_EQ(w->router.token_choice.shape, (std::vector<int64_t>{3, 16}));
  EXPECT_TRUE(w->router.token_choice_w2.empty());
  EXPECT_EQ(w->router.token_choice_bias, (std::vector<float>{0.0f, 0.25f, 0.5f}));
}

TEST(Weights, MorTokenChoiceWithoutBiasAndDifferingCopy) {
  TinyModelSpec s = Spec("mor-tc");
  s.router = "mlp";
  Built b = Make(s);
  Erase(&b.tensors, "model.layers.1.router_bias");
  Perturb(&b.tensors, "model.layers.1.block_list.2.0.mlp.down_proj.weight");
  auto w = MustResolve(std::move(b));
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(w->router.token_choice_bias, (std::vector<float>{0.0f, 0.0f, 0.0f}));
  EXPECT_EQ(w->router.token_choice_w2.shape, (std::vector<int64_t>{3, 32}));
  EXPECT_EQ(w->Layer(1, 0).P(Proj::kDown).per_loop.size(), 3u);
}

TEST(Weights, TiedOrMissingLmHead) {
  TinyModelSpec s = Spec("vanilla");
  s.tie_embeddings = true;
  Built tied = Make(s);
  EXPECT_EQ(FindTensor(&tied.tensors, "model.norm.weight") != nullptr, true);
  auto w = MustResolve(std::move(tied));
  ASSERT_NE(w, nullptr);
  EXPECT_TRUE(w->lm_head_tied);
  EXPECT_EQ(w->lm_head.data, w->embed.data);

  Built missing = Make(Spec("vanilla"));  // tie_word_embeddings false, tensor absent
  Erase(&missing.tensors, "lm_head.weight");
  w = MustResolve(std::move(missing));
  ASSERT_NE(w, nullptr);
  EXPECT_TRUE(w->lm_head_tied);

  Built saved = Make(s);  // tied config that still saved an equal lm_head
  OwnedTensor head = *FindTensor(&saved.tensors, "model.embed_tokens.weight");
  head.name = "lm_head.weight";
  saved.tensors.push_back(head);
  w = MustResolve(std::move(saved));
  ASSERT_NE(w, nullptr);
  EXPECT_TRUE(w->lm_head_tied);
}

TEST(Weights, TiedConfigWithDifferentLmHeadIsAnError) {
  Built b = Make(Spec("vanilla"));
  b.config.tie_word_embeddings = true;
  auto w = Resolve(std::move(b));
  ASSERT_FALSE(w.ok());
  EXPECT_NE(w.status().message().find("lm_head.weight"), std::string::npos);
  EXPECT_NE(w.status().message().find(kFile), std::string::npos);
}

TEST(Weights, MissingTensorNamesTensorAndFile) {
  Built b = Make(Spec("recursive-cycle"));
  Erase(&b.tensors, "model.layers.1.post_attention_layernorm.weight");
  auto w = Resolve(std::move(b));
  ASSERT_FALSE(w.ok());
  EXPECT_NE(w.status().message().find("model.layers.1.post_attention_layernorm.weight"),
            std::string::npos);
  EXPECT_NE(w.status().message().find(kFile), std::string::npos);
}

TEST(Weights, WrongShapeNamesTensorAndFile) {
  Built b = Make(Spec("vanilla"));
  FindTensor(&b.tensors, "model.layers.2.mlp.up_proj.weight")->shape = {16, 32};
  auto w = Resolve(std::move(b));
  ASSERT_FALSE(w.ok());
  const std::string msg(w.status().message());
  EXPECT_NE(msg.find("model.layers.2.mlp.up_proj.weight"), std::string::npos) << msg;
  EXPECT_NE(msg.find(kFile), std::string::npos) << msg;
  EXPECT_NE(msg.find("[16, 32]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[32, 16]"), std::string::npos) << msg;
}

TEST(Weights, WrongDtypeNamesTensorAndFile) {
  Built b = Make(Spec("vanilla"));
  OwnedTensor* norm = FindTensor(&b.tensors, "model.norm.weight");
  norm->dtype = DType::kI32;
  norm->bytes.resize(16 * 4);
  auto w = Resolve(std::move(b));
  ASSERT_FALSE(w.ok());
  const std::string msg(w.status().message());
  EXPECT_NE(msg.find("model.norm.weight"), std::string::npos) << msg;
  EXPECT_NE(msg.find(kFile), std::string::npos) << msg;
  EXPECT_NE(msg.find("I32"), std::string::npos) << msg;
}

TEST(Weights, LeftoverTensorIsAnErrorExceptInvFreq) {
  Built b = Make(Spec("recursive-cycle"));
  OwnedTensor extra = OwnedTensor::FromF32("model.layers.0.self_attn.rotary_emb.inv_freq",
                                           DType::kF32, {2}, {1.0f, 0.5f});
  b.tensors.push_back(extra);
  Built ok = b;
  EXPECT_NE(MustResolve(std::move(ok)), nullptr);

  extra.name = "model.layers.6.mlp.up_proj.weight";  // a 7th unrolled layer: 6 expected
  b.tensors.push_back(extra);
  auto w = Resolve(std::move(b));
  ASSERT_FALSE(w.ok());
  const std::string msg(w.status().message());
  EXPECT_NE(msg.find("model.layers.6.mlp.up_proj.weight (mem.safetensors)"), std::string::npos)
      << msg;
  EXPECT_EQ(msg.find("inv_freq"), std::string::npos) << msg;
}

TEST(Weights, LayoutMustFitRouting) {
  Built mor = Make(Spec("mor-ec"));
  Built plain = Make(Spec("recursive-middle-cycle"));
  plain.config = mor.config;  // expert_choice config, unrolled tensors
  auto w = Resolve(std::move(plain));
  ASSERT_FALSE(w.ok());
  EXPECT_NE(w.status().message().find("expert_choice"), std::string::npos) << w.status();

  Built tc = Make(Spec("mor-tc"));
  tc.config = mor.config;  // expert_choice config, token-choice tensors
  w = Resolve(std::move(tc));
  ASSERT_FALSE(w.ok());
  EXPECT_NE(w.status().message().find("block_list"), std::string::npos) << w.status();
}

TEST(Weights, MissingRouterNamesTensor) {
  Built b = Make(Spec("mor-ec"));
  Erase(&b.tensors, "model.layers.2.mor_router.router.weight");
  auto w = Resolve(std::move(b));
  ASSERT_FALSE(w.ok());
  EXPECT_NE(w.status().message().find("model.layers.2.mor_router.router.weight"),
            std::string::npos);
}

TEST(Weights, LoraOnUntargetedProjectionIsAnError) {
  TinyModelSpec s = Spec("relaxed-lora");
  Built b = Make(s);
  s.lora_targets = {"q_proj"};  // the checkpoint also has v_proj LoRA tensors
  b.config = *TinyModelConfig(s);
  auto w = Resolve(std::move(b));
  ASSERT_FALSE(w.ok());
  EXPECT_NE(w.status().message().find("v_proj.base_layer.weight"), std::string::npos) << w.status();
}

}  // namespace
}  // namespace morserve
