// The gateway's request parsing and response rendering without processes: OpenAI bodies to
// GenerateRequests (prompt shapes, n and seeds, vLLM fields, type errors naming the field),
// the JSON escaping of the streaming fast path, and SSE chunks that parse as OpenAI chunks.
#include <gtest/gtest.h>

#include <random>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "server/gateway/backend_discovery.h"
#include "server/gateway/openai_request.h"
#include "server/gateway/openai_response.h"
#include "server/gateway/options.h"

namespace morserve::gateway {
namespace {

using nlohmann::json;

OpenAiRequest Parse(Endpoint e, const json& body) {
  OpenAiRequest r;
  std::optional<ApiError> err = ParseOpenAiRequest(e, body.dump(), &r);
  EXPECT_FALSE(err.has_value()) << err->message;
  return r;
}

ApiError ParseError(Endpoint e, const std::string& body) {
  OpenAiRequest r;
  std::optional<ApiError> err = ParseOpenAiRequest(e, body, &r);
  EXPECT_TRUE(err.has_value()) << body;
  return err.value_or(ApiError{});
}

TEST(OpenAiRequestTest, PromptShapesBecomeOneCallPerChoice) {
  OpenAiRequest s = Parse(Endpoint::kCompletions, {{"prompt", "hi"}});
  ASSERT_EQ(s.calls.size(), 1u);
  EXPECT_EQ(s.calls[0].text(), "hi");
  EXPECT_EQ(s.logprobs, -1);
  OpenAiRequest ids = Parse(Endpoint::kCompletions, {{"prompt", {5, 6, 7}}});
  ASSERT_EQ(ids.calls.size(), 1u);
  EXPECT_EQ(ids.calls[0].token_ids().ids_size(), 3);
  OpenAiRequest many =
      Parse(Endpoint::kCompletions, {{"prompt", {json{1, 2}, json("x")}}, {"n", 2}, {"seed", 7}});
  ASSERT_EQ(many.calls.size(), 4u);
  EXPECT_EQ(many.num_prompts, 2);
  EXPECT_EQ(many.calls[0].token_ids().ids(1), 2);
  EXPECT_EQ(many.calls[1].token_ids().ids(1), 2);
  EXPECT_EQ(many.calls[2].text(), "x");
  EXPECT_EQ(many.calls[0].sampling().seed(), 7u);
  EXPECT_EQ(many.calls[1].sampling().seed(), 8u);
  EXPECT_EQ(many.calls[2].sampling().seed(), 7u);
  EXPECT_EQ(many.calls[3].sampling().seed(), 8u);
}

TEST(OpenAiRequestTest, SamplingAndVllmFieldsMapToTheProto) {
  OpenAiRequest r = Parse(Endpoint::kCompletions, {{"prompt", "p"},
                                                   {"temperature", 0.5},
                                                   {"top_p", 0.9},
                                                   {"top_k", 40},
                                                   {"min_p", 0.1},
                                                   {"repetition_penalty", 1.2},
                                                   {"presence_penalty", 0.5},
                                                   {"frequency_penalty", -0.5},
                                                   {"max_tokens", 9},
                                                   {"stop", "END"},
                                                   {"stop_token_ids", {3, 4}},
                                                   {"ignore_eos", true},
                                                   {"skip_special_tokens", false},
                                                   {"logprobs", 2},
                                                   {"user", "u"},
                                                   {"unknown", {1}},
                                                   {"stream", true},
                                                   {"stream_options", {{"include_usage", true}}},
                                                   {"suffix", nullptr}});
  const v1::GenerateRequest& c = r.calls[0];
  EXPECT_FLOAT_EQ(c.sampling().temperature(), 0.5f);
  EXPECT_FLOAT_EQ(c.sampling().top_p(), 0.9f);
  EXPECT_EQ(c.sampling().top_k(), 40);
  EXPECT_FLOAT_EQ(c.sampling().min_p(), 0.1f);
  EXPECT_FLOAT_EQ(c.sampling().repetition_penalty(), 1.2f);
  EXPECT_FLOAT_EQ(c.sampling().presence_penalty(), 0.5f);
  EXPECT_FLOAT_EQ(c.sampling().frequency_penalty(), -0.5f);
  EXPECT_FALSE(c.sampling().has_seed());
  EXPECT_EQ(c.max_tokens(), 9);
  ASSERT_EQ(c.stop_size(), 1);
  EXPECT_EQ(c.stop(0), "END");
  EXPECT_EQ(c.stop_token_ids_size(), 2);
  EXPECT_TRUE(c.ignore_eos());
  EXPECT_FALSE(c.skip_special_tokens());
  EXPECT_EQ(c.logprobs(), 2);
  EXPECT_TRUE(c.token_text());
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);

