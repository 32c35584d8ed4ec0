// Parsing and validation of config.json and the recursion object (see config.h).
// Every error names the field it is about, as "config.json: <field>: <problem>".
#include "engine/model/config.h"

#include <cmath>
#include <fstream>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/model/config_json.h"
#include "engine/model/huginn_config.h"
#include "engine/model/layer_plan.h"

namespace morserve {
namespace {

using nlohmann::json;
using namespace config_json;  // NOLINT(google-build-using-namespace): this file's own helpers

absl::Status ParseRouter(const json& j, Routing routing, int nr, RouterConfig* r) {
  const std::string p = "recursion.router.";
  if (auto s = CheckKnownKeys(j, p,
                              {"arch", "activation", "alpha", "temperature", "threshold", "gating",
                               "capacity", "aux_router"});
      !s.ok()) {
    return s;
  }
  if (auto s = GetEnum<RouterArch>(
          j, p, "arch", {{"linear", RouterArch::kLinear}, {"mlp", RouterArch::kMlp}}, &r->arch);
      !s.ok()) {
    return s;
  }
  r->activation =
      routing == Routing::kTokenChoice ? RouterActivation::kSoftmax : RouterActivation::kSigmoid;
  std::vector<std::pair<const char*, RouterActivation>> acts;
  if (routing == Routing::kTokenChoice) {
    acts = {{"softmax", RouterActivation::kSoftmax}, {"sigmoid", RouterActivation::kSigmoid}};
  } else {
    acts = {{"sigmoid", RouterActivation::kSigmoid}, {"tanh", RouterActivation::kTanh}};
  }
  if (auto s = GetEnum(j, p, "activation", acts, &r->activation); !s.ok()) return s;
  for (auto [key, out] : {std::pair{"alpha", &r->alpha}, std::pair{"temperature", &r->temperature},
                          std::pair{"threshold", &r->threshold}}) {
    if (auto s = GetFloat(j, p, key, out); !s.ok()) return s;
  }
  if (!(r->temperature > 0)) return FieldError(p + "temperature", "must be > 0");
  if (auto s = GetEnum<Gating>(j, p, "gating",
                               {{"weighted", Gating::kWeighted}, {"additive", Gating::kAdditive}},
                               &r->gating);
      !s.ok()) {
    return s;
  }
  if (auto s = GetBool(j, p, "aux_router", &r->aux_router); !s.ok()) return s;
  if (r->aux_router && routing != Routing::kExpertChoice) {
    return FieldError(p + "aux_router", "only with routing expert_choice");
  }
  r->capacity.clear();
  if (auto it = j.find("capacity"); it != j.end() && !it->is_null()) {
    if (routing != Routing::kExpertChoice) {
      return FieldError(p + "capacity", "only with routing expert_choice");
    }
    if (!it->is_array() || static_cast<int>(it->size()) != nr) {
      return FieldError(p + "capacity", absl::StrCat("must list one fraction per loop (", nr, ")"));
    }
    for (const json& v : *it) {
      if (!v.is_number() || !(v.get<float>() > 0)) {
        return FieldError(p + "capacity", "fractions must be numbers > 0");
      }
      r->capacity.push_back(v.get<float>());
    }
  }
  return absl::OkStatus();
}

absl::Status ParseLora(const json& j, LoraConfig* l) {
  const std::string p = "recursion.lora.";
  if (auto s = CheckKnownKeys(j, p, {"rank", "alpha", "targets"}); !s.ok()) return s;
  if (auto s = GetInt(j, p, "rank", true, &l->rank); !s.ok()) return s;
  l->alpha = static_cast<float>(l->rank);
  if (auto s = GetFloat(j, p, "alpha", &l->alpha); !s.ok()) return s;
  l->targets = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
  if (auto it = j.find("targets"); it != j.end()) {
    const std::set<std::string> known(l->targets.begin(), l->targets.end());
    l->targets.clear();
    if (!it->is_array()) return FieldError(p + "targets", "must be a list of projection names");
    for (const json& v : *it) {
      if (!v.is_string() || !known.count(v.get<std::string>())) {
        return FieldError(p + "targets", absl::StrCat("unknown projection ", Quote(v)));
      }
      l->targets.push_back(v.get<std::string>());
    }
  }
  return absl::OkStatus();
}

absl::Status ParseEarlyExit(const json& j, EarlyExitConfig* e) {
  const std::string p = "recursion.early_exit.";
  if (auto s = CheckKnownKeys(j, p, {"threshold", "exit_kv"}); !s.ok()) return s;
  if (auto s = GetFloat(j, p, "threshold", &e->threshold); !s.ok()) return s;
  if (!(e->threshold > 0)) return FieldError(p + "threshold", "must be > 0");
  return GetEnum<ExitKv>(j, p, "exit_kv",
                         {{"propagate", ExitKv::kPropagate}, {"skip", ExitKv::kSkip}}, &e->exit_kv);
}

absl::Status ParseRecursion(const json& j, RecursionConfig* r) {
  const std::string p = "recursion.";
  if (auto s = CheckKnownKeys(j, p,
                              {"num_recursions", "sharing", "routing", "router", "kv", "lora",
                               "early_exit", "layer_kind"});
      !s.ok()) {
    return s;
  }
  r->present = true;
  if (auto s = GetInt(j, p, "num_recursions", true, &r->num_recursions); !s.ok()) return s;
  if (r->num_recursions < 1) return FieldError(p + "num_recursions", "must be >= 1");
  if (auto s = GetEnum<Sharing>(j, p, "sharing",
                                {{"none", Sharing::kNone},
                                 {"cycle", Sharing::kCycle},
                                 {"sequence", Sharing::kSequence},
                                 {"middle_cycle", Sharing::kMiddleCycle},
                                 {"middle_sequence", Sharing::kMiddleSequence}},
                                &r->sharing);
      !s.ok()) {
    return s;
  }
  if (auto s = GetEnum<Routing>(j, p, "routing",
                                {{"none", Routing::kNone},
                                 {"expert_choice", Routing::kExpertChoice},
                                 {"token_choice", Routing::kTokenChoice},
                                 {"early_exit", Routing::kEarlyExit}},
                                &r->routing);
      !s.ok()) {
    return s;
  }
  if (auto s = GetEnum<KvMode>(
          j, p, "kv", {{"recursion_wise", KvMode::kRecursionWise}, {"shared", KvMode::kShared}},
          &r->kv);
      !s.ok()) {
    return s;
  }
  if (auto s = GetEnum<LayerKind>(
          j, p, "layer_kind",
          {{"standard", LayerKind::kStandard}, {"recurrent", LayerKind::kRecurrent}},
          &r->layer_kind);
      !s.ok()) {
    return s;
  }
  const bool routed = r->routing == Routing::kExpertChoice || r->routing == Routing::kTokenChoice;
  if (auto it = j.find("router"); it != j.end()) {
    if (!routed) return FieldError(p + "router", "only with routing expert_choice or token_choice");
    if (auto s = ParseRouter(*it, r->routing, r->num_recursions, &r->router); !s.ok()) return s;
  } else if (routed) {
    if (auto s = ParseRouter(json::object(), r->routing, r->num_recursions, &r->router); !s.ok()) {
      return s;
    }
  }
  if (auto it = j.find("lora"); it != j.end() && !it->is_null()) {
    if (auto s = ParseLora(*it, &r->lora); !s.ok()) return s;
  }
  if (auto it = j.find("early_exit"); it != j.end() && !it->is_null()) {
    if (r->routing != Routing::kEarlyExit) {
      return FieldError(p + "early_exit", "only with routing early_exit");
    }
    if (auto s = ParseEarlyExit(*it, &r->early_exit); !s.ok()) return s;
  } else if (r->routing == Routing::kEarlyExit) {
    return FieldError(p + "early_exit", "missing (routing early_exit needs a threshold)");
  }
  return absl::OkStatus();
}

// Cross-field rules of docs/models.md (listed in docs/models.md#refused-at-load).
absl::Status ValidateRecursion(RecursionConfig* r) {
  const std::string p = "recursion.";
  const int nr = r->num_recursions;
  if (r->sharing == Sharing::kNone && nr != 1) {
    return FieldError(p + "num_recursions", "must be 1 with sharing none");
  }
  if (r->sharing == Sharing::kNone && r->routing != Routing::kNone) {
    return FieldError(p + "routing", "needs a looped segment (sharing is none)");
  }
  if (r->lora.rank > 0 && r->sharing == Sharing::kNone) {
    return FieldError(p + "lora", "needs a shared (looped) plan; sharing is none");
  }
  if (r->routing == Routing::kExpertChoice && r->router.capacity.empty()) {
    for (int i = 0; i < nr; ++i) r->router.capacity.push_back(static_cast<float>(nr - i) / nr);
  }
  if (r->kv == KvMode::kShared && r->routing == Routing::kExpertChoice &&
      r->router.capacity[0] < 1.0f) {
    return FieldError(p + "kv", "shared needs every token to run loop 1 (router.capacity[0] >= 1)");
  }
  if (r->kv == KvMode::kShared && r->layer_kind == LayerKind::kRecurrent) {
    return FieldError(p + "kv", "shared is not defined for layer_kind recurrent");
  }
  return absl::OkStatus();
}

// Top-level config.json keys: the ones ParseBase / ParseModelConfig read, and metadata that
// cannot change what the Llama block computes (training-only settings, provenance, the HF
// cache switch). Any other key is a load error that names it: a field this loader does not
// understand may change the math (a looped family's num_loops, a quantization config,
// remote code), so it is never ignored silently.
constexpr const char* kReadKeys[] = {"hidden_size",
                                     "num_hidden_layers",
                                     "num_attention_heads",
                                     "intermediate_size",
                                     "vocab_size",
                                     "num_key_value_heads",
                                     "max_position_embeddings",
                                     "rms_norm_eps",
                                     "rope_theta",
                                     "tie_word_embeddings",
                                     "torch_dtype",
                                     "architectures",
                                     "model_type",
                                     "bos_token_id",
                                     "eos_token_id",
                                     "head_dim",
                                     "rope_scaling",
                                     "hidden_act",
                                     "attention_bias",
                                     "mlp_bias",
                                     "rope_interleaved",
                                     "sliding_window",
                                     "recursion"};
constexpr const char* kMetadataKeys[] = {
    "_name_or_path",  "transformers_version", "initializer_range",
    "use_cache",      "pad_token_id",         "attention_dropout",
    "pretraining_tp", "is_llama_config",      "transformers.js_config",
    "dtype",     // newer transformers' name for torch_dtype: the tensors carry their own dtypes
    "mkmodel"};  // provenance written by `morserve mkmodel` (family, seed, depth mix)
// model_type values and, per model_type, the architectures whose math is the Llama block of
// docs/models.md (nanbeige: the whole stack looped, docs/models.md#nanbeige42).
constexpr const char* kLlamaArchitectures[] = {"LlamaForCausalLM", "MoRLlamaForCausalLM"};
constexpr const char* kNanbeigeArchitectures[] = {"NanbeigeForCausalLM"};
constexpr const char* kOuroArchitectures[] = {"OuroForCausalLM"};
// Ouro's own keys (docs/models.md#ouro): the loop count and exit threshold (read); the
// sliding-window switches and early_exit_step (must be off, checked by ParseOuro); layer
// types (all full attention); max_window_layers (used only with a sliding window); auto_map
// (the remote code whose math this loader implements).
constexpr const char* kOuroKeys[] = {
    "total_ut_steps", "early_exit_threshold", "early_exit_step", "use_sliding_window",
    "layer_types",    "max_window_layers",    "auto_map"};
// Nanbeige4.2's own keys: the loop count and inter-loop norm (read), the layer types (all
// full attention), a training-only weight list, and features of the released code that must
// be off (their truthy values change the math; refused by name).
constexpr const char* kNanbeigeReadKeys[] = {"num_loops", "skip_loop_final_norm", "layer_types",
                                             "loop_loss_weights"};
constexpr const char* kNanbeigeOffKeys[] = {"qk_layernorm",
                                            "emb_neighbor_num",
                                            "insert_ngram_layer_idx",
                                            "ngram_insert_all_layers",
                                            "enable_double_loop_split",
                                            "loop_middle_layers",
                                            "loop_share_kv",
                                            "enable_hyper_connection",
                                            "enable_mhc",
                                            "enable_h_res_identity",
                                            "enable_depth_attention"};

std::string ModelTypeOf(const json& c) {
  auto it = c.find("model_type");
  return it != c.end() && it->is_string() ? it->get<std::string>() : "llama";
}

absl::Status CheckTopLevelKeys(const json& c, const std::string& p) {
  if (auto it = c.find("model_type"); it != c.end() && !it->is_null()) {
    if (!it->is_string() || (*it != "llama" && *it != "nanbeige" && *it != "ouro")) {
      return FieldError(p + "model_type",
                        absl::StrCat(Quote(*it),
                                     " is not supported (supported: llama, nanbeige, ouro, "
                                     "huginn_raven)"));
    }
  }
  const std::string type = ModelTypeOf(c);
  const bool nanbeige = type == "nanbeige", ouro = type == "ouro";
  for (const auto& [key, value] : c.items()) {
    const bool family_key =
        (nanbeige && (OneOf(key, kNanbeigeReadKeys) || OneOf(key, kNanbeigeOffKeys))) ||
        (ouro && OneOf(key, kOuroKeys));
    if (!OneOf(key, kReadKeys) && !OneOf(key, kMetadataKeys) && !family_key) {
      return FieldError(p + key,
                        "not understood by this loader (the model may not be a Llama-block model); "
                        "refusing rather than ignoring it");
    }
  }
  if (auto it = c.find("architectures"); it != c.end() && !it->is_null()) {
    if (!it->is_array()) return FieldError(p + "architectures", "must be an array of strings");
    for (const json& a : *it) {
      const std::string name = a.is_string() ? a.get<std::string>() : "";
      const bool ok = nanbeige ? OneOf(name, kNanbeigeArchitectures)
                      : ouro   ? OneOf(name, kOuroArchitectures)
                               : OneOf(name, kLlamaArchitectures);
      if (!ok) {
        return FieldError(
            p + "architectures",
            absl::StrCat(Quote(a), " is not supported with model_type ", type, " (supported: ",
                         nanbeige ? absl::StrJoin(kNanbeigeArchitectures, ", ")
                         : ouro   ? absl::StrJoin(kOuroArchitectures, ", ")
                                  : absl::StrJoin(kLlamaArchitectures, ", "),
                         ")"));
      }
    }
  }
  if (auto it = c.find("rope_interleaved"); it != c.end() && !it->is_null() && *it != false) {
    return FieldError(p + "rope_interleaved", "only false is supported (RoPE rotates halves)");
  }
  // Ouro (a Qwen2-style config) carries a sliding_window size that only use_sliding_window
  // switches on; ParseOuro refuses that switch.
  if (auto it = c.find("sliding_window"); it != c.end() && !it->is_null() && !ouro) {
    return FieldError(p + "sliding_window", "not supported (full causal attention only)");
  }
  return absl::OkStatus();
}

absl::Status CheckFullAttentionLayers(const json& c, const std::string& p, int num_layers) {
  auto it = c.find("layer_types");
  if (it == c.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_array() || static_cast<int>(it->size()) != num_layers) {
    return FieldError(p + "layer_types",
                      absl::StrCat("must list num_hidden_layers (", num_layers, ") entries"));
  }
  for (const json& t : *it) {
    if (t != "full_attention") {
      return FieldError(p + "layer_types",
                        absl::StrCat(Quote(t), ": only full_attention layers are supported"));
    }
  }
  return absl::OkStatus();
}

// The unrolled depth of `loops` loops over num_hidden_layers: bounded, so the product can
// neither overflow nor ask for an absurd plan.
absl::Status UnrollLoops(const std::string& field, int loops, ModelConfig* m) {
  constexpr int64_t kMaxUnrolledLayers = 1 << 16;
  if (static_cast<int64_t>(m->num_layers) * loops > kMaxUnrolledLayers) {
    return FieldError(field, absl::StrCat(loops, " loops of ", m->num_layers, " layers exceed ",
                                          kMaxUnrolledLayers, " unrolled layers"));
  }
  m->num_layers *= loops;
  return absl::OkStatus();
}

// Nanbeige4.2 (docs/models.md#nanbeige42): num_hidden_layers L stored layers run num_loops N
// times (KV slot n * L + l), RMSNorm(x, model.norm) between loops unless skip_loop_final_norm.
// Expressed as the plan every path already runs: an unrolled depth of N * L, sharing cycle
// with one looped segment of L layers, loop 0's copies stored (the others tied to them).
absl::Status ParseNanbeige(const json& c, ModelConfig* m) {
  const std::string p = "config.json: ";
  int loops = 2;  // NanbeigeConfig's default
  if (auto s = GetInt(c, p, "num_loops", false, &loops); !s.ok()) return s;
  if (loops < 1) return FieldError(p + "num_loops", "must be >= 1");
  bool skip_norm = false;
  if (auto s = GetBool(c, p, "skip_loop_final_norm", &skip_norm); !s.ok()) return s;
  for (const char* key : kNanbeigeOffKeys) {
    if (auto it = c.find(key); it != c.end() && Truthy(*it)) {
      return FieldError(p + key,
                        absl::StrCat(Quote(*it), ": not supported (must be false, 0 or null)"));
    }
  }
  if (auto s = CheckFullAttentionLayers(c, p, m->num_layers); !s.ok()) return s;
  m->model_type = "nanbeige";
  if (loops == 1) return absl::OkStatus();  // one pass: the Llama block as it is
  RecursionConfig& r = m->recursion;
  r.present = true;
  r.num_recursions = loops;
  r.sharing = Sharing::kCycle;
  r.norm_between_loops = !skip_norm;
  return UnrollLoops(p + "num_loops", loops, m);
}

// Ouro (docs/models.md#ouro): num_hidden_layers L sandwich layers run total_ut_steps T times
// (KV slot t * L + l), RMSNorm(x, model.norm) after every loop, and a learned exit gate read
// after each loop in adaptive mode. The plan is Nanbeige's: an unrolled depth of T * L,
// sharing cycle, one looped segment of L layers stored once.
absl::Status ParseOuro(const json& c, ModelConfig* m) {
  const std::string p = "config.json: ";
  int loops = 4;  // OuroConfig's default
  if (auto s = GetInt(c, p, "total_ut_steps", false, &loops); !s.ok()) return s;
  if (loops < 1) return FieldError(p + "total_ut_steps", "must be >= 1");
  float threshold = 1.0f;  // null: the last loop (a cumulative probability never exceeds 1)
  if (auto s = GetFloat(c, p, "early_exit_threshold", &threshold); !s.ok()) return s;
  if (!(threshold > 0)) return FieldError(p + "early_exit_threshold", "must be > 0");
  if (auto it = c.find("early_exit_step"); it != c.end() && !it->is_null()) {
    return FieldError(p + "early_exit_step", "not supported (a fixed exit step; must be null)");
  }
  if (auto it = c.find("use_sliding_window"); it != c.end() && Truthy(*it)) {
    return FieldError(p + "use_sliding_window", "not supported (full causal attention only)");
  }
  if (auto s = CheckFullAttentionLayers(c, p, m->num_layers); !s.ok()) return s;
  if (!c.contains("rms_norm_eps")) m->rms_norm_eps = 1e-6f;  // OuroConfig's default
  m->model_type = "ouro";
  m->sandwich_norm = true;
  if (loops == 1) return absl::OkStatus();  // one pass: no loop, no exit
  RecursionConfig& r = m->recursion;
  r.present = true;
  r.num_recursions = loops;
  r.sharing = Sharing::kCycle;
  r.norm_between_loops = true;
  r.exit_rule = LoopExitRule::kOuroGate;
  r.loop_exit_threshold = threshold;
  return UnrollLoops(p + "total_ut_steps", loops, m);
}

absl::Status ParseBase(const json& c, ModelConfig* m) {
  const std::string p = "config.json: ";
  if (auto s = CheckTopLevelKeys(c, p); !s.ok()) return s;
  for (auto [key, out] :
       {std::pair{"hidden_size", &m->hidden_size}, std::pair{"num_hidden_layers", &m->num_layers},
        std::pair{"num_attention_heads", &m->num_heads},
        std::pair{"intermediate_size", &m->intermediate_size},
        std::pair{"vocab_size", &m->vocab_size}}) {
    if (auto s = GetInt(c, p, key, true, out); !s.ok()) return s;
    if (*out <= 0) return FieldError(p + key, "must be > 0");
  }
  m->num_kv_heads = m->num_heads;
  if (auto s = GetInt(c, p, "num_key_value_heads", false, &m->num_kv_heads); !s.ok()) return s;
  if (auto s = GetInt(c, p, "max_position_embeddings", false, &m->max_position_embeddings);
      !s.ok()) {
    return s;
  }
  if (auto s = GetFloat(c, p, "rms_norm_eps", &m->rms_norm_eps); !s.ok()) return s;
  if (auto s = GetFloat(c, p, "rope_theta", &m->rope_theta); !s.ok()) return s;
  if (auto s = GetBool(c, p, "tie_word_embeddings", &m->tie_word_embeddings); !s.ok()) return s;
  if (auto it = c.find("torch_dtype"); it != c.end() && it->is_string()) m->torch_dtype = *it;
  if (auto it = c.find("architectures"); it != c.end() && it->is_array()) {
    for (const json& a : *it) {
      if (a.is_string()) m->architectures.push_back(a.get<std::string>());
    }
  }
  if (auto s = GetTokenIds(c, "bos_token_id", &m->bos_token_ids); !s.ok()) return s;
  if (auto s = GetTokenIds(c, "eos_token_id", &m->eos_token_ids); !s.ok()) return s;
  if (m->num_kv_heads <= 0 || m->num_heads % m->num_kv_heads != 0) {
    return FieldError(
        p + "num_key_value_heads",
        absl::StrCat(m->num_kv_heads, " does not divide num_attention_heads ", m->num_heads));
  }
  if (c.contains("head_dim") && !c["head_dim"].is_null()) {
    if (auto s = GetInt(c, p, "head_dim", true, &m->head_dim); !s.ok()) return s;
  } else if (m->hidden_size % m->num_heads != 0) {
    return FieldError(p + "num_attention_heads", "does not divide hidden_size");
  } else {
    m->head_dim = m->hidden_size / m->num_heads;
  }
  if (m->head_dim <= 0 || m->head_dim % 2 != 0) {
    return FieldError(p + "head_dim", "must be even and > 0 (RoPE rotates halves)");
  }
  if (!(m->rms_norm_eps > 0)) return FieldError(p + "rms_norm_eps", "must be > 0");
  if (!(m->rope_theta > 0)) return FieldError(p + "rope_theta", "must be > 0");
  if (m->max_position_embeddings <= 0) {
    return FieldError(p + "max_position_embeddings", "must be > 0");
  }
  // Things the Llama block of docs/models.md#the-block does not compute: fail loudly.
  if (auto it = c.find("rope_scaling"); it != c.end() && !it->is_null()) {
    return FieldError(p + "rope_scaling", "not supported (plain RoPE only)");
  }
  if (auto it = c.find("hidden_act"); it != c.end() && *it != "silu") {
    return FieldError(p + "hidden_act", "only silu is supported");
  }
  for (const char* key : {"attention_bias", "mlp_bias"}) {
    if (auto it = c.find(key); it != c.end() && it->is_boolean() && it->get<bool>()) {
      return FieldError(p + key, "biases are not supported");
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<json> ReadJsonFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  json j = json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return absl::InvalidArgumentError(absl::StrCat(path, ": not valid JSON"));
  if (!j.is_object()) return absl::InvalidArgumentError(absl::StrCat(path, ": not a JSON object"));
  return j;
}

}  // namespace

bool LoraConfig::Targets(const std::string& proj) const {
  if (rank <= 0) return false;
  for (const std::string& t : targets) {
    if (t == proj) return true;
  }
  return false;
}

absl::StatusOr<ModelConfig> ParseModelConfig(const json& config, const json* recursion_sidecar) {
  ModelConfig m;
  if (!config.is_object()) return absl::InvalidArgumentError("config.json: not a JSON object");
  const json* rec = nullptr;
  if (auto it = config.find("recursion"); it != config.end() && !it->is_null()) rec = &*it;
  if (rec != nullptr && recursion_sidecar != nullptr) {
    return FieldError("recursion", "given both in config.json and in recursion.json");
  }
  if (rec == nullptr) rec = recursion_sidecar;
  if (ModelTypeOf(config) == "huginn_raven") {  // its own field names: not the Llama keys
    if (rec != nullptr) {
      return FieldError("recursion",
                        "not allowed with model_type huginn_raven (its recurrences are "
                        "config.json's mean_recurrence)");
    }
    if (auto s = ParseHuginnConfig(config, &m); !s.ok()) return s;
    if (auto plan = BuildLayerPlan(m); !plan.ok()) return plan.status();
    return m;
  }
  if (auto s = ParseBase(config, &m); !s.ok()) return s;
  if (ModelTypeOf(config) == "nanbeige") {
    if (rec != nullptr) {
      return FieldError(
          "recursion",
          "not allowed with model_type nanbeige (its loops are config.json's num_loops)");
    }
    if (auto s = ParseNanbeige(config, &m); !s.ok()) return s;
  }
  if (ModelTypeOf(config) == "ouro") {
    if (rec != nullptr) {
      return FieldError(
          "recursion",
          "not allowed with model_type ouro (its loops are config.json's total_ut_steps)");
    }
    if (auto s = ParseOuro(config, &m); !s.ok()) return s;
  }
  if (rec != nullptr) {
    if (auto s = ParseRecursion(*rec, &m.recursion); !s.ok()) return s;
    if (auto s = ValidateRecursion(&m.recursion); !s.ok()) return s;
  }
  // The plan carries the divisibility and single-looped-segment rules.
  if (auto plan = BuildLayerPlan(m); !plan.ok()) return plan.status();
  return m;
}

namespace {

// Huginn's own looped.json keys (docs/checkpoints.md#loopedjson): num_steps (the recurrences
// of full mode and the most of adaptive; re-unrolls the plan), init_scale (s0's scale, 0:
// zeros), exit_criterion (kl, the only one).
absl::Status ApplyHuginnDefaults(const json& looped, ModelConfig* config) {
  const std::string p = "looped.json: ";
  RecursionConfig& r = config->recursion;
  int steps = r.num_recursions;
  if (auto s = GetInt(looped, p, "num_steps", false, &steps); !s.ok()) return s;
  const int core = config->num_layers - r.middle_first - r.middle_last;
  const int per_step = core / r.num_recursions;
  if (steps < 1 || static_cast<int64_t>(steps) * per_step > (1 << 16)) {
    return FieldError(p + "num_steps", absl::StrCat("must be in 1..", (1 << 16) / per_step));
  }
  config->num_layers = r.middle_first + per_step * steps + r.middle_last;
  r.num_recursions = steps;
  if (auto s = GetFloat(looped, p, "init_scale", &config->huginn.init_scale); !s.ok()) return s;
  if (!(config->huginn.init_scale >= 0)) return FieldError(p + "init_scale", "must be >= 0");
  if (auto it = looped.find("exit_criterion");
      it != looped.end() && !it->is_null() && *it != "kl") {
    return FieldError(p + "exit_criterion",
                      absl::StrCat(Quote(*it), " is not supported (only \"kl\")"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ApplyLoopedDefaults(const json& looped, ModelConfig* config) {
  const std::string p = "looped.json: ";
  const bool huginn = config->huginn.enabled;
  if (auto s = CheckKnownKeys(looped, p,
                              huginn ? std::set<std::string>{"mode", "exit_threshold", "num_steps",
                                                             "init_scale", "exit_criterion"}
                                     : std::set<std::string>{"mode", "exit_threshold"});
      !s.ok()) {
    return s;
  }
  RecursionConfig& r = config->recursion;
  if (huginn) {
    if (auto s = ApplyHuginnDefaults(looped, config); !s.ok()) return s;
  }
  if (auto s = GetEnum<LoopMode>(looped, p, "mode",
                                 {{"full", LoopMode::kFull}, {"adaptive", LoopMode::kAdaptive}},
                                 &r.default_loop_mode);
      !s.ok()) {
    return s;
  }
  if (r.default_loop_mode == LoopMode::kAdaptive && r.exit_rule == LoopExitRule::kNone) {
    return FieldError(
        p + "mode",
        absl::StrCat("adaptive needs a looped model with an exit rule (ouro); model_type ",
                     config->model_type, " runs full depth only"));
  }
  if (looped.contains("exit_threshold") && !looped["exit_threshold"].is_null()) {
    if (r.exit_rule == LoopExitRule::kNone) {
      return FieldError(p + "exit_threshold",
                        absl::StrCat("model_type ", config->model_type, " has no exit rule"));
    }
    if (auto s = GetFloat(looped, p, "exit_threshold", &r.loop_exit_threshold); !s.ok()) return s;
    if (!(r.loop_exit_threshold > 0)) return FieldError(p + "exit_threshold", "must be > 0");
  }
  return absl::OkStatus();
}

absl::StatusOr<ModelConfig> LoadModelConfig(const std::string& dir) {
  auto config = ReadJsonFile(dir + "/config.json");
  if (!config.ok()) return config.status();
  absl::StatusOr<ModelConfig> m;
  if (std::ifstream probe(dir + "/recursion.json"); !probe) {
    m = ParseModelConfig(*config, nullptr);
  } else {
    auto sidecar = ReadJsonFile(dir + "/recursion.json");
    if (!sidecar.ok()) return sidecar.status();
    m = ParseModelConfig(*config, &*sidecar);
  }
  if (!m.ok()) return m;
  if (std::ifstream probe(dir + "/looped.json"); probe) {
    auto looped = ReadJsonFile(dir + "/looped.json");
    if (!looped.ok()) return looped.status();
    if (auto s = ApplyLoopedDefaults(*looped, &*m); !s.ok()) return s;
  }
  return m;
}

const char* SharingName(Sharing s) {
  switch (s) {
    case Sharing::kNone:
      return "none";
    case Sharing::kCycle:
      return "cycle";
    case Sharing::kSequence:
      return "sequence";
    case Sharing::kMiddleCycle:
      return "middle_cycle";
    case Sharing::kMiddleSequence:
      return "middle_sequence";
  }
  return "?";
}

const char* RoutingName(Routing r) {
  switch (r) {
    case Routing::kNone:
      return "none";
    case Routing::kExpertChoice:
      return "expert_choice";
    case Routing::kTokenChoice:
      return "token_choice";
    case Routing::kEarlyExit:
      return "early_exit";
  }
  return "?";
}

const char* KvModeName(KvMode k) { return k == KvMode::kShared ? "shared" : "recursion_wise"; }

const char* LoopModeName(LoopMode m) { return m == LoopMode::kAdaptive ? "adaptive" : "full"; }

namespace {
const char* ActivationName(RouterActivation a) {
  switch (a) {
    case RouterActivation::kSigmoid:
      return "sigmoid";
    case RouterActivation::kTanh:
      return "tanh";
    case RouterActivation::kSoftmax:
      return "softmax";
  }
  return "?";
}
}  // namespace

json RecursionToJson(const RecursionConfig& r) {
  json j = {{"num_recursions", r.num_recursions},
            {"sharing", SharingName(r.sharing)},
            {"routing", RoutingName(r.routing)},
            {"kv", KvModeName(r.kv)},
            {"layer_kind", r.layer_kind == LayerKind::kRecurrent ? "recurrent" : "standard"}};
  if (r.routing == Routing::kExpertChoice || r.routing == Routing::kTokenChoice) {
    json router = {{"arch", r.router.arch == RouterArch::kMlp ? "mlp" : "linear"},
                   {"activation", ActivationName(r.router.activation)},
                   {"alpha", r.router.alpha},
                   {"temperature", r.router.temperature},
                   {"threshold", r.router.threshold},
                   {"gating", r.router.gating == Gating::kAdditive ? "additive" : "weighted"}};
    if (r.routing == Routing::kExpertChoice) {
      router["capacity"] = r.router.capacity;
      router["aux_router"] = r.router.aux_router;
    }
    j["router"] = router;
  }
  if (r.lora.rank > 0) {
    j["lora"] = {{"rank", r.lora.rank}, {"alpha", r.lora.alpha}, {"targets", r.lora.targets}};
  }
  if (r.routing == Routing::kEarlyExit) {
    j["early_exit"] = {{"threshold", r.early_exit.threshold},
                       {"exit_kv", r.early_exit.exit_kv == ExitKv::kSkip ? "skip" : "propagate"}};
  }
  return j;
}

}  // namespace morserve
