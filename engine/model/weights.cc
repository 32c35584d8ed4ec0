// Resolves a checkpoint's tensors against the config and the layer plan (see weights.h).
//
// Supported layouts (docs/checkpoints.md#tensor-layouts):
//   - unrolled: model.layers.{j}.* for every unrolled layer j (vanilla, plain Recursive,
//     Relaxed with PEFT LoRA keys). A Recursive checkpoint may store only loop 0's copy of
//     each shared layer: the missing copies are then tied to it.
//   - MoR expert-choice: model.layers.{i}.block.{k}.* per loop, with mor_router/mlp_router.
//   - MoR token-choice: model.layers.{i}.block_list.{r}.{k}.*, one router [Nr, H].
// In the MoR layouts, `i` counts stored layers in plan order: each unique layer takes one
// index, an expert-choice looped segment one per loop, a token-choice segment one in all.
// The aux router (mlp_router) has the router's arch: mlp_router.weight [1, H], or
// mlp_router.0.weight [2H, H] and mlp_router.2.weight [1, 2H].
//
// Invariants: copies of a shared layer are compared byte for byte; equal copies become one
// view, differing copies one view per loop. Every tensor of the store is used exactly once
// (rotary_emb.inv_freq buffers excepted), so a layout mistake is an error, not a silent
// fallback. Every error names the tensor and its file.
#include "engine/model/weights.h"

#include <optional>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/core/check.h"
#include "engine/io/tensor_store.h"

namespace morserve {
namespace {

enum class Layout { kUnrolled, kMorExpert, kMorToken, kHuginn };

constexpr const char* kProjModule[kNumProj] = {
    "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
    "mlp.gate_proj",    "mlp.up_proj",      "mlp.down_proj"};

const char* LayoutName(Layout l) {
  switch (l) {
    case Layout::kUnrolled:
      return "unrolled (model.layers.{j}.*)";
    case Layout::kMorExpert:
      return "MoR expert-choice (model.layers.{r}.block.{k}.*)";
    case Layout::kMorToken:
      return "MoR token-choice (model.layers.{i}.block_list.{r}.{k}.*)";
    case Layout::kHuginn:
      return "Huginn (transformer.{prelude,core_block,coda}.{k}.*)";
  }
  return "?";
}

// Finds the layout from the key names: any `model.layers.N.block_list.` or
// `model.layers.N.block.` key selects the MoR layouts.
Layout DetectLayout(const TensorStore& store) {
  bool expert = false;
  for (const auto& [name, view] : store.tensors()) {
    const std::string prefix = "model.layers.";
    if (name.rfind(prefix, 0) != 0) continue;
    const size_t dot = name.find('.', prefix.size());
    if (dot == std::string::npos) continue;
    if (name.compare(dot + 1, 11, "block_list.") == 0) return Layout::kMorToken;
    if (name.compare(dot + 1, 6, "block.") == 0) expert = true;
  }
  return expert ? Layout::kMorExpert : Layout::kUnrolled;
}

// Stored RoPE tables: recomputed from the config, never read.
bool IsIgnoredBuffer(const std::string& name) {
  return absl::EndsWith(name, "rotary_emb.inv_freq") || name == "freqs_cis";
}

// Shape of projection p in the Llama block: [out, in].
std::vector<int64_t> ProjShape(const ModelConfig& c, Proj p) {
  const int64_t h = c.hidden_size, q = c.q_dim(), kv = c.kv_dim(), i = c.intermediate_size;
  switch (p) {
    case Proj::kQ:
      return {q, h};
    case Proj::kK:
    case Proj::kV:
      return {kv, h};
    case Proj::kO:
      return {h, q};
    case Proj::kGate:
    case Proj::kUp:
      return {i, h};
    case Proj::kDown:
      return {h, i};
  }
  return {};
}

class Resolver {
 public:
  Resolver(const ModelConfig& config, const LayerPlan& plan, const TensorStore& store)
      : config_(config),
        plan_(plan),
        store_(store),
        layout_(config.huginn.enabled ? Layout::kHuginn : DetectLayout(store)) {
    int index = 0;
    for (const Segment& s : plan_.segments) {
      first_stored_layer_.push_back(index);
      if (!s.looped()) {
        index += s.num_layers;
      } else {
        index += layout_ == Layout::kMorToken ? 1 : s.loops;
      }
    }
  }

