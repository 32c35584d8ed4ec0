// Tiny random model writer (see mkmodel.h). Three steps: the family's defaults and the
// user's overrides become a config.json (validated by ParseModelConfig); the layer plan of
// that config says which layer copies exist; each copy's tensors are named in the family's
// official layout and filled from a per-role RNG, so copies meant to be equal are equal
// byte for byte and untied copies differ.
#include "engine/tools/mkmodel.h"

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "engine/io/safetensors_writer.h"
#include "engine/model/layer_plan.h"
#include "engine/tokenizer/tokenizer.h"
#include "engine/tools/commands.h"
#include "engine/tools/depth_mix.h"

namespace morserve {
namespace {

using nlohmann::json;

constexpr float kEmbedStd = 0.4f;  // logits std ~ 0.4 * sqrt(hidden): peaked, not flat
constexpr double kGeluOne = 0.8413447460685429;  // exact-erf GELU(1)

struct FamilyDefaults {
  const char* name;
  const char* sharing;
  const char* routing;
  const char* layer_kind;
  int lora_rank;
  bool untied_attention;
};

constexpr FamilyDefaults kFamilies[] = {
    {"vanilla", "none", "none", "standard", 0, false},
    {"recursive-cycle", "cycle", "none", "standard", 0, false},
    {"recursive-sequence", "sequence", "none", "standard", 0, false},
    {"recursive-middle-cycle", "middle_cycle", "none", "standard", 0, false},
    {"recursive-middle-sequence", "middle_sequence", "none", "standard", 0, false},
    {"recursive-untied-attn", "cycle", "none", "standard", 0, true},
    {"relaxed-lora", "cycle", "none", "standard", 4, false},
    {"mor-ec", "middle_cycle", "expert_choice", "standard", 0, false},
    {"mor-tc", "middle_cycle", "token_choice", "standard", 0, false},
    {"early-exit", "middle_cycle", "early_exit", "standard", 0, false},
    {"recurrent", "none", "none", "recurrent", 0, false},
    // Nanbeige4.2's layout (docs/checkpoints.md#nanbeige42): config.json model_type nanbeige
    // with num_loops, HF Llama names for the stored stack only.
    {"nanbeige", "cycle", "none", "standard", 0, false},
    // Ouro's layout (docs/checkpoints.md#ouro): model_type ouro with total_ut_steps, sandwich
    // norms, the exit gate; the stored stack only.
    {"ouro", "cycle", "none", "standard", 0, false},
    // Huginn-0125's layout (docs/checkpoints.md#huginn-0125): model_type huginn_raven,
    // transformer.{prelude,core_block,coda}.{k}.* SandwichBlocks, the adapter, ln_f.
    {"huginn", "middle_cycle", "none", "standard", 0, false},
};

// A spec with the family's defaults filled in.
struct Resolved {
  TinyModelSpec spec;
  std::string sharing;
  std::string routing;
  int recursions = 1;
  int layers = 0;
};

absl::StatusOr<Resolved> Resolve(const TinyModelSpec& spec) {
  const FamilyDefaults* f = nullptr;
  for (const FamilyDefaults& c : kFamilies) {
    if (spec.family == c.name) f = &c;
  }
  if (f == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("mkmodel: unknown family '", spec.family,
                     "' (known: ", absl::StrJoin(TinyModelFamilies(), ", "), ")"));
  }
  Resolved r{spec, spec.sharing.empty() ? f->sharing : spec.sharing, f->routing, 1, spec.layers};
  TinyModelSpec& s = r.spec;
  if (s.layer_kind.empty()) s.layer_kind = f->layer_kind;
  if (s.lora_rank < 0) s.lora_rank = f->lora_rank;
  if (s.lora_alpha < 0) s.lora_alpha = 2.0f * static_cast<float>(s.lora_rank);
  if (s.lora_targets.empty()) s.lora_targets = {"q_proj", "v_proj"};
  s.untied_attention = s.untied_attention || f->untied_attention;
  if (s.activation.empty()) s.activation = r.routing == "token_choice" ? "softmax" : "sigmoid";
  if (s.alpha < 0) s.alpha = r.routing == "token_choice" ? 1.0f : 0.1f;
  r.recursions = r.sharing == "none" ? 1 : s.recursions;
  if (s.family == "huginn") {
    // Prelude P, core C x --recursions (mean_recurrence), coda D; --layers is the unrolled
    // P + C x r + D (default C = 2). MHA with head_dim hidden / heads, as released.
    if (s.prelude_layers < 1 || s.coda_layers < 1) {
      return absl::InvalidArgumentError("mkmodel: --prelude and --coda must be >= 1");
    }
    if (r.sharing != "middle_cycle" || s.head_dim > 0 || s.lora_rank != 0 || s.untied_attention ||
        s.layer_kind != "standard" || s.kv != "recursion_wise") {
      return absl::InvalidArgumentError(
          "mkmodel: huginn has its own plan: no --sharing, --head-dim, LoRA, --untied-attn, "
          "--layer-kind or --kv shared");
    }
    s.kv_heads = s.heads;
    const int ends = s.prelude_layers + s.coda_layers;
    if (r.layers <= 0) r.layers = ends + 2 * r.recursions;
    if (r.layers <= ends || (r.layers - ends) % r.recursions != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("mkmodel: huginn --layers must be --prelude + --coda + a multiple of "
                       "--recursions, got ",
                       r.layers));
    }
  } else if (s.prelude_layers != 2 || s.coda_layers != 2) {
    return absl::InvalidArgumentError("mkmodel: --prelude and --coda are huginn options");
  }
  if (r.layers <= 0) {
    const bool middle = r.sharing == "middle_cycle" || r.sharing == "middle_sequence";
    r.layers = r.sharing == "none" ? 4 : 2 * r.recursions + (middle ? 2 : 0);
  }
  if (s.family == "nanbeige" || s.family == "ouro") {
    // The whole stack looped: only --recursions (num_loops / total_ut_steps), --layers
    // (unrolled: loops x the stored stack), --head-dim and the family's own knobs shape it.
    if (r.sharing != "cycle" || s.kv != "recursion_wise" || s.lora_rank != 0 ||
        s.untied_attention || s.layer_kind != "standard") {
      return absl::InvalidArgumentError(
          absl::StrCat("mkmodel: ", s.family,
                       " loops its whole stack with per-loop KV: no --sharing, --kv shared, LoRA, "
                       "--untied-attn or --layer-kind"));
    }
    s.first_copy_only = true;  // the checkpoint stores the L layers once
  }
  if (!s.loop_mode.empty() && s.loop_mode != "full" && s.loop_mode != "adaptive") {
    return absl::InvalidArgumentError(
        absl::StrCat("mkmodel: --loop-mode must be full or adaptive, got '", s.loop_mode, "'"));
  }
  if (s.family != "nanbeige" && s.skip_loop_final_norm) {
    return absl::InvalidArgumentError("mkmodel: --skip-loop-final-norm is a nanbeige option");
  }
  if (s.shards < 1) return absl::InvalidArgumentError("mkmodel: --shards must be >= 1");
  if (!s.depth_mix.empty()) {
    if (r.routing == "none") {
      return absl::InvalidArgumentError(absl::StrCat(
          "mkmodel: --depth-mix needs a family with routers or early exit (mor-ec, mor-tc, "
          "early-exit), not ",
          s.family));
    }
    if (auto st = CheckDepthMix(s.depth_mix, r.recursions); !st.ok()) return st;
    if (s.router_bias != 0.0f) {
      return absl::InvalidArgumentError(
          "mkmodel: --depth-mix sets the router scores: drop --router-bias");
    }
    if (!s.capacity.empty()) {
      return absl::InvalidArgumentError(
          "mkmodel: --depth-mix sets the capacities: drop --capacity");
    }
    if (r.routing == "expert_choice") s.capacity = DepthMixCapacity(s.depth_mix);
  }
  return r;
}

