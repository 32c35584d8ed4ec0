// OpenAI response and chunk rendering (see openai_response.h).
#include "server/gateway/openai_response.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <random>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace morserve::gateway {
namespace {

using ojson = nlohmann::ordered_json;

std::string Dump(const ojson& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

ojson Bytes(const std::string& s) {
  ojson b = ojson::array();
  for (unsigned char c : s) b.push_back(static_cast<int>(c));
  return b;
}

// Completions' legacy logprobs object (tokens, token_logprobs, top_logprobs, text_offset),
// built entry by entry; text offsets continue from *offset.
class LegacyLogprobs {
 public:
  explicit LegacyLogprobs(int* offset) : offset_(offset) {}

  // A generated token: vLLM's shape, the top alternatives plus the sampled token.
  void Generated(const v1::Token& t) { Scored(t, t.top_logprobs_size()); }
  // Prompt entries as the backend sends them: the first (rank 0) has nothing to be scored
  // from and gets nulls; the others their first `top` alternatives plus the token itself.
  void Prompt(const google::protobuf::RepeatedPtrField<v1::Token>& prompt, int top) {
    for (const v1::Token& t : prompt) {
      if (t.rank() == 0) {
        Entry(t, nullptr, nullptr);
      } else {
        Scored(t, top);
      }
    }
  }
  ojson Json() && {
    return {{"tokens", std::move(tokens_)},
            {"token_logprobs", std::move(logprobs_)},
            {"top_logprobs", std::move(tops_)},
            {"text_offset", std::move(offsets_)}};
  }

 private:
  void Scored(const v1::Token& t, int top_n) {
    ojson top = ojson::object();
    for (int j = 0; j < std::min(top_n, t.top_logprobs_size()); ++j) {
      top[t.top_logprobs(j).text()] = t.top_logprobs(j).logprob();
    }
    if (!top.contains(t.text())) top[t.text()] = t.logprob();
    Entry(t, t.logprob(), std::move(top));
  }
  void Entry(const v1::Token& t, ojson logprob, ojson top) {
    tokens_.push_back(t.text());
    logprobs_.push_back(std::move(logprob));
    tops_.push_back(std::move(top));
    offsets_.push_back(*offset_);
    *offset_ += static_cast<int>(t.text().size());
  }

  int* offset_;
  ojson tokens_ = ojson::array(), logprobs_ = ojson::array(), tops_ = ojson::array(),
        offsets_ = ojson::array();
};

ojson CompletionLogprobs(const OpenAiRequest& req,
                         const google::protobuf::RepeatedPtrField<v1::Token>& prompt,
                         const google::protobuf::RepeatedPtrField<v1::Token>& tokens, int* offset) {
  LegacyLogprobs out(offset);
  if (req.echo_logprobs()) out.Prompt(prompt, req.logprobs);
  for (const v1::Token& t : tokens) out.Generated(t);
  return std::move(out).Json();
}

// vLLM's prompt_logprobs: null for the first prompt token, then per token an object keyed by
// token id (the prompt token first, then its top alternatives) of {logprob, rank,
// decoded_token}.
ojson PromptLogprobsJson(const google::protobuf::RepeatedPtrField<v1::Token>& prompt, int top) {
  ojson out = ojson::array();
  for (const v1::Token& t : prompt) {
    if (t.rank() == 0) {
      out.push_back(nullptr);
      continue;
    }
    ojson entry = ojson::object();
    entry[std::to_string(t.id())] = {
        {"logprob", t.logprob()}, {"rank", t.rank()}, {"decoded_token", t.text()}};
    for (int j = 0; j < std::min(top, t.top_logprobs_size()); ++j) {
      const v1::TopLogprob& a = t.top_logprobs(j);
      const std::string key = std::to_string(a.token_id());
      if (entry.contains(key)) continue;
      entry[key] = {{"logprob", a.logprob()}, {"rank", j + 1}, {"decoded_token", a.text()}};
    }
    out.push_back(std::move(entry));
  }
  return out;
}

// Chat logprobs: {"content": [{token, logprob, bytes, top_logprobs: [...]}]}.
ojson ChatLogprobs(const google::protobuf::RepeatedPtrField<v1::Token>& tokens) {
  ojson content = ojson::array();
  for (const v1::Token& t : tokens) {
    ojson top = ojson::array();
    for (const v1::TopLogprob& a : t.top_logprobs()) {
      top.push_back({{"token", a.text()}, {"logprob", a.logprob()}, {"bytes", Bytes(a.text())}});
    }
    content.push_back({{"token", t.text()},
                       {"logprob", t.logprob()},
                       {"bytes", Bytes(t.text())},
                       {"top_logprobs", std::move(top)}});
  }
  return {{"content", std::move(content)}};
}

// `prompt`: the prompt's entries, led into completions' object with echo (else empty).
ojson Logprobs(const OpenAiRequest& req,
               const google::protobuf::RepeatedPtrField<v1::Token>& prompt,
               const google::protobuf::RepeatedPtrField<v1::Token>& t, int* offset) {
  if (req.logprobs < 0) return nullptr;
  return req.endpoint == Endpoint::kChat ? ChatLogprobs(t)
                                         : CompletionLogprobs(req, prompt, t, offset);
}

const google::protobuf::RepeatedPtrField<v1::Token>& NoTokens() {
  static const google::protobuf::RepeatedPtrField<v1::Token> none;
  return none;
}

// vLLM's stop_reason: the stop string or stop token id that ended the choice, else null.
ojson StopReason(const v1::Finished& f) {
  if (!f.stop_string().empty()) return f.stop_string();
  if (f.reason() == v1::FINISH_REASON_STOP && f.stop_token_id() >= 0) return f.stop_token_id();
  return nullptr;
}

ojson UsageJson(const OpenAiRequest& req, const UsageTotals& u) {
  ojson usage = {{"prompt_tokens", u.prompt},
                 {"completion_tokens", u.completion},
                 {"total_tokens", u.prompt + u.completion},
                 {"prompt_tokens_details", {{"cached_tokens", u.cached}}}};
  if (req.return_loops) usage["recursion_loops"] = u.recursion_loops;
  return usage;
}

// ,"token_loops":[...] of a stream message's tokens.
void AppendTokenLoops(const v1::GenerateResponse& m, std::string* out) {
  out->append(",\"token_loops\":[");
  for (int i = 0; i < m.tokens_size(); ++i) {
    if (i > 0) out->push_back(',');
    absl::StrAppend(out, m.tokens(i).loops());
  }
  out->push_back(']');
}

std::string RandomHex() {
  static std::atomic<uint64_t> counter{0};
  thread_local std::mt19937_64 rng(std::random_device{}());
  char buf[33];
  std::snprintf(buf, sizeof(buf), "%016llx%016llx", static_cast<unsigned long long>(rng()),
                static_cast<unsigned long long>(rng() ^ counter.fetch_add(1)));
  return buf;
}

}  // namespace

ResponseHeader NewResponseHeader(Endpoint endpoint, std::string model) {
  ResponseHeader h;
  h.id = absl::StrCat(endpoint == Endpoint::kChat ? "chatcmpl-" : "cmpl-", RandomHex());
  h.created = static_cast<int64_t>(std::time(nullptr));
  h.model = std::move(model);
  return h;
}

const char* FinishReasonName(v1::FinishReason r) {
  switch (r) {
    case v1::FINISH_REASON_LENGTH:
      return "length";
    case v1::FINISH_REASON_STOP:
      return "stop";
    case v1::FINISH_REASON_CANCELLED:
      return "abort";
    case v1::FINISH_REASON_ERROR:
      return "error";
    default:
      return "stop";
  }
}

std::string RenderResponse(const OpenAiRequest& req, const ResponseHeader& h,
                           const std::vector<ChoiceResult>& choices, const UsageTotals& usage) {
  const bool chat = req.endpoint == Endpoint::kChat;
  ojson out;
  out["id"] = h.id;
  out["object"] = chat ? "chat.completion" : "text_completion";
  out["created"] = h.created;
  out["model"] = h.model;
  ojson list = ojson::array();
  for (size_t i = 0; i < choices.size(); ++i) {
    const ChoiceResult& c = choices[i];
    int offset = 0;
    ojson choice;
    choice["index"] = i;
    if (chat) {
      choice["message"] = {{"role", "assistant"}, {"content", c.text}};
    } else {
      choice["text"] = c.text;
    }
    choice["logprobs"] = Logprobs(req, c.prompt_tokens, c.tokens, &offset);
    choice["finish_reason"] = FinishReasonName(c.finished.reason());
    choice["stop_reason"] = StopReason(c.finished);
    if (req.return_loops) choice["token_loops"] = c.token_loops;
    if (!chat && req.prompt_logprobs >= 0) {
      choice["prompt_logprobs"] = PromptLogprobsJson(c.prompt_tokens, req.prompt_logprobs);
    }
    list.push_back(std::move(choice));
  }
  out["choices"] = std::move(list);
  out["usage"] = UsageJson(req, usage);
  // Chat (vLLM): one list for the rendered prompt, at the top level, from the first choice.
  if (chat && req.prompt_logprobs >= 0 && !choices.empty()) {
    out["prompt_logprobs"] = PromptLogprobsJson(choices[0].prompt_tokens, req.prompt_logprobs);
  }
  return Dump(out);
}

void AppendJsonString(std::string_view s, std::string* out) {
  static const char kHex[] = "0123456789abcdef";
  out->push_back('"');
  for (char ch : s) {
    const unsigned char c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"':
        out->append("\\\"");
        break;
      case '\\':
        out->append("\\\\");
        break;
      case '\n':
        out->append("\\n");
        break;
      case '\r':
        out->append("\\r");
        break;
      case '\t':
        out->append("\\t");
        break;
      default:
        if (c < 0x20) {
          out->append("\\u00");
          out->push_back(kHex[c >> 4]);
          out->push_back(kHex[c & 15]);
        } else {
          out->push_back(ch);
        }
    }
  }
  out->push_back('"');
}

