// config.json / recursion object parsing and layer plans for every sharing strategy.
#include "engine/model/config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "engine/model/layer_plan.h"
#include "tests/testutil.h"

namespace morserve {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;

json BaseConfig(int layers = 6) {
  return {{"hidden_size", 64},
          {"num_hidden_layers", layers},
          {"num_attention_heads", 4},
          {"num_key_value_heads", 2},
          {"intermediate_size", 128},
          {"vocab_size", 256},
          {"rms_norm_eps", 1e-5},
          {"rope_theta", 10000.0},
          {"architectures", {"LlamaForCausalLM"}},
          {"eos_token_id", 2},
          {"bos_token_id", 1},
          {"torch_dtype", "bfloat16"}};
}

absl::Status ParseError(const json& config) { return ParseModelConfig(config, nullptr).status(); }

TEST(ConfigTest, VanillaDefaults) {
  auto c = ParseModelConfig(BaseConfig(), nullptr);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->head_dim, 16);
  EXPECT_EQ(c->kv_dim(), 32);
  EXPECT_FALSE(c->recursion.present);
  EXPECT_EQ(c->eos_token_ids, std::vector<int>{2});
  auto plan = BuildLayerPlan(*c);
  ASSERT_TRUE(plan.ok());
  ASSERT_EQ(plan->segments.size(), 1u);
  EXPECT_EQ(plan->segments[0].num_layers, 6);
  EXPECT_EQ(plan->num_cache_slots, 6);
  EXPECT_EQ(plan->looped_segment, -1);
}

TEST(ConfigTest, MorExpertChoiceDefaultsCapacity) {
  json c = BaseConfig(8);
  c["recursion"] = {{"num_recursions", 3},
                    {"sharing", "middle_cycle"},
                    {"routing", "expert_choice"},
                    {"router", {{"alpha", 0.1}}}};
  auto m = ParseModelConfig(c, nullptr);
  ASSERT_TRUE(m.ok()) << m.status();
  const RouterConfig& r = m->recursion.router;
  ASSERT_EQ(r.capacity.size(), 3u);
  EXPECT_FLOAT_EQ(r.capacity[0], 1.0f);
  EXPECT_FLOAT_EQ(r.capacity[1], 2.0f / 3);
  EXPECT_FLOAT_EQ(r.capacity[2], 1.0f / 3);
  EXPECT_EQ(r.activation, RouterActivation::kSigmoid);
  EXPECT_FLOAT_EQ(r.alpha, 0.1f);
  auto plan = BuildLayerPlan(*m);
  ASSERT_TRUE(plan.ok());
  ASSERT_EQ(plan->segments.size(), 3u);
  EXPECT_EQ(plan->looped_segment, 1);
  EXPECT_EQ(plan->segments[1].num_layers, 2);
  EXPECT_EQ(plan->segments[1].loops, 3);
  EXPECT_EQ(plan->num_layer_slots, 4);
  EXPECT_EQ(plan->num_cache_slots, 1 + 6 + 1);
  // Unrolled numbering: layer 0 unique, loops of 2 layers, then the last unique layer.
  EXPECT_EQ(plan->UnrolledLayer(1, 0, 0), 1);
  EXPECT_EQ(plan->UnrolledLayer(1, 2, 1), 6);
  EXPECT_EQ(plan->UnrolledLayer(2, 0, 0), 7);
  EXPECT_EQ(plan->CacheSlot(1, 2, 1), 1 + 5);
}

TEST(ConfigTest, SidecarAndSharedKv) {
  json rec = {{"num_recursions", 2}, {"sharing", "cycle"}, {"kv", "shared"}};
  auto m = ParseModelConfig(BaseConfig(4), &rec);
  ASSERT_TRUE(m.ok()) << m.status();
  auto plan = BuildLayerPlan(*m);
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->num_cache_slots, 2);
  EXPECT_EQ(plan->CacheSlot(0, 1, 1), plan->CacheSlot(0, 0, 1));
  EXPECT_TRUE(plan->WritesKv(0, 0));
  EXPECT_FALSE(plan->WritesKv(0, 1));
}

TEST(ConfigTest, SequenceSharingNumbering) {
  json c = BaseConfig(6);
  c["recursion"] = {{"num_recursions", 3}, {"sharing", "sequence"}};
  auto m = ParseModelConfig(c, nullptr);
  ASSERT_TRUE(m.ok()) << m.status();
  auto plan = BuildLayerPlan(*m);
  ASSERT_EQ(plan->segments.size(), 2u);
  // Unrolled j uses slot j div Nr.
  EXPECT_EQ(plan->UnrolledLayer(0, 2, 0), 2);
  EXPECT_EQ(plan->UnrolledLayer(1, 0, 0), 3);
  EXPECT_EQ(plan->looped_segment, -1);
  EXPECT_EQ(plan->num_unrolled_layers(), 6);
}

