// Directory-level conversions (see convert.h).
#include "engine/convert/convert.h"

#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "engine/convert/model_dir_writer.h"
#include "engine/convert/mor_checkpoint.h"
#include "engine/convert/mor_yaml.h"
#include "engine/model/weights.h"

namespace morserve {
namespace {

absl::StatusOr<nlohmann::json> ReadConfigJson(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a JSON object"));
  }
  return j;
}

}  // namespace

absl::Status ConvertVanillaDir(const std::string& from_dir, const std::string& out_dir,
                               const RecursiveConversionOptions& options) {
  if (std::filesystem::exists(from_dir + "/recursion.json")) {
    return absl::InvalidArgumentError(absl::StrCat(
        from_dir, "/recursion.json exists: the source is already recursive; --from takes a "
                  "vanilla Llama model"));
  }
  auto config = ReadConfigJson(from_dir + "/config.json");
  if (!config.ok()) return config.status();
  auto source = LoadModel(from_dir);
  if (!source.ok()) return source.status();
  auto converted = ConvertVanillaToRecursive(**source, options);
  if (!converted.ok()) return converted.status();
  return WriteModelDir(out_dir, *config, converted->config.recursion, converted->tensors, from_dir);
}

absl::Status ConvertMorRun(const std::string& yaml_path, const std::string& checkpoint,
                           const std::string& config_path, const std::string& out_dir) {
  namespace fs = std::filesystem;
  auto recursion = LoadMorRunConfig(yaml_path);
  if (!recursion.ok()) return recursion.status();
  std::error_code ec;
  const std::string ckpt_dir =
      fs::is_directory(checkpoint, ec) ? checkpoint : fs::path(checkpoint).parent_path().string();
  const std::string cfg_path = !config_path.empty() ? config_path
                                                    : (fs::path(ckpt_dir) / "config.json").string();
  if (config_path.empty() && !fs::exists(cfg_path, ec)) {
    return absl::NotFoundError(absl::StrCat(
        "no config.json beside --checkpoint ", checkpoint, " (looked for ", cfg_path,
        "); pass the run's Hugging Face config with --config"));
  }
  auto config = ReadConfigJson(cfg_path);
  if (!config.ok()) return config.status();
  if (config->contains("recursion")) {
    return absl::InvalidArgumentError(absl::StrCat(
        cfg_path, " already has a recursion object; --from-mor-yaml builds it from the run config"));
  }
  auto store = OpenCheckpointPath(checkpoint);
  if (!store.ok()) return store.status();
  auto tensors = CopyMorTensors(**store);
  if (!tensors.ok()) return tensors.status();
  return WriteModelDirJson(out_dir, *config, *recursion, *tensors, ckpt_dir);
}

}  // namespace morserve
