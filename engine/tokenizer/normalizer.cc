#include "engine/tokenizer/normalizer.h"

#include <unicode/bytestream.h>
#include <unicode/locid.h>
#include <unicode/normalizer2.h>
#include <unicode/unistr.h>

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "engine/tokenizer/js_regex.h"
#include "engine/tokenizer/utf8.h"

namespace morserve {
namespace {

using nlohmann::json;

class SequenceNormalizer : public Normalizer {
 public:
  explicit SequenceNormalizer(std::vector<std::unique_ptr<Normalizer>> steps)
      : steps_(std::move(steps)) {}
  std::string Normalize(std::string_view text) const override {
    std::string s(text);
    for (const auto& step : steps_) s = step->Normalize(s);
    return s;
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> steps_;
};

class ReplaceNormalizer : public Normalizer {
 public:
  ReplaceNormalizer(std::string literal, std::unique_ptr<JsRegex> regex, std::string content)
      : literal_(std::move(literal)), regex_(std::move(regex)), content_(std::move(content)) {}
  std::string Normalize(std::string_view text) const override {
    if (regex_) return regex_->ReplaceAll(text, content_);
    if (literal_.empty()) return std::string(text);
    return absl::StrReplaceAll(AView(text), {{literal_, content_}});
  }

 private:
  std::string literal_;
  std::unique_ptr<JsRegex> regex_;
  std::string content_;
};

class PrependNormalizer : public Normalizer {
 public:
  explicit PrependNormalizer(std::string prefix) : prefix_(std::move(prefix)) {}
  std::string Normalize(std::string_view text) const override {
    return absl::StrCat(prefix_, AView(text));
  }

 private:
  std::string prefix_;
};

class UnicodeNormalizer : public Normalizer {
 public:
  UnicodeNormalizer(const icu::Normalizer2* n, bool nfc) : n_(n), nfc_(nfc) {}
  std::string Normalize(std::string_view text) const override {
    // ASCII is stable under every form; under NFC so is everything below U+0300 (the first
    // code point whose NFC quick check is not Yes), i.e. UTF-8 lead bytes below 0xCC.
    const unsigned char limit = nfc_ ? 0xCC : 0x80;
    if (std::all_of(text.begin(), text.end(),
                    [&](char c) { return static_cast<unsigned char>(c) < limit; })) {
      return std::string(text);
    }
    UErrorCode status = U_ZERO_ERROR;
    icu::StringPiece piece(text.data(), static_cast<int32_t>(text.size()));
    // Most text is already normalized; the quick check works on UTF-8 without a copy.
    if (n_->isNormalizedUTF8(piece, status) && U_SUCCESS(status)) return std::string(text);
    status = U_ZERO_ERROR;
    std::string out;
    icu::StringByteSink<std::string> sink(&out);
    n_->normalizeUTF8(0, piece, sink, nullptr, status);
    if (U_FAILURE(status)) return std::string(text);
    return out;
  }

 private:
  const icu::Normalizer2* n_;
  bool nfc_;
};

class LowercaseNormalizer : public Normalizer {
 public:
  std::string Normalize(std::string_view text) const override {
    icu::UnicodeString s = icu::UnicodeString::fromUTF8(
        icu::StringPiece(text.data(), static_cast<int32_t>(text.size())));
    s.toLower(icu::Locale::getRoot());
    std::string out;
    s.toUTF8String(out);
    return out;
  }
};

class StripNormalizer : public Normalizer {
 public:
  StripNormalizer(bool left, bool right) : left_(left), right_(right) {}
  std::string Normalize(std::string_view text) const override {
    if (left_) text = TrimJsWhitespaceStart(text);
    if (right_) text = TrimJsWhitespaceEnd(text);
    return std::string(text);
  }

 private:
  bool left_, right_;
};

absl::StatusOr<std::unique_ptr<Normalizer>> MakeUnicode(const std::string& type) {
  UErrorCode status = U_ZERO_ERROR;
  const icu::Normalizer2* n = nullptr;
  if (type == "NFC") n = icu::Normalizer2::getNFCInstance(status);
  if (type == "NFD") n = icu::Normalizer2::getNFDInstance(status);
  if (type == "NFKC") n = icu::Normalizer2::getNFKCInstance(status);
  if (type == "NFKD") n = icu::Normalizer2::getNFKDInstance(status);
  if (n == nullptr || U_FAILURE(status)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "normalizer ", type,
        ": Unicode normalization data is unavailable (ICU: ", u_errorName(status), ")"));
  }
  return std::make_unique<UnicodeNormalizer>(n, type == "NFC");
}

}  // namespace

absl::StatusOr<std::unique_ptr<Normalizer>> Normalizer::FromJson(const json& config) {
  if (config.is_null()) return std::unique_ptr<Normalizer>();
  if (!config.is_object() || !config.contains("type") || !config["type"].is_string()) {
    return absl::InvalidArgumentError("normalizer: expected an object with a string 'type'");
  }
  const std::string type = config["type"];
  try {
    if (type == "Sequence") {
      std::vector<std::unique_ptr<Normalizer>> steps;
      for (const json& item : config.at("normalizers")) {
        absl::StatusOr<std::unique_ptr<Normalizer>> step = FromJson(item);
        if (!step.ok()) return step.status();
        if (*step) steps.push_back(*std::move(step));
      }
      return std::make_unique<SequenceNormalizer>(std::move(steps));
    }
    if (type == "Replace") {
      const json& pattern = config.at("pattern");
      std::string content = config.at("content");
      if (pattern.contains("Regex")) {
        absl::StatusOr<std::unique_ptr<JsRegex>> regex =
            JsRegex::Compile(pattern["Regex"].get<std::string>());
        if (!regex.ok()) return regex.status();
        return std::make_unique<ReplaceNormalizer>("", *std::move(regex), content);
      }
      return std::make_unique<ReplaceNormalizer>(pattern.at("String").get<std::string>(), nullptr,
                                                 content);
    }
    if (type == "Prepend") {
      return std::make_unique<PrependNormalizer>(config.at("prepend").get<std::string>());
    }
    if (type == "NFC" || type == "NFD" || type == "NFKC" || type == "NFKD") {
      return MakeUnicode(type);
    }
    if (type == "Lowercase") return std::make_unique<LowercaseNormalizer>();
    if (type == "Strip") {
      return std::make_unique<StripNormalizer>(config.value("strip_left", false),
                                               config.value("strip_right", false));
    }
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("normalizer ", type, ": ", e.what()));
  }
  return absl::UnimplementedError(absl::StrCat("normalizer type '", type, "' is not supported"));
}

}  // namespace morserve