// Floats as the user would write them in JSON (0.1, not 0.10000000149011612).
double Clean(float f) { return std::stod(absl::StrCat(f)); }

json RecursionJson(const Resolved& r) {
  const TinyModelSpec& s = r.spec;
  json j = {{"num_recursions", r.recursions},
            {"sharing", r.sharing},
            {"routing", r.routing},
            {"kv", s.kv},
            {"layer_kind", s.layer_kind}};
  if (r.routing == "expert_choice" || r.routing == "token_choice") {
    json router = {{"arch", s.router},   {"activation", s.activation}, {"alpha", Clean(s.alpha)},
                   {"temperature", 1.0}, {"threshold", 0.0},           {"gating", s.gating}};
    if (r.routing == "expert_choice") {
      router["aux_router"] = s.aux_router;
      if (!s.capacity.empty()) {
        json cap = json::array();
        for (float c : s.capacity) cap.push_back(Clean(c));
        router["capacity"] = cap;
      }
    }
    j["router"] = router;
  }
  if (s.lora_rank > 0) {
    j["lora"] = {
        {"rank", s.lora_rank}, {"alpha", Clean(s.lora_alpha)}, {"targets", s.lora_targets}};
  }
  if (r.routing == "early_exit") {
    j["early_exit"] = {{"threshold", Clean(s.exit_threshold)}, {"exit_kv", s.exit_kv}};
  }
  return j;
}

const char* TorchDtype(DType t) {
  switch (t) {
    case DType::kF32:
      return "float32";
    case DType::kF16:
      return "float16";
    default:
      return "bfloat16";
  }
}

// Huginn-0125's config.json (raven_config_minimal): its own field names, the released
// values of the fixed ones, and the training-only fields it carries.
json HuginnConfigJson(const Resolved& r) {
  const TinyModelSpec& s = r.spec;
  const int core = (r.layers - s.prelude_layers - s.coda_layers) / r.recursions;
  return {{"architectures", {"RavenForCausalLM"}},
          {"model_type", "huginn_raven"},
          {"n_embd", s.hidden},
          {"num_attention_heads", s.heads},
          {"num_key_value_heads", s.heads},
          {"intermediate_size", s.intermediate},
          {"vocab_size", s.vocab},
          {"padded_vocab_size", s.vocab},
          {"block_size", s.max_pos},
          {"norm_eps", 1e-6},
          {"rope_base", 50000},
          {"qk_bias", true},
          {"bias", false},
          {"tie_embeddings", s.tie_embeddings},
          {"n_layers_in_prelude", s.prelude_layers},
          {"n_layers_in_recurrent_block", core},
          {"n_layers_in_coda", s.coda_layers},
          {"n_layers", s.prelude_layers + core + s.coda_layers},
          {"mean_recurrence", r.recursions},
          {"injection_type", "linear"},
          {"state_init", "like-init"},
          {"block_class_name", "SandwichBlock"},
          {"mlp_class_name", "GatedMLP"},
          {"nonlin_name", "SiLU"},
          {"norm_class_name", "RMSNorm_llama"},
          {"init_strategy", "takase"},
          {"mean_backprop_depth", 8},
          {"sampling_scheme", "poisson-lognormal-filling"},
          {"torch_dtype", TorchDtype(s.dtype)},
          {"bos_token_id", s.bos_token_id >= 0 ? json(s.bos_token_id) : json(nullptr)},
          {"eos_token_id",
           s.eos_token_ids.size() == 1 ? json(s.eos_token_ids[0]) : json(s.eos_token_ids)},
          {"mkmodel", {{"family", s.family}, {"seed", s.seed}}}};
}

