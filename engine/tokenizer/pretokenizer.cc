#include "engine/tokenizer/pretokenizer.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "engine/tokenizer/js_regex.h"
#include "engine/tokenizer/utf8.h"

namespace morserve {
namespace {

using nlohmann::json;

// GPT-2's pattern, used by ByteLevel with use_regex (transformers.js' form of it).
constexpr const char* kGpt2Pattern =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

class SequencePreTokenizer : public PreTokenizer {
 public:
  explicit SequencePreTokenizer(std::vector<std::unique_ptr<PreTokenizer>> steps)
      : steps_(std::move(steps)) {}
  void Split(std::string_view text, int section_index,
             std::vector<std::string>* words) const override {
    std::vector<std::string> current{std::string(text)}, next;
    for (const auto& step : steps_) {
      next.clear();
      for (const std::string& w : current) step->Split(w, section_index, &next);
      current.swap(next);
    }
    for (std::string& w : current) words->push_back(std::move(w));
  }
  bool byte_level() const override { return !steps_.empty() && steps_.back()->byte_level(); }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> steps_;
};

enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

class SplitPreTokenizer : public PreTokenizer {
 public:
  SplitPreTokenizer(std::string literal, std::unique_ptr<JsRegex> regex, SplitBehavior behavior,
                    bool invert)
      : literal_(std::move(literal)),
        regex_(std::move(regex)),
        behavior_(behavior),
        invert_(invert) {}

  void Split(std::string_view text, int, std::vector<std::string>* words) const override {
    // Pieces in order, each flagged as a match of the pattern (or, inverted, a non-match).
    std::vector<std::pair<std::string_view, bool>> pieces;
    size_t prev = 0;
    auto on_match = [&](size_t start, size_t end) {
      if (start > prev) pieces.push_back({text.substr(prev, start - prev), false});
      if (end > start) pieces.push_back({text.substr(start, end - start), true});
      prev = end;
    };
    if (regex_) {
      regex_->ForEachMatch(text, on_match);
    } else if (!literal_.empty()) {
      for (size_t at = text.find(literal_); at != std::string_view::npos;
           at = text.find(literal_, at + literal_.size())) {
        on_match(at, at + literal_.size());
      }
    }
    if (prev < text.size()) pieces.push_back({text.substr(prev), false});
    if (invert_) {
      for (auto& p : pieces) p.second = !p.second;
    }
    std::string pending;  // kMergedWithNext: delimiters waiting for the next piece
    bool have_pending = false;
    for (size_t i = 0; i < pieces.size(); ++i) {
      auto [piece, is_delim] = pieces[i];
      switch (behavior_) {
        case SplitBehavior::kRemoved:
          if (!is_delim) words->emplace_back(piece);
          break;
        case SplitBehavior::kIsolated:
          words->emplace_back(piece);
          break;
        case SplitBehavior::kMergedWithPrevious:
          if (is_delim && !words->empty() && i > 0) {
            words->back().append(piece);
          } else {
            words->emplace_back(piece);
          }
          break;
        case SplitBehavior::kMergedWithNext:
          if (is_delim) {
            pending.append(piece);
            have_pending = true;
          } else {
            words->push_back(absl::StrCat(pending, AView(piece)));
            pending.clear();
            have_pending = false;
          }
          break;
        case SplitBehavior::kContiguous:
          if (is_delim && i > 0 && pieces[i - 1].second && !words->empty()) {
            words->back().append(piece);
          } else {
            words->emplace_back(piece);
          }
          break;
      }
    }
    if (have_pending) words->push_back(pending);
  }

 private:
  std::string literal_;
  std::unique_ptr<JsRegex> regex_;
  SplitBehavior behavior_;
  bool invert_;
};

class ByteLevelPreTokenizer : public PreTokenizer {
 public:
  ByteLevelPreTokenizer(bool add_prefix_space, std::unique_ptr<JsRegex> regex)
      : add_prefix_space_(add_prefix_space), regex_(std::move(regex)) {}
  void Split(std::string_view text, int, std::vector<std::string>* words) const override {
    std::string prefixed;
    if (add_prefix_space_ && !absl::StartsWith(AView(text), " ")) {
      prefixed = absl::StrCat(" ", AView(text));
      text = prefixed;
    }
    if (!regex_) {
      words->emplace_back(text);
      return;
    }
    // text.match(pattern): the matches only.
    regex_->ForEachMatch(text, [&](size_t start, size_t end) {
      if (end > start) words->emplace_back(text.substr(start, end - start));
    });
  }
  bool byte_level() const override { return true; }

 private:
  bool add_prefix_space_;
  std::unique_ptr<JsRegex> regex_;
};

// Pre-tokenizers that keep the matches of one regex (transformers.js' Digits, Punctuation,
// Whitespace and WhitespaceSplit).
class MatchesPreTokenizer : public PreTokenizer {
 public:
  explicit MatchesPreTokenizer(std::unique_ptr<JsRegex> regex) : regex_(std::move(regex)) {}
  void Split(std::string_view text, int, std::vector<std::string>* words) const override {
    regex_->ForEachMatch(text, [&](size_t start, size_t end) {
      if (end > start) words->emplace_back(text.substr(start, end - start));
    });
  }