  OpenAiRequest chat = Parse(
      Endpoint::kChat,
      {{"messages",
        {{{"role", "user"},
          {"content", {{{"type", "text"}, {"text", "a"}}, {{"type", "text"}, {"text", "b"}}}}},
         {{"role", "assistant"}, {"content", nullptr}}}},
       {"max_completion_tokens", 3},
       {"max_tokens", 99},
       {"logprobs", true},
       {"top_logprobs", 4}});
  ASSERT_EQ(chat.calls[0].chat().messages_size(), 2);
  EXPECT_EQ(chat.calls[0].chat().messages(0).content(), "a\nb");
  EXPECT_EQ(chat.calls[0].chat().messages(1).content(), "");
  EXPECT_EQ(chat.calls[0].max_tokens(), 3);
  EXPECT_FALSE(chat.calls[0].max_tokens_to_context());
  // Without a limit chat runs to the context (vLLM); completions keep the default of 16.
  OpenAiRequest open_chat =
      Parse(Endpoint::kChat, {{"messages", {{{"role", "user"}, {"content", "x"}}}}});
  EXPECT_FALSE(open_chat.calls[0].has_max_tokens());
  EXPECT_TRUE(open_chat.calls[0].max_tokens_to_context());
  EXPECT_FALSE(Parse(Endpoint::kCompletions, {{"prompt", "x"}}).calls[0].max_tokens_to_context());
  EXPECT_EQ(chat.logprobs, 4);
  EXPECT_EQ(chat.calls[0].logprobs(), 4);
}

TEST(OpenAiRequestTest, BadFieldsNameTheField) {
  EXPECT_EQ(ParseError(Endpoint::kCompletions, "{").http_status, 400);
  EXPECT_EQ(ParseError(Endpoint::kCompletions, "{\"prompt\": \"x\", \"n\": 1.5}").param, "n");
  EXPECT_EQ(ParseError(Endpoint::kCompletions, "{\"prompt\": \"x\", \"n\": 200}").param, "n");
  EXPECT_EQ(ParseError(Endpoint::kCompletions, "{\"prompt\": \"x\", \"n\": 1e300}").param, "n");
  EXPECT_EQ(
      ParseError(Endpoint::kCompletions, "{\"prompt\": \"x\", \"seed\": 18446744073709551615}")
          .param,
      "seed");
  EXPECT_EQ(ParseError(Endpoint::kCompletions, "{\"prompt\": \"x\", \"stop\": 3}").param, "stop");
  EXPECT_EQ(ParseError(Endpoint::kCompletions, "{\"prompt\": \"x\", \"logprobs\": 21}").param,
            "logprobs");
  EXPECT_EQ(
      ParseError(Endpoint::kCompletions, "{\"prompt\": \"x\", \"prompt_logprobs\": 21}").param,
      "prompt_logprobs");
  EXPECT_EQ(ParseError(Endpoint::kCompletions, "{\"prompt\": \"x\", \"max_tokens\": -1}").param,
            "max_tokens");
  EXPECT_EQ(ParseError(Endpoint::kChat, "{\"messages\": [{\"role\": \"user\"}], \"max_tokens\": 0}")
                .param,
            "max_tokens");
  EXPECT_EQ(ParseError(Endpoint::kCompletions, "{\"prompt\": [[1], [\"a\"]]}").param, "prompt");
  EXPECT_EQ(ParseError(Endpoint::kCompletions, "{\"prompt\": [99999999999]}").param, "prompt");
  EXPECT_EQ(ParseError(Endpoint::kChat,
                       "{\"messages\": [{\"role\": \"user\", \"content\": "
                       "[{\"type\": \"image_url\"}]}]}")
                .param,
            "messages[0].content");
  EXPECT_EQ(ParseError(Endpoint::kChat, "{\"messages\": \"hi\"}").param, "messages");
  EXPECT_EQ(ParseError(Endpoint::kCompletions, "{\"prompt\": \"x\", \"model\": 3}").param, "model");
}

// vLLM's cache_salt reaches every call of the request on both endpoints; absent or null it
// stays empty (the default namespace); anything but a non-empty string is a 400 naming it.
TEST(OpenAiRequestTest, CacheSaltGoesToEveryCall) {
  OpenAiRequest c =
      Parse(Endpoint::kCompletions, {{"prompt", {"a", "b"}}, {"n", 2}, {"cache_salt", "s1"}});
  ASSERT_EQ(c.calls.size(), 4u);
  for (const v1::GenerateRequest& call : c.calls) EXPECT_EQ(call.cache_salt(), "s1");
  OpenAiRequest chat = Parse(Endpoint::kChat, {{"messages", {{{"role", "user"}, {"content", "x"}}}},
                                               {"cache_salt", "tenant \u00e9"}});
  ASSERT_EQ(chat.calls.size(), 1u);
  EXPECT_EQ(chat.calls[0].cache_salt(), "tenant \u00e9");
  EXPECT_EQ(Parse(Endpoint::kCompletions, {{"prompt", "x"}}).calls[0].cache_salt(), "");
  EXPECT_EQ(Parse(Endpoint::kCompletions, {{"prompt", "x"}, {"cache_salt", nullptr}})
                .calls[0]
                .cache_salt(),
            "");
  for (const char* bad : {"3", "\"\"", "[\"a\"]", "{}", "true"}) {
    for (Endpoint e : {Endpoint::kCompletions, Endpoint::kChat}) {
      const std::string body = absl::StrCat(
          e == Endpoint::kChat ? R"({"messages": [{"role": "user"}], )" : R"({"prompt": "x", )",
          "\"cache_salt\": ", bad, "}");
      const ApiError err = ParseError(e, body);
      EXPECT_EQ(err.http_status, 400) << body;
      EXPECT_EQ(err.param, "cache_salt") << body;
      EXPECT_NE(err.message.find("cache_salt"), std::string::npos) << err.message;
    }
  }
}

// The looped-model extra fields: mode ("full" | "adaptive") and exit_threshold (> 0) reach
// every call on both endpoints; absent or null they stay unset (the model's defaults); a
// wrong type or value is a 400 naming the field.
TEST(OpenAiRequestTest, LoopModeAndExitThresholdGoToEveryCall) {
  OpenAiRequest c =
      Parse(Endpoint::kCompletions,
            {{"prompt", {"a", "b"}}, {"n", 2}, {"mode", "adaptive"}, {"exit_threshold", 0.25}});
  ASSERT_EQ(c.calls.size(), 4u);
  for (const v1::GenerateRequest& call : c.calls) {
    ASSERT_TRUE(call.has_mode());
    EXPECT_EQ(call.mode(), "adaptive");
    ASSERT_TRUE(call.has_exit_threshold());
    EXPECT_FLOAT_EQ(call.exit_threshold(), 0.25f);
  }
  OpenAiRequest chat = Parse(Endpoint::kChat, {{"messages", {{{"role", "user"}, {"content", "x"}}}},
                                               {"mode", "full"},
                                               {"exit_threshold", 1}});
  ASSERT_EQ(chat.calls.size(), 1u);
  EXPECT_EQ(chat.calls[0].mode(), "full");
  EXPECT_FLOAT_EQ(chat.calls[0].exit_threshold(), 1.0f);
  for (const json& body : {json{{"prompt", "x"}},
                           json{{"prompt", "x"}, {"mode", nullptr}, {"exit_threshold", nullptr}}}) {
    const OpenAiRequest r = Parse(Endpoint::kCompletions, body);
    EXPECT_FALSE(r.calls[0].has_mode()) << body.dump();
    EXPECT_FALSE(r.calls[0].has_exit_threshold()) << body.dump();
  }
  const std::pair<const char*, const char*> kBad[] = {
      {"mode", "3"},
      {"mode", "\"bogus\""},
      {"mode", "\"Full\""},
      {"mode", "\"\""},
      {"mode", "[\"full\"]"},
      {"mode", "true"},
      {"exit_threshold", "\"x\""},
      {"exit_threshold", "\"0.5\""},
      {"exit_threshold", "-1"},
      {"exit_threshold", "0"},
      {"exit_threshold", "1e-50"},  // 0 as the backend's float
      {"exit_threshold", "1e300"},  // infinite as a float
      {"exit_threshold", "[0.5]"},
      {"exit_threshold", "false"},
  };
  for (const auto& [field, bad] : kBad) {
    for (Endpoint e : {Endpoint::kCompletions, Endpoint::kChat}) {
      const std::string body = absl::StrCat(
          e == Endpoint::kChat ? R"({"messages": [{"role": "user"}], )" : R"({"prompt": "x", )",
          "\"", field, "\": ", bad, "}");
      const ApiError err = ParseError(e, body);
      EXPECT_EQ(err.http_status, 400) << body;
      EXPECT_EQ(err.type, "invalid_request_error") << body;
      EXPECT_EQ(err.param, field) << body;
      EXPECT_EQ(err.message.rfind(absl::StrCat(field, ": "), 0), 0u) << err.message;
    }
  }
}

// OpenAI's logit_bias and vLLM's allowed_token_ids / min_tokens on both endpoints: values
// reach the proto as given; malformed ones are 400s naming the field (ids against the
// vocabulary and min_tokens against max_tokens are the backend's checks).
TEST(OpenAiRequestTest, TokenConstraintsMapToTheProto) {
  for (Endpoint ep : {Endpoint::kCompletions, Endpoint::kChat}) {
    const json body = {{"prompt", "p"},
                       {"messages", {{{"role", "user"}, {"content", "c"}}}},
                       {"logit_bias", {{"50256", -100}, {"7", 2.5}, {"0", 100.0}}},
                       {"allowed_token_ids", {7, 9, 7}},
                       {"min_tokens", 3}};
    const OpenAiRequest r = Parse(ep, body);
    const v1::GenerateRequest& call = r.calls[0];
    const auto& bias = call.sampling().logit_bias();
    ASSERT_EQ(bias.size(), 3u);
    EXPECT_EQ(bias.at(50256), -100.0f);
    EXPECT_EQ(bias.at(7), 2.5f);
    EXPECT_EQ(bias.at(0), 100.0f);
    ASSERT_TRUE(call.sampling().has_allowed_token_ids());
    EXPECT_EQ(std::vector<int>(call.sampling().allowed_token_ids().ids().begin(),
                               call.sampling().allowed_token_ids().ids().end()),
              (std::vector<int>{7, 9, 7}));
    EXPECT_EQ(call.min_tokens(), 3);
    const OpenAiRequest plain = Parse(ep, {{"prompt", "p"}, {"messages", body["messages"]}});
    EXPECT_TRUE(plain.calls[0].sampling().logit_bias().empty());
    EXPECT_FALSE(plain.calls[0].sampling().has_allowed_token_ids());
    EXPECT_EQ(plain.calls[0].min_tokens(), 0);
  }
  const std::string head = R"({"prompt": "x", )";
  for (const auto& [field, value] :
       std::vector<std::pair<std::string, std::string>>{{"logit_bias", R"({"12": 100.5})"},
                                                        {"logit_bias", R"({"12": -101})"},
                                                        {"logit_bias", R"({"abc": 1})"},
                                                        {"logit_bias", R"({"1.5": 1})"},
                                                        {"logit_bias", R"({"": 1})"},
                                                        {"logit_bias", R"({"-": 1})"},
                                                        {"logit_bias", R"({"99999999999": 1})"},
                                                        {"logit_bias", R"({"3": "high"})"},
                                                        {"logit_bias", R"([1, 2])"},
                                                        {"logit_bias", R"(5)"},
                                                        {"allowed_token_ids", R"([])"},
                                                        {"allowed_token_ids", R"([1, "a"])"},
                                                        {"allowed_token_ids", R"(3)"},
                                                        {"min_tokens", R"(-1)"},
                                                        {"min_tokens", R"(2.5)"},
                                                        {"min_tokens", R"("3")"}}) {
    const std::string body = absl::StrCat(head, "\"", field, "\": ", value, "}");
    const ApiError e = ParseError(Endpoint::kCompletions, body);
    EXPECT_EQ(e.http_status, 400) << body;
    EXPECT_EQ(e.param, field) << body << ": " << e.message;
  }
}

// Prompt logprobs: echo with logprobs and vLLM's prompt_logprobs ask the backend to score
// the prompt (the larger k of both); echo with max_tokens 0 scores with k 0 (the backend
// takes max_tokens 0 only so); plain max_tokens 0 goes through for the backend to refuse.
TEST(OpenAiRequestTest, PromptLogprobsMapToTheProto) {
  struct Case {
    json body;
    int want_k;  // -1: unset
    int max_tokens;
  };
  const std::vector<Case> cases = {
      {{{"prompt", "p"}, {"echo", true}, {"logprobs", 2}}, 2, 16},
      {{{"prompt", "p"}, {"echo", true}, {"logprobs", 1}, {"prompt_logprobs", 5}}, 5, 16},
      {{{"prompt", "p"}, {"echo", true}, {"logprobs", 7}, {"prompt_logprobs", 0}}, 7, 16},
      {{{"prompt", "p"}, {"prompt_logprobs", 0}, {"max_tokens", 0}}, 0, 0},
      {{{"prompt", "p"}, {"echo", true}, {"max_tokens", 0}}, 0, 0},
      {{{"prompt", "p"}, {"echo", true}, {"max_tokens", 3}}, -1, 3},
      {{{"prompt", "p"}, {"logprobs", 3}}, -1, 16},
      {{{"prompt", "p"}, {"max_tokens", 0}}, -1, 0},
  };
  for (const Case& c : cases) {
    const OpenAiRequest r = Parse(Endpoint::kCompletions, c.body);
    const v1::GenerateRequest& call = r.calls[0];
    EXPECT_EQ(call.has_prompt_logprobs() ? call.prompt_logprobs() : -1, c.want_k) << c.body;
    EXPECT_EQ(call.has_max_tokens() ? call.max_tokens() : 16, c.max_tokens) << c.body;
    if (c.want_k >= 0) EXPECT_TRUE(call.token_text()) << c.body;
  }
  EXPECT_EQ(
      Parse(Endpoint::kCompletions, {{"prompt", "p"}, {"prompt_logprobs", 4}}).prompt_logprobs, 4);
}

// Chat takes vLLM's prompt_logprobs: the first choice's call asks the backend (the list is
// the response's, not a choice's); with stream only 0, which asks for nothing (as vLLM).
TEST(OpenAiRequestTest, ChatPromptLogprobsMapToTheFirstCall) {
  const json msgs = {{{"role", "user"}, {"content", "x"}}};
  OpenAiRequest r = Parse(Endpoint::kChat, {{"messages", msgs}, {"prompt_logprobs", 3}, {"n", 3}});
  EXPECT_EQ(r.prompt_logprobs, 3);
  ASSERT_EQ(r.calls.size(), 3u);
  EXPECT_EQ(r.calls[0].prompt_logprobs(), 3);
  EXPECT_TRUE(r.calls[0].token_text());
  EXPECT_FALSE(r.calls[1].has_prompt_logprobs());
  EXPECT_FALSE(r.calls[2].has_prompt_logprobs());
  EXPECT_EQ(r.logprobs, -1) << "independent of the output's logprobs";
  r = Parse(Endpoint::kChat, {{"messages", msgs}, {"prompt_logprobs", 0}, {"stream", true}});
  EXPECT_EQ(r.prompt_logprobs, -1);
  EXPECT_FALSE(r.calls[0].has_prompt_logprobs());
  EXPECT_FALSE(Parse(Endpoint::kChat, {{"messages", msgs}}).calls[0].has_prompt_logprobs());
  for (const std::string bad : {"21", "-1", "\"2\"", "1.5"}) {
    const ApiError e = ParseError(
        Endpoint::kChat, R"({"messages": [{"role": "user"}], "prompt_logprobs": )" + bad + "}");
    EXPECT_EQ(e.http_status, 400) << bad;
    EXPECT_EQ(e.param, "prompt_logprobs") << bad;
  }
  const ApiError e = ParseError(
      Endpoint::kChat, R"({"messages": [{"role": "user"}], "prompt_logprobs": 1, "stream": true})");
  EXPECT_EQ(e.param, "prompt_logprobs");
  EXPECT_NE(e.message.find("stream"), std::string::npos) << e.message;
}

// Malformed bodies never crash or throw: byte mutations of valid bodies (and JSON values of
// every type in every field) parse to a request or to a 400.
TEST(OpenAiRequestTest, MutatedBodiesGiveARequestOrA400) {
  const std::vector<std::string> seeds = {
      R"({"prompt": ["a", [1, 2]], "n": 2, "seed": 3, "stop": ["x"], "logprobs": 1,
          "stream": true, "stream_options": {"include_usage": true}, "max_tokens": 4,
          "logit_bias": {"5": -100, "17": 2.5}, "allowed_token_ids": [5, 9], "min_tokens": 2})",
      R"({"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
          "logprobs": true, "top_logprobs": 2, "max_completion_tokens": 3, "top_k": 5})"};
  std::mt19937 rng(7);
  int parsed = 0, rejected = 0;
  for (int i = 0; i < 20000; ++i) {
    std::string body = seeds[i % 2];
    const int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits; ++e) {
      const size_t at = rng() % body.size();
      switch (rng() % 3) {
        case 0:
          body[at] = static_cast<char>(rng() % 256);
          break;
        case 1:
          body.erase(at, 1 + rng() % 8);
          break;
        default:
          body.insert(at, std::string(1, "{}[]\",:0-9.eE\\ntfu"[rng() % 20]));
      }
      if (body.empty()) body = "{";
    }
    for (Endpoint ep : {Endpoint::kCompletions, Endpoint::kChat}) {
      OpenAiRequest r;
      std::optional<ApiError> err;
      ASSERT_NO_THROW(err = ParseOpenAiRequest(ep, body, &r)) << body;
      if (err) {
        EXPECT_EQ(err->http_status, 400);
        ++rejected;
      } else {
        EXPECT_GE(r.calls.size(), 1u);
        ++parsed;
      }
    }
  }
  // Each field with a value of each JSON type.
  const std::vector<json> values = {
      nullptr, true, -1, 2.5, "s", json::array(), json::object(), json::array({1, "x"}), 1e300};
  for (const char* field :
       {"prompt", "messages", "n", "seed", "stop", "logprobs", "top_logprobs", "max_tokens",
        "temperature", "stream_options", "stop_token_ids", "ignore_eos", "model", "echo", "top_k",
        "prompt_logprobs", "logit_bias", "allowed_token_ids", "min_tokens"}) {
    for (const json& v : values) {
      json body = {{"prompt", "p"}, {"messages", {{{"role", "user"}, {"content", "c"}}}}};
      body[field] = v;
      for (Endpoint ep : {Endpoint::kCompletions, Endpoint::kChat}) {
        OpenAiRequest r;
        ASSERT_NO_THROW(ParseOpenAiRequest(ep, body.dump(), &r)) << body.dump();
      }
    }
  }
  EXPECT_GT(parsed, 0);
  EXPECT_GT(rejected, 0);
}