json ConfigJson(const Resolved& r) {
  const TinyModelSpec& s = r.spec;
  if (s.family == "huginn") return HuginnConfigJson(r);
  json j = {
      {"architectures", {"LlamaForCausalLM"}},
      {"model_type", "llama"},
      {"hidden_size", s.hidden},
      {"intermediate_size", s.intermediate},
      {"num_hidden_layers", r.layers},
      {"num_attention_heads", s.heads},
      {"num_key_value_heads", s.kv_heads},
      {"vocab_size", s.vocab},
      {"max_position_embeddings", s.max_pos},
      {"rms_norm_eps", 1e-5},
      {"rope_theta", 10000.0},
      {"hidden_act", "silu"},
      {"tie_word_embeddings", s.tie_embeddings},
      {"torch_dtype", TorchDtype(s.dtype)},
      {"bos_token_id", s.bos_token_id >= 0 ? json(s.bos_token_id) : json(nullptr)},
      {"eos_token_id",
       s.eos_token_ids.size() == 1 ? json(s.eos_token_ids[0]) : json(s.eos_token_ids)},
      {"mkmodel", {{"family", s.family}, {"seed", s.seed}, {"router_bias", Clean(s.router_bias)}}}};
  if (!s.depth_mix.empty()) {
    json mix = json::array();
    for (float f : s.depth_mix) mix.push_back(Clean(f));
    j["mkmodel"]["depth_mix"] = mix;
  }
  if (s.head_dim > 0) j["head_dim"] = s.head_dim;
  if (s.family == "nanbeige") {
    j["model_type"] = "nanbeige";
    j["architectures"] = {"NanbeigeForCausalLM"};
    j["num_hidden_layers"] = r.layers / r.recursions;
    j["num_loops"] = r.recursions;
    j["skip_loop_final_norm"] = s.skip_loop_final_norm;
    j["layer_types"] = std::vector<std::string>(r.layers / r.recursions, "full_attention");
    return j;
  }
  if (s.family == "ouro") {  // OuroConfig (Qwen2-style): sliding window present but off
    j["model_type"] = "ouro";
    j["architectures"] = {"OuroForCausalLM"};
    j["num_hidden_layers"] = r.layers / r.recursions;
    j["total_ut_steps"] = r.recursions;
    j["early_exit_threshold"] = Clean(s.exit_threshold);
    j["rms_norm_eps"] = 1e-6;
    j["use_sliding_window"] = false;
    j["sliding_window"] = s.max_pos;
    j["max_window_layers"] = r.layers / r.recursions;
    j["layer_types"] = std::vector<std::string>(r.layers / r.recursions, "full_attention");
    return j;
  }
  const bool vanilla =
      r.sharing == "none" && r.routing == "none" && s.layer_kind == "standard" && s.lora_rank == 0;
  if (!vanilla) j["recursion"] = RecursionJson(r);
  return j;
}

// ---- Random values ---------------------------------------------------------------------

uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

uint64_t Fnv1a(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

// n samples of N(mean, std), from a generator seeded by (seed, role) only.
std::vector<float> Normal(uint64_t seed, const std::string& role, int64_t n, double std,
                          double mean = 0.0) {
  std::mt19937_64 rng(SplitMix64(seed ^ Fnv1a(role)));
  auto uniform = [&rng] { return (static_cast<double>(rng() >> 11) + 0.5) * 0x1.0p-53; };
  std::vector<float> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; i += 2) {
    const double radius = std::sqrt(-2.0 * std::log(uniform()));
    const double angle = 2.0 * M_PI * uniform();
    out[i] = static_cast<float>(mean + std * radius * std::cos(angle));
    if (i + 1 < n) out[i + 1] = static_cast<float>(mean + std * radius * std::sin(angle));
  }
  return out;
}

// ---- Layout ---------------------------------------------------------------------------

const char* const kProjModules[] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                                    "self_attn.o_proj", "mlp.gate_proj",    "mlp.up_proj",
                                    "mlp.down_proj"};
const char* const kProjNames[] = {"q_proj",    "k_proj",  "v_proj",   "o_proj",
                                  "gate_proj", "up_proj", "down_proj"};

class TensorWriter {
 public:
  TensorWriter(const Resolved& r, const ModelConfig& c, const LayerPlan& plan, const DepthMix* mix)
      : s_(r.spec), c_(c), plan_(plan), routing_(c.recursion.routing), mix_(mix) {}

  std::vector<OwnedTensor> Build();

 private:
  void Add(const std::string& name, std::vector<int64_t> shape, const std::vector<float>& values,
           DType dtype) {
    out_.push_back(OwnedTensor::FromF32(name, dtype, std::move(shape), values));
  }
  void Add(const std::string& name, std::vector<int64_t> shape, const std::vector<float>& values) {
    Add(name, std::move(shape), values, s_.dtype);
  }
  // The hidden channel 0 is held constant in expert-choice models (router bias, see .h).
  bool ConstantChannel() const { return routing_ == Routing::kExpertChoice; }
  void AddLayerCopy(const std::string& prefix, int segment, int loop, int k);
  void AddExpertRouter(const std::string& prefix, const std::string& role, int loop);
  void AddTokenRouter(const std::string& layer);
  void AddUnrolled();
  void AddMor();
  void AddHuginnBlock(const std::string& prefix, const std::string& role);
  std::vector<OwnedTensor> BuildHuginn();

  const TinyModelSpec& s_;
  const ModelConfig& c_;
  const LayerPlan& plan_;
  const Routing routing_;
  const DepthMix* mix_;  // nullptr: no --depth-mix
  std::vector<OwnedTensor> out_;
};