TEST(ConfigTest, MiddleSequence) {
  json c = BaseConfig(6);
  c["recursion"] = {{"num_recursions", 4},
                    {"sharing", "middle_sequence"},
                    {"routing", "early_exit"},
                    {"early_exit", {{"threshold", 0.9}, {"exit_kv", "skip"}}}};
  auto m = ParseModelConfig(c, nullptr);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->recursion.early_exit.exit_kv, ExitKv::kSkip);
  auto plan = BuildLayerPlan(*m);
  EXPECT_EQ(plan->looped_segment, 1);
  EXPECT_EQ(plan->num_cache_slots, 1 + 4 + 1);
}

struct BadCase {
  const char* name;
  json recursion;  // null: modify base instead
  const char* field;
};

TEST(ConfigTest, RejectsBadRecursionNamingTheField) {
  const std::vector<BadCase> cases = {
      {"unknown key",
       {{"num_recursions", 2}, {"sharing", "cycle"}, {"bogus", 1}},
       "recursion.bogus"},
      {"bad sharing", {{"num_recursions", 2}, {"sharing", "spiral"}}, "recursion.sharing"},
      {"indivisible", {{"num_recursions", 3}, {"sharing", "cycle"}}, "recursion.num_recursions"},
      {"middle indivisible",
       {{"num_recursions", 3}, {"sharing", "middle_cycle"}},
       "recursion.num_recursions"},
      {"routing on multi-segment",
       {{"num_recursions", 2}, {"sharing", "sequence"}, {"routing", "expert_choice"}},
       "recursion.routing"},
      {"router unknown key",
       {{"num_recursions", 2},
        {"sharing", "cycle"},
        {"routing", "expert_choice"},
        {"router", {{"arch", "linear"}, {"size", 3}}}},
       "recursion.router.size"},
      {"capacity length",
       {{"num_recursions", 2},
        {"sharing", "cycle"},
        {"routing", "expert_choice"},
        {"router", {{"capacity", {1.0}}}}},
       "recursion.router.capacity"},
      {"tanh on token choice",
       {{"num_recursions", 2},
        {"sharing", "cycle"},
        {"routing", "token_choice"},
        {"router", {{"activation", "tanh"}}}},
       "recursion.router.activation"},
      {"early exit without threshold",
       {{"num_recursions", 2}, {"sharing", "cycle"}, {"routing", "early_exit"}},
       "recursion.early_exit"},
      {"router without routing",
       {{"num_recursions", 2}, {"sharing", "cycle"}, {"router", json::object()}},
       "recursion.router"},
      {"lora unknown target",
       {{"num_recursions", 2}, {"sharing", "cycle"}, {"lora", {{"rank", 4}, {"targets", {"qkv"}}}}},
       "recursion.lora.targets"},
      {"none with loops", {{"num_recursions", 2}, {"sharing", "none"}}, "recursion.num_recursions"},
      {"shared kv with capacity < 1",
       {{"num_recursions", 2},
        {"sharing", "cycle"},
        {"kv", "shared"},
        {"routing", "expert_choice"},
        {"router", {{"capacity", {0.5, 0.25}}}}},
       "recursion.kv"},
      {"num_recursions string",
       {{"num_recursions", "3"}, {"sharing", "cycle"}},
       "recursion.num_recursions"},
  };
  for (const BadCase& bc : cases) {
    json c = BaseConfig(4);
    c["recursion"] = bc.recursion;
    absl::Status s = ParseError(c);
    EXPECT_FALSE(s.ok()) << bc.name;
    EXPECT_THAT(std::string(s.message()), HasSubstr(bc.field)) << bc.name << ": " << s;
  }
}