ChunkWriter::ChunkWriter(const OpenAiRequest& req, const ResponseHeader& h) : req_(req) {
  prefix_ = "data: {\"id\":";
  AppendJsonString(h.id, &prefix_);
  absl::StrAppend(&prefix_, ",\"object\":\"",
                  req.endpoint == Endpoint::kChat ? "chat.completion.chunk" : "text_completion",
                  "\",\"created\":", h.created, ",\"model\":");
  AppendJsonString(h.model, &prefix_);
  prefix_.append(",\"choices\":[");
}

void ChunkWriter::Role(int index, std::string* out) const {
  absl::StrAppend(out, prefix_, "{\"index\":", index,
                  ",\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"logprobs\":null,"
                  "\"finish_reason\":null}]}\n\n");
}

void ChunkWriter::Delta(int index, std::string_view text, const v1::GenerateResponse& m,
                        int* text_offset, std::string* out) const {
  absl::StrAppend(out, prefix_, "{\"index\":", index, ",");
  const bool chat = req_.endpoint == Endpoint::kChat;
  out->append(chat ? "\"delta\":{\"content\":" : "\"text\":");
  AppendJsonString(text, out);
  if (chat) out->push_back('}');
  out->append(",\"logprobs\":");
  if (req_.logprobs >= 0) {
    out->append(Dump(Logprobs(req_, NoTokens(), m.tokens(), text_offset)));
  } else {
    out->append("null");
  }
  if (req_.return_loops) AppendTokenLoops(m, out);
  out->append(",\"finish_reason\":null}]}\n\n");
}