  absl::Status Run(ModelWeights* w);

 private:
  absl::Status CheckLayout() const;
  absl::Status ResolveEmbeddingAndHead(const std::string& embed_name, const std::string& norm_name,
                                       const char* tie_key, bool require_untied_head,
                                       ModelWeights* w);
  absl::Status ResolveLayer(int segment, int k, LayerWeights* out, DedupReport* report);
  absl::Status ResolveTensor(int segment, int k, const std::string& module,
                             const std::vector<int64_t>& shape, bool copies_stored,
                             std::optional<Proj> proj, LoopTensor* out, DedupReport* report);
  absl::Status ResolveRouters(RouterWeights* out);
  absl::Status ResolveExitGate(ModelWeights* w);
  absl::Status ResolveHuginnGlobals(ModelWeights* w);
  absl::Status ResolveHuginnLayer(int segment, int k, LayerWeights* out);
  absl::StatusOr<LoopRouter> ResolveRouter(const std::string& prefix, const std::string& linear,
                                           int outputs);
  absl::Status CheckLeftovers() const;

  // Key prefix of the copy of layer (segment, k) that loop `loop` runs.
  std::string CopyPrefix(int segment, int loop, int k) const;
  bool HasPrefix(const std::string& prefix) const;
  // Looks up `name`, checks dtype and shape, and marks it used.
  absl::StatusOr<TensorView> Take(const std::string& name, const std::vector<int64_t>& shape);
  std::string Files() const;

  const ModelConfig& config_;
  const LayerPlan& plan_;
  const TensorStore& store_;
  const Layout layout_;
  std::vector<int> first_stored_layer_;  // MoR layouts: model.layers index of each segment
  std::set<std::string> used_;
};

std::string Resolver::Files() const {
  std::set<std::string> files;
  for (const auto& [name, view] : store_.tensors()) files.insert(view.file);
  if (files.empty()) return "an empty checkpoint";
  return absl::StrJoin(files, ", ");
}

bool Resolver::HasPrefix(const std::string& prefix) const {
  for (auto it = store_.tensors().lower_bound(prefix);
       it != store_.tensors().end() && absl::StartsWith(it->first, prefix); ++it) {
    if (!IsIgnoredBuffer(it->first)) return true;
  }
  return false;
}

absl::StatusOr<TensorView> Resolver::Take(const std::string& name,
                                          const std::vector<int64_t>& shape) {
  const TensorView* v = store_.Find(name);
  if (v == nullptr) {
    return absl::NotFoundError(absl::StrCat("missing tensor ", name, " (layout ",
                                            LayoutName(layout_), ", files: ", Files(), ")"));
  }
  if (v->dtype != DType::kF32 && v->dtype != DType::kF16 && v->dtype != DType::kBF16) {
    return absl::InvalidArgumentError(absl::StrCat("tensor ", name, " in ", v->file, " has dtype ",
                                                   std::string(DTypeName(v->dtype)),
                                                   "; weights must be F32, F16 or BF16"));
  }
  if (v->shape != shape) {
    return absl::InvalidArgumentError(absl::StrCat("tensor ", name, " in ", v->file, " has shape ",
                                                   ShapeString(v->shape), ", config.json implies ",
                                                   ShapeString(shape)));
  }
  used_.insert(name);
  return *v;
}

std::string Resolver::CopyPrefix(int segment, int loop, int k) const {
  const Segment& s = plan_.segments[segment];
  if (layout_ == Layout::kUnrolled) {
    return absl::StrCat("model.layers.", plan_.UnrolledLayer(segment, loop, k), ".");
  }
  const int base = first_stored_layer_[segment];
  if (!s.looped()) return absl::StrCat("model.layers.", base + k, ".");
  if (layout_ == Layout::kMorExpert) {
    return absl::StrCat("model.layers.", base + loop, ".block.", k, ".");
  }
  return absl::StrCat("model.layers.", base, ".block_list.", loop, ".", k, ".");
}

absl::Status Resolver::CheckLayout() const {
  const Routing routing = config_.recursion.routing;
  const bool mor = layout_ != Layout::kUnrolled;
  const bool want_expert = routing == Routing::kExpertChoice;
  const bool want_token = routing == Routing::kTokenChoice;
  if ((want_expert || want_token) && plan_.looped_segment < 0) {
    return absl::InvalidArgumentError(absl::StrCat("recursion.routing: ", RoutingName(routing),
                                                   " needs exactly one looped segment"));
  }
  if ((want_expert && layout_ != Layout::kMorExpert) ||
      (want_token && layout_ != Layout::kMorToken) || (mor && !want_expert && !want_token)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "checkpoint (", Files(), ") has the ", LayoutName(layout_),
        " layout, which does not fit "
        "recursion.routing ",
        RoutingName(routing),
        want_expert  ? " (expects model.layers.{r}.block.{k}.* and mor_router tensors)"
        : want_token ? " (expects model.layers.{i}.block_list.{r}.{k}.* and a mor_router)"
                     : ""));
  }
  return absl::OkStatus();
}

