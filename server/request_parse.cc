// Generate request parsing (see request_parse.h).
#include "server/request_parse.h"

#include "absl/strings/str_cat.h"

namespace morserve {
namespace {

// Text needs the tokenizer component, which this server does not link yet.
absl::Status NoTokenizer(const char* field) {
  return absl::FailedPreconditionError(absl::StrCat(
      field, ": model has no tokenizer (this server reads token ids only): send token_ids"));
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
}

}  // namespace

absl::StatusOr<ParsedGenerate> ParseGenerateRequest(const v1::GenerateRequest& in) {
  ParsedGenerate out;
  GenerateRequest& r = out.request;
  r.request_id = in.request_id();
  switch (in.input_case()) {
    case v1::GenerateRequest::kTokenIds:
      if (in.token_ids().ids().empty()) {
        return absl::InvalidArgumentError("token_ids: must not be empty");
      }
      r.prompt.assign(in.token_ids().ids().begin(), in.token_ids().ids().end());
      break;
    case v1::GenerateRequest::kText: return NoTokenizer("text");
    case v1::GenerateRequest::kChat: return NoTokenizer("chat");
    case v1::GenerateRequest::INPUT_NOT_SET:
      return absl::InvalidArgumentError("input: one of text, token_ids or chat is required");
  }
  ApplySampling(in.sampling(), &r.params);
  if (in.has_max_tokens()) r.params.max_tokens = in.max_tokens();
  if (!in.stop().empty()) return NoTokenizer("stop");
  r.params.stop_token_ids.assign(in.stop_token_ids().begin(), in.stop_token_ids().end());
  r.params.ignore_eos = in.ignore_eos();
  r.params.logprobs = in.logprobs();
  if (in.has_exit_threshold()) r.exit_threshold = in.exit_threshold();
  out.echo = in.echo();
  out.skip_special_tokens = !in.has_skip_special_tokens() || in.skip_special_tokens();
  return out;
}

}  // namespace morserve