void ChunkWriter::Prompt(int index, const v1::GenerateResponse& m, int* text_offset,
                         std::string* out) const {
  absl::StrAppend(out, prefix_, "{\"index\":", index, ",\"text\":");
  AppendJsonString(req_.echo ? m.prompt_text() : "", out);
  out->append(",\"logprobs\":");
  if (req_.echo_logprobs()) {
    out->append(Dump(CompletionLogprobs(req_, m.prompt_logprobs(), NoTokens(), text_offset)));
  } else {
    out->append("null");
  }
  if (req_.prompt_logprobs >= 0) {
    absl::StrAppend(out, ",\"prompt_logprobs\":",
                    Dump(PromptLogprobsJson(m.prompt_logprobs(), req_.prompt_logprobs)));
  }
  out->append(",\"finish_reason\":null}]}\n\n");
}

void ChunkWriter::Finish(int index, const v1::Finished& f, std::string* out) const {
  const bool chat = req_.endpoint == Endpoint::kChat;
  absl::StrAppend(out, prefix_, "{\"index\":", index, chat ? ",\"delta\":{}" : ",\"text\":\"\"",
                  ",\"logprobs\":null,\"finish_reason\":\"", FinishReasonName(f.reason()),
                  "\",\"stop_reason\":", Dump(StopReason(f)), "}]}\n\n");
}

void ChunkWriter::Usage(const UsageTotals& u, std::string* out) const {
  // The prefix ends inside "choices":[ : close it empty, then the usage.
  absl::StrAppend(out, prefix_, "],\"usage\":", Dump(UsageJson(req_, u)), "}\n\n");
}

void ChunkWriter::Error(const ApiError& e, std::string* out) {
  absl::StrAppend(out, "data: ", e.ToJson(), "\n\n");
}

void ChunkWriter::Done(std::string* out) { out->append("data: [DONE]\n\n"); }

}  // namespace morserve::gateway
