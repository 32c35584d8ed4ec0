// Renders chat messages into a prompt with the model's own Jinja chat template, as
// transformers' apply_chat_template(tokenize=False) does: the template sees `messages`,
// `add_generation_prompt`, `tools` and `documents` (None unless given), the special tokens
// of tokenizer_config.json (bos_token, eos_token, ...), and any extra variables
// (e.g. enable_thinking), which override the others. A config with several named templates
// uses "tool_use" when tools are given and it exists, else "default".
//
// Key order matters (tools are printed with tojson), so pass nlohmann::ordered_json when the
// caller parsed the request itself; the nlohmann::json overload sorts keys like std::map.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "engine/tokenizer/jinja/template.h"
#include "nlohmann/json.hpp"

namespace morserve {

class ChatTemplate {
 public:
  // tokenizer_config["chat_template"] is a string or a list of {name, template}. Fails
  // with NotFound when there is none, InvalidArgument/Unimplemented when it does not parse.
  static absl::StatusOr<ChatTemplate> FromTokenizerConfig(const nlohmann::json& tokenizer_config);
  // A template given directly (e.g. a --chat-template override or chat_template.jinja); the
  // special tokens still come from tokenizer_config when given.
  static absl::StatusOr<ChatTemplate> FromString(std::string_view source,
                                                 const nlohmann::json& tokenizer_config = {});

  // messages: [{role, content}, ...], content a string or a list of parts.
  // extra: more template variables (tools, bos_token/eos_token overrides, enable_thinking).
  absl::StatusOr<std::string> Render(const nlohmann::json& messages, bool add_generation_prompt,
                                     const nlohmann::json& extra = {}) const;
  absl::StatusOr<std::string> Render(const nlohmann::ordered_json& messages,
                                     bool add_generation_prompt,
                                     const nlohmann::ordered_json& extra = {}) const;

  // Pins the time strftime_now sees; by default it is the system's local time.
  void set_clock(jinja::Clock clock) { options_.clock = std::move(clock); }

  const nlohmann::ordered_json& special_tokens() const { return special_tokens_; }

 private:
  ChatTemplate() = default;
  absl::Status ReadSpecialTokens(const nlohmann::json& tokenizer_config);

  std::map<std::string, jinja::Template, std::less<>> templates_;  // by name; "default"
  nlohmann::ordered_json special_tokens_ = nlohmann::ordered_json::object();
  jinja::RenderOptions options_;
};

}  // namespace morserve