TEST(ConfigTest, RejectsBadBaseFields) {
  json c = BaseConfig();
  c["num_key_value_heads"] = 3;
  EXPECT_THAT(std::string(ParseError(c).message()), HasSubstr("num_key_value_heads"));
  c = BaseConfig();
  c.erase("vocab_size");
  EXPECT_THAT(std::string(ParseError(c).message()), HasSubstr("vocab_size: missing"));
  c = BaseConfig();
  c["rope_scaling"] = {{"rope_type", "llama3"}};
  EXPECT_THAT(std::string(ParseError(c).message()), HasSubstr("rope_scaling"));
  c = BaseConfig();
  c["hidden_act"] = "gelu";
  EXPECT_THAT(std::string(ParseError(c).message()), HasSubstr("hidden_act"));
  c = BaseConfig();
  c["hidden_size"] = 66;
  EXPECT_THAT(std::string(ParseError(c).message()), HasSubstr("num_attention_heads"));
  c = BaseConfig();
  c["recursion"] = {{"num_recursions", 2}, {"sharing", "cycle"}};
  json rec = {{"num_recursions", 2}, {"sharing", "cycle"}};
  EXPECT_THAT(std::string(ParseModelConfig(c, &rec).status().message()),
              HasSubstr("both in config.json and in recursion.json"));
}

TEST(ConfigTest, LoadFromDirectory) {
  testing::TempDir dir;
  testing::WriteFile(dir.File("config.json"), BaseConfig(4).dump());
  testing::WriteFile(
      dir.File("recursion.json"),
      json({{"num_recursions", 2}, {"sharing", "cycle"}, {"routing", "token_choice"}}).dump());
  auto m = LoadModelConfig(dir.path());
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->recursion.routing, Routing::kTokenChoice);
  EXPECT_EQ(m->recursion.router.activation, RouterActivation::kSoftmax);
  testing::WriteFile(dir.File("config.json"), "{not json");
  EXPECT_THAT(std::string(LoadModelConfig(dir.path()).status().message()),
              HasSubstr("not valid JSON"));
}

TEST(ConfigTest, RecursionJsonRoundTrip) {
  json c = BaseConfig(8);
  c["recursion"] = {
      {"num_recursions", 3},
      {"sharing", "middle_cycle"},
      {"routing", "expert_choice"},
      {"router",
       {{"arch", "mlp"}, {"activation", "tanh"}, {"alpha", 0.5}, {"capacity", {1.0, 0.5, 0.25}}}},
      {"lora", {{"rank", 4}, {"alpha", 8}, {"targets", {"q_proj"}}}}};
  auto m = ParseModelConfig(c, nullptr);
  ASSERT_TRUE(m.ok()) << m.status();
  json again = BaseConfig(8);
  again["recursion"] = RecursionToJson(m->recursion);
  auto m2 = ParseModelConfig(again, nullptr);
  ASSERT_TRUE(m2.ok()) << m2.status();
  EXPECT_EQ(RecursionToJson(m2->recursion), RecursionToJson(m->recursion));
  EXPECT_FLOAT_EQ(m2->recursion.lora.scale(), 2.0f);
  EXPECT_TRUE(m2->recursion.lora.Targets("q_proj"));
  EXPECT_FALSE(m2->recursion.lora.Targets("v_proj"));
}

// A config.json key, model_type or architecture the loader does not understand is a load error
// naming it (never a silent fallback to the Llama block: a Nanbeige directory, model_type
// nanbeige with num_loops 2, used to load as a one-loop Llama and give wrong tokens; Huginn's
// loader takes only Huginn's fields, and Ouro's keys load only with model_type ouro).
TEST(ConfigStrictKeysTest, LoopedFamiliesAndUnknownFieldsAreRefusedByName) {
  struct Case {
    const char* key;
    json value;
    const char* want;  // substring of the error
  };
  const Case cases[] = {
      {"model_type", "qwen2",
       "config.json: model_type: \"qwen2\" is not supported (supported: llama, nanbeige, ouro, "
       "huginn_raven)"},
      // Huginn's loader reads its own field names: a Llama-shaped one is not Huginn.
      {"model_type", "huginn_raven", "not understood by the huginn_raven loader"},
      {"model_type", 3, "config.json: model_type: 3"},
      {"architectures",
       {"OuroForCausalLM"},
       "config.json: architectures: \"OuroForCausalLM\" is not supported"},
      {"architectures", "LlamaForCausalLM", "config.json: architectures: must be an array"},
      {"num_loops", 2, "config.json: num_loops: not understood by this loader"},  // not nanbeige
      {"total_ut_steps", 4, "config.json: total_ut_steps: not understood"},
      {"quantization_config",
       {{"quant_method", "gptq"}},
       "config.json: quantization_config: not understood"},
      {"auto_map", {{"AutoModelForCausalLM", "x.Y"}}, "config.json: auto_map: not understood"},
      {"rope_interleaved", true, "config.json: rope_interleaved: only false"},
      {"sliding_window", 4096, "config.json: sliding_window: not supported"},
  };
  for (const Case& c : cases) {
    json config = BaseConfig();
    config[c.key] = c.value;
    const absl::Status s = ParseError(config);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.key;
    EXPECT_THAT(std::string(s.message()), HasSubstr(c.want)) << c.key;
  }
}