// The embedding, the final norm and the head: lm_head.weight when stored (equal to the
// embedding when config.json ties them, `tie_key` naming that field), else the embedding;
// `require_untied_head`: a missing head with untied embeddings is an error (Huginn).
absl::Status Resolver::ResolveEmbeddingAndHead(const std::string& embed_name,
                                               const std::string& norm_name, const char* tie_key,
                                               bool require_untied_head, ModelWeights* w) {
  const int64_t v = config_.vocab_size, h = config_.hidden_size;
  auto embed = Take(embed_name, {v, h});
  if (!embed.ok()) return embed.status();
  w->embed = *embed;
  auto norm = Take(norm_name, {h});
  if (!norm.ok()) return norm.status();
  w->final_norm = *norm;
  w->lm_head = w->embed;
  w->lm_head_tied = true;
  if (store_.Find("lm_head.weight") == nullptr) {
    if (require_untied_head && !config_.tie_word_embeddings) {
      return absl::NotFoundError(absl::StrCat("missing tensor lm_head.weight: config.json sets ",
                                              tie_key, " false (files: ", Files(), ")"));
    }
    return absl::OkStatus();
  }
  auto head = Take("lm_head.weight", {v, h});
  if (!head.ok()) return head.status();
  if (config_.tie_word_embeddings) {
    if (!head->SameContents(w->embed)) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor lm_head.weight in ", head->file, " differs from ", embed_name,
                       " in ", w->embed.file, ", but config.json sets ", tie_key));
    }
    return absl::OkStatus();
  }
  w->lm_head = *head;
  w->lm_head_tied = false;
  return absl::OkStatus();
}

