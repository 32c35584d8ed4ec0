#include "engine/tokenizer/chat_template.h"

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace morserve {
namespace {

// The special-token attributes transformers passes to every chat template.
constexpr const char* kSpecialTokens[] = {"bos_token", "eos_token", "unk_token", "sep_token",
                                          "pad_token", "cls_token", "mask_token"};

// A token in tokenizer_config.json is a string or an AddedToken object {"content": ...}.
std::optional<std::string> TokenText(const nlohmann::json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) {
    return v["content"].get<std::string>();
  }
  return std::nullopt;
}

}  // namespace

absl::Status ChatTemplate::ReadSpecialTokens(const nlohmann::json& config) {
  if (config.is_null()) return absl::OkStatus();
  if (!config.is_object())
    return absl::InvalidArgumentError("tokenizer_config must be a JSON object");
  for (const char* key : kSpecialTokens) {
    auto it = config.find(key);
    if (it == config.end() || it->is_null()) continue;
    std::optional<std::string> text = TokenText(*it);
    if (!text) {
      return absl::InvalidArgumentError(
          absl::StrCat("tokenizer_config: ", key, " must be a string or {\"content\": string}"));
    }
    special_tokens_[key] = *text;
  }
  if (auto it = config.find("additional_special_tokens"); it != config.end() && it->is_array()) {
    nlohmann::ordered_json list = nlohmann::ordered_json::array();
    for (const auto& t : *it) {
      if (std::optional<std::string> text = TokenText(t)) list.push_back(*text);
    }
    special_tokens_["additional_special_tokens"] = std::move(list);
  }
  return absl::OkStatus();
}

absl::StatusOr<ChatTemplate> ChatTemplate::FromTokenizerConfig(const nlohmann::json& config) {
  if (!config.is_object())
    return absl::InvalidArgumentError("tokenizer_config must be a JSON object");
  auto it = config.find("chat_template");
  if (it == config.end() || it->is_null()) {
    return absl::NotFoundError("tokenizer_config.json has no chat_template");
  }
  ChatTemplate ct;
  if (absl::Status s = ct.ReadSpecialTokens(config); !s.ok()) return s;
  if (it->is_string()) {
    absl::StatusOr<jinja::Template> t = jinja::Template::Parse(it->get<std::string>());
    if (!t.ok()) return t.status();
    ct.templates_.emplace("default", *std::move(t));
    return ct;
  }
  if (!it->is_array()) {
    return absl::InvalidArgumentError(
        "chat_template must be a string or a list of {name, template}");
  }
  for (const auto& entry : *it) {
    if (!entry.is_object() || !entry.contains("name") || !entry["name"].is_string() ||
        !entry.contains("template") || !entry["template"].is_string()) {
      return absl::InvalidArgumentError(
          "chat_template list entries must be {name, template} strings");
    }
    const std::string name = entry["name"].get<std::string>();
    absl::StatusOr<jinja::Template> t =
        jinja::Template::Parse(entry["template"].get<std::string>());
    if (!t.ok()) {
      return absl::Status(t.status().code(),
                          absl::StrCat("chat_template '", name, "': ", t.status().message()));
    }
    ct.templates_.insert_or_assign(name, *std::move(t));
  }
  if (ct.templates_.empty()) return absl::NotFoundError("chat_template list is empty");
  return ct;
}

absl::StatusOr<ChatTemplate> ChatTemplate::FromString(std::string_view source,
                                                      const nlohmann::json& config) {
  ChatTemplate ct;
  if (absl::Status s = ct.ReadSpecialTokens(config); !s.ok()) return s;
  absl::StatusOr<jinja::Template> t = jinja::Template::Parse(source);
  if (!t.ok()) return t.status();
  ct.templates_.emplace("default", *std::move(t));
  return ct;
}

absl::StatusOr<std::string> ChatTemplate::Render(const nlohmann::json& messages,
                                                 bool add_generation_prompt,
                                                 const nlohmann::json& extra) const {
  return Render(nlohmann::ordered_json(messages), add_generation_prompt,
                extra.is_null() ? nlohmann::ordered_json() : nlohmann::ordered_json(extra));
}

absl::StatusOr<std::string> ChatTemplate::Render(const nlohmann::ordered_json& messages,
                                                 bool add_generation_prompt,
                                                 const nlohmann::ordered_json& extra) const {
  if (!messages.is_array()) return absl::InvalidArgumentError("messages must be a JSON array");
  if (!extra.is_null() && !extra.is_object()) {
    return absl::InvalidArgumentError("extra template variables must be a JSON object");
  }
  const bool has_tools = extra.is_object() && extra.contains("tools") && !extra["tools"].is_null();
  auto pick = templates_.find(has_tools && templates_.count("tool_use") ? "tool_use" : "default");
  if (pick == templates_.end()) {
    std::vector<std::string> names;
    for (const auto& [name, t] : templates_) names.push_back(name);
    return absl::NotFoundError(
        absl::StrCat("no 'default' chat template; available: ", absl::StrJoin(names, ", ")));
  }
  nlohmann::ordered_json context = nlohmann::ordered_json::object();
  context["messages"] = messages;
  context["tools"] = nullptr;
  context["documents"] = nullptr;
  context["add_generation_prompt"] = add_generation_prompt;
  for (const auto& [k, v] : special_tokens_.items()) context[k] = v;
  if (extra.is_object()) {
    for (const auto& [k, v] : extra.items()) context[k] = v;
  }
  return pick->second.Render(context, options_);
}

}  // namespace morserve
