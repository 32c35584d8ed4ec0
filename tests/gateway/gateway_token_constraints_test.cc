// logit_bias (OpenAI), min_tokens and allowed_token_ids (vLLM) through the gateway with curl:
// the real `morserve serve` (a tiny model on a `morserve mktokenizer` tokenizer, eos set to
// its greedy first token for kPrompt, a small chat template: no npm) behind the real
// `morserve-gateway`, both on 127.0.0.1 port 0. On /v1/completions and /v1/chat/completions:
// +100 bias gives all-one-token output, streamed or not; allowed ids and min_tokens give the
// gRPC server's tokens for the same request (the gateway passes the values through);
// min_tokens with ignore_eos off holds back the EOS that otherwise ends the request at once;
// bad values are 400s naming the field (the gateway's checks and the backend's).
#include <gtest/gtest.h>

#include <algorithm>

#include "engine/tokenizer/tokenizer.h"
#include "nlohmann/json.hpp"
#include "tests/engine_harness.h"
#include "tests/gateway/gateway_process.h"
#include "tests/server/served_suite.h"
#include "tests/server/test_models.h"

namespace morserve::testing {
namespace {

using nlohmann::json;

const std::vector<int> kPrompt = {5, 17, 42, 99, 3, 250, 7};

class GatewayTokenConstraintsTest : public ServedSuite<GatewayTokenConstraintsTest, GatewayStack> {
 protected:
  // The same weights with eos = the greedy first token of kPrompt.
  static void SetUpTestSuite() { StartSuiteWithEosAt("vanilla", kPrompt, &first_, &vocab_); }

  static HttpResult Post(const std::string& path, const json& body) {
    return served_->Post(path, body);
  }
  static json Completion(json extra) {
    json body = {{"prompt", kPrompt}, {"max_tokens", 6}, {"temperature", 0}, {"ignore_eos", true}};
    body.update(extra);
    return body;
  }
  static json Chat(json extra) {
    json body = {{"messages", {{{"role", "user"}, {"content", "hello there"}}}},
                 {"max_tokens", 5},
                 {"temperature", 0},
                 {"ignore_eos", true}};
    body.update(extra);
    return body;
  }
  // The gRPC server's tokens for the prompt ids with the same constraints.
  StreamResult Grpc(int max_tokens, const std::function<void(v1::GenerateRequest*)>& set) {
    v1::GenerateRequest r = TokenRequest(kPrompt, max_tokens);
    set(&r);
    StreamResult got = GenerateAll(stub_.get(), r);
    EXPECT_TRUE(got.status.ok()) << got.status.error_message();
    return got;
  }
  static void ExpectError(const HttpResult& got, const std::string& param) {
    EXPECT_EQ(got.status, 400) << got.body;
    const json j = got.Json();
    ASSERT_TRUE(j.contains("error")) << got.body;
    EXPECT_EQ(j["error"]["param"], param) << got.body;
    EXPECT_EQ(j["error"]["type"], "invalid_request_error") << got.body;
  }

  static const Tokenizer& Tok() { return served_->tokenizer(); }

