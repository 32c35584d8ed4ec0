// Engine flags (see engine_flags.h).
#include "engine/tools/engine_flags.h"

#include "absl/strings/str_cat.h"

namespace morserve {

const std::set<std::string>& EngineFlagNames() {
  static const std::set<std::string> names = {
      "mode",       "weights",      "max-batch",   "max-step-tokens", "max-running",
      "block-size", "kv-blocks",    "kv-cache-mb", "threads",         "recurrent-prefill",
      "device",     "prefix-cache", "cuda-graphs", "cuda-gemm",       "cuda-attention-fold"};
  return names;
}

absl::StatusOr<BatchingMode> ParseBatchingMode(const std::string& s) {
  if (s == "depth") return BatchingMode::kDepthWise;
  if (s == "sequence") return BatchingMode::kSequenceWise;
  return absl::InvalidArgumentError(absl::StrCat("--mode: depth or sequence, got '", s, "'"));
}

absl::StatusOr<CpuWeights> ParseCpuWeights(const std::string& s) {
  if (s == "auto") return CpuWeights::kAuto;
  if (s == "f32") return CpuWeights::kF32;
  if (s == "bf16") return CpuWeights::kBF16;
  if (s == "f16") return CpuWeights::kF16;
  if (s == "int8") return CpuWeights::kInt8;
  if (s == "amx-bf16") return CpuWeights::kAmxBf16;
  if (s == "w8a8") return CpuWeights::kW8A8;
  return absl::InvalidArgumentError(
      absl::StrCat("--weights: auto, f32, bf16, f16, int8, amx-bf16 or w8a8, got '", s, "'"));
}

const char* CpuWeightsName(CpuWeights w) {
  switch (w) {
    case CpuWeights::kAuto:
      return "auto";
    case CpuWeights::kF32:
      return "f32";
    case CpuWeights::kBF16:
      return "bf16";
    case CpuWeights::kF16:
      return "f16";
    case CpuWeights::kInt8:
      return "int8";
    case CpuWeights::kAmxBf16:
      return "amx-bf16";
    case CpuWeights::kW8A8:
      return "w8a8";
  }
  return "?";
}

const char* BatchingModeName(BatchingMode m) {
  return m == BatchingMode::kDepthWise ? "depth" : "sequence";
}

absl::StatusOr<EngineConfig> EngineConfigFromFlags(const Flags& flags) {
  EngineConfig c;
  auto mode = ParseBatchingMode(flags.Get("mode", "depth"));
  if (!mode.ok()) return mode.status();
  c.mode = *mode;
  auto weights = ParseCpuWeights(flags.Get("weights", "auto"));
  if (!weights.ok()) return weights.status();
  c.weights = *weights;
  const std::string device = flags.Get("device", "cpu");
  if (device != "cpu" && device != "cuda")
    return absl::InvalidArgumentError("--device: cpu or cuda");
  c.device = device == "cuda" ? Device::kCuda : Device::kCpu;
  const std::string prefill = flags.Get("recurrent-prefill", "tiled");
  if (prefill != "tiled" && prefill != "naive") {
    return absl::InvalidArgumentError(
        absl::StrCat("--recurrent-prefill: tiled or naive, got '", prefill, "'"));
  }
  c.recurrent_prefill = prefill == "naive" ? RecurrentPrefill::kNaive : RecurrentPrefill::kTiled;
  const std::string prefix_cache = flags.Get("prefix-cache", "on");
  if (prefix_cache != "on" && prefix_cache != "off") {
    return absl::InvalidArgumentError(
        absl::StrCat("--prefix-cache: on or off, got '", prefix_cache, "'"));
  }
  c.prefix_cache = prefix_cache == "on";
  const std::string graphs = flags.Get("cuda-graphs", "on");
  if (graphs != "on" && graphs != "off") {
    return absl::InvalidArgumentError(absl::StrCat("--cuda-graphs: on or off, got '", graphs, "'"));
  }
  c.cuda_graphs = graphs == "on";
  const std::string gemm = flags.Get("cuda-gemm", "auto");
  if (gemm == "auto") {
    c.cuda_gemm = CudaGemm::kAuto;
  } else if (gemm == "cublaslt") {
    c.cuda_gemm = CudaGemm::kCublasLt;
  } else if (gemm == "fixed") {
    c.cuda_gemm = CudaGemm::kFixed;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("--cuda-gemm: auto, cublaslt or fixed, got '", gemm, "'"));
  }
  const std::string fold = flags.Get("cuda-attention-fold", "cta");
  if (fold != "cta" && fold != "warp") {
    return absl::InvalidArgumentError(
        absl::StrCat("--cuda-attention-fold: cta or warp, got '", fold, "'"));
  }
  c.cuda_attention_fold = fold == "warp" ? CudaAttentionFold::kWarp : CudaAttentionFold::kCta;
  struct IntFlag {
    const char* name;
    int* out;
    int min;
  };
  int kv_mb = static_cast<int>(c.kv_cache_bytes >> 20);
  for (IntFlag f :
       {IntFlag{"max-batch", &c.max_batch_rows, 1},
        IntFlag{"max-step-tokens", &c.max_step_tokens, 1},
        IntFlag{"max-running", &c.max_running, 1}, IntFlag{"block-size", &c.block_size, 1},
        IntFlag{"kv-blocks", &c.num_kv_blocks, 0}, IntFlag{"kv-cache-mb", &kv_mb, 1},
        IntFlag{"threads", &c.threads, 0}}) {
    auto v = flags.GetInt(f.name, *f.out);
    if (!v.ok()) return v.status();
    if (*v < f.min)
      return absl::InvalidArgumentError(absl::StrCat("--", f.name, ": must be >= ", f.min));
    *f.out = *v;
  }
  c.kv_cache_bytes = static_cast<int64_t>(kv_mb) << 20;
  if (!flags.Has("max-running")) c.max_running = c.max_batch_rows;
  return c;
}

}  // namespace morserve
