// Normalizers of tokenizer.json: text -> text before pre-tokenization, applied to each span
// between added tokens. Supported: Sequence, Replace (String or Regex), Prepend, NFC, NFD,
// NFKC, NFKD (ICU), Lowercase, Strip. Anything else is an error at load, never a silent skip.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace morserve {

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  virtual std::string Normalize(std::string_view text) const = 0;
  // A null JSON value yields nullptr (no normalizer).
  static absl::StatusOr<std::unique_ptr<Normalizer>> FromJson(const nlohmann::json& config);
};

}  // namespace morserve
