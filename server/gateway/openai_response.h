// OpenAI response bodies from backend stream messages: the non-streaming completion and chat
// completion objects, and the Server-Sent Events chunks of streaming ones
// (text_completion / chat.completion.chunk, a usage chunk with empty choices, an in-band
// error event, `data: [DONE]`). Logprobs: the legacy completions object (tokens,
// token_logprobs, top_logprobs, text_offset; with echo the prompt's entries first, the first
// of them null) and chat's content list (token, logprob, bytes, top_logprobs), from each
// Token's own text (the backend's token_text); vLLM's prompt_logprobs list (per choice on
// completions, once at the top level of a chat completion). With return_loops, each choice's
// (or chunk's) `token_loops` and usage's `recursion_loops` (docs/cli.md#looped-model-fields).
//
// The per-token streaming path writes JSON by hand into one reused string (a fixed prefix per
// request plus the escaped delta) instead of building a JSON tree per chunk.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "morserve/v1/morserve.pb.h"
#include "server/gateway/api_error.h"
#include "server/gateway/openai_request.h"

namespace morserve::gateway {

// What a finished choice has collected (non-streaming).
struct ChoiceResult {
  std::string text;
  google::protobuf::RepeatedPtrField<v1::Token> tokens;         // with logprobs only
  google::protobuf::RepeatedPtrField<v1::Token> prompt_tokens;  // with prompt logprobs
  std::vector<int> token_loops;                                 // with return_loops
  v1::Finished finished;
};

struct ResponseHeader {
  std::string id;  // "cmpl-..." / "chatcmpl-..."
  int64_t created = 0;
  std::string model;
};

ResponseHeader NewResponseHeader(Endpoint endpoint, std::string model);

// "length", "stop", "abort" or "error".
const char* FinishReasonName(v1::FinishReason r);

// {"prompt_tokens", "completion_tokens", "total_tokens", "prompt_tokens_details":
// {"cached_tokens"}}: prompt and cached tokens once per prompt (its first choice's call);
// with return_loops also "recursion_loops", summed over every choice's call.
struct UsageTotals {
  int64_t prompt = 0;
  int64_t completion = 0;
  int64_t cached = 0;  // prompt tokens whose KV the backend's prefix cache had
  int64_t recursion_loops = 0;
};

std::string RenderResponse(const OpenAiRequest& req, const ResponseHeader& h,
                           const std::vector<ChoiceResult>& choices, const UsageTotals& usage);

// Appends JSON-escaped `s` (quotes included) to `out`.
void AppendJsonString(std::string_view s, std::string* out);

class ChunkWriter {
 public:
  ChunkWriter(const OpenAiRequest& req, const ResponseHeader& h);

  // chat: the first chunk of a choice, delta {"role": "assistant", "content": ""}.
  void Role(int index, std::string* out) const;
  // Text (and the logprobs of `tokens`, their loops, when requested); `text_offset` runs per
  // choice.
  void Delta(int index, std::string_view text, const v1::GenerateResponse& m, int* text_offset,
             std::string* out) const;
  // completions: the first chunk of a choice with echo or prompt_logprobs: the prompt's text
  // (echo), its entries in the logprobs object (echo with logprobs), and vLLM's
  // prompt_logprobs list (prompt_logprobs).
  void Prompt(int index, const v1::GenerateResponse& m, int* text_offset, std::string* out) const;
  void Finish(int index, const v1::Finished& f, std::string* out) const;
  void Usage(const UsageTotals& u, std::string* out) const;
  static void Error(const ApiError& e, std::string* out);
  static void Done(std::string* out);

 private:
  const OpenAiRequest& req_;
  std::string prefix_;  // data: {"id":...,"object":...,"created":...,"model":...,"choices":[
};

}  // namespace morserve::gateway
