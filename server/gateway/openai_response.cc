// OpenAI response and chunk rendering (see openai_response.h).
#include "server/gateway/openai_response.h"

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

// Completions' legacy logprobs object for `tokens`; text offsets continue from *offset.
ojson CompletionLogprobs(const google::protobuf::RepeatedPtrField<v1::Token>& tokens, int* offset) {
  ojson toks = ojson::array(), lps = ojson::array(), tops = ojson::array(), offs = ojson::array();
  for (const v1::Token& t : tokens) {
    toks.push_back(t.text());
    lps.push_back(t.logprob());
    // vLLM's shape: the top alternatives plus the sampled token.
    ojson top = ojson::object();
    for (const v1::TopLogprob& a : t.top_logprobs()) top[a.text()] = a.logprob();
    if (!top.contains(t.text())) top[t.text()] = t.logprob();
    tops.push_back(std::move(top));
    offs.push_back(*offset);
    *offset += static_cast<int>(t.text().size());
  }
  ojson j;
  j["tokens"] = std::move(toks);
  j["token_logprobs"] = std::move(lps);
  j["top_logprobs"] = std::move(tops);
  j["text_offset"] = std::move(offs);
  return j;
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

ojson Logprobs(const OpenAiRequest& req, const google::protobuf::RepeatedPtrField<v1::Token>& t,
               int* offset) {
  if (req.logprobs < 0) return nullptr;
  return req.endpoint == Endpoint::kChat ? ChatLogprobs(t) : CompletionLogprobs(t, offset);
}

// vLLM's stop_reason: the stop string or stop token id that ended the choice, else null.
ojson StopReason(const v1::Finished& f) {
  if (!f.stop_string().empty()) return f.stop_string();
  if (f.reason() == v1::FINISH_REASON_STOP && f.stop_token_id() >= 0) return f.stop_token_id();
  return nullptr;
}

ojson UsageJson(const UsageTotals& u) {
  return {{"prompt_tokens", u.prompt},
          {"completion_tokens", u.completion},
          {"total_tokens", u.prompt + u.completion}};
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
    choice["logprobs"] = Logprobs(req, c.tokens, &offset);
    choice["finish_reason"] = FinishReasonName(c.finished.reason());
    choice["stop_reason"] = StopReason(c.finished);
    list.push_back(std::move(choice));
  }
  out["choices"] = std::move(list);
  out["usage"] = UsageJson(usage);
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
    out->append(Dump(Logprobs(req_, m.tokens(), text_offset)));
  } else {
    out->append("null");
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
  absl::StrAppend(out, prefix_, "],\"usage\":", Dump(UsageJson(u)), "}\n\n");
}

void ChunkWriter::Error(const ApiError& e, std::string* out) {
  absl::StrAppend(out, "data: ", e.ToJson(), "\n\n");
}

void ChunkWriter::Done(std::string* out) { out->append("data: [DONE]\n\n"); }

}  // namespace morserve::gateway
