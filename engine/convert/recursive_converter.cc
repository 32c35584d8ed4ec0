// Vanilla -> Recursive / Relaxed conversion (see recursive_converter.h).
#include "engine/convert/recursive_converter.h"

#include <algorithm>
#include <set>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/convert/lora_svd.h"
#include "engine/model/layer_plan.h"

namespace morserve {
namespace {

constexpr const char* kProjModule[kNumProj] = {
    "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
    "mlp.gate_proj",    "mlp.up_proj",      "mlp.down_proj"};
const std::vector<std::string> kAllTargets = {"q_proj",    "k_proj",  "v_proj",   "o_proj",
                                              "gate_proj", "up_proj", "down_proj"};

OwnedTensor CopyOf(const TensorView& v, std::string name) {
  OwnedTensor t;
  t.name = std::move(name);
  t.dtype = v.dtype;
  t.shape = v.shape;
  const auto* p = static_cast<const uint8_t*>(v.data);
  t.bytes.assign(p, p + v.nbytes());
  return t;
}

std::vector<float> Values(const OwnedTensor& t) {
  std::vector<float> out(t.bytes.size() / DTypeSize(t.dtype));
  ToF32(t.dtype, t.bytes.data(), out.size(), out.data());
  return out;
}

// The shared tensor from its sources: the exact bytes of a single source, or the fp64 mean
// of several rounded once to the sources' dtype.
OwnedTensor SharedTensor(const std::vector<const TensorView*>& sources, std::string name) {
  if (sources.size() == 1) return CopyOf(*sources[0], std::move(name));
  std::vector<double> sum(static_cast<size_t>(sources[0]->numel()), 0.0);
  for (const TensorView* v : sources) {
    const std::vector<float> x = v->ToF32Vector();
    for (size_t i = 0; i < sum.size(); ++i) sum[i] += x[i];
  }
  std::vector<float> mean(sum.size());
  for (size_t i = 0; i < sum.size(); ++i) mean[i] = static_cast<float>(sum[i] / sources.size());
  return OwnedTensor::FromF32(std::move(name), sources[0]->dtype, sources[0]->shape, mean);
}

absl::Status CheckOptions(const ModelConfig& c, const RecursiveConversionOptions& o,
                          std::vector<std::string>* targets) {
  if (c.recursion.present) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the source model is already recursive (recursion.sharing ", SharingName(c.recursion.sharing),
        "); convert --from takes a vanilla Llama model"));
  }
  if (o.sharing == Sharing::kNone) {
    return absl::InvalidArgumentError(
        "--sharing: must be cycle, sequence, middle_cycle or middle_sequence");
  }
  if (o.recursions < 2) {
    return absl::InvalidArgumentError(absl::StrCat("--recursions: must be >= 2, got ", o.recursions));
  }
  const bool middle = o.sharing == Sharing::kMiddleCycle || o.sharing == Sharing::kMiddleSequence;
  const int looped = middle ? c.num_layers - 2 : c.num_layers;
  if (looped < o.recursions || looped % o.recursions != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--recursions: ", o.recursions, " does not divide the ", looped, " layers that --sharing ",
        SharingName(o.sharing), " loops (num_hidden_layers ", c.num_layers,
        middle ? ", first and last kept unique)" : ")"));
  }
  if (o.lora_rank < 0) {
    return absl::InvalidArgumentError(absl::StrCat("--lora-rank: must be >= 0, got ", o.lora_rank));
  }
  if (o.lora_rank == 0 && (o.lora_alpha != 0.0f || !o.lora_targets.empty())) {
    return absl::InvalidArgumentError("--lora-alpha and --lora-targets need --lora-rank > 0");
  }
  if (o.lora_alpha < 0.0f) {
    return absl::InvalidArgumentError(absl::StrCat("--lora-alpha: must be > 0, got ", o.lora_alpha));
  }
  *targets = o.lora_targets.empty() ? kAllTargets : o.lora_targets;
  std::set<std::string> seen;
  for (const std::string& t : *targets) {
    if (std::find(kAllTargets.begin(), kAllTargets.end(), t) == kAllTargets.end()) {
      return absl::InvalidArgumentError(absl::StrCat("--lora-targets: unknown projection '", t,
                                                     "' (known: ", absl::StrJoin(kAllTargets, ","),
                                                     ")"));
    }
    if (!seen.insert(t).second) {
      return absl::InvalidArgumentError(absl::StrCat("--lora-targets: '", t, "' listed twice"));
    }
  }
  return absl::OkStatus();
}

class Converter {
 public:
  Converter(const ModelWeights& source, const RecursiveConversionOptions& options,
            const ModelConfig& target, const LayerPlan& plan)
      : src_(source), opt_(options), cfg_(target), plan_(plan) {}

  absl::StatusOr<std::vector<OwnedTensor>> Run();

 private:
  const LayerWeights& Original(int j) const { return src_.layers[j]; }
  absl::Status AddLayer(int segment, int k);
  absl::Status AddLora(const std::string& key, const OwnedTensor& shared, const TensorView& original);

  const ModelWeights& src_;
  const RecursiveConversionOptions& opt_;
  const ModelConfig& cfg_;
  const LayerPlan& plan_;
  std::vector<OwnedTensor> out_;
};