void TensorWriter::AddLayerCopy(const std::string& prefix, int segment, int loop, int k) {
  const int64_t h = c_.hidden_size, q = c_.q_dim(), kv = c_.kv_dim(), inter = c_.intermediate_size;
  const std::string role = absl::StrCat("segment", segment, ".layer", k, ".");
  const bool looped = plan_.segments[segment].looped();
  std::vector<const char*> norms = {"input_layernorm", "post_attention_layernorm"};
  if (c_.sandwich_norm) {
    norms.push_back("input_layernorm_2");
    norms.push_back("post_attention_layernorm_2");
  }
  for (const char* norm : norms) {
    std::vector<float> w = Normal(s_.seed, role + norm, h, 0.1, 1.0);
    if (mix_ && std::string(norm) == "post_attention_layernorm") mix_->PostAttentionNorm(&w);
    Add(prefix + norm + ".weight", {h}, w);
  }
  const LayerPlace place = !looped && segment < plan_.looped_segment ? LayerPlace::kBefore
                           : looped                                  ? LayerPlace::kLooped
                                                                     : LayerPlace::kAfter;
  const std::vector<int64_t> shapes[] = {{q, h},     {kv, h},    {kv, h},   {h, q},
                                         {inter, h}, {inter, h}, {h, inter}};
  for (int p = 0; p < 7; ++p) {
    const std::vector<int64_t>& shape = shapes[p];
    std::string proj_role = role + kProjNames[p];
    if (s_.untied_attention && looped && p <= 3) absl::StrAppend(&proj_role, ".loop", loop);
    // Residual writers get a smaller scale so the stream stays tame over many layers.
    const double std = (p == 3 || p == 6 ? 0.5 : 1.0) / std::sqrt(static_cast<double>(shape[1]));
    std::vector<float> w = Normal(s_.seed, proj_role, shape[0] * shape[1], std);
    if (ConstantChannel() && (p == 3 || p == 6)) {
      std::fill(w.begin(), w.begin() + shape[1], 0.0f);  // nothing writes hidden channel 0
    }
    if (mix_) mix_->Projection(p, place, shape[0], shape[1], &w);
    const std::string key = prefix + kProjModules[p];
    if (!(looped && c_.recursion.lora.Targets(kProjNames[p]))) {
      Add(key + ".weight", shape, w);
      continue;
    }
    const int64_t rank = c_.recursion.lora.rank;
    const std::string lora_role = absl::StrCat(proj_role, ".loop", loop, ".lora_");
    Add(key + ".base_layer.weight", shape, w);
    std::vector<float> a =
        Normal(s_.seed, lora_role + "A", rank * shape[1], 1.0 / std::sqrt(double(shape[1])));
    std::vector<float> b = Normal(s_.seed, lora_role + "B", shape[0] * rank, 0.05);
    if (mix_) {
      mix_->LoraA(p, rank, shape[1], &a);
      mix_->LoraB(p, shape[0], rank, &b);
    }
    Add(key + ".lora_A.default.weight", {rank, shape[1]}, a);
    Add(key + ".lora_B.default.weight", {shape[0], rank}, b);
  }
}

// Expert-choice router (or aux router) of one loop, scoring the hidden state; carries the
// router bias on hidden channel 0 (see mkmodel.h).
void TensorWriter::AddExpertRouter(const std::string& prefix, const std::string& role, int loop) {
  const int64_t h = c_.hidden_size;
  const float bias = s_.router_bias;
  if (c_.recursion.router.arch == RouterArch::kLinear) {
    std::vector<float> w = Normal(s_.seed, role, h, 1.0 / std::sqrt(double(h)));
    w[0] = bias;
    if (mix_) mix_->ExpertRouter(loop, &w);
    Add(prefix + ".weight", {1, h}, w);
    return;
  }
  std::vector<float> w1 = Normal(s_.seed, role + ".0", 2 * h * h, 1.0 / std::sqrt(double(h)));
  for (int64_t i = 0; i < 2 * h; ++i) w1[i * h] = 0.0f;  // only unit 0 reads channel 0
  std::fill(w1.begin(), w1.begin() + h, 0.0f);
  w1[0] = 1.0f;
  std::vector<float> w2 = Normal(s_.seed, role + ".2", 2 * h, 1.0 / std::sqrt(double(2 * h)));
  w2[0] = static_cast<float>(bias / kGeluOne);
  if (mix_) mix_->ExpertRouter(loop, &w1, &w2);
  Add(prefix + ".0.weight", {2 * h, h}, w1);
  Add(prefix + ".2.weight", {1, 2 * h}, w2);
}

void TensorWriter::AddTokenRouter(const std::string& layer) {
  const int64_t h = c_.hidden_size, nr = c_.recursion.num_recursions;
  const std::string prefix = layer + "mor_router.router";
  if (c_.recursion.router.arch == RouterArch::kLinear) {
    std::vector<float> w = Normal(s_.seed, "tc_router", nr * h, 1.0 / std::sqrt(h));
    if (mix_) mix_->TokenRouter(&w);
    Add(prefix + ".weight", {nr, h}, w);
  } else {
    std::vector<float> w1 = Normal(s_.seed, "tc_router.0", 2 * h * h, 1.0 / std::sqrt(double(h)));
    std::vector<float> w2 =
        Normal(s_.seed, "tc_router.2", nr * 2 * h, 1.0 / std::sqrt(double(2 * h)));
    if (mix_) mix_->TokenRouter(&w1, &w2);
    Add(prefix + ".0.weight", {2 * h, h}, w1);
    Add(prefix + ".2.weight", {nr, 2 * h}, w2);
  }
  std::vector<float> bias(nr);
  for (int64_t i = 0; i < nr; ++i) bias[i] = s_.router_bias * static_cast<float>(i);
  Add(layer + "router_bias", {nr}, bias, DType::kF32);
}

