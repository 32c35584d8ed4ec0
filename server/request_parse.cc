// Generate request parsing (see request_parse.h).
#include "server/request_parse.h"

#include <algorithm>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace morserve {
namespace {

absl::Status NoTokenizer(const char* field) {
  return absl::FailedPreconditionError(
      absl::StrCat(field,
                   ": model has no tokenizer (no tokenizer.json in the model directory): send "
                   "token_ids"));
}

void ApplySampling(const v1::SamplingParams& s, SamplingParams* p) {
  if (s.has_temperature()) p->temperature = s.temperature();
  if (s.has_top_k()) p->top_k = s.top_k();
  if (s.has_top_p()) p->top_p = s.top_p();
  if (s.has_min_p()) p->min_p = s.min_p();
  if (s.has_repetition_penalty()) p->repetition_penalty = s.repetition_penalty();
  if (s.has_presence_penalty()) p->presence_penalty = s.presence_penalty();
  if (s.has_frequency_penalty()) p->frequency_penalty = s.frequency_penalty();
  if (s.has_seed()) p->seed = s.seed();
  // Sorted by id: the map's order is unspecified, and validation names the first bad id.
  p->logit_bias.assign(s.logit_bias().begin(), s.logit_bias().end());
  std::sort(p->logit_bias.begin(), p->logit_bias.end());
  if (s.has_allowed_token_ids()) {
    p->allowed_token_ids.emplace(s.allowed_token_ids().ids().begin(),
                                 s.allowed_token_ids().ids().end());
  }
}

}  // namespace

absl::StatusOr<std::string> RenderChat(const v1::ChatInput& chat, const ChatTemplate& tmpl) {
  if (chat.messages().empty()) {
    return absl::InvalidArgumentError("chat.messages: must not be empty");
  }
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  for (int i = 0; i < chat.messages_size(); ++i) {
    const v1::ChatMessage& m = chat.messages(i);
    if (m.role().empty()) {
      return absl::InvalidArgumentError(absl::StrCat("chat.messages[", i, "].role: required"));
    }
    messages.push_back({{"role", m.role()}, {"content", m.content()}});
  }
  const bool add_generation_prompt =
      !chat.has_add_generation_prompt() || chat.add_generation_prompt();
  absl::StatusOr<std::string> text = tmpl.Render(messages, add_generation_prompt);
  if (!text.ok()) {
    return absl::Status(text.status().code(), absl::StrCat("chat: ", text.status().message()));
  }
  return text;
}

namespace {

// The prompt ids (and text) of the request's input.
absl::Status ParseInput(const v1::GenerateRequest& in, const TextModel& text, ParsedGenerate* out) {
  std::vector<int>& prompt = out->request.prompt;
  switch (in.input_case()) {
    case v1::GenerateRequest::kTokenIds:
      if (in.token_ids().ids().empty()) {
        return absl::InvalidArgumentError("token_ids: must not be empty");
      }
      prompt.assign(in.token_ids().ids().begin(), in.token_ids().ids().end());
      if (text.tokenizer != nullptr && in.echo()) {
        out->prompt_text = text.tokenizer->Decode(prompt, out->skip_special_tokens);
      }
      return absl::OkStatus();
    case v1::GenerateRequest::kText:
      if (text.tokenizer == nullptr) return NoTokenizer("text");
      prompt = text.tokenizer->Encode(in.text(), /*add_special_tokens=*/true);
      if (prompt.empty()) return absl::InvalidArgumentError("text: encodes to no tokens");
      out->prompt_text = in.text();
      return absl::OkStatus();
    case v1::GenerateRequest::kChat: {
      if (text.tokenizer == nullptr) return NoTokenizer("chat");
      if (text.chat_template == nullptr) {
        return absl::FailedPreconditionError(
            "chat: model has no chat template (none in tokenizer_config.json or "
            "chat_template.jinja; `serve --chat-template FILE` sets one): send text");
      }
      absl::StatusOr<std::string> rendered = RenderChat(in.chat(), *text.chat_template);
      if (!rendered.ok()) return rendered.status();
      prompt = text.tokenizer->Encode(*rendered, /*add_special_tokens=*/false);
      if (prompt.empty()) return absl::InvalidArgumentError("chat: renders to no tokens");
      out->prompt_text = *std::move(rendered);
      return absl::OkStatus();
    }
    case v1::GenerateRequest::INPUT_NOT_SET:
      break;
  }
  return absl::InvalidArgumentError("input: one of text, token_ids or chat is required");
}

// "full" or "adaptive" (LoopModeName); whether the model has an exit rule for adaptive is
// Engine::Submit's check.
absl::StatusOr<LoopMode> ParseLoopMode(const std::string& name) {
  for (LoopMode m : {LoopMode::kFull, LoopMode::kAdaptive}) {
    if (name == LoopModeName(m)) return m;
  }
  constexpr size_t kShown = 40;  // of a long value, its start
  const std::string shown = absl::CEscape(name.substr(0, kShown));
  return absl::InvalidArgumentError(absl::StrCat("mode: expected \"full\" or \"adaptive\", got \"",
                                                 shown, name.size() > kShown ? "...\"" : "\""));
}

}  // namespace

absl::StatusOr<ParsedGenerate> ParseGenerateRequest(const v1::GenerateRequest& in,
                                                    const TextModel& text) {
  ParsedGenerate out;
  GenerateRequest& r = out.request;
  r.request_id = in.request_id();
  out.echo = in.echo();
  out.skip_special_tokens = !in.has_skip_special_tokens() || in.skip_special_tokens();
  if (auto s = ParseInput(in, text, &out); !s.ok()) return s;
  ApplySampling(in.sampling(), &r.params);
  if (in.has_max_tokens()) r.params.max_tokens = in.max_tokens();
  if (!in.stop().empty()) {
    if (text.tokenizer == nullptr) return NoTokenizer("stop");
    for (int i = 0; i < in.stop_size(); ++i) {
      if (in.stop(i).empty()) {
        return absl::InvalidArgumentError(absl::StrCat("stop[", i, "]: must not be empty"));
      }
    }
    out.stop.assign(in.stop().begin(), in.stop().end());
  }
  r.params.stop_token_ids.assign(in.stop_token_ids().begin(), in.stop_token_ids().end());
  r.params.ignore_eos = in.ignore_eos();
  r.params.min_tokens = in.min_tokens();
  r.params.logprobs = in.logprobs();
  if (in.has_prompt_logprobs()) r.params.prompt_logprobs = in.prompt_logprobs();
  if (in.token_text() && text.tokenizer == nullptr) return NoTokenizer("token_text");
  out.token_text = in.token_text();
  if (in.has_exit_threshold()) r.exit_threshold = in.exit_threshold();
  if (in.has_num_steps()) r.num_steps = in.num_steps();
  if (in.has_init_scale()) r.init_scale = in.init_scale();
  if (in.has_mode()) {
    absl::StatusOr<LoopMode> mode = ParseLoopMode(in.mode());
    if (!mode.ok()) return mode.status();
    r.loop_mode = *mode;
  }
  r.cache_salt = in.cache_salt();
  return out;
}

}  // namespace morserve