TEST(OpenAiResponseTest, JsonEscapingRoundTrips) {
  const std::string s = std::string("quote\" back\\ nl\n tab\t ctl\x01 ü 你好 🙂");
  std::string out;
  AppendJsonString(s, &out);
  EXPECT_EQ(json::parse(out).get<std::string>(), s);
}

// usage.prompt_tokens_details.cached_tokens (OpenAI's shape) in the response and in the
// streamed usage chunk; 0 when nothing was cached.
TEST(OpenAiResponseTest, UsageHasCachedPromptTokens) {
  OpenAiRequest req =
      Parse(Endpoint::kChat, {{"messages", {{{"role", "user"}, {"content", "x"}}}}});
  ResponseHeader h = NewResponseHeader(Endpoint::kChat, "m");
  ChoiceResult c;
  c.text = "y";
  c.finished.set_reason(v1::FINISH_REASON_LENGTH);
  json j = json::parse(RenderResponse(req, h, {c}, {40, 2, 32}));
  EXPECT_EQ(j["usage"]["prompt_tokens"], 40);
  EXPECT_EQ(j["usage"]["total_tokens"], 42);
  EXPECT_EQ(j["usage"]["prompt_tokens_details"]["cached_tokens"], 32);
  j = json::parse(RenderResponse(req, h, {c}, {40, 2}));
  EXPECT_EQ(j["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
  std::string out;
  ChunkWriter(req, h).Usage({40, 2, 16}, &out);
  ASSERT_EQ(out.rfind("data: ", 0), 0u) << out;
  const json chunk = json::parse(out.substr(6));
  EXPECT_TRUE(chunk["choices"].empty());
  EXPECT_EQ(chunk["usage"]["prompt_tokens_details"]["cached_tokens"], 16);
}

TEST(OpenAiResponseTest, ChunksAreOpenAiShapes) {
  OpenAiRequest req = Parse(Endpoint::kChat, {{"messages", {{{"role", "user"}, {"content", "x"}}}},
                                              {"logprobs", true},
                                              {"top_logprobs", 1}});
  ResponseHeader h = NewResponseHeader(Endpoint::kChat, "m\"odel");
  ChunkWriter w(req, h);
  v1::GenerateResponse m;
  v1::Token* t = m.add_tokens();
  t->set_text("hé");
  t->set_logprob(-0.5f);
  v1::TopLogprob* top = t->add_top_logprobs();
  top->set_text("hé");
  top->set_logprob(-0.5f);
  v1::Finished f;
  f.set_reason(v1::FINISH_REASON_STOP);
  f.set_stop_string("END");
  std::string out;
  int offset = 0;
  w.Role(0, &out);
  w.Delta(0, "hé\n", m, &offset, &out);
  w.Finish(0, f, &out);
  w.Usage({3, 1}, &out);
  ChunkWriter::Done(&out);
  std::vector<json> chunks;
  size_t pos = 0;
  while (pos < out.size()) {
    const size_t end = out.find("\n\n", pos);
    ASSERT_NE(end, std::string::npos);
    const std::string line = out.substr(pos, end - pos);
    ASSERT_EQ(line.rfind("data: ", 0), 0u) << line;
    if (line != "data: [DONE]") chunks.push_back(json::parse(line.substr(6)));
    pos = end + 2;
  }
  ASSERT_EQ(chunks.size(), 4u);
  EXPECT_EQ(chunks[0]["object"], "chat.completion.chunk");
  EXPECT_EQ(chunks[0]["model"], "m\"odel");
  EXPECT_EQ(chunks[0]["choices"][0]["delta"]["role"], "assistant");
  EXPECT_EQ(chunks[1]["choices"][0]["delta"]["content"], "hé\n");
  const json& lp = chunks[1]["choices"][0]["logprobs"]["content"][0];
  EXPECT_EQ(lp["token"], "hé");
  EXPECT_EQ(lp["bytes"], json({104, 195, 169}));
  EXPECT_EQ(lp["top_logprobs"][0]["logprob"], -0.5);
  EXPECT_EQ(chunks[2]["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(chunks[2]["choices"][0]["stop_reason"], "END");
  EXPECT_TRUE(chunks[3]["choices"].empty());
  EXPECT_EQ(chunks[3]["usage"]["total_tokens"], 4);
  EXPECT_EQ(chunks[3]["id"], chunks[0]["id"]);
}

// The backend's prompt entries: the first bare (rank 0), then scored ones.
google::protobuf::RepeatedPtrField<v1::Token> PromptEntries() {
  google::protobuf::RepeatedPtrField<v1::Token> p;
  v1::Token* a = p.Add();
  a->set_id(10);
  a->set_text("He");
  v1::Token* b = p.Add();
  b->set_id(31);  // above its alternative's id: key order is insertion order, not sorted
  b->set_text("llo");
  b->set_logprob(-2.5f);
  b->set_rank(3);
  for (auto [id, text, lp] : {std::tuple{12, " x", -0.5f}, std::tuple{31, "llo", -2.5f}}) {
    v1::TopLogprob* t = b->add_top_logprobs();
    t->set_token_id(id);
    t->set_text(text);
    t->set_logprob(lp);
  }
  return p;
}

TEST(OpenAiResponseTest, EchoLogprobsLeadWithThePromptAndNullFirst) {
  OpenAiRequest req =
      Parse(Endpoint::kCompletions,
            {{"prompt", "Hello"}, {"echo", true}, {"logprobs", 1}, {"prompt_logprobs", 2}});
  ChoiceResult c;
  c.text = "Hello!";
  c.prompt_tokens = PromptEntries();
  v1::Token* g = c.tokens.Add();
  g->set_text("!");
  g->set_logprob(-1.0f);
  c.finished.set_reason(v1::FINISH_REASON_LENGTH);
  const json j =
      json::parse(RenderResponse(req, NewResponseHeader(Endpoint::kCompletions, "m"), {c}, {2, 1}));
  const json& ch = j["choices"][0];
  EXPECT_EQ(ch["text"], "Hello!");
  const json& lp = ch["logprobs"];
  EXPECT_EQ(lp["tokens"], json({"He", "llo", "!"}));
  EXPECT_EQ(lp["token_logprobs"], json({nullptr, -2.5, -1.0}));
  EXPECT_TRUE(lp["top_logprobs"][0].is_null());
  EXPECT_EQ(lp["top_logprobs"][1],
            json({{" x", -0.5}, {"llo", -2.5}}));  // logprobs 1: top 1 + itself
  EXPECT_EQ(lp["text_offset"], json({0, 2, 5}));
  const nlohmann::ordered_json plp = nlohmann::ordered_json::parse(
      RenderResponse(req, NewResponseHeader(Endpoint::kCompletions, "m"), {c},
                     {2, 1}))["choices"][0]["prompt_logprobs"];
  ASSERT_EQ(plp.size(), 2u);
  EXPECT_TRUE(plp[0].is_null());
  EXPECT_EQ(json(plp[1]["31"]), json({{"logprob", -2.5}, {"rank", 3}, {"decoded_token", "llo"}}));
  EXPECT_EQ(json(plp[1]["12"]), json({{"logprob", -0.5}, {"rank", 1}, {"decoded_token", " x"}}));
  EXPECT_EQ(plp[1].begin().key(), "31") << "the prompt token leads its entry";

  // Streaming: the prompt chunk carries the same entries; offsets continue in the deltas.
  ChunkWriter w(req, NewResponseHeader(Endpoint::kCompletions, "m"));
  v1::GenerateResponse first;
  first.set_prompt_text("Hello");
  *first.mutable_prompt_logprobs() = PromptEntries();
  std::string out;
  int offset = 0;
  w.Prompt(0, first, &offset, &out);
  v1::GenerateResponse next;
  *next.add_tokens() = *g;
  w.Delta(0, "!", next, &offset, &out);
  const size_t cut = out.find("\n\n");
  const json p = json::parse(out.substr(6, cut - 6));
  const json d = json::parse(out.substr(cut + 2 + 6, out.size() - cut - 2 - 6 - 2));
  EXPECT_EQ(p["choices"][0]["text"], "Hello");
  EXPECT_EQ(p["choices"][0]["logprobs"]["token_logprobs"], json({nullptr, -2.5}));
  EXPECT_EQ(p["choices"][0]["prompt_logprobs"], json(plp));
  EXPECT_EQ(d["choices"][0]["logprobs"]["text_offset"], json({5}));
}

// Chat: one prompt_logprobs list at the top level (after usage, as vLLM), from the first
// choice; the choices carry none.
TEST(OpenAiResponseTest, ChatPromptLogprobsAreTopLevel) {
  OpenAiRequest req = Parse(
      Endpoint::kChat,
      {{"messages", {{{"role", "user"}, {"content", "x"}}}}, {"prompt_logprobs", 1}, {"n", 2}});
  std::vector<ChoiceResult> choices(2);
  choices[0].text = "a";
  choices[0].prompt_tokens = PromptEntries();
  choices[1].text = "b";
  const nlohmann::ordered_json j = nlohmann::ordered_json::parse(
      RenderResponse(req, NewResponseHeader(Endpoint::kChat, "m"), choices, {2, 2}));
  ASSERT_TRUE(j.contains("prompt_logprobs")) << j.dump();
  EXPECT_EQ(std::prev(j.end()).key(), "prompt_logprobs");
  const auto& plp = j["prompt_logprobs"];
  ASSERT_EQ(plp.size(), 2u);
  EXPECT_TRUE(plp[0].is_null());
  EXPECT_EQ(plp[1].begin().key(), "31");
  EXPECT_EQ(json(plp[1]["31"]), json({{"logprob", -2.5}, {"rank", 3}, {"decoded_token", "llo"}}));
  EXPECT_EQ(json(plp[1]["12"]), json({{"logprob", -0.5}, {"rank", 1}, {"decoded_token", " x"}}));
  EXPECT_EQ(plp[1].size(), 2u) << "top 1 plus the prompt token";
  for (const auto& ch : j["choices"]) EXPECT_FALSE(ch.contains("prompt_logprobs")) << ch.dump();
  req.prompt_logprobs = -1;
  EXPECT_FALSE(
      json::parse(RenderResponse(req, NewResponseHeader(Endpoint::kChat, "m"), choices, {2, 2}))
          .contains("prompt_logprobs"));
}

TEST(GatewayOptionsTest, FlagsParseAndBadOnesAreNamed) {
  const char* argv[] = {"gw",        "--backend", "a:1,b:2", "--backend=c:3",    "--port",
                        "0",         "--threads", "3",       "--max-body-bytes", "100",
                        "--api-key", "k"};
  auto o = ParseGatewayOptions(12, const_cast<char**>(argv));
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->backends, (std::vector<std::string>{"a:1", "b:2", "c:3"}));
  EXPECT_EQ(o->port, 0);
  EXPECT_EQ(o->threads, 3);
  EXPECT_EQ(o->max_body_bytes, 100);
  EXPECT_EQ(o->api_key, "k");
  const char* bad1[] = {"gw", "--backend", "nohost"};
  EXPECT_NE(ParseGatewayOptions(3, const_cast<char**>(bad1)).status().message().find("--backend"),
            std::string::npos);
  const char* bad2[] = {"gw", "--backend", "a:1", "--port", "99999"};
  EXPECT_NE(ParseGatewayOptions(5, const_cast<char**>(bad2)).status().message().find("--port"),
            std::string::npos);
  const char* bad3[] = {"gw"};
  EXPECT_FALSE(ParseGatewayOptions(1, const_cast<char**>(bad3)).ok());
}

TEST(GatewayOptionsTest, DiscoveryFlags) {
  const char* argv[] = {"gw",
                        "--backend",
                        "dns:morserve-grpc:50051",
                        "--backend-file",
                        "/f",
                        "--resolve-interval-ms",
                        "250",
                        "--write-timeout-s",
                        "7"};
  auto o = ParseGatewayOptions(9, const_cast<char**>(argv));
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->backends, (std::vector<std::string>{"dns:morserve-grpc:50051"}));
  EXPECT_EQ(o->backend_files, (std::vector<std::string>{"/f"}));
  EXPECT_EQ(o->resolve_interval_ms, 250);
  EXPECT_EQ(o->write_timeout_s, 7);
  const char* only_file[] = {"gw", "--backend-file", "/f"};
  EXPECT_TRUE(ParseGatewayOptions(3, const_cast<char**>(only_file)).ok());
  for (const char* bad : {"dns:name", "dns::1", "dns:a:b:1", "dns:name:0", "dns:name:x"}) {
    const char* a[] = {"gw", "--backend", bad};
    auto r = ParseGatewayOptions(3, const_cast<char**>(a));
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.status().message().find("dns:NAME:PORT"), std::string::npos) << r.status();
  }
  const char* bad_timeout[] = {"gw", "--backend", "a:1", "--write-timeout-s", "0"};
  EXPECT_NE(ParseGatewayOptions(5, const_cast<char**>(bad_timeout))
                .status()
                .message()
                .find("--write-timeout-s"),
            std::string::npos);
}

TEST(BackendDiscoveryTest, SpecsAndFileLines) {
  auto dns = ParseBackendSpec("dns:svc.ns.svc.cluster.local:50051");
  ASSERT_TRUE(dns.ok());
  EXPECT_EQ(dns->kind, BackendSource::Kind::kDns);
  EXPECT_EQ(dns->value, "svc.ns.svc.cluster.local");
  EXPECT_EQ(dns->port, 50051);
  auto fixed = ParseBackendSpec("[::1]:7");
  ASSERT_TRUE(fixed.ok());
  EXPECT_EQ(fixed->kind, BackendSource::Kind::kFixed);
  EXPECT_EQ(fixed->value, "[::1]:7");

  auto lines = ParseBackendFile("f", "# pods\n10.0.0.1:50051\n\n  10.0.0.2:50051  # b\r\n");
  ASSERT_TRUE(lines.ok()) << lines.status();
  EXPECT_EQ(*lines, (std::vector<std::string>{"10.0.0.1:50051", "10.0.0.2:50051"}));
  EXPECT_TRUE(ParseBackendFile("f", "")->empty());
  auto bad = ParseBackendFile("list.txt", "10.0.0.1:50051\nnot-an-address\n");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("list.txt:2"), std::string::npos) << bad.status();

  EXPECT_EQ(TargetOf("10.1.2.3", 5, false), "10.1.2.3:5");
  EXPECT_EQ(TargetOf("::1", 5, true), "[::1]:5");
}

}  // namespace
}  // namespace morserve::gateway