// model.layers.{j} for every unrolled layer j (Hugging Face / plain Recursive / PEFT).
void TensorWriter::AddUnrolled() {
  for (int s = 0; s < static_cast<int>(plan_.segments.size()); ++s) {
    const Segment& seg = plan_.segments[s];
    for (int loop = 0; loop < seg.loops; ++loop) {
      if (loop > 0 && s_.first_copy_only) break;
      for (int k = 0; k < seg.num_layers; ++k) {
        AddLayerCopy(absl::StrCat("model.layers.", plan_.UnrolledLayer(s, loop, k), "."), s, loop,
                     k);
      }
    }
  }
}

// Official MoR layouts: unique layers take one model.layers index each, an expert-choice
// segment one per loop (.block.{k}), a token-choice segment one in all (.block_list.{r}.{k}).
void TensorWriter::AddMor() {
  int index = 0;
  for (int s = 0; s < static_cast<int>(plan_.segments.size()); ++s) {
    const Segment& seg = plan_.segments[s];
    if (!seg.looped()) {
      for (int k = 0; k < seg.num_layers; ++k) {
        AddLayerCopy(absl::StrCat("model.layers.", index++, "."), s, 0, k);
      }
      continue;
    }
    const int copies = s_.first_copy_only ? 1 : seg.loops;
    if (routing_ == Routing::kTokenChoice) {
      const std::string layer = absl::StrCat("model.layers.", index++, ".");
      for (int loop = 0; loop < copies; ++loop) {
        for (int k = 0; k < seg.num_layers; ++k) {
          AddLayerCopy(absl::StrCat(layer, "block_list.", loop, ".", k, "."), s, loop, k);
        }
      }
      AddTokenRouter(layer);
      continue;
    }
    for (int loop = 0; loop < seg.loops; ++loop) {
      const std::string layer = absl::StrCat("model.layers.", index + loop, ".");
      for (int k = 0; loop < copies && k < seg.num_layers; ++k) {
        AddLayerCopy(absl::StrCat(layer, "block.", k, "."), s, loop, k);
      }
      AddExpertRouter(layer + "mor_router.router", absl::StrCat("router.loop", loop), loop);
      if (c_.recursion.router.aux_router) {
        AddExpertRouter(layer + "mlp_router", absl::StrCat("aux_router.loop", loop), loop);
      }
    }
    index += seg.loops;
  }
}

// One SandwichBlock of Huginn's layout (norm_1..norm_4, fused Wqkv and fc, qk_bias).
void TensorWriter::AddHuginnBlock(const std::string& prefix, const std::string& role) {
  const int64_t h = c_.hidden_size, inter = c_.intermediate_size;
  for (int n = 1; n <= 4; ++n) {
    Add(absl::StrCat(prefix, "norm_", n, ".weight"), {h},
        Normal(s_.seed, absl::StrCat(role, "norm_", n), h, 0.1, 1.0));
  }
  const double in_std = 1.0 / std::sqrt(static_cast<double>(h));
  Add(prefix + "attn.Wqkv.weight", {3 * h, h}, Normal(s_.seed, role + "Wqkv", 3 * h * h, in_std));
  Add(prefix + "attn.qk_bias", {2, 1, c_.num_heads, c_.head_dim},
      Normal(s_.seed, role + "qk_bias", 2 * h, 0.1));
  Add(prefix + "attn.proj.weight", {h, h}, Normal(s_.seed, role + "proj", h * h, 0.5 * in_std));
  Add(prefix + "mlp.fc.weight", {2 * inter, h},
      Normal(s_.seed, role + "fc", 2 * inter * h, in_std));
  Add(prefix + "mlp.proj.weight", {h, inter},
      Normal(s_.seed, role + "mlp_proj", h * inter, 0.5 / std::sqrt(static_cast<double>(inter))));
}

// Huginn-0125's tensors: the wte (scaled by sqrt(H) when read, so its std is 1/sqrt(H)), the
// blocks of prelude, core (stored once) and coda, the adapter, ln_f, the stored freqs_cis
// buffer ([1, block_size, 1, hd/2, 2] cos/sin, which the loader ignores) and lm_head when
// untied.
std::vector<OwnedTensor> TensorWriter::BuildHuginn() {
  const int64_t v = c_.vocab_size, h = c_.hidden_size, hd = c_.head_dim;
  Add("transformer.wte.weight", {v, h},
      Normal(s_.seed, "embed", v * h, 1.0 / std::sqrt(static_cast<double>(h))));
  static constexpr const char* kPart[] = {"prelude", "core_block", "coda"};
  for (int s = 0; s < 3; ++s) {
    for (int k = 0; k < plan_.segments[s].num_layers; ++k) {
      AddHuginnBlock(absl::StrCat("transformer.", kPart[s], ".", k, "."),
                     absl::StrCat(kPart[s], k, "."));
    }
  }
  Add("transformer.adapter.weight", {h, 2 * h},
      Normal(s_.seed, "adapter", 2 * h * h, 1.0 / std::sqrt(static_cast<double>(2 * h))));
  Add("transformer.ln_f.weight", {h}, Normal(s_.seed, "final_norm", h, 0.1, 1.0));
  const int64_t positions = c_.max_position_embeddings;
  std::vector<float> freqs(static_cast<size_t>(positions * hd));
  for (int64_t p = 0; p < positions; ++p) {
    for (int64_t i = 0; i < hd / 2; ++i) {
      const double angle = static_cast<double>(p) * std::pow(c_.rope_theta, -2.0 * i / hd);
      freqs[(p * hd / 2 + i) * 2] = static_cast<float>(std::cos(angle));
      freqs[(p * hd / 2 + i) * 2 + 1] = static_cast<float>(std::sin(angle));
    }
  }
  Add("freqs_cis", {1, positions, 1, hd / 2, 2}, freqs, DType::kF32);
  if (!c_.tie_word_embeddings) {
    Add("lm_head.weight", {v, h}, Normal(s_.seed, "lm_head", v * h, kEmbedStd));
  }
  return std::move(out_);
}

