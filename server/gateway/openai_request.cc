// OpenAI request parsing (see openai_request.h).
#include "server/gateway/openai_request.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace morserve::gateway {
namespace {

using nlohmann::json;

// A field's value, or null when absent or null.
const json* Field(const json& obj, const char* name) {
  auto it = obj.find(name);
  if (it == obj.end() || it->is_null()) return nullptr;
  return &*it;
}

ApiError TypeError(const char* name, const char* what) {
  return InvalidRequest(absl::StrCat(name, ": expected ", what), name);
}

std::optional<ApiError> GetBool(const json& obj, const char* name, std::optional<bool>* out) {
  const json* v = Field(obj, name);
  if (v == nullptr) return std::nullopt;
  if (!v->is_boolean()) return TypeError(name, "a boolean");
  *out = v->get<bool>();
  return std::nullopt;
}

std::optional<ApiError> GetNumber(const json& obj, const char* name, std::optional<double>* out) {
  const json* v = Field(obj, name);
  if (v == nullptr) return std::nullopt;
  if (!v->is_number()) return TypeError(name, "a number");
  *out = v->get<double>();
  return std::nullopt;
}

std::optional<ApiError> GetInt(const json& obj, const char* name, int64_t lo, int64_t hi,
                               std::optional<int64_t>* out) {
  const json* v = Field(obj, name);
  if (v == nullptr) return std::nullopt;
  // 2.0 is accepted as 2 (JSON has one number type); 2.5 is not.
  const bool whole_float = v->is_number_float() && std::isfinite(v->get<double>()) &&
                           std::floor(v->get<double>()) == v->get<double>();
  if (!v->is_number_integer() && !v->is_number_unsigned() && !whole_float) {
    return TypeError(name, "an integer");
  }
  // Range-checked before any conversion (a huge double or uint64 does not fit int64_t).
  bool in_range;
  int64_t i = 0;
  if (v->is_number_unsigned()) {
    const uint64_t u = v->get<uint64_t>();
    in_range = hi >= 0 && u <= static_cast<uint64_t>(hi);
    if (in_range) i = static_cast<int64_t>(u);
  } else if (v->is_number_integer()) {
    i = v->get<int64_t>();
    in_range = i >= lo && i <= hi;
  } else {
    const double d = v->get<double>();
    in_range =
        d >= static_cast<double>(lo) && d <= static_cast<double>(hi) && d < 9.2e18 && d > -9.2e18;
    if (in_range) i = static_cast<int64_t>(d);
  }
  if (!in_range || i < lo || i > hi) {
    return InvalidRequest(absl::StrCat(name, ": must be in [", lo, ", ", hi, "], got ", v->dump()),
                          name);
  }
  *out = i;
  return std::nullopt;
}

// A list of token ids: every element an integer in int32.
bool AsIds(const json& v, std::vector<int32_t>* ids) {
  if (!v.is_array() || v.empty()) return false;
  ids->clear();
  for (const json& e : v) {
    if (!e.is_number_integer()) return false;
    const int64_t i = e.get<int64_t>();
    if (i < std::numeric_limits<int32_t>::min() || i > std::numeric_limits<int32_t>::max()) {
      return false;
    }
    ids->push_back(static_cast<int32_t>(i));
  }
  return true;
}

// prompt: a string, an array of strings, an array of ids, or an array of arrays of ids.
std::optional<ApiError> ParsePrompts(const json& body, std::vector<v1::GenerateRequest>* prompts) {
  const json* p = Field(body, "prompt");
  const char* kShape =
      "a string, an array of strings, an array of token ids or an array of "
      "arrays of token ids";
  if (p == nullptr) return InvalidRequest("prompt: required", "prompt");
  std::vector<int32_t> ids;
  if (p->is_string()) {
    prompts->emplace_back().set_text(p->get<std::string>());
    return std::nullopt;
  }
  if (!p->is_array() || p->empty()) return TypeError("prompt", kShape);
  if (AsIds(*p, &ids)) {
    prompts->emplace_back().mutable_token_ids()->mutable_ids()->Add(ids.begin(), ids.end());
    return std::nullopt;
  }
  for (const json& e : *p) {
    if (e.is_string()) {
      prompts->emplace_back().set_text(e.get<std::string>());
    } else if (AsIds(e, &ids)) {
      prompts->emplace_back().mutable_token_ids()->mutable_ids()->Add(ids.begin(), ids.end());
    } else {
      return TypeError("prompt", kShape);
    }
  }
  return std::nullopt;
}

// A message's content: a string, null, or an array of {"type": "text", "text": ...} parts
// (joined with newlines, as vLLM does).
std::optional<ApiError> MessageContent(const json& m, size_t i, std::string* out) {
  const std::string param = absl::StrCat("messages[", i, "].content");
  const json* c = Field(m, "content");
  if (c == nullptr) return std::nullopt;
  if (c->is_string()) {
    *out = c->get<std::string>();
    return std::nullopt;
  }
  if (!c->is_array())
    return InvalidRequest(param + ": expected a string or an array of parts", param);
  for (const json& part : *c) {
    const json* type = part.is_object() ? Field(part, "type") : nullptr;
    const json* text = part.is_object() ? Field(part, "text") : nullptr;
    if (type == nullptr || *type != "text" || text == nullptr || !text->is_string()) {
      return InvalidRequest(
          param + ": only {\"type\": \"text\", \"text\": ...} parts are supported", param);
    }
    if (!out->empty()) out->push_back('\n');
    out->append(text->get<std::string>());
  }
  return std::nullopt;
}

std::optional<ApiError> ParseMessages(const json& body, v1::ChatInput* chat) {
  const json* msgs = Field(body, "messages");
  if (msgs == nullptr) return InvalidRequest("messages: required", "messages");
  if (!msgs->is_array() || msgs->empty()) {
    return InvalidRequest("messages: expected a non-empty array", "messages");
  }
  for (size_t i = 0; i < msgs->size(); ++i) {
    const json& m = (*msgs)[i];
    const std::string param = absl::StrCat("messages[", i, "]");
    if (!m.is_object()) return InvalidRequest(param + ": expected an object", param);
    const json* role = Field(m, "role");
    if (role == nullptr || !role->is_string() || role->get<std::string>().empty()) {
      return InvalidRequest(param + ".role: expected a non-empty string", param + ".role");
    }
    v1::ChatMessage* out = chat->add_messages();
    out->set_role(role->get<std::string>());
    if (auto e = MessageContent(m, i, out->mutable_content())) return e;
  }
  return std::nullopt;
}

// stop: a string or an array of strings.
std::optional<ApiError> ParseStop(const json& body, v1::GenerateRequest* r) {
  const json* s = Field(body, "stop");
  if (s == nullptr) return std::nullopt;
  if (s->is_string()) {
    r->add_stop(s->get<std::string>());
    return std::nullopt;
  }
  if (!s->is_array()) return TypeError("stop", "a string or an array of strings");
  for (const json& e : *s) {
    if (!e.is_string()) return TypeError("stop", "a string or an array of strings");
    r->add_stop(e.get<std::string>());
  }
  return std::nullopt;
}

// OpenAI's logit_bias: {"<token id>": bias in [-100, 100]}. The backend checks the ids
// against the vocabulary.
std::optional<ApiError> ParseLogitBias(const json& body, v1::SamplingParams* s) {
  const json* lb = Field(body, "logit_bias");
  if (lb == nullptr) return std::nullopt;
  if (!lb->is_object()) return TypeError("logit_bias", "an object mapping token ids to biases");
  for (const auto& [key, value] : lb->items()) {
    int64_t id = 0;
    const bool digits = !key.empty() && key.size() <= 11 &&
                        std::all_of(key.begin() + (key[0] == '-'), key.end(),
                                    [](char c) { return c >= '0' && c <= '9'; }) &&
                        key != "-";
    if (digits) id = std::stoll(key);
    if (!digits || id < std::numeric_limits<int32_t>::min() ||
        id > std::numeric_limits<int32_t>::max()) {
      return InvalidRequest(
          absl::StrCat("logit_bias: key \"", key, "\" is not a token id (an integer)"),
          "logit_bias");
    }
    if (!value.is_number()) {
      return InvalidRequest(absl::StrCat("logit_bias: bias of token ", key, " must be a number"),
                            "logit_bias");
    }
    const double bias = value.get<double>();
    if (!(bias >= -100.0 && bias <= 100.0)) {
      return InvalidRequest(absl::StrCat("logit_bias: bias of token ", key,
                                         " must be in [-100, 100], got ", value.dump()),
                            "logit_bias");
    }
    (*s->mutable_logit_bias())[static_cast<int32_t>(id)] = static_cast<float>(bias);
  }
  return std::nullopt;
}

// vLLM's allowed_token_ids (a non-empty array of ids) and min_tokens (>= 0; the backend
// checks it against max_tokens, which may be set from the context only there).
std::optional<ApiError> ParseTokenConstraints(const json& body, v1::GenerateRequest* r) {
  if (auto e = ParseLogitBias(body, r->mutable_sampling())) return e;
  if (const json* ids = Field(body, "allowed_token_ids")) {
    std::vector<int32_t> v;
    if (!AsIds(*ids, &v)) return TypeError("allowed_token_ids", "a non-empty array of token ids");
    r->mutable_sampling()->mutable_allowed_token_ids()->mutable_ids()->Add(v.begin(), v.end());
  }
  std::optional<int64_t> i;
  if (auto e = GetInt(body, "min_tokens", 0, std::numeric_limits<int32_t>::max(), &i)) return e;
  if (i) r->set_min_tokens(static_cast<int32_t>(*i));
  return std::nullopt;
}

std::optional<ApiError> ParseSampling(const json& body, v1::GenerateRequest* r) {
  v1::SamplingParams* s = r->mutable_sampling();
  std::optional<double> d;
  std::optional<int64_t> i;
  std::optional<bool> b;
  struct FloatField {
    const char* name;
    void (v1::SamplingParams::*set)(float);
  };
  for (const FloatField& f :
       {FloatField{"temperature", &v1::SamplingParams::set_temperature},
        FloatField{"top_p", &v1::SamplingParams::set_top_p},
        FloatField{"min_p", &v1::SamplingParams::set_min_p},
        FloatField{"repetition_penalty", &v1::SamplingParams::set_repetition_penalty},
        FloatField{"presence_penalty", &v1::SamplingParams::set_presence_penalty},
        FloatField{"frequency_penalty", &v1::SamplingParams::set_frequency_penalty}}) {
    d.reset();
    if (auto e = GetNumber(body, f.name, &d)) return e;
    if (d) (s->*f.set)(static_cast<float>(*d));
  }
  if (auto e = GetInt(body, "top_k", -1, std::numeric_limits<int32_t>::max(), &i)) return e;
  if (i) s->set_top_k(static_cast<int32_t>(*i));
  i.reset();
  if (auto e = GetInt(body, "seed", std::numeric_limits<int64_t>::min(),
                      std::numeric_limits<int64_t>::max(), &i)) {
    return e;
  }
  if (i) s->set_seed(static_cast<uint64_t>(*i));
  if (auto e = GetBool(body, "ignore_eos", &b)) return e;
  if (b) r->set_ignore_eos(*b);
  b.reset();
  if (auto e = GetBool(body, "skip_special_tokens", &b)) return e;
  if (b) r->set_skip_special_tokens(*b);
  if (const json* ids = Field(body, "stop_token_ids")) {
    std::vector<int32_t> v;
    if (!ids->is_array() || (!ids->empty() && !AsIds(*ids, &v))) {
      return TypeError("stop_token_ids", "an array of token ids");
    }
    r->mutable_stop_token_ids()->Add(v.begin(), v.end());
  }
  if (auto e = ParseTokenConstraints(body, r)) return e;
  return ParseStop(body, r);
}

// vLLM's prompt_logprobs (0..20, both endpoints; -1, vLLM's whole vocabulary, is refused).
std::optional<ApiError> ParsePromptLogprobs(const json& body, OpenAiRequest* out) {
  std::optional<int64_t> i;
  if (auto e = GetInt(body, "prompt_logprobs", 0, kMaxLogprobs, &i)) return e;
  out->prompt_logprobs = i ? static_cast<int>(*i) : -1;
  return std::nullopt;
}

// Chat: prompt_logprobs scores the rendered chat prompt; as vLLM, a stream takes only 0, and
// gets none (the response's top-level list has no place among the chunks).
std::optional<ApiError> ParseChatPromptLogprobs(const json& body, OpenAiRequest* out,
                                                v1::GenerateRequest* r) {
  if (auto e = ParsePromptLogprobs(body, out)) return e;
  if (out->stream && out->prompt_logprobs > 0) {
    return InvalidRequest("prompt_logprobs: not available with stream (as vLLM)",
                          "prompt_logprobs");
  }
  if (out->stream) out->prompt_logprobs = -1;
  if (out->prompt_logprobs >= 0) {
    r->set_prompt_logprobs(out->prompt_logprobs);
    r->set_token_text(true);
  }
  return std::nullopt;
}

// Completions: logprobs, echo and vLLM's prompt_logprobs. The backend scores the prompt for
// the larger of echo's logprobs and prompt_logprobs; echo with max_tokens 0 and neither still
// has it scored (k 0), since the backend takes max_tokens 0 only with prompt logprobs.
std::optional<ApiError> ParseCompletionLogprobs(const json& body, bool no_output,
                                                OpenAiRequest* out, v1::GenerateRequest* r) {
  std::optional<int64_t> i;
  std::optional<bool> b;
  if (auto e = GetInt(body, "logprobs", 0, kMaxLogprobs, &i)) return e;
  out->logprobs = i ? static_cast<int>(*i) : -1;
  if (auto e = GetBool(body, "echo", &b)) return e;
  out->echo = b.value_or(false);
  if (auto e = ParsePromptLogprobs(body, out)) return e;
  int k = std::max(out->prompt_logprobs, out->echo_logprobs() ? out->logprobs : -1);
  if (k < 0 && out->echo && no_output) k = 0;
  if (k >= 0) {
    r->set_prompt_logprobs(k);
    r->set_token_text(true);
  }
  return std::nullopt;
}

// max_tokens (chat: max_completion_tokens first), logprobs, echo, n, stream.
std::optional<ApiError> ParseOutput(const json& body, OpenAiRequest* out, v1::GenerateRequest* r) {
  std::optional<int64_t> i;
  std::optional<bool> b;
  const bool chat = out->endpoint == Endpoint::kChat;
  const char* max_name = chat && Field(body, "max_completion_tokens") != nullptr
                             ? "max_completion_tokens"
                             : "max_tokens";
  // Completions take 0 (the backend accepts it only with prompt logprobs: see below).
  if (auto e = GetInt(body, max_name, chat ? 1 : 0, std::numeric_limits<int32_t>::max(), &i)) {
    return e;
  }
  if (i) r->set_max_tokens(static_cast<int32_t>(*i));
  const bool no_output = i && *i == 0;
  // Chat without a limit runs to the context, as vLLM does; completions keep OpenAI's 16.
  if (!i && chat) r->set_max_tokens_to_context(true);
  i.reset();
  if (auto e = GetInt(body, "n", 1, kMaxChoices, &i)) return e;
  out->n = i.value_or(1);
  i.reset();
  if (chat) {
    if (auto e = GetBool(body, "logprobs", &b)) return e;
    const bool want = b.value_or(false);
    if (auto e = GetInt(body, "top_logprobs", 0, kMaxLogprobs, &i)) return e;
    if (i && !want) {
      return InvalidRequest("top_logprobs: requires logprobs to be true", "top_logprobs");
    }
    out->logprobs = want ? static_cast<int>(i.value_or(0)) : -1;
  } else if (auto e = ParseCompletionLogprobs(body, no_output, out, r)) {
    return e;
  }
  b.reset();
  if (auto e = GetBool(body, "stream", &b)) return e;
  out->stream = b.value_or(false);
  if (const json* so = Field(body, "stream_options")) {
    if (!so->is_object()) return TypeError("stream_options", "an object");
    b.reset();
    if (auto e = GetBool(*so, "include_usage", &b)) return e;
    out->include_usage = b.value_or(false);
  }
  if (chat) {
    if (auto e = ParseChatPromptLogprobs(body, out, r)) return e;
  }
  if (out->logprobs >= 0) {
    r->set_logprobs(out->logprobs);
    r->set_token_text(true);
  }
  r->set_echo(out->echo);
  return std::nullopt;
}

std::optional<json> ParseObject(std::string_view body, std::optional<ApiError>* error) {
  json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    *error = InvalidRequest("the body is not valid JSON");
    return std::nullopt;
  }
  if (!j.is_object()) {
    *error = InvalidRequest("the body must be a JSON object");
    return std::nullopt;
  }
  return j;
}

