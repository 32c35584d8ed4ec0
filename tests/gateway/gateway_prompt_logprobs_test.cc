// Prompt logprobs through the gateway with curl: the real `morserve serve` (a tiny MoR model
// on a tokenizer `morserve mktokenizer` trains from this repo's README: no npm) behind the
// real `morserve-gateway`, both on 127.0.0.1 port 0. /v1/completions with echo and logprobs
// leads the legacy logprobs object with the prompt's tokens (the first null) and equals the
// gRPC server's prompt logprobs, then the generated tokens; max_tokens 0 with echo is
// lm-eval's loglikelihood request, whose summed logprob equals the gRPC server's and the
// reference implementation's; streaming gives the same entries; vLLM's prompt_logprobs field
// in its shape, on /v1/chat/completions too (the rendered chat prompt, one top-level list,
// equal to the in-process engine's values); bad values are 400s naming the field.
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "engine/reference/reference_model.h"
#include "engine/tokenizer/tokenizer.h"
#include "engine/tools/mkmodel.h"
#include "nlohmann/json.hpp"
#include "tests/engine_harness.h"
#include "tests/gateway/gateway_process.h"
#include "tests/server/served_suite.h"
#include "tests/server/test_models.h"

namespace morserve::testing {
namespace {

using nlohmann::json;

class GatewayPromptLogprobsTest : public ServedSuite<GatewayPromptLogprobsTest, GatewayStack> {
 protected:
  static void SetUpTestSuite() { StartSuite("mor-ec"); }

  static HttpResult Post(const json& body) { return served_->Post("/v1/completions", body); }

  // What the gateway asks the backend for a greedy echo request with logprobs k.
  StreamResult Grpc(const std::string& prompt, int max_tokens, int k) {
    v1::GenerateRequest g;
    g.set_text(prompt);
    g.set_max_tokens(max_tokens);
    g.set_ignore_eos(true);
    g.mutable_sampling()->set_temperature(0);
    g.set_logprobs(k);
    g.set_prompt_logprobs(k);
    g.set_token_text(true);
    g.set_echo(true);
    StreamResult r = GenerateAll(stub_.get(), g);
    EXPECT_TRUE(r.status.ok()) << r.status.error_message();
    return r;
  }