std::vector<OwnedTensor> TensorWriter::Build() {
  if (c_.huginn.enabled) return BuildHuginn();
  const int64_t v = c_.vocab_size, h = c_.hidden_size;
  std::vector<float> embed = Normal(s_.seed, "embed", v * h, kEmbedStd);
  if (ConstantChannel()) {
    for (int64_t i = 0; i < v; ++i) embed[i * h] = 1.0f;
  }
  if (mix_) mix_->Embedding(&embed);
  Add("model.embed_tokens.weight", {v, h}, embed);
  const bool mor = routing_ == Routing::kExpertChoice || routing_ == Routing::kTokenChoice;
  if (mor) {
    AddMor();
  } else {
    AddUnrolled();
  }
  std::vector<float> final_norm = Normal(s_.seed, "final_norm", h, 0.1, 1.0);
  if (mix_) mix_->FinalNorm(&final_norm);
  Add("model.norm.weight", {h}, final_norm);
  if (c_.model_type == "ouro") {  // lambda = sigmoid(w . h_t + b): b = --router-bias
    Add("model.early_exit_gate.weight", {1, h},
        Normal(s_.seed, "exit_gate", h, 1.0 / std::sqrt(static_cast<double>(h))));
    Add("model.early_exit_gate.bias", {1}, {s_.router_bias});
  }
  if (!c_.tie_word_embeddings) {
    std::vector<float> lm_head = Normal(s_.seed, "lm_head", v * h, kEmbedStd);
    if (mix_) mix_->LmHead(&lm_head);
    Add("lm_head.weight", {v, h}, lm_head);
  }
  return std::move(out_);
}

// ---- Files ----------------------------------------------------------------------------

absl::Status WriteText(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  if (!out) return absl::InternalError(absl::StrCat("mkmodel: cannot write ", path));
  return absl::OkStatus();
}

void RemoveStaleModelFiles(const std::string& dir) {
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("model", 0) == 0 &&
        (name.ends_with(".safetensors") || name == "model.safetensors.index.json")) {
      std::filesystem::remove(entry.path(), ec);
    }
  }
}

// The tokenizer files of `dir` that exist (tokenizer.json is required).
absl::Status CopyTokenizerFiles(const std::string& from, const std::string& to) {
  for (const char* name : {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                           "generation_config.json", "chat_template.jinja"}) {
    const std::filesystem::path src = std::filesystem::path(from) / name;
    if (!std::filesystem::exists(src) && std::string(name) != "tokenizer.json") continue;
    std::error_code ec;
    std::filesystem::copy_file(src, std::filesystem::path(to) / name,
                               std::filesystem::copy_options::overwrite_existing, ec);
    if (ec) {
      return absl::InternalError(
          absl::StrCat("mkmodel: cannot copy ", src.string(), ": ", ec.message()));
    }
  }
  return absl::OkStatus();
}

absl::Status WriteShards(const std::string& dir, std::vector<OwnedTensor> tensors, int shards) {
  if (shards == 1) return WriteSafetensors(dir + "/model.safetensors", tensors);
  const size_t n = tensors.size();
  if (static_cast<size_t>(shards) > n) {
    return absl::InvalidArgumentError(
        absl::StrCat("mkmodel: --shards ", shards, " exceeds the ", n, " tensors"));
  }
  json weight_map = json::object();
  uint64_t total = 0;
  for (int i = 0; i < shards; ++i) {
    char file[64];
    std::snprintf(file, sizeof file, "model-%05d-of-%05d.safetensors", i + 1, shards);
    std::vector<OwnedTensor> part(std::make_move_iterator(tensors.begin() + i * n / shards),
                                  std::make_move_iterator(tensors.begin() + (i + 1) * n / shards));
    for (const OwnedTensor& t : part) {
      weight_map[t.name] = file;
      total += t.bytes.size();
    }
    if (auto s = WriteSafetensors(dir + "/" + file, part); !s.ok()) return s;
  }
  json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
  return WriteText(dir + "/model.safetensors.index.json", index.dump(2) + "\n");
}

absl::StatusOr<DepthMix> MakeDepthMix(const Resolved& r, const ModelConfig& c,
                                      const LayerPlan& plan) {
  DepthMixModel m;
  m.routing = c.recursion.routing;
  m.recursions = c.recursion.num_recursions;
  m.hidden = c.hidden_size;
  m.vocab = c.vocab_size;
  const int looped = plan.looped_segment;
  m.layers_per_loop = looped >= 0 ? plan.segments[looped].num_layers : 1;
  m.last_layer_unique = looped >= 0 && looped + 1 < static_cast<int>(plan.segments.size());
  m.tied_embeddings = c.tie_word_embeddings;
  m.exit_threshold = r.spec.exit_threshold;
  m.special_ids = r.spec.eos_token_ids;
  if (r.spec.bos_token_id >= 0) m.special_ids.push_back(r.spec.bos_token_id);
  m.seed = r.spec.seed;
  return DepthMix::Make(r.spec.depth_mix, m);
}

}  // namespace

const std::vector<std::string>& TinyModelFamilies() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> v;
    for (const FamilyDefaults& f : kFamilies) v.push_back(f.name);
    return v;
  }();
  return names;
}

absl::StatusOr<ModelConfig> TinyModelConfig(const TinyModelSpec& spec) {
  auto r = Resolve(spec);
  if (!r.ok()) return r.status();
  auto config = ParseModelConfig(ConfigJson(*r), nullptr);
  if (!config.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "mkmodel: family ", spec.family, " with these options: ", config.status().message()));
  }
  return config;
}