TEST(ConfigStrictKeysTest, LlamaConfigsAsPublishedStillLoad) {
  // The keys of SmolLM2-360M's and Llama 3's config.json (values as published) and the
  // official MoR checkpoint's architecture.
  json config = BaseConfig();
  config.update({{"_name_or_path", "HuggingFaceTB/SmolLM2-360M"},
                 {"model_type", "llama"},
                 {"attention_bias", false},
                 {"attention_dropout", 0.0},
                 {"hidden_act", "silu"},
                 {"initializer_range", 0.02},
                 {"is_llama_config", true},
                 {"max_position_embeddings", 8192},
                 {"mlp_bias", false},
                 {"pad_token_id", 2},
                 {"pretraining_tp", 1},
                 {"rope_interleaved", false},
                 {"rope_scaling", nullptr},
                 {"tie_word_embeddings", true},
                 {"transformers_version", "4.42.3"},
                 {"transformers.js_config", {{"kv_cache_dtype", {{"q4f16", "float16"}}}}},
                 {"use_cache", true},
                 {"head_dim", 16},
                 {"sliding_window", nullptr},
                 {"dtype", "bfloat16"},
                 {"architectures", {"MoRLlamaForCausalLM"}}});
  auto m = ParseModelConfig(config, nullptr);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->max_position_embeddings, 8192);
}

// Nanbeige4.2 (docs/models.md#nanbeige42): L stored layers looped num_loops times is the plan
// of an unrolled depth N * L with one cycle segment of L layers, KV per (loop, layer), and the
// final norm between loops unless skip_loop_final_norm.
json NanbeigeConfig() {
  json c = BaseConfig(3);
  c["model_type"] = "nanbeige";
  c["architectures"] = {"NanbeigeForCausalLM"};
  c["num_loops"] = 2;
  c["skip_loop_final_norm"] = false;
  c["head_dim"] = 32;  // q/o not square, as released (hidden / heads = 16 here)
  c["layer_types"] = {"full_attention", "full_attention", "full_attention"};
  c["loop_loss_weights"] = {0.5, 1.0};
  c["qk_layernorm"] = false;
  c["enable_hyper_connection"] = false;
  c["emb_neighbor_num"] = 0;
  return c;
}

TEST(ConfigNanbeigeTest, LoopsTheWholeStackWithPerLoopKv) {
  auto m = ParseModelConfig(NanbeigeConfig(), nullptr);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->model_type, "nanbeige");
  EXPECT_EQ(m->num_layers, 6);
  EXPECT_EQ(m->q_dim(), 128);
  EXPECT_TRUE(m->recursion.present);
  EXPECT_EQ(m->recursion.num_recursions, 2);
  EXPECT_EQ(m->recursion.sharing, Sharing::kCycle);
  EXPECT_EQ(m->recursion.routing, Routing::kNone);
  EXPECT_TRUE(m->recursion.norm_between_loops);
  auto plan = BuildLayerPlan(*m);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->segments.size(), 1u);
  EXPECT_EQ(plan->looped_segment, 0);
  EXPECT_EQ(plan->segments[0].num_layers, 3);
  EXPECT_EQ(plan->segments[0].loops, 2);
  EXPECT_EQ(plan->num_cache_slots, 6);
  EXPECT_EQ(plan->CacheSlot(0, 1, 2), 5);      // slot n * L + l
  EXPECT_EQ(plan->UnrolledLayer(0, 0, 2), 2);  // loop 0's copy: the stored model.layers.2

  json skip = NanbeigeConfig();
  skip["skip_loop_final_norm"] = true;
  skip.erase("num_loops");  // NanbeigeConfig's default: 2
  auto s = ParseModelConfig(skip, nullptr);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_FALSE(s->recursion.norm_between_loops);
  EXPECT_EQ(s->recursion.num_recursions, 2);

  json one = NanbeigeConfig();
  one["num_loops"] = 1;
  auto o = ParseModelConfig(one, nullptr);
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_FALSE(o->recursion.present);
  EXPECT_EQ(o->num_layers, 3);
}

