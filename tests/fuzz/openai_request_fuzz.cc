// Fuzzes the gateway's OpenAI request parsers (server/gateway/openai_request.cc: completions,
// chat completions, /tokenize) and its response writers (server/gateway/openai_response.cc:
// the non-streaming body and every Server-Sent Event chunk). Input: a byte choosing the
// endpoint, the request body, then optionally a NUL and a serialized GenerateResponse (what
// a backend would stream back, with any text, tokens, logprobs and finish reason).
// Properties: a rejected body gets a 400 with a message and a JSON error body; an accepted
// one makes calls; every body and every `data:` event the writers produce is valid JSON.
#include "server/gateway/openai_request.h"
#include "server/gateway/openai_response.h"
#include "tests/fuzz/fuzz_support.h"

namespace {

using morserve::fuzz::Check;
using namespace morserve::gateway;

// Every event in `sse` is "data: <json>\n\n" or the final "data: [DONE]\n\n".
void CheckEvents(const std::string& sse) {
  size_t at = 0;
  while (at < sse.size()) {
    Check(sse.compare(at, 6, "data: ") == 0, "an event starts with data: ");
    const size_t end = sse.find("\n\n", at);
    Check(end != std::string::npos, "an event ends with a blank line");
    const std::string payload = sse.substr(at + 6, end - at - 6);
    Check(payload == "[DONE]" || nlohmann::json::accept(payload), "an event carries JSON");
    at = end + 2;
  }
}

void WriteStream(const OpenAiRequest& req, const morserve::v1::GenerateResponse& m) {
  const ResponseHeader h = NewResponseHeader(req.endpoint, "fuzz-model");
  ChunkWriter w(req, h);
  std::string out;
  int offset = 0;
  for (int i = 0; i < static_cast<int>(req.calls.size()); ++i) {
    if (req.endpoint == Endpoint::kChat) w.Role(i, &out);
    if (req.endpoint == Endpoint::kCompletions && (req.echo || req.prompt_logprobs >= 0)) {
      w.Prompt(i, m, &offset, &out);
    }
    w.Delta(i, m.text(), m, &offset, &out);
    w.Finish(i, m.finished(), &out);
  }
  if (req.include_usage) w.Usage({m.finished().usage().prompt_tokens(), 7}, &out);
  ChunkWriter::Error(NoServingBackend(), &out);
  ChunkWriter::Done(&out);
  CheckEvents(out);
}

void WriteBody(const OpenAiRequest& req, const morserve::v1::GenerateResponse& m) {
  std::vector<ChoiceResult> choices(req.calls.size());
  for (ChoiceResult& c : choices) {
    c.text = m.prompt_text() + m.text();
    c.tokens = m.tokens();
    c.prompt_tokens = m.prompt_logprobs();
    c.finished = m.finished();
  }
  const std::string body =
      RenderResponse(req, NewResponseHeader(req.endpoint, "fuzz-model"), choices, {3, 4});
  Check(nlohmann::json::accept(body), "a response body is JSON");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const uint8_t which = data[0] % 3;
  const std::vector<std::string_view> parts =
      morserve::fuzz::SplitAtNul(morserve::fuzz::AsText(data + 1, size - 1), 2);
  if (which == 2) {
    std::string model;
    morserve::v1::TokenizeRequest t;
    std::optional<ApiError> e = ParseTokenizeRequest(parts[0], &model, &t);
    if (e) {
      Check(e->http_status == 400 && !e->message.empty(), "a bad /tokenize body is a 400");
      Check(nlohmann::json::accept(e->ToJson()), "an error body is JSON");
    }
    return 0;
  }
  OpenAiRequest req;
  std::optional<ApiError> e =
      ParseOpenAiRequest(which == 0 ? Endpoint::kCompletions : Endpoint::kChat, parts[0], &req);
  if (e) {
    Check(e->http_status == 400 && !e->message.empty(), "a bad body is a 400 with a message");
    Check(nlohmann::json::accept(e->ToJson()), "an error body is JSON");
    return 0;
  }
  Check(!req.calls.empty(), "an accepted body makes calls");
  morserve::v1::GenerateResponse m;
  if (parts.size() == 2 && !m.ParseFromArray(parts[1].data(), static_cast<int>(parts[1].size()))) {
    return 0;
  }
  WriteStream(req, m);
  WriteBody(req, m);
  return 0;
}