absl::StatusOr<std::vector<OwnedTensor>> TinyModelTensors(const TinyModelSpec& spec) {
  auto r = Resolve(spec);
  if (!r.ok()) return r.status();
  auto config = TinyModelConfig(spec);
  if (!config.ok()) return config.status();
  auto plan = BuildLayerPlan(*config);
  if (!plan.ok()) return plan.status();
  if (spec.depth_mix.empty()) return TensorWriter(*r, *config, *plan, nullptr).Build();
  auto mix = MakeDepthMix(*r, *config, *plan);
  if (!mix.ok()) return mix.status();
  return TensorWriter(*r, *config, *plan, &*mix).Build();
}

absl::Status WriteTinyModel(const TinyModelSpec& spec, const std::string& dir) {
  auto r = Resolve(spec);
  if (!r.ok()) return r.status();
  auto tensors = TinyModelTensors(spec);
  if (!tensors.ok()) return tensors.status();
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec)
    return absl::InternalError(absl::StrCat("mkmodel: cannot create ", dir, ": ", ec.message()));
  RemoveStaleModelFiles(dir);
  if (auto s = WriteText(dir + "/config.json", ConfigJson(*r).dump(2) + "\n"); !s.ok()) return s;
  std::filesystem::remove(dir + "/looped.json", ec);  // a stale one would change the defaults
  if (!spec.loop_mode.empty()) {
    json looped{{"mode", spec.loop_mode}};
    // Huginn's KL threshold has no config.json field: the requests' default lives here.
    if (spec.family == "huginn") looped["exit_threshold"] = spec.exit_threshold;
    if (auto s = WriteText(dir + "/looped.json", looped.dump(2) + "\n"); !s.ok()) return s;
  }
  if (!spec.tokenizer_dir.empty()) {
    if (auto s = CopyTokenizerFiles(spec.tokenizer_dir, dir); !s.ok()) return s;
  }
  return WriteShards(dir, std::move(*tensors), spec.shards);
}

absl::Status UseTokenizer(const std::string& dir, TinyModelSpec* spec) {
  absl::StatusOr<std::unique_ptr<Tokenizer>> tok = Tokenizer::FromDirectory(dir);
  if (!tok.ok()) {
    return absl::Status(tok.status().code(),
                        absl::StrCat("mkmodel: --tokenizer-dir: ", tok.status().message()));
  }
  spec->vocab = (*tok)->vocab_size();
  spec->bos_token_id = (*tok)->bos_token_id().value_or(-1);
  spec->eos_token_ids = (*tok)->eos_token_ids();
  spec->tokenizer_dir = dir;
  return absl::OkStatus();
}

// ---- Command line ---------------------------------------------------------------------

const char* MkmodelUsage() {
  return "usage: morserve mkmodel --family F --out DIR [options]\n"
         "families: vanilla recursive-cycle recursive-sequence recursive-middle-cycle\n"
         "          recursive-middle-sequence recursive-untied-attn relaxed-lora mor-ec mor-tc\n"
         "          early-exit recurrent nanbeige ouro huginn\n"
         "sizes:    --hidden 64 --layers N --heads 4 --kv-heads 2 --intermediate 128\n"
         "          --vocab 256 --recursions 3 --max-pos 512 --head-dim D (default hidden/heads)\n"
         "files:    --seed 1 --dtype bf16|f16|f32 --shards N --tie-embeddings\n"
         "          --first-copy-only (store loop 0's copy of shared layers only)\n"
         "plan:     --sharing none|cycle|sequence|middle_cycle|middle_sequence\n"
         "          --kv recursion_wise|shared --layer-kind standard|recurrent --untied-attn\n"
         "LoRA:     --lora-rank R --lora-alpha A --lora-targets q_proj,v_proj\n"
         "MoR:      --router linear|mlp --activation sigmoid|tanh|softmax --alpha A\n"
         "          --gating weighted|additive --aux-router --capacity 1,0.67,0.33\n"
         "          --router-bias B (> 0: deeper, < 0: earlier exits; see mkmodel.h)\n"
         "          --depth-mix f1,...,fR (fraction of tokens leaving after loop 1..R, built\n"
         "          into the routers; mor-ec, mor-tc, early-exit; see depth_mix.h)\n"
         "early exit: --exit-threshold 0.9 --exit-kv propagate|skip\n"
         "nanbeige: --recursions N is num_loops, --layers N x the stored stack,\n"
         "          --skip-loop-final-norm (no model.norm between loops)\n"
         "ouro:     --recursions T is total_ut_steps, --layers T x the stored stack,\n"
         "          --exit-threshold Q (early_exit_threshold), --router-bias B (the exit\n"
         "          gate's bias: > 0 earlier exits, < 0 later)\n"
         "huginn:   --recursions R is mean_recurrence, --prelude P --coda D (default 2),\n"
         "          --layers P + C x R + D (default C 2); MHA, head_dim hidden/heads;\n"
         "          with --loop-mode, --exit-threshold Q is looped.json's KL threshold\n"
         "looped:   --loop-mode full|adaptive (writes looped.json: the requests' default)\n"
         "tokenizer: --tokenizer-dir DIR (copies DIR's tokenizer.json, tokenizer_config.json,\n"
         "          ...; vocab, bos and eos from it; overrides --vocab)\n";
}