  static const Tokenizer& Tok() { return served_->tokenizer(); }
};

json EchoBody(const std::string& prompt, int max_tokens, int logprobs) {
  return {{"prompt", prompt},         {"echo", true},     {"logprobs", logprobs},
          {"max_tokens", max_tokens}, {"temperature", 0}, {"ignore_eos", true}};
}

// The legacy object: prompt entries (null first) then generated ones, values as gRPC gives
// them, offsets the running byte count of the token texts.
void ExpectEchoLogprobs(const json& lp, const StreamResult& want, const std::vector<int>& prompt,
                        int k) {
  const size_t n = prompt.size(), total = n + want.tokens.size();
  ASSERT_EQ(lp["tokens"].size(), total) << lp.dump();
  ASSERT_EQ(want.prompt_logprobs.size(), n);
  EXPECT_TRUE(lp["token_logprobs"][0].is_null());
  EXPECT_TRUE(lp["top_logprobs"][0].is_null());
  int offset = 0;
  for (size_t i = 0; i < total; ++i) {
    SCOPED_TRACE(i);
    const bool in_prompt = i < n;
    const std::string text = in_prompt ? want.prompt_logprobs[i].text() : "";
    if (in_prompt) EXPECT_EQ(lp["tokens"][i], text);
    EXPECT_EQ(lp["text_offset"][i], offset);
    offset += static_cast<int>(lp["tokens"][i].get<std::string>().size());
    if (i == 0) continue;
    const double got = lp["token_logprobs"][i].get<double>();
    EXPECT_EQ(got, in_prompt ? want.prompt_logprobs[i].logprob() : want.logprobs[i - n]);
    const json& top = lp["top_logprobs"][i];
    EXPECT_TRUE(top.contains(lp["tokens"][i].get<std::string>())) << top.dump();
    EXPECT_LE(top.size(), static_cast<size_t>(k + 1));
    if (!in_prompt) continue;
    // Keyed by text: check the alternatives whose text no other entry shares (byte tokens
    // of a split UTF-8 character may decode alike).
    std::map<std::string, int> seen{{text, 1}};
    for (const v1::TopLogprob& t : want.prompt_logprobs[i].top_logprobs()) ++seen[t.text()];
    for (const v1::TopLogprob& t : want.prompt_logprobs[i].top_logprobs()) {
      if (seen[t.text()] == 1) EXPECT_EQ(top[t.text()].get<double>(), t.logprob()) << top.dump();
    }
  }
}

TEST_F(GatewayPromptLogprobsTest, EchoLogprobsLeadWithThePromptAndEqualTheGrpcServer) {
  const std::string prompt = "The gateway scores every prompt token";
  const std::vector<int> ids = Tok().Encode(prompt, true);
  const StreamResult want = Grpc(prompt, 3, 2);
  HttpResult r = Post(EchoBody(prompt, 3, 2));
  ASSERT_EQ(r.status, 200) << r.body;
  const json j = r.Json();
  const json& ch = j["choices"][0];
  EXPECT_EQ(ch["text"], prompt + want.text);
  EXPECT_EQ(ch["finish_reason"], "length");
  EXPECT_FALSE(ch.contains("prompt_logprobs")) << "only with vLLM's field";
  ExpectEchoLogprobs(ch["logprobs"], want, ids, 2);
  EXPECT_EQ(j["usage"]["prompt_tokens"], ids.size());
  EXPECT_EQ(j["usage"]["completion_tokens"], 3);

  // n = 2: each choice carries the prompt's entries.
  json body = EchoBody(prompt, 3, 2);
  body["n"] = 2;
  HttpResult two = Post(body);
  ASSERT_EQ(two.status, 200) << two.body;
  for (const json& c : two.Json()["choices"]) ExpectEchoLogprobs(c["logprobs"], want, ids, 2);
}

// lm-evaluation-harness's loglikelihood request: echo, logprobs, max_tokens 0; the
// continuation's summed logprob is the gRPC server's and the reference's.
TEST_F(GatewayPromptLogprobsTest, LoglikelihoodRequestSumsToTheReference) {
  const std::string prompt = "Question: what is served here? Answer: recursive models";
  const std::vector<int> ids = Tok().Encode(prompt, true);
  HttpResult r = Post(EchoBody(prompt, 0, 1));
  ASSERT_EQ(r.status, 200) << r.body;
  const json j = r.Json();
  const json& ch = j["choices"][0];
  EXPECT_EQ(ch["text"], prompt);
  EXPECT_EQ(ch["finish_reason"], "length");
  EXPECT_EQ(j["usage"]["completion_tokens"], 0);
  const json& lp = ch["logprobs"];
  ASSERT_EQ(lp["tokens"].size(), ids.size()) << r.body;

  const StreamResult want = Grpc(prompt, 0, 1);
  ASSERT_EQ(want.prompt_logprobs.size(), ids.size());
  EXPECT_TRUE(want.tokens.empty());
  auto weights = LoadModel(served_->model_dir());
  ASSERT_TRUE(weights.ok()) << weights.status();
  ReferenceModel ref(*weights);
  const std::vector<StepOutput> outs = ref.Forward(ids);
  // The continuation: the last 4 tokens, as lm-eval sums them.
  double sum_http = 0, sum_grpc = 0, sum_ref = 0, scale = 1;
  for (size_t i = ids.size() - 4; i < ids.size(); ++i) {
    sum_http += lp["token_logprobs"][i].get<double>();
    sum_grpc += want.prompt_logprobs[i].logprob();
    const RefLogprob r = ReferenceLogprob(outs[i - 1].logits, ids[i]);
    scale = std::max(scale, r.scale);
    sum_ref += r.logprob;
  }
  EXPECT_DOUBLE_EQ(sum_http, sum_grpc);
  // Four terms, each within the engine's 2e-4 * max(|logit|, 1) (prompt_logprobs_test).
  EXPECT_NEAR(sum_http, sum_ref, 4 * 2e-4 * scale);
  EXPECT_LT(sum_http, 0.0);
}

// SSE: a prompt chunk (text and the prompt's entries), then the generated deltas; the entries
// concatenate to the non-streaming object. With max_tokens 0: the prompt chunk, the finish
// chunk, [DONE].
TEST_F(GatewayPromptLogprobsTest, StreamingGivesThePromptChunkFirst) {
  const std::string prompt = "Streams score prompts too";
  for (int max_tokens : {4, 0}) {
    SCOPED_TRACE(max_tokens);
    const json plain = Post(EchoBody(prompt, max_tokens, 3)).Json();
    json body = EchoBody(prompt, max_tokens, 3);
    body["stream"] = true;
    HttpResult r = Post(body);
    ASSERT_EQ(r.status, 200) << r.body;
    const std::vector<std::string> data = SseData(r.body);
    ASSERT_GE(data.size(), 3u) << r.body;
    EXPECT_EQ(data.back(), "[DONE]");
    const json first = json::parse(data[0])["choices"][0];
    EXPECT_EQ(first["text"], prompt);
    EXPECT_TRUE(first["logprobs"]["token_logprobs"][0].is_null());
    json tokens = json::array(), values = json::array(), offsets = json::array();
    std::string text;
    for (size_t i = 0; i + 1 < data.size(); ++i) {
      const json ch = json::parse(data[i])["choices"][0];
      text += ch["text"].get<std::string>();
      if (ch["logprobs"].is_null()) continue;
      for (const json& t : ch["logprobs"]["tokens"]) tokens.push_back(t);
      for (const json& v : ch["logprobs"]["token_logprobs"]) values.push_back(v);
      for (const json& o : ch["logprobs"]["text_offset"]) offsets.push_back(o);
    }
    const json& lp = plain["choices"][0]["logprobs"];
    EXPECT_EQ(text, plain["choices"][0]["text"]);
    EXPECT_EQ(tokens, lp["tokens"]);
    EXPECT_EQ(values, lp["token_logprobs"]);
    EXPECT_EQ(offsets, lp["text_offset"]);
    if (max_tokens == 0) EXPECT_EQ(data.size(), 3u) << r.body;
  }
}

// vLLM's prompt_logprobs: [null, {"<id>": {logprob, rank, decoded_token}, ...}], the prompt
// token first, up to k alternatives besides; streaming puts it on the choice's first chunk.
TEST_F(GatewayPromptLogprobsTest, VllmPromptLogprobsField) {
  const std::vector<int> ids = {12, 200, 31, 77, 5, 140};
  v1::GenerateRequest g = TokenRequest(ids, 2);
  g.set_prompt_logprobs(3);
  g.set_token_text(true);
  const StreamResult want = GenerateAll(stub_.get(), g);
  ASSERT_TRUE(want.status.ok()) << want.status.error_message();
  for (bool stream : {false, true}) {
    SCOPED_TRACE(stream);
    json body = {{"prompt", ids},    {"prompt_logprobs", 3}, {"max_tokens", 2},
                 {"temperature", 0}, {"ignore_eos", true},   {"stream", stream}};
    HttpResult r = Post(body);
    ASSERT_EQ(r.status, 200) << r.body;
    // Parsed keeping key order: the prompt token leads its entry.
    nlohmann::ordered_json ch;
    if (stream) {
      ch = nlohmann::ordered_json::parse(SseData(r.body)[0])["choices"][0];
      EXPECT_EQ(ch["text"], "") << "no echo: the prompt chunk has no text";
    } else {
      ch = nlohmann::ordered_json::parse(r.body)["choices"][0];
      EXPECT_TRUE(ch["logprobs"].is_null());
    }
    const nlohmann::ordered_json& plp = ch["prompt_logprobs"];
    ASSERT_EQ(plp.size(), ids.size()) << r.body;
    EXPECT_TRUE(plp[0].is_null());
    for (size_t i = 1; i < ids.size(); ++i) {
      const v1::Token& t = want.prompt_logprobs[i];
      const std::string key = std::to_string(ids[i]);
      EXPECT_EQ(plp[i].begin().key(), key);
      EXPECT_EQ(plp[i][key]["logprob"].get<double>(), t.logprob());
      EXPECT_EQ(plp[i][key]["rank"], t.rank());
      EXPECT_EQ(plp[i][key]["decoded_token"], t.text());
      EXPECT_GE(plp[i].size(), 3u);
      EXPECT_LE(plp[i].size(), 4u);
      for (int j = 0; j < t.top_logprobs_size(); ++j) {
        const nlohmann::ordered_json& e = plp[i][std::to_string(t.top_logprobs(j).token_id())];
        EXPECT_EQ(e["logprob"].get<double>(), t.top_logprobs(j).logprob());
        if (t.top_logprobs(j).token_id() != ids[i]) EXPECT_EQ(e["rank"], j + 1);
      }
    }
  }
}

// Chat completions (vLLM's extension): prompt_logprobs scores the rendered chat prompt (the
// template's text, encoded without special tokens) and comes once, at the response's top
// level: the in-process engine's values bit for bit, the reference's within the engine's
// tolerance; with n = 2 still one list (the choices carry none).
TEST_F(GatewayPromptLogprobsTest, ChatPromptLogprobsScoreTheRenderedPrompt) {
  const json messages = {{{"role", "system"}, {"content", "Answer briefly."}},
                         {{"role", "user"}, {"content", "What does the gateway serve?"}}};
  const std::vector<int> ids = Tok().Encode(
      "system: Answer briefly.\nuser: What does the gateway serve?\nassistant:", false);
  const int k = 3;
  auto weights = LoadModel(served_->model_dir());
  ASSERT_TRUE(weights.ok()) << weights.status();
  GenerateRequest local = Greedy(ids, 1);
  local.params.prompt_logprobs = k;
  const std::vector<PromptTokenLogprob> want =
      RunAlone(*weights, local).prompt_logprobs.value_or(std::vector<PromptTokenLogprob>{});
  ASSERT_EQ(want.size(), ids.size() - 1);
  ReferenceModel ref(*weights);
  const std::vector<StepOutput> outs = ref.Forward(ids);
  for (int n : {1, 2}) {
    SCOPED_TRACE(n);
    const json body = {{"messages", messages}, {"prompt_logprobs", k}, {"max_tokens", 3},
                       {"temperature", 0},     {"ignore_eos", true},   {"n", n}};
    HttpResult r = served_->Post("/v1/chat/completions", body);
    ASSERT_EQ(r.status, 200) << r.body;
    const nlohmann::ordered_json j = nlohmann::ordered_json::parse(r.body);
    EXPECT_EQ(j["object"], "chat.completion");
    EXPECT_EQ(j["usage"]["prompt_tokens"], ids.size()) << "the rendered prompt is scored";
    ASSERT_EQ(j["choices"].size(), static_cast<size_t>(n));
    for (const auto& ch : j["choices"]) {
      EXPECT_FALSE(ch.contains("prompt_logprobs")) << "top level only";
      EXPECT_TRUE(ch["logprobs"].is_null());
      EXPECT_EQ(ch["message"]["content"], j["choices"][0]["message"]["content"]);
    }
    const nlohmann::ordered_json& plp = j["prompt_logprobs"];
    ASSERT_EQ(plp.size(), ids.size()) << r.body;
    EXPECT_TRUE(plp[0].is_null());
    for (size_t i = 1; i < ids.size(); ++i) {
      SCOPED_TRACE(i);
      const PromptTokenLogprob& e = want[i - 1];
      const std::string key = std::to_string(ids[i]);
      EXPECT_EQ(plp[i].begin().key(), key) << "the prompt token leads its entry";
      EXPECT_EQ(plp[i][key]["logprob"].get<double>(), e.logprob);
      EXPECT_EQ(plp[i][key]["rank"], e.rank);
      EXPECT_EQ(plp[i][key]["decoded_token"], Tok().Decode({ids[i]}, false));
      ASSERT_EQ(e.top_logprobs.size(), static_cast<size_t>(k));
      EXPECT_EQ(plp[i].size(), static_cast<size_t>(e.rank <= k ? k : k + 1));
      for (int t = 0; t < k; ++t) {
        const auto& alt = plp[i][std::to_string(e.top_logprobs[t].token)];
        EXPECT_EQ(alt["logprob"].get<double>(), e.top_logprobs[t].logprob);
        if (e.top_logprobs[t].token != ids[i]) EXPECT_EQ(alt["rank"], t + 1);
      }
      // The reference: log_softmax of position i - 1's logits at ids[i].
      const RefLogprob ref_lp = ReferenceLogprob(outs[i - 1].logits, ids[i]);
      EXPECT_NEAR(plp[i][key]["logprob"].get<double>(), ref_lp.logprob, 2e-4 * ref_lp.scale);
    }
  }
  // Without the field: no list.
  HttpResult plain = served_->Post("/v1/chat/completions",
                                   {{"messages", messages}, {"max_tokens", 1}, {"temperature", 0}});
  ASSERT_EQ(plain.status, 200) << plain.body;
  EXPECT_FALSE(plain.Json().contains("prompt_logprobs")) << plain.body;
}

// Chat streams (as vLLM): prompt_logprobs > 0 is a 400 naming the field; 0 streams without
// them; bad values are 400s naming the field.
TEST_F(GatewayPromptLogprobsTest, ChatPromptLogprobsStreamAndBadValues) {
  const json messages = {{{"role", "user"}, {"content", "hello there"}}};
  auto chat = [&](json extra) {
    json body = {
        {"messages", messages}, {"max_tokens", 3}, {"temperature", 0}, {"ignore_eos", true}};
    body.update(extra);
    return served_->Post("/v1/chat/completions", body);
  };
  for (const json& bad :
       {json{{"prompt_logprobs", 2}, {"stream", true}}, json{{"prompt_logprobs", 21}},
        json{{"prompt_logprobs", -1}}, json{{"prompt_logprobs", "2"}}}) {
    const HttpResult r = chat(bad);
    EXPECT_EQ(r.status, 400) << bad << " " << r.body;
    const json e = r.Json()["error"];
    ASSERT_TRUE(e.is_object()) << r.body;
    EXPECT_EQ(e["param"], "prompt_logprobs") << r.body;
    EXPECT_NE(e["message"].get<std::string>().find("prompt_logprobs"), std::string::npos);
  }
  const HttpResult r = chat({{"prompt_logprobs", 0}, {"stream", true}});
  ASSERT_EQ(r.status, 200) << r.body;
  const std::vector<std::string> data = SseData(r.body);
  ASSERT_GE(data.size(), 3u) << r.body;
  EXPECT_EQ(data.back(), "[DONE]");
  std::string text;
  for (size_t i = 0; i + 1 < data.size(); ++i) {
    const json c = json::parse(data[i]);
    EXPECT_FALSE(c.contains("prompt_logprobs")) << data[i];
    EXPECT_FALSE(c["choices"][0].contains("prompt_logprobs")) << data[i];
    text += c["choices"][0]["delta"].value("content", "");
  }
  const HttpResult whole = chat(json::object());
  ASSERT_EQ(whole.status, 200) << whole.body;
  EXPECT_EQ(text, whole.Json()["choices"][0]["message"]["content"]);
}

TEST_F(GatewayPromptLogprobsTest, BadValuesAre400sNamingTheField) {
  struct Case {
    json body;
    std::string param, message;
  };
  const std::vector<Case> cases = {
      {{{"prompt", "x"}, {"prompt_logprobs", 21}}, "prompt_logprobs", "prompt_logprobs"},
      {{{"prompt", "x"}, {"prompt_logprobs", -1}}, "prompt_logprobs", "prompt_logprobs"},
      {{{"prompt", "x"}, {"prompt_logprobs", "2"}}, "prompt_logprobs", "prompt_logprobs"},
      {{{"prompt", "x"}, {"max_tokens", -1}}, "max_tokens", "max_tokens"},
      // The backend's answer: max_tokens 0 needs prompt logprobs (or echo).
      {{{"prompt", "x"}, {"max_tokens", 0}}, "", "max_tokens"},
  };
  for (const Case& c : cases) {
    HttpResult r = Post(c.body);
    EXPECT_EQ(r.status, 400) << c.body << " " << r.body;
    const json e = r.Json()["error"];
    ASSERT_TRUE(e.is_object()) << r.body;
    EXPECT_NE(e["message"].get<std::string>().find(c.message), std::string::npos) << r.body;
    if (!c.param.empty()) EXPECT_EQ(e["param"], c.param) << r.body;
  }
}

}  // namespace
}  // namespace morserve::testing