  static inline int first_ = -1;
  static inline int vocab_ = 0;
};

TEST_F(GatewayTokenConstraintsTest, LargeBiasGivesOneTokenOnBothEndpoints) {
  const int x = first_ == 77 ? 78 : 77;
  const json bias = {{"logit_bias", {{std::to_string(x), 100}}}};
  HttpResult got = Post("/v1/completions", Completion(bias));
  ASSERT_EQ(got.status, 200) << got.body;
  EXPECT_EQ(got.Json()["choices"][0]["text"], Tok().Decode(std::vector<int>(6, x), true));
  EXPECT_EQ(got.Json()["usage"]["completion_tokens"], 6);
  got = Post("/v1/chat/completions", Chat(bias));
  ASSERT_EQ(got.status, 200) << got.body;
  EXPECT_EQ(got.Json()["choices"][0]["message"]["content"],
            Tok().Decode(std::vector<int>(5, x), true));
  // Streamed: the same text in deltas.
  json stream = Completion(bias);
  stream["stream"] = true;
  got = Post("/v1/completions", stream);
  ASSERT_EQ(got.status, 200) << got.body;
  std::string text;
  for (const std::string& d : SseData(got.body)) {
    if (d == "[DONE]") continue;
    const json c = json::parse(d);
    if (!c["choices"].empty()) text += c["choices"][0]["text"].get<std::string>();
  }
  EXPECT_EQ(text, Tok().Decode(std::vector<int>(6, x), true));
  // Without the bias the output differs (the bias is what made it).
  got = Post("/v1/completions", Completion(json::object()));
  EXPECT_NE(got.Json()["choices"][0]["text"], Tok().Decode(std::vector<int>(6, x), true));
}

TEST_F(GatewayTokenConstraintsTest, AllowedIdsAndBiasEqualTheGrpcServer) {
  const std::vector<int> allowed = {11, 60, 61, 200, vocab_ - 1};
  const StreamResult want = Grpc(6, [&](v1::GenerateRequest* r) {
    r->mutable_sampling()->set_temperature(0.9f);
    r->mutable_sampling()->set_seed(5);
    for (int id : allowed) r->mutable_sampling()->mutable_allowed_token_ids()->add_ids(id);
    (*r->mutable_sampling()->mutable_logit_bias())[61] = -2.0f;
  });
  ASSERT_EQ(want.tokens.size(), 6u);
  for (int t : want.tokens) EXPECT_NE(std::find(allowed.begin(), allowed.end(), t), allowed.end());
  const HttpResult got = Post("/v1/completions", Completion({{"temperature", 0.9},
                                                             {"seed", 5},
                                                             {"allowed_token_ids", allowed},
                                                             {"logit_bias", {{"61", -2.0}}}}));
  ASSERT_EQ(got.status, 200) << got.body;
  EXPECT_EQ(got.Json()["choices"][0]["text"], Tok().Decode(want.tokens, true));
}

TEST_F(GatewayTokenConstraintsTest, MinTokensHoldsEosBack) {
  json body = Completion({{"ignore_eos", false}, {"max_tokens", 10}});
  HttpResult got = Post("/v1/completions", body);
  ASSERT_EQ(got.status, 200) << got.body;
  EXPECT_EQ(got.Json()["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(got.Json()["usage"]["completion_tokens"], 1) << "eos is the greedy first token";
  body["min_tokens"] = 4;
  got = Post("/v1/completions", body);
  ASSERT_EQ(got.status, 200) << got.body;
  const StreamResult want = Grpc(10, [](v1::GenerateRequest* r) {
    r->set_ignore_eos(false);
    r->set_min_tokens(4);
  });
  EXPECT_GE(got.Json()["usage"]["completion_tokens"].get<int>(), 4);
  EXPECT_EQ(got.Json()["usage"]["completion_tokens"], want.tokens.size());
  EXPECT_EQ(got.Json()["choices"][0]["text"], want.text);
  for (int t = 0; t < 4; ++t) EXPECT_NE(want.tokens[t], first_);
  // Chat takes it too (through extra_body in the SDKs: a top-level field on the wire).
  got = Post("/v1/chat/completions", Chat({{"ignore_eos", false}, {"min_tokens", 5}}));
  ASSERT_EQ(got.status, 200) << got.body;
  EXPECT_EQ(got.Json()["usage"]["completion_tokens"], 5);
}

TEST_F(GatewayTokenConstraintsTest, BadValuesAre400sNamingTheField) {
  for (const std::string path : {"/v1/completions", "/v1/chat/completions"}) {
    auto body = [&](json extra) {
      return path == "/v1/completions" ? Completion(extra) : Chat(extra);
    };
    SCOPED_TRACE(path);
    ExpectError(Post(path, body({{"logit_bias", {{"5", 101}}}})), "logit_bias");
    ExpectError(Post(path, body({{"logit_bias", {{"five", 1}}}})), "logit_bias");
    ExpectError(Post(path, body({{"logit_bias", {{std::to_string(vocab_), 1}}}})), "logit_bias");
    ExpectError(Post(path, body({{"allowed_token_ids", json::array()}})), "allowed_token_ids");
    ExpectError(Post(path, body({{"allowed_token_ids", {1, vocab_}}})), "allowed_token_ids");
    ExpectError(Post(path, body({{"min_tokens", -1}})), "min_tokens");
    ExpectError(Post(path, body({{"min_tokens", 7}, {"max_tokens", 6}})), "min_tokens");
  }
}

}  // namespace
}  // namespace morserve::testing