TEST(ConfigNanbeigeTest, FeaturesItDoesNotComputeAreRefusedByName) {
  struct Case {
    const char* key;
    json value;
    const char* want;
  };
  const Case cases[] = {
      {"qk_layernorm", true, "config.json: qk_layernorm: true: not supported"},
      {"emb_neighbor_num", 4, "config.json: emb_neighbor_num: 4: not supported"},
      {"insert_ngram_layer_idx", {3}, "config.json: insert_ngram_layer_idx: [3]: not supported"},
      {"loop_share_kv", true, "config.json: loop_share_kv"},
      {"enable_depth_attention", true, "config.json: enable_depth_attention"},
      {"layer_types",
       {"full_attention", "sliding_attention", "full_attention"},
       "config.json: layer_types: \"sliding_attention\": only full_attention"},
      {"layer_types",
       {"full_attention"},
       "config.json: layer_types: must list num_hidden_layers (3)"},
      {"num_loops", 0, "config.json: num_loops: must be >= 1"},
      {"architectures",
       {"LlamaForCausalLM"},
       "config.json: architectures: \"LlamaForCausalLM\" is not supported with model_type "
       "nanbeige"},
      {"recursion",
       {{"num_recursions", 2}, {"sharing", "cycle"}},
       "recursion: not allowed with model_type nanbeige"},
      {"total_ut_steps", 4, "config.json: total_ut_steps: not understood"},
      {"num_loops", 1 << 30, "config.json: num_loops: 1073741824 loops of 3 layers exceed"},
  };
  for (const Case& c : cases) {
    json config = NanbeigeConfig();
    config[c.key] = c.value;
    const absl::Status s = ParseError(config);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.key;
    EXPECT_THAT(std::string(s.message()), HasSubstr(c.want)) << c.key;
  }
}

// Ouro (docs/models.md#ouro): OuroConfig as released (Qwen2-style keys, the sliding window
// present but off, auto_map to the remote code) is L sandwich layers looped total_ut_steps
// times with the norm after every loop and the exit gate's rule.
json OuroConfig() {
  json c = BaseConfig(3);
  c["model_type"] = "ouro";
  c["architectures"] = {"OuroForCausalLM"};
  c["total_ut_steps"] = 4;
  c["early_exit_threshold"] = 1.0;
  c["head_dim"] = 16;
  c["layer_types"] = {"full_attention", "full_attention", "full_attention"};
  c["use_sliding_window"] = false;
  c["sliding_window"] = 4096;
  c["max_window_layers"] = 3;
  c["auto_map"] = {{"AutoConfig", "configuration_ouro.OuroConfig"},
                   {"AutoModelForCausalLM", "modeling_ouro.OuroForCausalLM"}};
  c["hidden_act"] = "silu";
  c["rope_scaling"] = nullptr;
  c.erase("rms_norm_eps");  // OuroConfig's default 1e-6
  return c;
}

TEST(ConfigOuroTest, LoopsTheWholeStackWithSandwichNormsAndTheExitGate) {
  auto m = ParseModelConfig(OuroConfig(), nullptr);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->model_type, "ouro");
  EXPECT_TRUE(m->sandwich_norm);
  EXPECT_EQ(m->num_layers, 12);
  EXPECT_FLOAT_EQ(m->rms_norm_eps, 1e-6f);
  const RecursionConfig& r = m->recursion;
  EXPECT_TRUE(r.present);
  EXPECT_EQ(r.num_recursions, 4);
  EXPECT_EQ(r.sharing, Sharing::kCycle);
  EXPECT_EQ(r.routing, Routing::kNone);
  EXPECT_TRUE(r.norm_between_loops);
  EXPECT_EQ(r.exit_rule, LoopExitRule::kOuroGate);
  EXPECT_FLOAT_EQ(r.loop_exit_threshold, 1.0f);
  EXPECT_EQ(r.default_loop_mode, LoopMode::kFull);
  auto plan = BuildLayerPlan(*m);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->num_cache_slots, 12);  // one slot per (loop, layer)
  EXPECT_EQ(plan->CacheSlot(0, 3, 2), 11);

  json defaults = OuroConfig();  // total_ut_steps 4 and a null threshold (the last loop)
  defaults.erase("total_ut_steps");
  defaults["early_exit_threshold"] = nullptr;
  auto d = ParseModelConfig(defaults, nullptr);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->recursion.num_recursions, 4);
  EXPECT_FLOAT_EQ(d->recursion.loop_exit_threshold, 1.0f);
}