// vLLM's cache_salt: requests share prefix-cached KV only when their salts are equal. As in
// vLLM, when given it must be a non-empty string.
std::optional<ApiError> GetCacheSalt(const json& body, v1::GenerateRequest* r) {
  const json* v = Field(body, "cache_salt");
  if (v == nullptr) return std::nullopt;
  if (!v->is_string() || v->get_ref<const std::string&>().empty()) {
    return TypeError("cache_salt", "a non-empty string");
  }
  r->set_cache_salt(v->get<std::string>());
  return std::nullopt;
}

// Looped models (extra body fields, as vLLM takes its own): `return_loops` (bool, the
// gateway's: OpenAiRequest), `mode` ("full" | "adaptive"), `exit_threshold` (a number > 0) and
// Huginn's `num_steps` (an integer >= 1) and `init_scale` (a number >= 0),
// checked here as cache_salt is, so a bad value costs no
// backend call (the backend checks them again). Whether the model has an exit rule for
// "adaptive" is the backend's check: its INVALID_ARGUMENT names `mode` and comes back as a
// 400.
std::optional<ApiError> GetLoopParams(const json& body, OpenAiRequest* out,
                                      v1::GenerateRequest* r) {
  std::optional<bool> b;
  if (auto e = GetBool(body, "return_loops", &b)) return e;
  out->return_loops = b.value_or(false);
  if (const json* m = Field(body, "mode")) {
    if (!m->is_string() || (*m != "full" && *m != "adaptive")) {
      return InvalidRequest(
          absl::StrCat("mode: expected \"full\" or \"adaptive\", got ", m->dump().substr(0, 48)),
          "mode");
    }
    r->set_mode(m->get<std::string>());
  }
  std::optional<double> d;
  if (auto e = GetNumber(body, "exit_threshold", &d)) return e;
  if (d) {
    // Checked as the float the backend takes: 1e-50 is 0 there, 1e300 infinite.
    const auto f = static_cast<float>(*d);
    if (!(f > 0.0f) || !std::isfinite(f)) {
      return InvalidRequest(absl::StrCat("exit_threshold: must be a finite number > 0, got ",
                                         Field(body, "exit_threshold")->dump()),
                            "exit_threshold");
    }
    r->set_exit_threshold(f);
  }
  std::optional<int64_t> steps;
  if (auto e = GetInt(body, "num_steps", 1, std::numeric_limits<int32_t>::max(), &steps)) return e;
  if (steps) r->set_num_steps(static_cast<int32_t>(*steps));
  d.reset();
  if (auto e = GetNumber(body, "init_scale", &d)) return e;
  if (d) {
    const auto f = static_cast<float>(*d);
    if (!(f >= 0.0f) || !std::isfinite(f)) {
      return InvalidRequest(absl::StrCat("init_scale: must be a finite number >= 0, got ",
                                         Field(body, "init_scale")->dump()),
                            "init_scale");
    }
    r->set_init_scale(f);
  }
  return std::nullopt;
}

