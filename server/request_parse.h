// Edge validation of morserve.v1.GenerateRequest into the engine's GenerateRequest (TGI's
// "parse and validate at the edge": the engine sees typed structs only). Errors are
// INVALID_ARGUMENT naming the proto field; text, chat or stop strings without a tokenizer
// (or chat without a chat template) are FAILED_PRECONDITION. Range checks the engine also
// makes (sampling ranges, vocabulary, context) are left to Engine::Submit so there is one
// source of truth.
//
// Text input is encoded with special tokens added (the tokenizer's post-processor: BOS for
// Llama); chat input is rendered with add_generation_prompt (default true) and encoded
// WITHOUT adding special tokens, as the template already wrote them (Hugging Face's
// apply_chat_template(tokenize=True)).
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/runtime/request.h"
#include "engine/tokenizer/chat_template.h"
#include "engine/tokenizer/tokenizer.h"
#include "morserve/v1/morserve.pb.h"

namespace morserve {

// What the server has for text; either pointer may be null.
struct TextModel {
  const Tokenizer* tokenizer = nullptr;
  const ChatTemplate* chat_template = nullptr;
};

struct ParsedGenerate {
  GenerateRequest request;
  bool echo = false;
  bool skip_special_tokens = true;
  std::vector<std::string> stop;  // stop strings (matched by the server, not the engine)
  std::string prompt_text;        // with a tokenizer: the prompt as text (for echo)
  bool token_text = false;        // fill each Token's (and TopLogprob's) own text
};

// The chat messages rendered with the template (errors name chat.messages[i]).
absl::StatusOr<std::string> RenderChat(const v1::ChatInput& chat, const ChatTemplate& tmpl);

absl::StatusOr<ParsedGenerate> ParseGenerateRequest(const v1::GenerateRequest& in,
                                                    const TextModel& text = {});

}  // namespace morserve