TEST(ConfigOuroTest, FeaturesItDoesNotComputeAreRefusedByName) {
  struct Case {
    const char* key;
    json value;
    const char* want;
  };
  const Case cases[] = {
      {"use_sliding_window", true, "config.json: use_sliding_window: not supported"},
      {"early_exit_step", 2, "config.json: early_exit_step: not supported"},
      {"early_exit_threshold", 0, "config.json: early_exit_threshold: must be > 0"},
      {"total_ut_steps", 0, "config.json: total_ut_steps: must be >= 1"},
      {"hidden_act", "gelu", "config.json: hidden_act: only silu"},
      {"rope_scaling", {{"type", "yarn"}}, "config.json: rope_scaling: not supported"},
      {"layer_types",
       {"full_attention", "sliding_attention", "full_attention"},
       "config.json: layer_types: \"sliding_attention\": only full_attention"},
      {"architectures",
       {"LlamaForCausalLM"},
       "config.json: architectures: \"LlamaForCausalLM\" is not supported with model_type ouro"},
      {"num_loops", 2, "config.json: num_loops: not understood"},
      {"recursion",
       {{"num_recursions", 2}, {"sharing", "cycle"}},
       "recursion: not allowed with model_type ouro"},
      {"total_ut_steps", 1 << 30,
       "config.json: total_ut_steps: 1073741824 loops of 3 layers exceed"},
  };
  for (const Case& c : cases) {
    json config = OuroConfig();
    config[c.key] = c.value;
    const absl::Status s = ParseError(config);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.key;
    EXPECT_THAT(std::string(s.message()), HasSubstr(c.want)) << c.key;
  }
}

// looped.json (docs/checkpoints.md#loopedjson): the default mode and threshold of a looped
// model's requests; a mode or key the model cannot honour is an error naming it.
TEST(ConfigOuroTest, LoopedJsonSetsTheDefaultsAndRefusesWhatTheModelCannotDo) {
  auto ouro = ParseModelConfig(OuroConfig(), nullptr);
  ASSERT_TRUE(ouro.ok()) << ouro.status();
  ModelConfig m = *ouro;
  ASSERT_TRUE(ApplyLoopedDefaults({{"mode", "adaptive"}, {"exit_threshold", 0.6}}, &m).ok());
  EXPECT_EQ(m.recursion.default_loop_mode, LoopMode::kAdaptive);
  EXPECT_FLOAT_EQ(m.recursion.loop_exit_threshold, 0.6f);

  struct Case {
    json looped;
    const char* want;
  };
  const Case cases[] = {
      {{{"mode", "early"}}, "looped.json: mode: must be one of full, adaptive"},
      {{{"exit_threshold", -1}}, "looped.json: exit_threshold: must be > 0"},
      {{{"exit_threshold", "high"}}, "looped.json: exit_threshold: must be a number"},
      {{{"num_steps", 8}}, "looped.json: num_steps: unknown key"},
  };
  for (const Case& c : cases) {
    ModelConfig copy = *ouro;
    const absl::Status s = ApplyLoopedDefaults(c.looped, &copy);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.looped.dump();
    EXPECT_THAT(std::string(s.message()), HasSubstr(c.want)) << c.looped.dump();
  }
  auto nanbeige = ParseModelConfig(NanbeigeConfig(), nullptr);
  ASSERT_TRUE(nanbeige.ok());
  ModelConfig n = *nanbeige;
  EXPECT_THAT(std::string(ApplyLoopedDefaults({{"mode", "adaptive"}}, &n).message()),
              HasSubstr("looped.json: mode: adaptive needs a looped model with an exit rule"));
  EXPECT_TRUE(ApplyLoopedDefaults({{"mode", "full"}}, &n).ok());
  EXPECT_THAT(std::string(ApplyLoopedDefaults({{"exit_threshold", 0.5}}, &n).message()),
              HasSubstr("looped.json: exit_threshold: model_type nanbeige has no exit rule"));
}