 private:
  std::unique_ptr<JsRegex> regex_;
};

class MetaspacePreTokenizer : public PreTokenizer {
 public:
  MetaspacePreTokenizer(std::string replacement, std::string str_rep, bool add_prefix_space,
                        std::string prepend_scheme)
      : replacement_(std::move(replacement)),
        str_rep_(std::move(str_rep)),
        add_prefix_space_(add_prefix_space),
        prepend_scheme_(std::move(prepend_scheme)) {}
  // As transformers.js: spaces become the replacement and the text stays one word.
  void Split(std::string_view text, int section_index,
             std::vector<std::string>* words) const override {
    std::string s = absl::StrReplaceAll(AView(text), {{" ", str_rep_}});
    if (add_prefix_space_ && !absl::StartsWith(s, replacement_) &&
        (prepend_scheme_ == "always" || (prepend_scheme_ == "first" && section_index == 0))) {
      s = absl::StrCat(str_rep_, s);
    }
    words->push_back(std::move(s));
  }

 private:
  std::string replacement_, str_rep_;
  bool add_prefix_space_;
  std::string prepend_scheme_;
};

absl::StatusOr<SplitBehavior> ParseBehavior(const std::string& name) {
  if (name == "Removed") return SplitBehavior::kRemoved;
  if (name == "Isolated") return SplitBehavior::kIsolated;
  if (name == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (name == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (name == "Contiguous") return SplitBehavior::kContiguous;
  return absl::InvalidArgumentError(absl::StrCat("Split: unknown behavior '", name, "'"));
}

}  // namespace

std::unique_ptr<PreTokenizer> MakeMetaspacePreTokenizer(std::string replacement,
                                                        bool add_prefix_space,
                                                        std::string prepend_scheme) {
  std::string str_rep = replacement;
  return std::make_unique<MetaspacePreTokenizer>(std::move(replacement), std::move(str_rep),
                                                 add_prefix_space, std::move(prepend_scheme));
}

absl::StatusOr<std::unique_ptr<PreTokenizer>> PreTokenizer::FromJson(const json& config) {
  if (config.is_null()) return std::unique_ptr<PreTokenizer>();
  if (!config.is_object() || !config.contains("type") || !config["type"].is_string()) {
    return absl::InvalidArgumentError("pre_tokenizer: expected an object with a string 'type'");
  }
  const std::string type = config["type"];
  try {
    if (type == "Sequence") {
      std::vector<std::unique_ptr<PreTokenizer>> steps;
      for (const json& item : config.at("pretokenizers")) {
        absl::StatusOr<std::unique_ptr<PreTokenizer>> step = FromJson(item);
        if (!step.ok()) return step.status();
        if (!*step) continue;
        if (!steps.empty() && steps.back()->byte_level()) {
          return absl::UnimplementedError(
              "pre_tokenizer Sequence: steps after ByteLevel are not supported");
        }
        steps.push_back(*std::move(step));
      }
      return std::make_unique<SequencePreTokenizer>(std::move(steps));
    }
    if (type == "Split") {
      const json& pattern = config.at("pattern");
      absl::StatusOr<SplitBehavior> behavior =
          ParseBehavior(config.value("behavior", std::string("Isolated")));
      if (!behavior.ok()) return behavior.status();
      bool invert = config.value("invert", false);
      if (pattern.contains("Regex")) {
        absl::StatusOr<std::unique_ptr<JsRegex>> regex =
            JsRegex::Compile(pattern["Regex"].get<std::string>());
        if (!regex.ok()) return regex.status();
        return std::make_unique<SplitPreTokenizer>("", *std::move(regex), *behavior, invert);
      }
      return std::make_unique<SplitPreTokenizer>(pattern.at("String").get<std::string>(), nullptr,
                                                 *behavior, invert);
    }
    if (type == "ByteLevel") {
      std::unique_ptr<JsRegex> regex;
      if (config.value("use_regex", true)) {
        absl::StatusOr<std::unique_ptr<JsRegex>> compiled = JsRegex::Compile(kGpt2Pattern);
        if (!compiled.ok()) return compiled.status();
        regex = *std::move(compiled);
      }
      return std::make_unique<ByteLevelPreTokenizer>(config.value("add_prefix_space", false),
                                                     std::move(regex));
    }
    std::string matches_pattern;
    if (type == "Digits") {
      matches_pattern = config.value("individual_digits", false) ? "[^\\d]+|\\d" : "[^\\d]+|\\d+";
    } else if (type == "Punctuation") {
      const char* p = "\\p{P}\\x{21}-\\x{2F}\\x{3A}-\\x{40}\\x{5B}-\\x{60}\\x{7B}-\\x{7E}";
      matches_pattern = absl::StrCat("[^", p, "]+|[", p, "]+");
    } else if (type == "Whitespace") {
      matches_pattern = "\\w+|[^\\w\\s]+";
    } else if (type == "WhitespaceSplit") {
      matches_pattern = "\\S+";
    }
    if (!matches_pattern.empty()) {
      absl::StatusOr<std::unique_ptr<JsRegex>> regex = JsRegex::Compile(matches_pattern);
      if (!regex.ok()) return regex.status();
      return std::make_unique<MatchesPreTokenizer>(*std::move(regex));
    }
    if (type == "Metaspace") {
      std::string replacement = config.at("replacement");
      std::string str_rep = config.value("str_rep", std::string());
      if (str_rep.empty()) str_rep = replacement;
      std::string scheme = config.value("prepend_scheme", std::string("always"));
      return std::make_unique<MetaspacePreTokenizer>(
          replacement, str_rep, config.value("add_prefix_space", false), scheme);
    }
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("pre_tokenizer ", type, ": ", e.what()));
  }
  return absl::UnimplementedError(absl::StrCat("pre_tokenizer type '", type, "' is not supported"));
}

}  // namespace morserve