std::optional<ApiError> GetModel(const json& body, std::string* model) {
  if (const json* m = Field(body, "model")) {
    if (!m->is_string()) return TypeError("model", "a string");
    *model = m->get<std::string>();
  }
  return std::nullopt;
}

}  // namespace

std::optional<ApiError> ParseOpenAiRequest(Endpoint endpoint, std::string_view text,
                                           OpenAiRequest* out) {
  std::optional<ApiError> error;
  std::optional<json> body = ParseObject(text, &error);
  if (!body) return error;
  out->endpoint = endpoint;
  if (auto e = GetModel(*body, &out->model)) return e;
  v1::GenerateRequest base;
  if (auto e = ParseSampling(*body, &base)) return e;
  if (auto e = ParseOutput(*body, out, &base)) return e;
  if (auto e = GetCacheSalt(*body, &base)) return e;
  if (auto e = GetLoopParams(*body, out, &base)) return e;
  std::vector<v1::GenerateRequest> prompts;
  if (endpoint == Endpoint::kChat) {
    if (auto e = ParseMessages(*body, prompts.emplace_back().mutable_chat())) return e;
  } else if (auto e = ParsePrompts(*body, &prompts)) {
    return e;
  }
  if (prompts.size() * out->n > static_cast<size_t>(kMaxChoices)) {
    return InvalidRequest(absl::StrCat("n: prompts x n must be at most ", kMaxChoices, ", got ",
                                       prompts.size() * out->n),
                          "n");
  }
  out->num_prompts = static_cast<int>(prompts.size());
  for (v1::GenerateRequest& p : prompts) {
    for (int k = 0; k < out->n; ++k) {
      v1::GenerateRequest& call = out->calls.emplace_back(base);
      call.MergeFrom(p);  // the input oneof
      if (base.sampling().has_seed()) {
        call.mutable_sampling()->set_seed(base.sampling().seed() + static_cast<uint64_t>(k));
      }
      // Chat's prompt logprobs are the response's, not a choice's: the first call scores.
      if (endpoint == Endpoint::kChat && k > 0) call.clear_prompt_logprobs();
    }
  }
  return std::nullopt;
}

std::optional<ApiError> ParseTokenizeRequest(std::string_view text, std::string* model,
                                             v1::TokenizeRequest* out) {
  std::optional<ApiError> error;
  std::optional<json> body = ParseObject(text, &error);
  if (!body) return error;
  if (auto e = GetModel(*body, model)) return e;
  std::optional<bool> b;
  if (Field(*body, "messages") != nullptr) {  // vLLM's TokenizeChatRequest
    if (Field(*body, "prompt") != nullptr) {
      return InvalidRequest("prompt: give either prompt or messages, not both", "prompt");
    }
    if (auto e = ParseMessages(*body, out->mutable_chat())) return e;
    if (auto e = GetBool(*body, "add_generation_prompt", &b)) return e;
    if (b) out->mutable_chat()->set_add_generation_prompt(*b);
  } else {
    const json* p = Field(*body, "prompt");
    if (p == nullptr || !p->is_string()) return TypeError("prompt", "a string");
    out->set_text(p->get<std::string>());
  }
  b.reset();
  if (auto e = GetBool(*body, "add_special_tokens", &b)) return e;
  if (b) out->set_add_special_tokens(*b);
  return std::nullopt;
}

}  // namespace morserve::gateway
