#include "engine/tokenizer/decoder.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "engine/tokenizer/added_tokens.h"
#include "engine/tokenizer/bpe.h"
#include "engine/tokenizer/utf8.h"

namespace morserve {
namespace {

using nlohmann::json;

absl::Status ParseInto(const json& config, std::vector<DecoderStep>* steps) {
  if (!config.is_object() || !config.contains("type") || !config["type"].is_string()) {
    return absl::InvalidArgumentError("decoder: expected an object with a string 'type'");
  }
  const std::string type = config["type"];
  try {
    DecoderStep step;
    if (type == "Sequence") {
      for (const json& item : config.at("decoders")) {
        absl::Status s = ParseInto(item, steps);
        if (!s.ok()) return s;
      }
      return absl::OkStatus();
    } else if (type == "ByteLevel") {
      step.kind = DecoderStep::Kind::kByteLevel;
    } else if (type == "Replace") {
      step.kind = DecoderStep::Kind::kReplace;
      const json& pattern = config.at("pattern");
      if (!pattern.contains("String")) {
        return absl::UnimplementedError("decoder Replace: only String patterns are supported");
      }
      step.pattern = pattern["String"];
      step.content = config.at("content");
    } else if (type == "ByteFallback") {
      step.kind = DecoderStep::Kind::kByteFallback;
    } else if (type == "Fuse") {
      step.kind = DecoderStep::Kind::kFuse;
    } else if (type == "Strip") {
      step.kind = DecoderStep::Kind::kStrip;
      step.content = config.at("content");
      step.start = config.value("start", 0);
      step.stop = config.value("stop", 0);
      if (Utf16Length(step.content) != 1) {
        return absl::UnimplementedError("decoder Strip: content must be one character");
      }
    } else if (type == "Metaspace") {
      step.kind = DecoderStep::Kind::kMetaspace;
      step.pattern = config.at("replacement");
      step.add_prefix_space = config.value("add_prefix_space", false);
    } else {
      return absl::UnimplementedError(absl::StrCat("decoder type '", type, "' is not supported"));
    }
    steps->push_back(std::move(step));
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("decoder ", type, ": ", e.what()));
  }
  return absl::OkStatus();
}

std::string DecodeBytes(std::string_view bytes, bool strip_bom) {
  std::string out;
  Utf8StreamDecoder decoder(strip_bom);
  decoder.Feed(bytes, &out);
  decoder.Finish(&out);
  return out;
}

std::string ByteLevelToBytes(std::string_view token) {
  std::string bytes;
  for (size_t i = 0; i < token.size();) {
    int b = UnicodeToByte(NextCodePoint(token, &i));
    bytes.push_back(static_cast<char>(b < 0 ? 0 : b));
  }
  return bytes;
}

std::vector<std::string> Apply(const DecoderStep& step, std::vector<std::string> tokens,
                               const AddedTokenSplitter& added) {
  std::vector<std::string> out;
  switch (step.kind) {
    case DecoderStep::Kind::kByteLevel: {
      std::string bytes;
      bool open = false;
      for (std::string& t : tokens) {
        if (added.Find(t) != nullptr) {
          if (open) out.push_back(DecodeBytes(bytes, false));
          bytes.clear();
          open = false;
          out.push_back(std::move(t));
        } else {
          bytes += ByteLevelToBytes(t);
          open = true;
        }
      }
      if (open) out.push_back(DecodeBytes(bytes, false));
      return out;
    }
    case DecoderStep::Kind::kReplace:
      for (std::string& t : tokens) {
        out.push_back(step.pattern.empty()
                          ? std::move(t)
                          : absl::StrReplaceAll(t, {{step.pattern, step.content}}));
      }
      return out;
    case DecoderStep::Kind::kByteFallback: {
      std::string bytes;
      for (std::string& t : tokens) {
        int b = ParseByteToken(t);
        if (b >= 0) {
          bytes.push_back(static_cast<char>(b));
          continue;
        }
        if (!bytes.empty()) out.push_back(DecodeBytes(bytes, true));
        bytes.clear();
        out.push_back(std::move(t));
      }
      if (!bytes.empty()) out.push_back(DecodeBytes(bytes, true));
      return out;
    }
    case DecoderStep::Kind::kFuse:
      out.push_back(absl::StrJoin(tokens, ""));
      return out;
    case DecoderStep::Kind::kStrip:
      for (std::string& t : tokens) {
        std::string_view s = t;
        for (int i = 0; i < step.start && s.substr(0, step.content.size()) == step.content; ++i) {
          s.remove_prefix(step.content.size());
        }
        for (int i = 0; i < step.stop && s.size() >= step.content.size() &&
                        s.substr(s.size() - step.content.size()) == step.content;
             ++i) {
          s.remove_suffix(step.content.size());
        }
        out.emplace_back(s);
      }
      return out;
    case DecoderStep::Kind::kMetaspace:
      for (size_t i = 0; i < tokens.size(); ++i) {
        std::string s = absl::StrReplaceAll(tokens[i], {{step.pattern, " "}});
        if (step.add_prefix_space && i == 0 && !s.empty() && s[0] == ' ') s.erase(0, 1);
        out.push_back(std::move(s));
      }
      return out;
  }
  return out;
}

}  // namespace

absl::StatusOr<std::vector<DecoderStep>> ParseDecoder(const json& config) {
  std::vector<DecoderStep> steps;
  if (config.is_null()) return steps;
  absl::Status s = ParseInto(config, &steps);
  if (!s.ok()) return s;
  return steps;
}

int ParseByteToken(std::string_view t) {
  if (t.size() != 6 || t.substr(0, 3) != "<0x" || t[5] != '>') return -1;
  auto hex = [](char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  int hi = hex(t[3]), lo = hex(t[4]);
  if (hi < 0) return -1;
  return lo < 0 ? hi : hi * 16 + lo;  // parseInt stops at the first non-digit
}

std::string RunDecoder(const std::vector<DecoderStep>& steps, bool has_decoder,
                       const std::vector<std::string_view>& tokens,
                       const AddedTokenSplitter& added) {
  if (!has_decoder) {
    std::string joined;
    for (size_t i = 0; i < tokens.size(); ++i) {
      if (i > 0) joined.push_back(' ');
      joined.append(tokens[i]);
    }
    return joined;
  }
  std::vector<std::string> current(tokens.begin(), tokens.end());
  for (const DecoderStep& step : steps) current = Apply(step, std::move(current), added);
  return absl::StrJoin(current, "");
}

std::string CleanUpTokenization(std::string_view text) {
  static constexpr std::pair<const char*, const char*> kPatterns[] = {
      {" .", "."},     {" ?", "?"},   {" !", "!"},   {" ,", ","},     {" ' ", "'"},
      {" n't", "n't"}, {" 'm", "'m"}, {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"}};
  std::string s(text);
  if (s.find(' ') == std::string::npos) return s;
  for (const auto& [from, to] : kPatterns) s = absl::StrReplaceAll(s, {{from, to}});
  return s;
}

bool IsCleanUpSafeBoundary(char before) {
  return before != ' ' && before != '\'' && before != 'n' && before != 'v' && before != 'r';
}

}  // namespace morserve