// Huginn-0125's released config.json (raven_config_minimal), sizes scaled down.
json HuginnConfigJson() {
  return {{"architectures", {"RavenForCausalLM"}},
          {"auto_map", {{"AutoConfig", "raven_config_minimal.RavenConfig"}}},
          {"model_type", "huginn_raven"},
          {"name", "nebel-raven-3.5b"},
          {"n_embd", 96},
          {"num_attention_heads", 4},
          {"num_key_value_heads", 4},
          {"intermediate_size", 160},
          {"vocab_size", 512},
          {"padded_vocab_size", 512},
          {"padding_multiple", 4096},
          {"block_size", 1024},
          {"norm_eps", 1e-6},
          {"qk_bias", true},
          {"bias", false},
          {"tie_embeddings", true},
          {"n_layers_in_prelude", 2},
          {"n_layers_in_recurrent_block", 4},
          {"n_layers_in_coda", 2},
          {"n_layers", 8},
          {"mean_recurrence", 32},
          {"mean_backprop_depth", 8},
          {"effective_expected_depth", 132},
          {"injection_type", "linear"},
          {"state_init", "like-init"},
          {"block_class_name", "SandwichBlock"},
          {"mlp_class_name", "GatedMLP"},
          {"nonlin_name", "SiLU"},
          {"norm_class_name", "RMSNorm_llama"},
          {"init_strategy", "takase"},
          {"init_values", {{"std", 0.0087}, {"embed_scale", 72.66}}},
          {"sampling_scheme", "poisson-lognormal-filling"},
          {"architecture_class_name", "RecurrentGPT"},
          {"hf_config", {{"org", "tomg-group-umd"}, {"name", "huginn-0125"}}},
          {"torch_dtype", "bfloat16"},
          {"transformers_version", "4.44.2"},
          {"bos_token_id", 65504},
          {"eos_token_id", {65505, 65508}}};
}

TEST(ConfigHuginnTest, PreludeCoreCodaWithTheReleasedMath) {
  auto m = ParseModelConfig(HuginnConfigJson(), nullptr);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->model_type, "huginn_raven");
  EXPECT_EQ(m->hidden_size, 96);
  EXPECT_EQ(m->num_heads, 4);
  EXPECT_EQ(m->num_kv_heads, 4);
  EXPECT_EQ(m->head_dim, 24);
  EXPECT_EQ(m->max_position_embeddings, 1024);
  EXPECT_FLOAT_EQ(m->rms_norm_eps, 1e-6f);
  EXPECT_FLOAT_EQ(m->rope_theta, 50000.0f);  // absent: the released code's default
  EXPECT_TRUE(m->tie_word_embeddings);
  EXPECT_EQ(m->eos_token_ids, (std::vector<int>{65505, 65508}));
  EXPECT_EQ(m->num_layers, 2 + 4 * 32 + 2);
  const morserve::HuginnConfig& h = m->huginn;
  EXPECT_TRUE(h.enabled && h.residual_norm && h.qk_bias && h.rope_pairs && h.input_injection);
  EXPECT_FLOAT_EQ(h.embed_scale, std::sqrt(96.0f));
  EXPECT_EQ(h.init_scale, 0.0f);
  EXPECT_FALSE(m->sandwich_norm);  // Ouro's (norm before the add) is another block
  const RecursionConfig& r = m->recursion;
  EXPECT_EQ(r.num_recursions, 32);
  EXPECT_EQ(r.sharing, Sharing::kMiddleCycle);
  EXPECT_EQ(r.exit_rule, LoopExitRule::kHuginnKl);
  EXPECT_FLOAT_EQ(r.loop_exit_threshold, 1e-3f);
  auto plan = BuildLayerPlan(*m);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->segments.size(), 3u);
  EXPECT_EQ(plan->segments[0].num_layers, 2);
  EXPECT_EQ(plan->segments[1].num_layers, 4);
  EXPECT_EQ(plan->segments[1].loops, 32);
  EXPECT_EQ(plan->segments[2].num_layers, 2);
  EXPECT_EQ(plan->looped_segment, 1);
  EXPECT_EQ(plan->num_layer_slots, 8);
  EXPECT_EQ(plan->num_cache_slots, 2 + 4 * 32 + 2);  // one per (recurrence, core layer)
  EXPECT_EQ(plan->CacheSlot(1, 31, 3), 2 + 31 * 4 + 3);
  EXPECT_EQ(plan->CacheSlot(2, 0, 1), 2 + 128 + 1);

  json aliases = HuginnConfigJson();  // HF's attribute names for the same fields
  aliases.erase("n_embd");
  aliases["hidden_size"] = 96;
  aliases.erase("num_attention_heads");
  aliases["n_heads"] = 4;
  aliases["tie_word_embeddings"] = true;
  auto a = ParseModelConfig(aliases, nullptr);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->hidden_size, 96);
  EXPECT_EQ(a->num_heads, 4);
}

