// `morserve convert`: vanilla Llama -> Recursive / Relaxed Recursive model, or an official
// MoR training run -> a directory this server loads. Flags are parsed and checked here; the
// work is in engine/convert.
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "engine/convert/convert.h"
#include "engine/tools/commands.h"
#include "engine/tools/flags.h"

namespace morserve {
namespace {

const char kUsage[] =
    "usage: morserve convert --from DIR --out DIR --sharing S --recursions N --init I\n"
    "                        [--lora-rank R [--lora-alpha A] [--lora-targets q_proj,...]]\n"
    "                        [--norms shared|per-loop]\n"
    "       morserve convert --from-mor-yaml RUN.yaml --checkpoint DIR_OR_FILE --out DIR\n"
    "                        [--config config.json]\n"
    "  --sharing     cycle | sequence | middle_cycle | middle_sequence\n"
    "  --recursions  loops of the shared block; must divide the looped depth\n"
    "  --init        stepwise | average | lower (initialisation of the shared layers)\n"
    "  --lora-rank   per-loop LoRA rank (Relaxed); 0 = strict sharing. Initialised by truncated\n"
    "                SVD of W_layer - W_shared. --lora-alpha defaults to the rank (scale 1),\n"
    "                --lora-targets to all seven projections.\n"
    "  --norms       RMSNorm weights: shared, or per-loop originals (default: per-loop when\n"
    "                --lora-rank > 0, else shared)\n";

absl::StatusOr<Sharing> ParseSharingFlag(const std::string& v) {
  if (v == "cycle") return Sharing::kCycle;
  if (v == "sequence") return Sharing::kSequence;
  if (v == "middle_cycle") return Sharing::kMiddleCycle;
  if (v == "middle_sequence") return Sharing::kMiddleSequence;
  return absl::InvalidArgumentError(absl::StrCat(
      "--sharing: must be cycle, sequence, middle_cycle or middle_sequence, got '", v, "'"));
}

absl::Status Require(const Flags& f, std::initializer_list<const char*> names) {
  for (const char* n : names) {
    if (!f.Has(n) || f.Get(n).empty()) return absl::InvalidArgumentError(absl::StrCat("--", n, " is required"));
  }
  return absl::OkStatus();
}

absl::Status RefuseMixed(const Flags& f, const char* mode, std::initializer_list<const char*> names) {
  for (const char* n : names) {
    if (f.Has(n)) return absl::InvalidArgumentError(absl::StrCat("--", n, " does not apply to ", mode));
  }
  return absl::OkStatus();
}

absl::StatusOr<RecursiveConversionOptions> RecursiveOptions(const Flags& f) {
  if (auto s = Require(f, {"from", "out", "sharing", "recursions", "init"}); !s.ok()) return s;
  RecursiveConversionOptions o;
  auto sharing = ParseSharingFlag(f.Get("sharing"));
  if (!sharing.ok()) return sharing.status();
  o.sharing = *sharing;
  auto nr = f.GetInt("recursions", 0);
  if (!nr.ok()) return nr.status();
  o.recursions = *nr;
  auto init = ParseInitStrategy(f.Get("init"));
  if (!init.ok()) return init.status();
  o.init = *init;
  auto rank = f.GetInt("lora-rank", 0);
  if (!rank.ok()) return rank.status();
  o.lora_rank = *rank;
  auto alpha = f.GetDouble("lora-alpha", 0.0);
  if (!alpha.ok()) return alpha.status();
  if (f.Has("lora-alpha") && !(*alpha > 0)) {
    return absl::InvalidArgumentError(absl::StrCat("--lora-alpha: must be > 0, got ", f.Get("lora-alpha")));
  }
  o.lora_alpha = static_cast<float>(*alpha);
  o.lora_targets = f.GetList("lora-targets");
  if (f.Has("norms")) {
    const std::string n = f.Get("norms");
    if (n == "shared") {
      o.norms = NormTying::kShared;
    } else if (n == "per-loop") {
      o.norms = NormTying::kPerLoop;
    } else {
      return absl::InvalidArgumentError(absl::StrCat("--norms: must be shared or per-loop, got '", n, "'"));
    }
  }
  return o;
}

// `usage` is set for mistakes in the command line itself (exit 2 rather than 1).
absl::Status Run(const Args& args, bool* usage) {
  *usage = true;
  auto f = Flags::Parse(args,
                        {"from", "out", "sharing", "recursions", "init", "lora-rank", "lora-alpha",
                         "lora-targets", "norms", "from-mor-yaml", "checkpoint", "config"},
                        {});
  if (!f.ok()) return f.status();
  if (f->Has("from-mor-yaml")) {
    if (auto s = RefuseMixed(*f, "--from-mor-yaml",
                             {"from", "sharing", "recursions", "init", "lora-rank", "lora-alpha",
                              "lora-targets", "norms"});
        !s.ok()) {
      return s;
    }
    if (auto s = Require(*f, {"from-mor-yaml", "checkpoint", "out"}); !s.ok()) return s;
    *usage = false;
    if (auto s = ConvertMorRun(f->Get("from-mor-yaml"), f->Get("checkpoint"), f->Get("config"),
                               f->Get("out"));
        !s.ok()) {
      return s;
    }
    std::printf("wrote %s from the MoR run %s\n", f->Get("out").c_str(), f->Get("from-mor-yaml").c_str());
    return absl::OkStatus();
  }
  if (auto s = RefuseMixed(*f, "--from (vanilla conversion)", {"checkpoint", "config"}); !s.ok()) return s;
  auto options = RecursiveOptions(*f);
  if (!options.ok()) return options.status();
  *usage = false;
  if (auto s = ConvertVanillaDir(f->Get("from"), f->Get("out"), *options); !s.ok()) return s;
  std::printf("wrote %s (%s, %d recursions, %s init, LoRA rank %d)\n", f->Get("out").c_str(),
              f->Get("sharing").c_str(), options->recursions, InitStrategyName(options->init),
              options->lora_rank);
  return absl::OkStatus();
}

}  // namespace

int ConvertCommand(const Args& args) {
  for (const std::string& a : args) {
    if (a == "--help" || a == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    }
  }
  if (args.empty()) {
    std::fputs(kUsage, stderr);
    return 2;
  }
  bool usage = false;
  const absl::Status s = Run(args, &usage);
  if (s.ok()) return 0;
  std::fprintf(stderr, "morserve convert: %s\n", std::string(s.message()).c_str());
  // Usage mistakes exit 2 as the other commands do, including option values the conversion
  // rejects (their messages start with the flag); failures of the conversion itself exit 1.
  const bool flag_value = s.code() == absl::StatusCode::kInvalidArgument && s.message().rfind("--", 0) == 0;
  return usage || flag_value ? 2 : 1;
}

}  // namespace morserve