// One weight position of one layer, gathered from the copies of every loop. For projections
// a copy may be stored PEFT-style (base_layer + lora_A/lora_B) instead of as `.weight`.
absl::Status Resolver::ResolveTensor(int segment, int k, const std::string& module,
                                     const std::vector<int64_t>& shape, bool copies_stored,
                                     std::optional<Proj> proj, LoopTensor* out,
                                     DedupReport* report) {
  const Segment& seg = plan_.segments[segment];
  const LoraConfig& lora = config_.recursion.lora;
  const int copies = copies_stored ? seg.loops : 1;
  const bool lora_required = proj && seg.looped() && lora.Targets(ProjName(*proj));
  std::vector<TensorView> views;
  std::vector<LoraDelta> deltas;
  for (int loop = 0; loop < copies; ++loop) {
    const std::string key = CopyPrefix(segment, loop, k) + module;
    const bool peft = proj && store_.Find(key + ".base_layer.weight") != nullptr;
    if (peft && !lora.Targets(ProjName(*proj))) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor ", key, ".base_layer.weight in ", store_.Find(key + ".base_layer.weight")->file,
          " is a LoRA base layer, but recursion.lora does not target ", ProjName(*proj)));
    }
    if (!peft && lora_required && copies_stored) {
      return absl::NotFoundError(absl::StrCat("missing tensor ", key,
                                              ".base_layer.weight: recursion.lora targets ",
                                              ProjName(*proj), " (files: ", Files(), ")"));
    }
    auto base = Take(key + (peft ? ".base_layer.weight" : ".weight"), shape);
    if (!base.ok()) return base.status();
    views.push_back(*base);
    if (!peft) continue;
    const int64_t rank = lora.rank;
    auto a = Take(key + ".lora_A.default.weight", {rank, shape[1]});
    if (!a.ok()) return a.status();
    auto b = Take(key + ".lora_B.default.weight", {shape[0], rank});
    if (!b.ok()) return b.status();
    deltas.push_back(LoraDelta{*a, *b, lora.scale()});
  }
  if (lora_required && !copies_stored) {
    return absl::NotFoundError(absl::StrCat(
        "missing tensors ", CopyPrefix(segment, 1, k), module,
        ".*: a Relaxed (LoRA) checkpoint needs every loop's copy (files: ", Files(), ")"));
  }
  out->lora = std::move(deltas);
  const std::string what = absl::StrCat("segment ", segment, " layer ", k, " ", module);
  if (!seg.looped()) {
    out->per_loop = std::move(views);
    return absl::OkStatus();
  }
  if (!copies_stored) {
    out->per_loop = {views[0]};
    report->deduplicated.push_back(
        absl::StrCat(what, ": stored once (loop 0), tied for ", seg.loops, " loops"));
    return absl::OkStatus();
  }
  bool equal = true;
  for (size_t i = 1; i < views.size(); ++i) equal = equal && views[i].SameContents(views[0]);
  if (equal) {
    out->per_loop = {views[0]};
    report->deduplicated.push_back(absl::StrCat(what, ": ", seg.loops, " copies equal"));
  } else {
    out->per_loop = std::move(views);
    report->untied.push_back(absl::StrCat(what, ": ", seg.loops, " copies differ, kept per loop"));
  }
  return absl::OkStatus();
}

