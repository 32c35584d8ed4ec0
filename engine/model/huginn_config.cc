// Huginn-0125's config.json (see huginn_config.h); the math it selects is
// docs/models.md#huginn-0125.
#include "engine/model/huginn_config.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/model/config_json.h"

namespace morserve {
namespace {

using nlohmann::json;
using namespace config_json;  // NOLINT(google-build-using-namespace): the shared field readers

// Fields read (their values checked), and fields of the released config that describe
// training or provenance only (ignored).
constexpr const char* kReadKeys[] = {"model_type",
                                     "architectures",
                                     "n_embd",
                                     "hidden_size",
                                     "num_attention_heads",
                                     "n_heads",
                                     "num_key_value_heads",
                                     "head_dim",
                                     "intermediate_size",
                                     "vocab_size",
                                     "padded_vocab_size",
                                     "block_size",
                                     "norm_eps",
                                     "rope_base",
                                     "qk_bias",
                                     "qk_norm",
                                     "bias",
                                     "tie_embeddings",
                                     "tie_word_embeddings",
                                     "n_layers_in_prelude",
                                     "n_layers_in_recurrent_block",
                                     "n_layers_in_coda",
                                     "n_layers",
                                     "mean_recurrence",
                                     "injection_type",
                                     "state_init",
                                     "block_class_name",
                                     "mlp_class_name",
                                     "nonlin_name",
                                     "norm_class_name",
                                     "test_time_noise",
                                     "bos_token_id",
                                     "eos_token_id",
                                     "torch_dtype"};
constexpr const char* kIgnoredKeys[] = {"name",
                                        "hf_config",
                                        "auto_map",
                                        "transformers_version",
                                        "_name_or_path",
                                        "padding_multiple",
                                        "architecture_class_name",
                                        "init_strategy",
                                        "init_orthogonal",
                                        "init_values",
                                        "mean_backprop_depth",
                                        "effective_expected_depth",
                                        "sampling_scheme",
                                        "activation_checkpoint_impl",
                                        "test_time_noise_type",
                                        "use_cache",
                                        "pad_token_id",
                                        "dtype",
                                        "mkmodel"};

// A string field that must have the released value (absent: that value).
absl::Status RequireString(const json& c, const std::string& p, const char* key, const char* want) {
  auto it = c.find(key);
  if (it == c.end() || it->is_null() || *it == want) return absl::OkStatus();
  return FieldError(p + key, absl::StrCat(Quote(*it), " is not supported (only \"", want, "\")"));
}

// An integer read under either of two names (the config's own and its HF alias).
absl::Status GetAliased(const json& c, const std::string& p, const char* key, const char* alias,
                        int* out) {
  if (c.contains(key) && c.contains(alias) && c[key] != c[alias]) {
    return FieldError(p + alias, absl::StrCat("differs from ", key));
  }
  if (auto s = GetInt(c, p, c.contains(key) ? key : alias, true, out); !s.ok()) return s;
  if (*out <= 0) return FieldError(p + key, "must be > 0");
  return absl::OkStatus();
}

absl::Status CheckKeys(const json& c, const std::string& p) {
  for (const auto& [key, value] : c.items()) {
    if (!OneOf(key, kReadKeys) && !OneOf(key, kIgnoredKeys)) {
      return FieldError(p + key,
                        "not understood by the huginn_raven loader; refusing rather than "
                        "ignoring it");
    }
  }
  if (auto it = c.find("architectures"); it != c.end() && !it->is_null()) {
    if (!it->is_array()) return FieldError(p + "architectures", "must be an array of strings");
    for (const json& a : *it) {
      if (a != "RavenForCausalLM") {
        return FieldError(p + "architectures",
                          absl::StrCat(Quote(a),
                                       " is not supported with model_type huginn_raven "
                                       "(supported: RavenForCausalLM)"));
      }
    }
  }
  for (auto [key, want] :
       {std::pair{"injection_type", "linear"}, std::pair{"state_init", "like-init"},
        std::pair{"block_class_name", "SandwichBlock"}, std::pair{"mlp_class_name", "GatedMLP"},
        std::pair{"nonlin_name", "SiLU"}, std::pair{"norm_class_name", "RMSNorm_llama"}}) {
    if (auto s = RequireString(c, p, key, want); !s.ok()) return s;
  }
  for (const char* key : {"bias", "qk_norm", "test_time_noise"}) {
    if (auto it = c.find(key); it != c.end() && Truthy(*it)) {
      return FieldError(p + key,
                        absl::StrCat(Quote(*it), ": not supported (must be false, 0 or null)"));
    }
  }
  return absl::OkStatus();
}

absl::Status ParseSizes(const json& c, const std::string& p, ModelConfig* m) {
  if (auto s = GetAliased(c, p, "n_embd", "hidden_size", &m->hidden_size); !s.ok()) return s;
  if (auto s = GetAliased(c, p, "num_attention_heads", "n_heads", &m->num_heads); !s.ok()) return s;
  for (auto [key, out] : {std::pair{"intermediate_size", &m->intermediate_size},
                          std::pair{"vocab_size", &m->vocab_size}}) {
    if (auto s = GetInt(c, p, key, true, out); !s.ok()) return s;
    if (*out <= 0) return FieldError(p + key, "must be > 0");
  }
  if (m->hidden_size % m->num_heads != 0 || (m->hidden_size / m->num_heads) % 2 != 0) {
    return FieldError(p + "num_attention_heads", "must divide n_embd into an even head dimension");
  }
  m->head_dim = m->hidden_size / m->num_heads;
  m->num_kv_heads = m->num_heads;  // the released code forces MHA
  int v = m->num_kv_heads;
  if (auto s = GetInt(c, p, "num_key_value_heads", false, &v); !s.ok()) return s;
  if (v != m->num_heads)
    return FieldError(p + "num_key_value_heads", "must equal num_attention_heads");
  int hd = m->head_dim;
  if (auto s = GetInt(c, p, "head_dim", false, &hd); !s.ok()) return s;
  if (hd != m->head_dim)
    return FieldError(p + "head_dim", "must equal n_embd / num_attention_heads");
  int padded = m->vocab_size;
  if (auto s = GetInt(c, p, "padded_vocab_size", false, &padded); !s.ok()) return s;
  if (padded != m->vocab_size) return FieldError(p + "padded_vocab_size", "must equal vocab_size");
  m->max_position_embeddings = 4096;
  if (auto s = GetInt(c, p, "block_size", false, &m->max_position_embeddings); !s.ok()) return s;
  if (m->max_position_embeddings <= 0) return FieldError(p + "block_size", "must be > 0");
  m->rms_norm_eps = 1e-6f;
  if (auto s = GetFloat(c, p, "norm_eps", &m->rms_norm_eps); !s.ok()) return s;
  if (!(m->rms_norm_eps > 0)) return FieldError(p + "norm_eps", "must be > 0");
  m->rope_theta = 50000.0f;  // absent from the released json: the code's default
  if (auto s = GetFloat(c, p, "rope_base", &m->rope_theta); !s.ok()) return s;
  if (!(m->rope_theta > 0)) return FieldError(p + "rope_base", "must be > 0");
  return absl::OkStatus();
}

// Prelude P + core C x mean_recurrence + coda D as middle_cycle with P and D unique layers.
absl::Status ParsePlan(const json& c, const std::string& p, ModelConfig* m) {
  int prelude = 2, core = 4, coda = 2, steps = 32;
  for (auto [key, out] :
       {std::pair{"n_layers_in_prelude", &prelude}, std::pair{"n_layers_in_recurrent_block", &core},
        std::pair{"n_layers_in_coda", &coda}, std::pair{"mean_recurrence", &steps}}) {
    if (auto s = GetInt(c, p, key, false, out); !s.ok()) return s;
    if (*out < 1) return FieldError(p + key, "must be >= 1");
  }
  int stored = prelude + core + coda;
  if (auto s = GetInt(c, p, "n_layers", false, &stored); !s.ok()) return s;
  if (stored != prelude + core + coda) {
    return FieldError(p + "n_layers",
                      absl::StrCat("must be n_layers_in_prelude + "
                                   "n_layers_in_recurrent_block + n_layers_in_coda (",
                                   prelude + core + coda, ")"));
  }
  constexpr int64_t kMaxUnrolledLayers = 1 << 16;
  if (static_cast<int64_t>(core) * steps + prelude + coda > kMaxUnrolledLayers) {
    return FieldError(p + "mean_recurrence",
                      absl::StrCat(steps, " recurrences of ", core, " layers exceed ",
                                   kMaxUnrolledLayers, " unrolled layers"));
  }
  m->num_layers = prelude + core * steps + coda;
  RecursionConfig& r = m->recursion;
  r.present = true;
  r.num_recursions = steps;
  r.sharing = Sharing::kMiddleCycle;
  r.middle_first = prelude;
  r.middle_last = coda;
  r.exit_rule = LoopExitRule::kHuginnKl;
  r.loop_exit_threshold = 1e-3f;  // the released generate()'s "auto"
  return absl::OkStatus();
}

}  // namespace

absl::Status ParseHuginnConfig(const json& c, ModelConfig* m) {
  const std::string p = "config.json: ";
  if (auto s = CheckKeys(c, p); !s.ok()) return s;
  if (auto s = ParseSizes(c, p, m); !s.ok()) return s;
  if (auto s = ParsePlan(c, p, m); !s.ok()) return s;
  bool qk_bias = true, tie = true;
  if (auto s = GetBool(c, p, "qk_bias", &qk_bias); !s.ok()) return s;
  if (auto s = GetBool(c, p, "tie_embeddings", &tie); !s.ok()) return s;
  bool tie_hf = tie;
  if (auto s = GetBool(c, p, "tie_word_embeddings", &tie_hf); !s.ok()) return s;
  if (tie_hf != tie) return FieldError(p + "tie_word_embeddings", "differs from tie_embeddings");
  m->tie_word_embeddings = tie;
  if (auto it = c.find("torch_dtype"); it != c.end() && it->is_string()) m->torch_dtype = *it;
  if (auto s = GetTokenIds(c, "bos_token_id", &m->bos_token_ids); !s.ok()) return s;
  if (auto s = GetTokenIds(c, "eos_token_id", &m->eos_token_ids); !s.ok()) return s;
  m->model_type = "huginn_raven";
  m->architectures = {"RavenForCausalLM"};
  HuginnConfig& h = m->huginn;
  h.enabled = true;
  h.embed_scale = std::sqrt(static_cast<float>(m->hidden_size));
  h.residual_norm = true;
  h.qk_bias = qk_bias;
  h.rope_pairs = true;
  h.input_injection = true;
  return absl::OkStatus();
}

}  // namespace morserve
