// `morserve inspect` (see inspect.h). The JSON object is the source of truth; the text form
// is rendered from it so the two never disagree.
#include "engine/tools/inspect.h"

#include <cstdio>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "engine/io/tensor_store.h"
#include "engine/tools/commands.h"

namespace morserve {
namespace {

using nlohmann::json;

int64_t Numel(const TensorView& v) { return v.empty() ? 0 : v.numel(); }

int64_t LoopTensorParameters(const LoopTensor& t) {
  int64_t n = 0;
  for (const TensorView& v : t.per_loop) n += Numel(v);
  for (const LoraDelta& d : t.lora) n += Numel(d.a) + Numel(d.b);
  return n;
}

int64_t RouterParameters(const RouterWeights& r) {
  int64_t n = Numel(r.token_choice) + Numel(r.token_choice_w2);
  for (const auto* list : {&r.expert, &r.aux}) {
    for (const LoopRouter& lr : *list) n += Numel(lr.w1) + Numel(lr.w2);
  }
  return n;
}

json ConfigSummary(const ModelConfig& c) {
  return {{"hidden_size", c.hidden_size},
          {"num_hidden_layers", c.num_layers},
          {"num_attention_heads", c.num_heads},
          {"num_key_value_heads", c.num_kv_heads},
          {"head_dim", c.head_dim},
          {"intermediate_size", c.intermediate_size},
          {"vocab_size", c.vocab_size},
          {"tie_word_embeddings", c.tie_word_embeddings},
          {"model_type", c.model_type},
          {"norm_between_loops", c.recursion.norm_between_loops},
          {"sandwich_norm", c.sandwich_norm},
          {"exit_rule", c.recursion.exit_rule == LoopExitRule::kOuroGate   ? json("ouro_gate")
                        : c.recursion.exit_rule == LoopExitRule::kHuginnKl ? json("huginn_kl")
                                                                           : json(nullptr)},
          {"huginn", c.huginn.enabled ? json{{"embed_scale", c.huginn.embed_scale},
                                             {"residual_norm", c.huginn.residual_norm},
                                             {"qk_bias", c.huginn.qk_bias},
                                             {"rope_pairs", c.huginn.rope_pairs},
                                             {"input_injection", c.huginn.input_injection},
                                             {"init_scale", c.huginn.init_scale}}
                                      : json(nullptr)},
          {"loop_exit_threshold", c.recursion.loop_exit_threshold},
          {"default_loop_mode", LoopModeName(c.recursion.default_loop_mode)},
          {"recursion", c.recursion.present ? RecursionToJson(c.recursion) : json(nullptr)}};
}

json PlanSummary(const LayerPlan& plan) {
  json segments = json::array();
  for (const Segment& s : plan.segments) {
    segments.push_back({{"first_layer_slot", s.first_layer_slot},
                        {"num_layers", s.num_layers},
                        {"loops", s.loops},
                        {"first_cache_slot", s.first_cache_slot}});
  }
  return {{"describe", plan.Describe()},
          {"segments", segments},
          {"looped_segment", plan.looped_segment},
          {"num_layer_slots", plan.num_layer_slots},
          {"num_cache_slots", plan.num_cache_slots},
          {"num_unrolled_layers", plan.num_unrolled_layers()}};
}

// One entry per weight position of a looped segment: how many views the loops use.
json LoopedWeights(const ModelWeights& w) {
  static const char* kNorms[] = {"input_layernorm", "post_attention_layernorm"};
  json out = json::array();
  for (int s = 0; s < static_cast<int>(w.plan.segments.size()); ++s) {
    const Segment& seg = w.plan.segments[s];
    if (!seg.looped()) continue;
    for (int k = 0; k < seg.num_layers; ++k) {
      const LayerWeights& l = w.Layer(s, k);
      auto add = [&](const std::string& name, const LoopTensor& t) {
        out.push_back({{"segment", s},
                       {"layer", k},
                       {"tensor", name},
                       {"copies", t.per_loop.size()},
                       {"lora", t.lora.size()}});
      };
      add(kNorms[0], l.input_norm);
      add(kNorms[1], l.post_norm);
      for (int p = 0; p < kNumProj; ++p) add(ProjName(static_cast<Proj>(p)), l.proj[p]);
    }
  }
  return out;
}

json RouterSummary(const RouterWeights& r) {
  return {{"expert", r.expert.size()},
          {"aux", r.aux.size()},
          {"expert_arch", r.expert.empty() ? "" : (r.expert[0].w2.empty() ? "linear" : "mlp")},
          {"token_choice", !r.token_choice.empty()},
          {"token_choice_bias", r.token_choice_bias},
          {"parameters", RouterParameters(r)}};
}

}  // namespace

int64_t LayerParameters(const ModelConfig& c) {
  const int64_t h = c.hidden_size, q = c.q_dim(), kv = c.kv_dim(), i = c.intermediate_size;
  const bool four_norms = c.sandwich_norm || c.huginn.residual_norm;
  return (four_norms ? 4 : 2) * h + h * q + 2 * h * kv + q * h + 3 * h * i +
         (c.huginn.qk_bias ? q + kv : 0);
}

int64_t KvBytesPerTokenPerSlot(const ModelConfig& c) { return 2 * int64_t{c.kv_dim()} * 2; }

ParameterCounts CountParameters(const ModelWeights& w) {
  ParameterCounts n;
  if (w.store != nullptr) {
    for (const auto& [name, view] : w.store->tensors()) {
      if (!absl::EndsWith(name, "rotary_emb.inv_freq") && name != "freqs_cis") {
        n.checkpoint += Numel(view);
      }
    }
  }
  const int64_t globals = Numel(w.embed) + Numel(w.final_norm) +
                          (w.lm_head_tied ? 0 : Numel(w.lm_head)) + Numel(w.exit_gate_w) +
                          Numel(w.exit_gate_b) + Numel(w.adapter);
  n.stored = globals + RouterParameters(w.router);
  for (const LayerWeights& l : w.layers) {
    for (const LoopTensor* t :
         {&l.input_norm, &l.post_norm, &l.attn_out_norm, &l.mlp_out_norm, &l.q_bias, &l.k_bias}) {
      n.stored += LoopTensorParameters(*t);
    }
    for (const LoopTensor& t : l.proj) n.stored += LoopTensorParameters(t);
  }
  n.unrolled_equivalent = globals + w.plan.num_unrolled_layers() * LayerParameters(w.config);
  return n;
}

json InspectJson(const ModelWeights& w, const std::string& dir) {
  const ParameterCounts n = CountParameters(w);
  const int64_t per_slot = KvBytesPerTokenPerSlot(w.config);
  return {{"dir", dir},
          {"config", ConfigSummary(w.config)},
          {"plan", PlanSummary(w.plan)},
          {"parameters",
           {{"checkpoint", n.checkpoint},
            {"stored", n.stored},
            {"unrolled_equivalent", n.unrolled_equivalent}}},
          {"memory_bf16_bytes", 2 * n.stored},
          {"lm_head_tied", w.lm_head_tied},
          {"dedup", {{"deduplicated", w.dedup.deduplicated}, {"untied", w.dedup.untied}}},
          {"weights", LoopedWeights(w)},
          {"routers", RouterSummary(w.router)},
          {"kv",
           {{"dtype", "bf16"},
            {"bytes_per_token_per_slot", per_slot},
            {"cache_slots", w.plan.num_cache_slots},
            {"bytes_per_token", per_slot * w.plan.num_cache_slots}}}};
}

std::string InspectText(const json& j) {
  const json& p = j["parameters"];
  const json& kv = j["kv"];
  const json& c = j["config"];
  std::string out = absl::StrCat(
      "model ", j["dir"].get<std::string>(), " (model_type ", c["model_type"].get<std::string>(),
      c["norm_between_loops"].get<bool>() ? "; model.norm between loops" : "",
      c["sandwich_norm"].get<bool>() ? "; sandwich norms" : "", ")\n",
      j["plan"]["describe"].get<std::string>());
  if (const json& hg = c["huginn"]; !hg.is_null()) {
    absl::StrAppend(&out, "huginn: embedding x ", hg["embed_scale"].get<double>(),
                    ", sandwich blocks (norm after each residual add)",
                    hg["qk_bias"].get<bool>() ? ", qk_bias" : "",
                    ", RoPE on pairs, adapter over concat(state, prelude output), init_scale ",
                    hg["init_scale"].get<double>(), "; the engine does not run it yet\n");
  }
  if (!c["exit_rule"].is_null()) {
    absl::StrAppend(&out, "exit rule: ", c["exit_rule"].get<std::string>(), ", threshold ",
                    c["loop_exit_threshold"].get<double>(), ", default mode ",
                    c["default_loop_mode"].get<std::string>(), "\n");
  }
  absl::StrAppend(&out, "parameters: ", p["stored"].get<int64_t>(), " stored (",
                  p["checkpoint"].get<int64_t>(), " in the checkpoint files), ",
                  p["unrolled_equivalent"].get<int64_t>(), " unrolled-equivalent\n");
  absl::StrAppend(&out, "memory at bf16: ", j["memory_bf16_bytes"].get<int64_t>(), " bytes",
                  j["lm_head_tied"].get<bool>() ? " (lm_head tied to embed_tokens)" : "", "\n");
  for (const char* kind : {"deduplicated", "untied"}) {
    const json& list = j["dedup"][kind];
    absl::StrAppend(&out, kind, " (", list.size(), "):\n");
    for (const json& line : list) absl::StrAppend(&out, "  ", line.get<std::string>(), "\n");
  }
  const json& r = j["routers"];
  if (r["expert"].get<int>() > 0 || r["token_choice"].get<bool>()) {
    absl::StrAppend(&out, "routers: ", r["expert"].get<int>(), " expert-choice, ",
                    r["aux"].get<int>(), " aux, token-choice ",
                    r["token_choice"].get<bool>() ? "yes" : "no", ", ",
                    r["parameters"].get<int64_t>(), " parameters\n");
  }
  absl::StrAppend(&out, "KV cache (bf16): ", kv["bytes_per_token_per_slot"].get<int64_t>(),
                  " bytes per token per slot, ", kv["cache_slots"].get<int>(), " slots, ",
                  kv["bytes_per_token"].get<int64_t>(), " bytes per token\n");
  return out;
}

int InspectCommand(const Args& args) {
  std::string dir;
  bool as_json = false;
  for (const std::string& a : args) {
    if (a == "--json") {
      as_json = true;
    } else if (!a.empty() && a[0] == '-') {
      std::fprintf(stderr, "inspect: unknown flag %s\nusage: morserve inspect DIR [--json]\n",
                   a.c_str());
      return 2;
    } else if (dir.empty()) {
      dir = a;
    } else {
      std::fprintf(stderr, "usage: morserve inspect DIR [--json]\n");
      return 2;
    }
  }
  if (dir.empty()) {
    std::fprintf(stderr, "usage: morserve inspect DIR [--json]\n");
    return 2;
  }
  auto weights = LoadModel(dir);
  if (!weights.ok()) {
    std::fprintf(stderr, "inspect: %s\n", std::string(weights.status().message()).c_str());
    return 1;
  }
  const json j = InspectJson(**weights, dir);
  const std::string text = as_json ? j.dump(2) + "\n" : InspectText(j);
  std::fwrite(text.data(), 1, text.size(), stdout);
  return 0;
}

}  // namespace morserve