absl::Status Resolver::ResolveLayer(int segment, int k, LayerWeights* out, DedupReport* report) {
  const Segment& seg = plan_.segments[segment];
  // Copies of loops > 0 may all be absent: the checkpoint stored the shared layer once.
  bool copies_stored = true;
  if (seg.looped()) {
    bool any_later = false;
    for (int loop = 1; loop < seg.loops; ++loop) {
      any_later = any_later || HasPrefix(CopyPrefix(segment, loop, k));
    }
    copies_stored = any_later || !HasPrefix(CopyPrefix(segment, 0, k));
  }
  const std::vector<int64_t> norm_shape = {config_.hidden_size};
  if (auto s = ResolveTensor(segment, k, "input_layernorm", norm_shape, copies_stored, std::nullopt,
                             &out->input_norm, report);
      !s.ok()) {
    return s;
  }
  if (auto s = ResolveTensor(segment, k, "post_attention_layernorm", norm_shape, copies_stored,
                             std::nullopt, &out->post_norm, report);
      !s.ok()) {
    return s;
  }
  if (config_.sandwich_norm) {
    for (auto [module, t] : {std::pair{"input_layernorm_2", &out->attn_out_norm},
                             std::pair{"post_attention_layernorm_2", &out->mlp_out_norm}}) {
      if (auto s =
              ResolveTensor(segment, k, module, norm_shape, copies_stored, std::nullopt, t, report);
          !s.ok()) {
        return s;
      }
    }
  }
  for (int p = 0; p < kNumProj; ++p) {
    const Proj proj = static_cast<Proj>(p);
    if (auto s = ResolveTensor(segment, k, kProjModule[p], ProjShape(config_, proj), copies_stored,
                               proj, &out->proj[p], report);
        !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

// A router with `outputs` scores: linear `linear` [outputs, H], or mlp `.0` [2H, H] and
// `.2` [outputs, 2H] (`prefix` names the module holding the Linear or Sequential).
absl::StatusOr<LoopRouter> Resolver::ResolveRouter(const std::string& prefix,
                                                   const std::string& linear, int outputs) {
  const int64_t h = config_.hidden_size;
  LoopRouter r;
  if (config_.recursion.router.arch == RouterArch::kLinear) {
    auto w = Take(linear, {outputs, h});
    if (!w.ok()) return w.status();
    r.w1 = *w;
    return r;
  }
  auto w1 = Take(prefix + ".0.weight", {2 * h, h});
  if (!w1.ok()) return w1.status();
  auto w2 = Take(prefix + ".2.weight", {outputs, 2 * h});
  if (!w2.ok()) return w2.status();
  r.w1 = *w1;
  r.w2 = *w2;
  return r;
}

absl::Status Resolver::ResolveRouters(RouterWeights* out) {
  const RecursionConfig& rc = config_.recursion;
  const int seg = plan_.looped_segment;
  if (rc.routing == Routing::kExpertChoice) {
    for (int loop = 0; loop < rc.num_recursions; ++loop) {
      const std::string layer = absl::StrCat("model.layers.", first_stored_layer_[seg] + loop, ".");
      auto r = ResolveRouter(layer + "mor_router.router", layer + "mor_router.router.weight", 1);
      if (!r.ok()) return r.status();
      out->expert.push_back(*r);
      if (!rc.router.aux_router) continue;
      auto aux = ResolveRouter(layer + "mlp_router", layer + "mlp_router.weight", 1);
      if (!aux.ok()) return aux.status();
      out->aux.push_back(*aux);
    }
    return absl::OkStatus();
  }
  if (rc.routing != Routing::kTokenChoice) return absl::OkStatus();
  const int nr = rc.num_recursions;
  const std::string layer = absl::StrCat("model.layers.", first_stored_layer_[seg], ".");
  auto r = ResolveRouter(layer + "mor_router.router", layer + "mor_router.router.weight", nr);
  if (!r.ok()) return r.status();
  out->token_choice = r->w1;
  out->token_choice_w2 = r->w2;
  out->token_choice_bias.assign(nr, 0.0f);
  if (store_.Find(layer + "router_bias") != nullptr) {
    auto bias = Take(layer + "router_bias", {nr});
    if (!bias.ok()) return bias.status();
    out->token_choice_bias = bias->ToF32Vector();
  }
  return absl::OkStatus();
}

// Ouro's exit gate (docs/models.md#ouro), stored even when total_ut_steps is 1.
absl::Status Resolver::ResolveExitGate(ModelWeights* w) {
  if (config_.model_type != "ouro") return absl::OkStatus();
  auto gw = Take("model.early_exit_gate.weight", {1, config_.hidden_size});
  if (!gw.ok()) return gw.status();
  auto gb = Take("model.early_exit_gate.bias", {1});
  if (!gb.ok()) return gb.status();
  w->exit_gate_w = *gw;
  w->exit_gate_b = *gb;
  return absl::OkStatus();
}

absl::Status Resolver::CheckLeftovers() const {
  std::vector<std::string> unused;
  for (const auto& [name, view] : store_.tensors()) {
    if (used_.count(name) || IsIgnoredBuffer(name)) continue;
    unused.push_back(absl::StrCat(name, " (", view.file, ")"));
  }
  if (unused.empty()) return absl::OkStatus();
  const size_t total = unused.size();
  if (total > 8) unused.resize(8);
  return absl::InvalidArgumentError(
      absl::StrCat(total, " unused tensor(s) in the checkpoint; the ", LayoutName(layout_),
                   " layout for this config does not use: ", absl::StrJoin(unused, ", "),
                   total > 8 ? ", ..." : ""));
}

// Huginn-0125 (docs/checkpoints.md#huginn-0125): transformer.wte (tied unless lm_head.weight
// is stored), transformer.ln_f, transformer.adapter.
absl::Status Resolver::ResolveHuginnGlobals(ModelWeights* w) {
  if (auto st = ResolveEmbeddingAndHead("transformer.wte.weight", "transformer.ln_f.weight",
                                        "tie_embeddings", /*require_untied_head=*/true, w);
      !st.ok()) {
    return st;
  }
  const int64_t h = config_.hidden_size;
  auto adapter = Take("transformer.adapter.weight", {h, 2 * h});
  if (!adapter.ok()) return adapter.status();
  w->adapter = *adapter;
  return absl::OkStatus();
}

// One SandwichBlock: prelude.{k}, core_block.{k} (stored once, every recurrence runs it) or
// coda.{k}. The fused Wqkv [3H, H] (rows q|k|v) and fc [2I, H] (rows gate|up) and the
// qk_bias [2, 1, nh, hd] are split into views of their rows.
absl::Status Resolver::ResolveHuginnLayer(int segment, int k, LayerWeights* out) {
  static constexpr const char* kPart[] = {"prelude", "core_block", "coda"};  // the 3 segments
  const std::string prefix = absl::StrCat("transformer.", kPart[segment], ".", k, ".");
  const int64_t h = config_.hidden_size, i = config_.intermediate_size;
  const int64_t nh = config_.num_heads, hd = config_.head_dim;
  auto one = [](const TensorView& v) { return LoopTensor{{v}, {}}; };
  LoopTensor* norms[] = {&out->input_norm, &out->attn_out_norm, &out->post_norm,
                         &out->mlp_out_norm};
  for (int n = 0; n < 4; ++n) {
    auto t = Take(absl::StrCat(prefix, "norm_", n + 1, ".weight"), {h});
    if (!t.ok()) return t.status();
    *norms[n] = one(*t);
  }
  auto qkv = Take(prefix + "attn.Wqkv.weight", {3 * h, h});
  if (!qkv.ok()) return qkv.status();
  out->proj[static_cast<int>(Proj::kQ)] = one(RowBlock(*qkv, 0, h, {h, h}, "q"));
  out->proj[static_cast<int>(Proj::kK)] = one(RowBlock(*qkv, h, h, {h, h}, "k"));
  out->proj[static_cast<int>(Proj::kV)] = one(RowBlock(*qkv, 2 * h, h, {h, h}, "v"));
  auto proj = Take(prefix + "attn.proj.weight", {h, h});
  if (!proj.ok()) return proj.status();
  out->proj[static_cast<int>(Proj::kO)] = one(*proj);
  auto fc = Take(prefix + "mlp.fc.weight", {2 * i, h});
  if (!fc.ok()) return fc.status();
  out->proj[static_cast<int>(Proj::kGate)] = one(RowBlock(*fc, 0, i, {i, h}, "gate"));
  out->proj[static_cast<int>(Proj::kUp)] = one(RowBlock(*fc, i, i, {i, h}, "up"));
  auto down = Take(prefix + "mlp.proj.weight", {h, i});
  if (!down.ok()) return down.status();
  out->proj[static_cast<int>(Proj::kDown)] = one(*down);
  if (config_.huginn.qk_bias) {
    auto bias = Take(prefix + "attn.qk_bias", {2, 1, nh, hd});
    if (!bias.ok()) return bias.status();
    out->q_bias = one(RowBlock(*bias, 0, 1, {nh * hd}, "q"));
    out->k_bias = one(RowBlock(*bias, 1, 1, {nh * hd}, "k"));
  }
  return absl::OkStatus();
}

absl::Status Resolver::Run(ModelWeights* w) {
  if (config_.huginn.enabled) {
    MORSERVE_CHECK(plan_.segments.size() == 3, "Huginn's plan is prelude, core, coda");
    if (auto s = ResolveHuginnGlobals(w); !s.ok()) return s;
    w->layers.resize(plan_.num_layer_slots);
    for (int s = 0; s < static_cast<int>(plan_.segments.size()); ++s) {
      const Segment& seg = plan_.segments[s];
      for (int k = 0; k < seg.num_layers; ++k) {
        if (auto st = ResolveHuginnLayer(s, k, &w->layers[seg.first_layer_slot + k]); !st.ok()) {
          return st;
        }
      }
    }
    return CheckLeftovers();
  }
  if (auto s = CheckLayout(); !s.ok()) return s;
  if (auto s = ResolveEmbeddingAndHead("model.embed_tokens.weight", "model.norm.weight",
                                       "tie_word_embeddings", /*require_untied_head=*/false, w);
      !s.ok()) {
    return s;
  }
  w->layers.resize(plan_.num_layer_slots);
  for (int s = 0; s < static_cast<int>(plan_.segments.size()); ++s) {
    const Segment& seg = plan_.segments[s];
    for (int k = 0; k < seg.num_layers; ++k) {
      if (auto st = ResolveLayer(s, k, &w->layers[seg.first_layer_slot + k], &w->dedup); !st.ok()) {
        return st;
      }
    }
  }
  if (auto s = ResolveRouters(&w->router); !s.ok()) return s;
  if (auto s = ResolveExitGate(w); !s.ok()) return s;
  return CheckLeftovers();
}

}  // namespace

const char* ProjName(Proj p) {
  switch (p) {
    case Proj::kQ:
      return "q_proj";
    case Proj::kK:
      return "k_proj";
    case Proj::kV:
      return "v_proj";
    case Proj::kO:
      return "o_proj";
    case Proj::kGate:
      return "gate_proj";
    case Proj::kUp:
      return "up_proj";
    case Proj::kDown:
      return "down_proj";
  }
  return "?";
}

absl::StatusOr<std::shared_ptr<const ModelWeights>> ResolveWeights(
    const ModelConfig& config, const LayerPlan& plan, std::shared_ptr<const TensorStore> store) {
  if (store == nullptr) return absl::InvalidArgumentError("ResolveWeights: no tensor store");
  auto w = std::make_shared<ModelWeights>();
  w->config = config;
  w->plan = plan;
  w->store = std::move(store);
  Resolver resolver(w->config, w->plan, *w->store);
  if (auto s = resolver.Run(w.get()); !s.ok()) return s;
  return std::shared_ptr<const ModelWeights>(std::move(w));
}

absl::StatusOr<std::shared_ptr<const ModelWeights>> LoadModel(const std::string& dir) {
  auto config = LoadModelConfig(dir);
  if (!config.ok()) {
    return absl::Status(config.status().code(), absl::StrCat(dir, ": ", config.status().message()));
  }
  auto plan = BuildLayerPlan(*config);
  if (!plan.ok()) {
    return absl::Status(plan.status().code(), absl::StrCat(dir, ": ", plan.status().message()));
  }
  auto store = OpenCheckpointDir(dir);
  if (!store.ok()) return store.status();
  return ResolveWeights(*config, *plan, std::shared_ptr<const TensorStore>(std::move(*store)));
}

}  // namespace morserve
