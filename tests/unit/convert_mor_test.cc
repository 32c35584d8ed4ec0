// `morserve convert --from-mor-yaml`: the official MoR Hydra run config maps to the recursion
// object (known keys, clear errors for values this server cannot serve), and an official
// checkpoint (mkmodel mor-ec / mor-tc, written in the official layout) converts to a
// directory whose reference logits equal those of the original.
#include "engine/convert/mor_yaml.h"

#include <filesystem>

#include "engine/convert/convert.h"
#include "engine/convert/mor_checkpoint.h"
#include "engine/io/safetensors_writer.h"
#include "engine/io/tensor_store.h"
#include "engine/model/weights.h"
#include "engine/reference/reference_model.h"
#include "engine/tools/mkmodel.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/engine_harness.h"
#include "tests/testutil.h"

namespace morserve {
namespace {

using nlohmann::json;
using testing::NarrowSpec;
using testing::ReadFile;
using testing::TempDir;
using testing::WriteFile;

// Mirrors conf/pretrain/<run>.yaml of the official code (training keys included).
std::string RunYaml(const std::string& mor_type, const std::string& extra_mor = "",
                    const std::string& kv_enable = "false", const std::string& router_type = "linear",
                    const std::string& sampling = "aux_loss", const std::string& balancing = "loss") {
  return "name: 250720_pretrain_smollm-360m_rec3_middle_cycle_mor\n"
         "wandb: true\n"
         "dataset: fineweb_edu\n"
         "model: smollm\n"
         "model_name_or_path: HuggingFaceTB/SmolLM-360M\n"
         "use_pretrained_weights: false\n"
         "recursive:\n"
         "  enable: true\n"
         "  base_depth: null\n"
         "  num_recursion: 3\n"
         "  sharing: middle_cycle\n"
         "  ln_share: true\n"
         "  initialization: random\n"
         "kv_sharing:\n"
         "  enable: " + kv_enable + "\n"
         "  base_depth: null\n"
         "  num_recursion: null\n"
         "  sharing: null\n"
         "relaxation:\n"
         "  enable: false\n"
         "  skip_first_loop: false\n"
         "  method: lora\n"
         "  lora:\n"
         "    r: 16\n"
         "    alpha: 32\n"
         "    dropout: 0.1\n"
         "    target_modules:\n"
         "    - q_proj\n"
         "    - v_proj\n"
         "    rank_pattern: null\n"
         "    alpha_pattern: 2.0\n"
         "    svd_init: false\n"
         "  prompt:\n"
         "    len: 16\n"
         "mor:\n"
         "  enable: true\n"
         "  type: " + mor_type + "\n"
         "  capacity: null\n"
         "  rand_router: false\n"
         "  router_type: " + router_type + "\n"
         "  z_loss: false\n"
         "  z_coeff: 0.001\n"
         "  temp: 1.0\n" + extra_mor +
         "  expert:\n"
         "    cap_warmup_step: 0\n"
         "    router_func: sigmoid\n"
         "    alpha: 0.1\n"
         "    sampling: " + sampling + "\n"
         "    include_first: true\n"
         "    coeff: 0.001\n"
         "    gating: weighted\n"
         "  token:\n"
         "    bal_warmup_step: 0\n"
         "    router_func: softmax\n"
         "    alpha: 1.0\n"
         "    balancing: " + balancing + "\n"
         "    coeff: 0.1\n"
         "    u: 0.001\n"
         "    gating: weighted\n"
         "learning_rate: 0.003\n"
         "precision: bf16\n";
}

json Map(const std::string& yaml) {
  auto r = MorRunConfigToRecursion(yaml, "run.yaml");
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *r : json();
}

void ExpectError(const std::string& yaml, const std::string& needle) {
  auto r = MorRunConfigToRecursion(yaml, "run.yaml");
  ASSERT_FALSE(r.ok()) << "expected an error containing '" << needle << "'";
  EXPECT_NE(r.status().message().find(needle), std::string::npos) << r.status().message();
}

std::string Replace(std::string s, const std::string& from, const std::string& to) {
  const size_t at = s.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  if (at != std::string::npos) s.replace(at, from.size(), to);
  return s;
}

TEST(ConvertMorYaml, ExpertChoiceRunMapsToTheRecursionObject) {
  const json r = Map(RunYaml("expert"));
  EXPECT_EQ(r["num_recursions"], 3);
  EXPECT_EQ(r["sharing"], "middle_cycle");
  EXPECT_EQ(r["routing"], "expert_choice");
  EXPECT_FALSE(r.contains("kv"));
  EXPECT_FALSE(r.contains("lora"));
  const json& router = r["router"];
  EXPECT_EQ(router["arch"], "linear");
  EXPECT_EQ(router["activation"], "sigmoid");
  EXPECT_DOUBLE_EQ(router["alpha"].get<double>(), 0.1);
  EXPECT_DOUBLE_EQ(router["temperature"].get<double>(), 1.0);
  EXPECT_EQ(router["gating"], "weighted");
  EXPECT_EQ(router["aux_router"], false);
  EXPECT_FALSE(router.contains("capacity"));  // null: the (Nr - i) / Nr default
  // The training code's capacity string, aux router, KV sharing, an mlp router.
  const json c = Map(RunYaml("expert", "", "true", "mlp", "aux_router"));
  EXPECT_EQ(c["kv"], "shared");
  EXPECT_EQ(c["router"]["arch"], "mlp");
  EXPECT_EQ(c["router"]["aux_router"], true);
  const json cap = Map(Replace(RunYaml("expert"), "capacity: null", "capacity: 1.0,0.5,0.25"));
  EXPECT_EQ(cap["router"]["capacity"], json::array({1.0, 0.5, 0.25}));
  const json listed = Map(Replace(RunYaml("expert"), "capacity: null", "capacity: [1.0, 0.6, 0.3]"));
  EXPECT_EQ(listed["router"]["capacity"], json::array({1.0, 0.6, 0.3}));
}

TEST(ConvertMorYaml, TokenChoiceRelaxationAndVanillaRuns) {
  const json t = Map(RunYaml("token", "", "false", "linear", "aux_loss", "loss_free"));
  EXPECT_EQ(t["routing"], "token_choice");
  EXPECT_EQ(t["router"]["activation"], "softmax");
  EXPECT_DOUBLE_EQ(t["router"]["alpha"].get<double>(), 1.0);
  EXPECT_FALSE(t["router"].contains("capacity"));
  EXPECT_FALSE(t["router"].contains("aux_router"));
  // relaxation: alpha = r * alpha_pattern, as the training code sets it.
  const json l = Map(Replace(Replace(RunYaml("expert"), "mor:\n  enable: true", "mor:\n  enable: false"),
                             "relaxation:\n  enable: false", "relaxation:\n  enable: true"));
  EXPECT_EQ(l["routing"], "none");
  EXPECT_EQ(l["lora"]["rank"], 16);
  EXPECT_DOUBLE_EQ(l["lora"]["alpha"].get<double>(), 32.0);
  EXPECT_EQ(l["lora"]["targets"], json::array({"q_proj", "v_proj"}));
  // Not recursive at all: no recursion object.
  const json v = Map(Replace(Replace(RunYaml("expert"), "mor:\n  enable: true", "mor:\n  enable: false"),
                             "recursive:\n  enable: true", "recursive:\n  enable: false"));
  EXPECT_TRUE(v.is_null());
}

TEST(ConvertMorYaml, UnknownKeysAndValuesAreErrorsNamingThem) {
  ExpectError(RunYaml("mixture"), "run.yaml: mor.type: 'mixture' is not a value");
  ExpectError(RunYaml("expert", "", "false", "wide_mlp"), "mor.router_type: 'wide_mlp'");
  ExpectError(RunYaml("expert", "", "false", "linear", "top_k"), "mor.expert.sampling: 'top_k'");
  ExpectError(RunYaml("expert", "  new_knob: 3\n"), "mor.new_knob: unknown key");
  ExpectError(Replace(RunYaml("expert"), "rand_router: false", "rand_router: true"), "mor.rand_router");
  ExpectError(Replace(RunYaml("expert"), "include_first: true", "include_first: false"),
              "mor.expert.include_first");
  ExpectError(Replace(RunYaml("expert"), "router_func: sigmoid", "router_func: relu"),
              "mor.expert.router_func: 'relu'");
  ExpectError(Replace(RunYaml("expert"), "capacity: null", "capacity: 1.0,0.5"),
              "mor.capacity: lists 2 fractions; recursive.num_recursion is 3");
  ExpectError(Replace(RunYaml("expert"), "sharing: middle_cycle", "sharing: zigzag"),
              "recursive.sharing: 'zigzag'");
  ExpectError(Replace(RunYaml("expert"), "num_recursion: 3", "num_recursion: 1"), "recursive.num_recursion");
  ExpectError(Replace(RunYaml("expert"), "num_recursion: 3", "num_recursion: three"), "recursive.num_recursion");
  // Found by tests/fuzz/mor_yaml_fuzz.cc: numbers past int's range were cast to int (UB).
  ExpectError(Replace(RunYaml("expert"), "num_recursion: 3", "num_recursion: 1e300"),
              "recursive.num_recursion: must be an integer >= 2");
  ExpectError(Replace(Replace(RunYaml("expert"), "relaxation:\n  enable: false",
                              "relaxation:\n  enable: true"),
                      "    r: 16", "    r: 4.4e73"),
              "relaxation.lora.r: must be an integer >= 1");
  ExpectError(Replace(RunYaml("expert"), "alpha: 0.1", "alpha: big"), "mor.expert.alpha: must be a number");
  ExpectError(Replace(Replace(RunYaml("expert"), "relaxation:\n  enable: false", "relaxation:\n  enable: true"),
                      "method: lora", "method: dora"),
              "relaxation.method: 'dora'");
  ExpectError(Replace(RunYaml("expert"), "  ln_share: true\n", "  ln_share: true\n  depth_scale: 2\n"),
              "recursive.depth_scale: unknown key");
  ExpectError("recursive: [1, 2\n", "not valid YAML");
  ExpectError("- just\n- a list\n", "not a YAML mapping");
  // Found by tests/fuzz/mor_yaml_fuzz.cc: a LoRA target with ill-formed UTF-8 reached
  // config.json's error message (nlohmann's dump throws on it) and aborted the process.
  ExpectError(Replace(Replace(RunYaml("expert"), "relaxation:\n  enable: false",
                              "relaxation:\n  enable: true"),
                      "- v_proj", "- v_pr\x8eoj"),
              "run.yaml: not valid YAML: not UTF-8 text");
}

// An official checkpoint: mkmodel's mor family, its config.json without the recursion object
// (the training code keeps that in the YAML), plus the run YAML.
struct OfficialRun {
  std::string dir;
  std::string yaml;
};

OfficialRun WriteOfficialRun(const TempDir& tmp, const TinyModelSpec& spec, const std::string& yaml) {
  OfficialRun run{tmp.File("ckpt"), tmp.File("run.yaml")};
  EXPECT_TRUE(WriteTinyModel(spec, run.dir).ok());
  json config = json::parse(ReadFile(run.dir + "/config.json"));
  config.erase("recursion");
  WriteFile(run.dir + "/config.json", config.dump(2));
  WriteFile(run.dir + "/tokenizer.json", "{\"version\": \"1.0\"}\n");
  WriteFile(run.yaml, yaml);
  return run;
}

void ExpectSameLogits(const std::string& original_dir, const std::string& converted_dir) {
  auto a = LoadModel(original_dir);
  auto b = LoadModel(converted_dir);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->get()->store->tensors().size(), a->get()->store->tensors().size());
  ReferenceModel ra(*a), rb(*b);
  const std::vector<int> tokens = {5, 17, 3, 42, 8, 8, 61, 0, 33, 12, 1, 2};
  const auto oa = ra.Forward(tokens);
  const auto ob = rb.Forward(tokens);
  ASSERT_EQ(oa.size(), ob.size());
  for (size_t t = 0; t < oa.size(); ++t) {
    EXPECT_EQ(oa[t].logits, ob[t].logits) << "token " << t;
    EXPECT_EQ(oa[t].trace.loops, ob[t].trace.loops) << "token " << t;
  }
}

TEST(ConvertMorCheckpoint, ExpertChoiceRoundTripsToTheSameLogits) {
  TempDir tmp;
  TinyModelSpec spec = NarrowSpec("mor-ec");
  spec.router_bias = 0.5f;  // some tokens go deep, some leave early
  const std::string original = tmp.File("original");
  ASSERT_TRUE(WriteTinyModel(spec, original).ok());
  const OfficialRun run = WriteOfficialRun(tmp, spec, RunYaml("expert"));
  const std::string out = tmp.File("out");
  absl::Status s = ConvertMorRun(run.yaml, run.dir, "", out);
  ASSERT_TRUE(s.ok()) << s;
  const json config = json::parse(ReadFile(out + "/config.json"));
  EXPECT_EQ(config["recursion"]["routing"], "expert_choice");
  EXPECT_EQ(config["recursion"]["num_recursions"], 3);
  EXPECT_EQ(ReadFile(out + "/tokenizer.json"), "{\"version\": \"1.0\"}\n");
  ExpectSameLogits(original, out);
  // Same with an mlp router and an aux router (mlp_router.* tensors).
  TempDir tmp2;
  spec.router = "mlp";
  spec.aux_router = true;
  ASSERT_TRUE(WriteTinyModel(spec, tmp2.File("original")).ok());
  const OfficialRun run2 = WriteOfficialRun(tmp2, spec, RunYaml("expert", "", "false", "mlp", "aux_router"));
  ASSERT_TRUE(ConvertMorRun(run2.yaml, run2.dir, "", tmp2.File("out")).ok());
  ExpectSameLogits(tmp2.File("original"), tmp2.File("out"));
}

TEST(ConvertMorCheckpoint, TokenChoiceFromAWrappedCheckpointFile) {
  TempDir tmp;
  TinyModelSpec spec = NarrowSpec("mor-tc");
  spec.router_bias = 0.3f;
  const std::string original = tmp.File("original");
  ASSERT_TRUE(WriteTinyModel(spec, original).ok());
  const OfficialRun run =
      WriteOfficialRun(tmp, spec, RunYaml("token", "", "false", "linear", "aux_loss", "loss_free"));
  // A DeepSpeed-wrapped state dict in a file of another name, with a RoPE buffer.
  auto tensors = TinyModelTensors(spec);
  ASSERT_TRUE(tensors.ok());
  for (OwnedTensor& t : *tensors) t.name = "module." + t.name;
  tensors->push_back(OwnedTensor::FromF32("module.model.layers.0.self_attn.rotary_emb.inv_freq",
                                          DType::kF32, {4}, {1, 0.5, 0.25, 0.125}));
  std::filesystem::remove(run.dir + "/model.safetensors");
  ASSERT_TRUE(WriteSafetensors(run.dir + "/checkpoint-1000.safetensors", *tensors).ok());
  const std::string out = tmp.File("out");
  absl::Status s = ConvertMorRun(run.yaml, run.dir + "/checkpoint-1000.safetensors", "", out);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(json::parse(ReadFile(out + "/config.json"))["recursion"]["routing"], "token_choice");
  ExpectSameLogits(original, out);
  EXPECT_EQ(LoaderTensorName("module._orig_mod.model.norm.weight"), "model.norm.weight");
  EXPECT_EQ(LoaderTensorName("base_model.model.lm_head.weight"), "lm_head.weight");
  EXPECT_EQ(LoaderTensorName("model.layers.1.self_attn.rotary_emb.inv_freq"), "");
}

TEST(ConvertMorCheckpoint, MismatchesAreClearErrors) {
  TempDir tmp;
  TinyModelSpec spec = NarrowSpec("mor-ec");
  const OfficialRun run = WriteOfficialRun(tmp, spec, RunYaml("expert"));
  // YAML says token choice, checkpoint is expert choice.
  WriteFile(tmp.File("token.yaml"), RunYaml("token"));
  absl::Status s = ConvertMorRun(tmp.File("token.yaml"), run.dir, "", tmp.File("out"));
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("would not load"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("token_choice"), std::string::npos) << s.message();
  EXPECT_FALSE(std::filesystem::exists(tmp.File("out")));
  // A router tensor missing.
  auto tensors = TinyModelTensors(spec);
  ASSERT_TRUE(tensors.ok());
  std::vector<OwnedTensor> kept;
  for (OwnedTensor& t : *tensors) {
    if (t.name != "model.layers.2.mor_router.router.weight") kept.push_back(std::move(t));
  }
  ASSERT_TRUE(WriteSafetensors(run.dir + "/model.safetensors", kept).ok());
  s = ConvertMorRun(run.yaml, run.dir, "", tmp.File("out"));
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("missing tensor model.layers.2.mor_router.router.weight"), std::string::npos)
      << s.message();
  // No config.json beside a checkpoint file; --config supplies it.
  const std::string lone = tmp.File("lone");
  std::filesystem::create_directories(lone);
  ASSERT_TRUE(WriteSafetensors(lone + "/weights.safetensors", *TinyModelTensors(spec)).ok());
  s = ConvertMorRun(run.yaml, lone + "/weights.safetensors", "", tmp.File("out"));
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("--config"), std::string::npos) << s.message();
  s = ConvertMorRun(run.yaml, lone + "/weights.safetensors", run.dir + "/config.json", tmp.File("out"));
  EXPECT_TRUE(s.ok()) << s;
  s = ConvertMorRun(run.yaml, tmp.File("absent"), "", tmp.File("out2"));
  EXPECT_FALSE(s.ok());
}

}  // namespace
}  // namespace morserve