namespace {

absl::Status BadValue(const std::string& flag, const std::string& value) {
  return absl::InvalidArgumentError(
      absl::StrCat("mkmodel: bad value for ", flag, ": '", value, "'"));
}

absl::Status ParseIntFlag(const std::string& flag, const std::string& v, int* out) {
  if (!absl::SimpleAtoi(v, out)) return BadValue(flag, v);
  return absl::OkStatus();
}

absl::Status ParseFloatFlag(const std::string& flag, const std::string& v, float* out) {
  if (!absl::SimpleAtof(v, out)) return BadValue(flag, v);
  return absl::OkStatus();
}

absl::Status ParseDtype(const std::string& v, DType* out) {
  if (v == "bf16" || v == "bfloat16") {
    *out = DType::kBF16;
  } else if (v == "f16" || v == "float16") {
    *out = DType::kF16;
  } else if (v == "f32" || v == "float32") {
    *out = DType::kF32;
  } else {
    return BadValue("--dtype", v);
  }
  return absl::OkStatus();
}

absl::Status ApplyValueFlag(const std::string& flag, const std::string& v, TinyModelSpec* s,
                            std::string* out_dir) {
  const std::map<std::string, int*> ints = {{"--hidden", &s->hidden},
                                            {"--layers", &s->layers},
                                            {"--heads", &s->heads},
                                            {"--kv-heads", &s->kv_heads},
                                            {"--intermediate", &s->intermediate},
                                            {"--vocab", &s->vocab},
                                            {"--recursions", &s->recursions},
                                            {"--max-pos", &s->max_pos},
                                            {"--head-dim", &s->head_dim},
                                            {"--prelude", &s->prelude_layers},
                                            {"--coda", &s->coda_layers},
                                            {"--shards", &s->shards},
                                            {"--lora-rank", &s->lora_rank}};
  const std::map<std::string, float*> floats = {{"--router-bias", &s->router_bias},
                                                {"--alpha", &s->alpha},
                                                {"--lora-alpha", &s->lora_alpha},
                                                {"--exit-threshold", &s->exit_threshold}};
  const std::map<std::string, std::string*> strings = {{"--family", &s->family},
                                                       {"--out", out_dir},
                                                       {"--sharing", &s->sharing},
                                                       {"--router", &s->router},
                                                       {"--activation", &s->activation},
                                                       {"--gating", &s->gating},
                                                       {"--kv", &s->kv},
                                                       {"--exit-kv", &s->exit_kv},
                                                       {"--layer-kind", &s->layer_kind},
                                                       {"--loop-mode", &s->loop_mode},
                                                       {"--tokenizer-dir", &s->tokenizer_dir}};
  if (auto it = ints.find(flag); it != ints.end()) return ParseIntFlag(flag, v, it->second);
  if (auto it = floats.find(flag); it != floats.end()) return ParseFloatFlag(flag, v, it->second);
  if (auto it = strings.find(flag); it != strings.end()) {
    *it->second = v;
    return absl::OkStatus();
  }
  if (flag == "--seed") {
    if (!absl::SimpleAtoi(v, &s->seed)) return BadValue(flag, v);
    return absl::OkStatus();
  }
  if (flag == "--dtype") return ParseDtype(v, &s->dtype);
  if (flag == "--lora-targets") {
    s->lora_targets = absl::StrSplit(v, ',', absl::SkipEmpty());
    return absl::OkStatus();
  }
  if (flag == "--capacity" || flag == "--depth-mix") {
    std::vector<float>* list = flag == "--capacity" ? &s->capacity : &s->depth_mix;
    list->clear();
    for (absl::string_view part : absl::StrSplit(v, ',', absl::SkipEmpty())) {
      float f;
      if (!absl::SimpleAtof(part, &f)) return BadValue(flag, v);
      list->push_back(f);
    }
    if (list->empty() && flag == "--depth-mix") return BadValue(flag, v);
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat("mkmodel: unknown flag ", flag));
}

}  // namespace

absl::StatusOr<TinyModelSpec> TinyModelSpecFromArgs(const std::vector<std::string>& args,
                                                    std::string* out_dir) {
  TinyModelSpec spec;
  const std::map<std::string, bool*> switches = {
      {"--aux-router", &spec.aux_router},
      {"--untied-attn", &spec.untied_attention},
      {"--first-copy-only", &spec.first_copy_only},
      {"--tie-embeddings", &spec.tie_embeddings},
      {"--skip-loop-final-norm", &spec.skip_loop_final_norm}};
  bool family_given = false;
  for (size_t i = 0; i < args.size(); ++i) {
    std::string flag = args[i], value;
    const size_t eq = flag.find('=');
    const bool inline_value = eq != std::string::npos;
    if (inline_value) {
      value = flag.substr(eq + 1);
      flag = flag.substr(0, eq);
    }
    if (auto it = switches.find(flag); it != switches.end() && !inline_value) {
      *it->second = true;
      continue;
    }
    if (!inline_value) {
      if (i + 1 >= args.size()) {
        return absl::InvalidArgumentError(absl::StrCat("mkmodel: ", flag, " needs a value"));
      }
      value = args[++i];
    }
    family_given = family_given || flag == "--family";
    if (auto s = ApplyValueFlag(flag, value, &spec, out_dir); !s.ok()) return s;
  }
  if (!family_given) return absl::InvalidArgumentError("mkmodel: --family is required");
  if (out_dir->empty()) return absl::InvalidArgumentError("mkmodel: --out is required");
  if (!spec.tokenizer_dir.empty()) {
    if (auto s = UseTokenizer(spec.tokenizer_dir, &spec); !s.ok()) return s;
  }
  return spec;
}

int MkmodelCommand(const Args& args) {
  for (const std::string& a : args) {
    if (a == "--help" || a == "-h") {
      std::fputs(MkmodelUsage(), stdout);
      return 0;
    }
  }
  std::string out_dir;
  auto spec = TinyModelSpecFromArgs(args, &out_dir);
  if (!spec.ok()) {
    std::fprintf(stderr, "%s\n%s", std::string(spec.status().message()).c_str(), MkmodelUsage());
    return 2;
  }
  if (auto s = WriteTinyModel(*spec, out_dir); !s.ok()) {
    std::fprintf(stderr, "%s\n", std::string(s.message()).c_str());
    return 1;
  }
  std::printf("wrote %s model to %s\n", spec->family.c_str(), out_dir.c_str());
  return 0;
}

}  // namespace morserve