absl::Status Converter::AddLora(const std::string& key, const OwnedTensor& shared,
                                const TensorView& original) {
  const int rows = static_cast<int>(shared.shape[0]), cols = static_cast<int>(shared.shape[1]);
  const std::vector<float> base = Values(shared);
  const std::vector<float> orig = original.ToF32Vector();
  std::vector<double> residual(base.size());
  for (size_t i = 0; i < base.size(); ++i) residual[i] = static_cast<double>(orig[i]) - base[i];
  const LoraConfig& lora = cfg_.recursion.lora;
  auto f = TruncatedSvdLora(residual, rows, cols, lora.rank, lora.scale());
  if (!f.ok()) return absl::Status(f.status().code(), absl::StrCat(key, ": ", f.status().message()));
  const int64_t rank = lora.rank;
  out_.push_back(OwnedTensor::FromF32(key + ".lora_A.default.weight", shared.dtype, {rank, cols}, f->a));
  out_.push_back(OwnedTensor::FromF32(key + ".lora_B.default.weight", shared.dtype, {rows, rank}, f->b));
  return absl::OkStatus();
}

absl::Status Converter::AddLayer(int segment, int k) {
  const Segment& seg = plan_.segments[segment];
  const std::vector<int> sources = InitSourceLayers(plan_, opt_.init, segment, k);
  auto views = [&](auto member) {
    std::vector<const TensorView*> v;
    for (int j : sources) v.push_back(&member(Original(j)).per_loop[0]);
    return v;
  };
  const OwnedTensor in_norm = SharedTensor(views([](const LayerWeights& l) -> const LoopTensor& { return l.input_norm; }), "");
  const OwnedTensor post_norm = SharedTensor(views([](const LayerWeights& l) -> const LoopTensor& { return l.post_norm; }), "");
  std::vector<OwnedTensor> proj;
  for (int p = 0; p < kNumProj; ++p) {
    proj.push_back(SharedTensor(views([p](const LayerWeights& l) -> const LoopTensor& { return l.proj[p]; }), ""));
  }
  const bool relaxed = seg.looped() && cfg_.recursion.lora.rank > 0;
  const bool norms_per_loop =
      seg.looped() && (opt_.norms == NormTying::kPerLoop || (opt_.norms == NormTying::kAuto && relaxed));
  // Strict models store loop 0 only; Relaxed ones (and untied norms) every loop's copy.
  const int copies = relaxed || norms_per_loop ? seg.loops : 1;
  for (int loop = 0; loop < copies; ++loop) {
    const int j = plan_.UnrolledLayer(segment, loop, k);
    const std::string prefix = absl::StrCat("model.layers.", j, ".");
    const LayerWeights& orig = Original(j);
    for (auto [name, shared, mine] :
         {std::tuple{"input_layernorm", &in_norm, &orig.input_norm},
          std::tuple{"post_attention_layernorm", &post_norm, &orig.post_norm}}) {
      const std::string key = prefix + name + ".weight";
      if (norms_per_loop) {
        out_.push_back(CopyOf(mine->per_loop[0], key));
      } else {
        OwnedTensor t = *shared;
        t.name = key;
        out_.push_back(std::move(t));
      }
    }
    for (int p = 0; p < kNumProj; ++p) {
      const std::string key = prefix + kProjModule[p];
      OwnedTensor base = proj[p];
      const bool lora = relaxed && cfg_.recursion.lora.Targets(ProjName(static_cast<Proj>(p)));
      base.name = key + (lora ? ".base_layer.weight" : ".weight");
      out_.push_back(std::move(base));
      if (!lora) continue;
      if (auto s = AddLora(key, proj[p], orig.proj[p].per_loop[0]); !s.ok()) return s;
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<OwnedTensor>> Converter::Run() {
  out_.push_back(CopyOf(src_.embed, "model.embed_tokens.weight"));
  // Grouped by weight position (segment, k), each position's copies loop by loop.
  for (int s = 0; s < static_cast<int>(plan_.segments.size()); ++s) {
    for (int k = 0; k < plan_.segments[s].num_layers; ++k) {
      if (auto st = AddLayer(s, k); !st.ok()) return st;
    }
  }
  out_.push_back(CopyOf(src_.final_norm, "model.norm.weight"));
  if (!src_.lm_head_tied) out_.push_back(CopyOf(src_.lm_head, "lm_head.weight"));
  return std::move(out_);
}

}  // namespace

absl::StatusOr<ConvertedModel> ConvertVanillaToRecursive(const ModelWeights& source,
                                                         const RecursiveConversionOptions& options) {
  std::vector<std::string> targets;
  if (auto s = CheckOptions(source.config, options, &targets); !s.ok()) return s;
  ConvertedModel out;
  out.config = source.config;
  RecursionConfig& rc = out.config.recursion;
  rc.present = true;
  rc.num_recursions = options.recursions;
  rc.sharing = options.sharing;
  if (options.lora_rank > 0) {
    rc.lora.rank = options.lora_rank;
    rc.lora.alpha = options.lora_alpha > 0 ? options.lora_alpha : static_cast<float>(options.lora_rank);
    rc.lora.targets = targets;
  }
  auto plan = BuildLayerPlan(out.config);
  if (!plan.ok()) return plan.status();
  auto tensors = Converter(source, options, out.config, *plan).Run();
  if (!tensors.ok()) return tensors.status();
  out.tensors = std::move(*tensors);
  return out;
}

}  // namespace morserve