TEST(ConfigHuginnTest, WhatItDoesNotComputeIsRefusedByName) {
  struct Case {
    const char* key;
    json value;
    const char* want;
  };
  const Case cases[] = {
      {"injection_type", "add", "config.json: injection_type: \"add\" is not supported"},
      {"state_init", "zero", "config.json: state_init: \"zero\" is not supported"},
      {"block_class_name", "TransformerPreNormBlock", "config.json: block_class_name:"},
      {"mlp_class_name", "BaseMLP", "config.json: mlp_class_name:"},
      {"nonlin_name", "GELU", "config.json: nonlin_name:"},
      {"norm_class_name", "LayerNorm", "config.json: norm_class_name:"},
      {"bias", true, "config.json: bias: true: not supported"},
      {"qk_norm", true, "config.json: qk_norm: true: not supported"},
      {"test_time_noise", 0.1, "config.json: test_time_noise: 0.1: not supported"},
      {"num_key_value_heads", 2, "config.json: num_key_value_heads: must equal"},
      {"head_dim", 32, "config.json: head_dim: must equal n_embd / num_attention_heads"},
      {"padded_vocab_size", 1024, "config.json: padded_vocab_size: must equal vocab_size"},
      {"n_layers", 9, "config.json: n_layers: must be n_layers_in_prelude"},
      {"mean_recurrence", 0, "config.json: mean_recurrence: must be >= 1"},
      {"mean_recurrence", 1 << 20, "config.json: mean_recurrence: 1048576 recurrences of 4"},
      {"n_heads", 3, "config.json: n_heads: differs from num_attention_heads"},
      {"tie_word_embeddings", false, "config.json: tie_word_embeddings: differs"},
      {"architectures", {"LlamaForCausalLM"}, "config.json: architectures: \"LlamaForCausalLM\""},
      {"rope_settings", {{"rope_base", 10000}}, "config.json: rope_settings: not understood"},
      {"recursion",
       {{"num_recursions", 2}, {"sharing", "cycle"}},
       "recursion: not allowed with model_type huginn_raven"},
  };
  for (const Case& c : cases) {
    json config = HuginnConfigJson();
    config[c.key] = c.value;
    const absl::Status s = ParseError(config);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.key;
    EXPECT_THAT(std::string(s.message()), HasSubstr(c.want)) << c.key;
  }
  json missing = HuginnConfigJson();
  missing.erase("vocab_size");
  EXPECT_THAT(std::string(ParseError(missing).message()),
              HasSubstr("config.json: vocab_size: missing"));
}

// Huginn's own looped.json keys: num_steps re-unrolls the plan, init_scale, exit_criterion.
TEST(ConfigHuginnTest, LoopedJsonSetsNumStepsInitScaleAndTheCriterion) {
  auto base = ParseModelConfig(HuginnConfigJson(), nullptr);
  ASSERT_TRUE(base.ok()) << base.status();
  ModelConfig m = *base;
  ASSERT_TRUE(ApplyLoopedDefaults({{"mode", "adaptive"},
                                   {"num_steps", 8},
                                   {"init_scale", 1.0},
                                   {"exit_threshold", 5e-4},
                                   {"exit_criterion", "kl"}},
                                  &m)
                  .ok());
  EXPECT_EQ(m.recursion.num_recursions, 8);
  EXPECT_EQ(m.num_layers, 2 + 4 * 8 + 2);
  EXPECT_FLOAT_EQ(m.huginn.init_scale, 1.0f);
  EXPECT_FLOAT_EQ(m.recursion.loop_exit_threshold, 5e-4f);
  EXPECT_EQ(m.recursion.default_loop_mode, LoopMode::kAdaptive);
  auto plan = BuildLayerPlan(m);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->segments[1].loops, 8);

  struct Case {
    json looped;
    const char* want;
  };
  const Case cases[] = {
      {{{"num_steps", 0}}, "looped.json: num_steps: must be in 1.."},
      {{{"init_scale", -1}}, "looped.json: init_scale: must be >= 0"},
      {{{"exit_criterion", "entropy-diff"}}, "looped.json: exit_criterion: \"entropy-diff\""},
      {{{"lookup_strategy", "latest-m4"}}, "looped.json: lookup_strategy: unknown key"},
  };
  for (const Case& c : cases) {
    ModelConfig copy = *base;
    const absl::Status s = ApplyLoopedDefaults(c.looped, &copy);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.looped.dump();
    EXPECT_THAT(std::string(s.message()), HasSubstr(c.want)) << c.looped.dump();
  }
  // Huginn's keys are not Ouro's.
  auto ouro = ParseModelConfig(OuroConfig(), nullptr);
  ASSERT_TRUE(ouro.ok());
  EXPECT_THAT(std::string(ApplyLoopedDefaults({{"init_scale", 1}}, &*ouro).message()),
              HasSubstr("looped.json: init_scale: unknown key"));
}

}  // namespace
}  // namespace morserve
