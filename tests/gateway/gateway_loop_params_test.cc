// The looped-model extra body fields through the OpenAI gateway with curl: `mode` ("full" |
// "adaptive") and `exit_threshold` (> 0) on /v1/completions and /v1/chat/completions. The
// real `morserve serve` on an early-exit model (mkmodel --family early-exit, threshold 0.2,
// 3 loops, a `morserve mktokenizer` tokenizer: no npm) behind the real `morserve-gateway`,
// plus a second pair on a vanilla model, all on 127.0.0.1 port 0.
//
// Wrong types and values are 400s naming the field; "adaptive" on a model without an exit
// rule is the backend's INVALID_ARGUMENT, a 400 naming `mode`. That exit_threshold reaches the
// engine is shown through the backend: the same greedy request sent with exit_threshold 1e-6
// and 1.5 straight over gRPC gives 1 loop per token and 3 loops per token, and the gateway's
// logprobs (and text) for each threshold equal that threshold's gRPC ones, while the two
// thresholds' logprobs differ. `return_loops` puts each token's loops in the responses
// (choices' `token_loops`, usage's `recursion_loops`), streamed and not, equal to the gRPC
// stream's; without it neither field appears. Huginn's `num_steps` (an integer >= 1) and
// `init_scale` (>= 0) are checked likewise and forwarded: a model that is not Huginn refuses
// them by name.
#include <gtest/gtest.h>

#include <cmath>
#include <set>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"
#include "tests/gateway/gateway_process.h"
#include "tests/server/served_suite.h"
#include "tests/server/server_process.h"
#include "tests/server/test_models.h"

namespace morserve::testing {
namespace {

using nlohmann::json;

constexpr int kRecursions = 3;
constexpr int kMaxTokens = 8;
const std::vector<int> kPrompt = {5, 17, 42, 9, 100, 23, 64};

class GatewayLoopParamsTest : public ServedSuite<GatewayLoopParamsTest, GatewayStack> {
 protected:
  static void SetUpTestSuite() {
    StartSuite("early-exit", [](TinyModelSpec* spec, const TempDir&) {
      spec->recursions = kRecursions;
      spec->exit_threshold = 0.2f;  // random weights are unsure: exits after 1, 2 and 3 loops
    });
    if (served_ == nullptr || !served_->gateway().Running()) return;
    // The vanilla pair: the suite's tokenizer and the plain chat template.
    TinyModelSpec vanilla;
    vanilla.family = "vanilla";
    vanilla.dtype = DType::kF32;
    vanilla.max_pos = 128;
    absl::Status s = UseTokenizer(served_->dir().File("tokenizer"), &vanilla);
    ASSERT_TRUE(s.ok()) << s;
    const std::string dir = served_->dir().File("vanilla");
    s = WriteTinyModel(vanilla, dir);
    ASSERT_TRUE(s.ok()) << s;
    WriteFile(dir + "/chat_template.jinja", kPlainChatTemplate);
    vanilla_server_ = new ServerProcess();
    ASSERT_NO_FATAL_FAILURE(StartOrDie(vanilla_server_, dir));
    vanilla_gateway_ = new GatewayProcess();
    ASSERT_TRUE(vanilla_gateway_->Start(
        {"--backend", vanilla_server_->address(), "--health-interval-ms", "200"}))
        << vanilla_gateway_->output();
    ASSERT_TRUE(vanilla_gateway_->WaitHealth(200)) << vanilla_gateway_->output();
  }
  static void TearDownTestSuite() {
    if (vanilla_gateway_ != nullptr && vanilla_gateway_->pid() > 0)
      EXPECT_EQ(vanilla_gateway_->Terminate(), 0) << vanilla_gateway_->output();
    if (vanilla_server_ != nullptr && vanilla_server_->pid() > 0)
      EXPECT_EQ(vanilla_server_->Terminate(), 0) << vanilla_server_->output();
    delete vanilla_gateway_;
    delete vanilla_server_;
    vanilla_gateway_ = nullptr;
    vanilla_server_ = nullptr;
    ServedSuite::TearDownTestSuite();
  }

  static json CompletionBody() {
    return {
        {"prompt", kPrompt}, {"max_tokens", kMaxTokens}, {"temperature", 0}, {"ignore_eos", true}};
  }
  static json ChatBody() {
    return {{"messages", {{{"role", "user"}, {"content", "the loop depth of a token"}}}},
            {"max_tokens", kMaxTokens},
            {"temperature", 0},
            {"ignore_eos", true}};
  }
  static HttpResult PostTo(const GatewayProcess& gateway, const std::string& path,
                           const json& body) {
    return Curl("POST", gateway.url() + path, body.dump());
  }
  static void ExpectFieldError(const HttpResult& got, const std::string& field) {
    EXPECT_EQ(got.status, 400) << got.body;
    const json j = got.Json();
    ASSERT_TRUE(j.is_object() && j.contains("error")) << got.body;
    EXPECT_EQ(j["error"]["param"], field) << got.body;
    EXPECT_EQ(j["error"]["type"], "invalid_request_error") << got.body;
    EXPECT_EQ(j["error"]["message"].get<std::string>().rfind(field + ": ", 0), 0u) << got.body;
  }

  // The gRPC request the gateway makes of ChatBody() / CompletionBody() (greedy, ignore_eos).
  static v1::GenerateRequest GrpcChat() {
    v1::GenerateRequest r;
    v1::ChatMessage* m = r.mutable_chat()->add_messages();
    m->set_role("user");
    m->set_content("the loop depth of a token");
    r.set_max_tokens(kMaxTokens);
    r.set_ignore_eos(true);
    r.mutable_sampling()->set_temperature(0);
    return r;
  }

  static inline ServerProcess* vanilla_server_ = nullptr;
  static inline GatewayProcess* vanilla_gateway_ = nullptr;
};

TEST_F(GatewayLoopParamsTest, BadLoopFieldIsA400NamingTheField) {
  const std::pair<const char*, json> kBad[] = {
      {"mode", 3},
      {"mode", "bogus"},
      {"mode", json::array({"full"})},
      {"exit_threshold", "x"},
      {"exit_threshold", -1},
      {"exit_threshold", 0},
      {"return_loops", "yes"},
      {"return_loops", 1},
      {"num_steps", "x"},
      {"num_steps", 0},
      {"num_steps", 2.5},
      {"init_scale", "x"},
      {"init_scale", -1},
  };
  for (const auto& [field, bad] : kBad) {
    SCOPED_TRACE(std::string(field) + " " + bad.dump());
    json completion = CompletionBody();
    completion[field] = bad;
    ExpectFieldError(served_->Post("/v1/completions", completion), field);
    json chat = ChatBody();
    chat[field] = bad;
    ExpectFieldError(served_->Post("/v1/chat/completions", chat), field);
  }
}

TEST_F(GatewayLoopParamsTest, AdaptiveOnAModelWithoutAnExitRuleIsA400NamingMode) {
  for (const GatewayProcess* gateway : {vanilla_gateway_, &served_->gateway()}) {
    json completion = CompletionBody();
    completion["mode"] = "adaptive";
    const HttpResult c = PostTo(*gateway, "/v1/completions", completion);
    ExpectFieldError(c, "mode");
    EXPECT_NE(c.body.find("adaptive needs a looped model with an exit rule"), std::string::npos)
        << c.body;
    json chat = ChatBody();
    chat["mode"] = "adaptive";
    chat["stream"] = true;  // refused before the stream starts: a plain 400 as well
    ExpectFieldError(PostTo(*gateway, "/v1/chat/completions", chat), "mode");
  }
}

// Huginn's fields reach the backend: on models that are not Huginn-0125 its INVALID_ARGUMENT
// comes back as a 400 naming the field (huginn_engine_test and server_loop_params_test show
// what they do on a Huginn model).
TEST_F(GatewayLoopParamsTest, HuginnFieldsReachTheBackend) {
  for (const GatewayProcess* gateway : {vanilla_gateway_, &served_->gateway()}) {
    for (const auto& [field, value] : {std::pair<const char*, json>{"num_steps", 2},
                                       std::pair<const char*, json>{"init_scale", 0.5}}) {
      SCOPED_TRACE(field);
      json completion = CompletionBody();
      completion[field] = value;
      const HttpResult c = PostTo(*gateway, "/v1/completions", completion);
      ExpectFieldError(c, field);
      EXPECT_NE(c.body.find("only Huginn-0125"), std::string::npos) << c.body;
      json chat = ChatBody();
      chat[field] = value;
      ExpectFieldError(PostTo(*gateway, "/v1/chat/completions", chat), field);
    }
  }
}

TEST_F(GatewayLoopParamsTest, FullModeIsAccepted) {
  for (const GatewayProcess* gateway : {vanilla_gateway_, &served_->gateway()}) {
    json completion = CompletionBody();
    completion["mode"] = "full";
    const HttpResult full = PostTo(*gateway, "/v1/completions", completion);
    EXPECT_EQ(full.status, 200) << full.body;
    const HttpResult plain = PostTo(*gateway, "/v1/completions", CompletionBody());
    ASSERT_EQ(plain.status, 200) << plain.body;
    EXPECT_EQ(full.Json()["choices"][0]["text"], plain.Json()["choices"][0]["text"]);
  }
  json chat = ChatBody();
  chat["mode"] = "full";
  EXPECT_EQ(served_->Post("/v1/chat/completions", chat).status, 200);
}

TEST_F(GatewayLoopParamsTest, ExitThresholdReachesTheEngine) {
  std::vector<float> first_logprob;  // per threshold, completions
  for (const float threshold : {1e-6f, 1.5f}) {
    SCOPED_TRACE(threshold);
    const int want_loops = threshold < 1.0f ? 1 : kRecursions;

    // Over gRPC: the depth of every token.
    v1::GenerateRequest g = TokenRequest(kPrompt, kMaxTokens);
    g.set_exit_threshold(threshold);
    const StreamResult grpc = GenerateAll(stub_.get(), g);
    ASSERT_TRUE(grpc.status.ok()) << grpc.status.error_message();
    ASSERT_EQ(grpc.loops.size(), static_cast<size_t>(kMaxTokens));
    for (size_t i = 0; i < grpc.loops.size(); ++i) EXPECT_EQ(grpc.loops[i], want_loops) << i;

    // Through the gateway: the same tokens with the same logprobs.
    json body = CompletionBody();
    body["exit_threshold"] = threshold;
    body["logprobs"] = 0;
    const HttpResult http = served_->Post("/v1/completions", body);
    ASSERT_EQ(http.status, 200) << http.body;
    const json choice = http.Json()["choices"][0];
    EXPECT_EQ(choice["text"], grpc.text);
    const json& lp = choice["logprobs"]["token_logprobs"];
    ASSERT_EQ(lp.size(), grpc.logprobs.size()) << http.body;
    for (size_t i = 0; i < lp.size(); ++i) {
      EXPECT_NEAR(lp[i].get<double>(), grpc.logprobs[i], 1e-5) << "token " << i;
    }
    first_logprob.push_back(grpc.logprobs[0]);

    // Chat likewise.
    v1::GenerateRequest gc = GrpcChat();
    gc.set_exit_threshold(threshold);
    const StreamResult grpc_chat = GenerateAll(stub_.get(), gc);
    ASSERT_TRUE(grpc_chat.status.ok()) << grpc_chat.status.error_message();
    for (size_t i = 0; i < grpc_chat.loops.size(); ++i) {
      EXPECT_EQ(grpc_chat.loops[i], want_loops) << i;
    }
    json chat = ChatBody();
    chat["exit_threshold"] = threshold;
    chat["logprobs"] = true;
    const HttpResult chat_http = served_->Post("/v1/chat/completions", chat);
    ASSERT_EQ(chat_http.status, 200) << chat_http.body;
    const json chat_choice = chat_http.Json()["choices"][0];
    EXPECT_EQ(chat_choice["message"]["content"], grpc_chat.text);
    const json& content = chat_choice["logprobs"]["content"];
    ASSERT_EQ(content.size(), grpc_chat.logprobs.size()) << chat_http.body;
    for (size_t i = 0; i < content.size(); ++i) {
      EXPECT_NEAR(content[i]["logprob"].get<double>(), grpc_chat.logprobs[i], 1e-5)
          << "token " << i;
    }
  }
  // Otherwise the comparison above would not tell the thresholds apart.
  ASSERT_EQ(first_logprob.size(), 2u);
  EXPECT_GT(std::abs(first_logprob[0] - first_logprob[1]), 1e-4);
}

// The early-exit model at threshold 0.2 mixes 1, 2 and 3 loops per token: the gateway's
// token_loops equal the gRPC stream's loops and its recursion_loops the gRPC usage's, on both
// endpoints, whole and streamed (the chunks' lists concatenated), with n = 2 summing usage.
TEST_F(GatewayLoopParamsTest, ReturnLoopsGivesEachTokensLoops) {
  const StreamResult grpc = GenerateAll(stub_.get(), TokenRequest(kPrompt, kMaxTokens));
  ASSERT_TRUE(grpc.status.ok()) << grpc.status.error_message();
  ASSERT_TRUE(grpc.finished.has_value());
  ASSERT_EQ(grpc.loops.size(), static_cast<size_t>(kMaxTokens));
  std::set<int> depths(grpc.loops.begin(), grpc.loops.end());
  EXPECT_GE(depths.size(), 2u) << "the model should exit at more than one depth";
  const int64_t grpc_loops = grpc.finished->usage().recursion_loops();
  const StreamResult grpc_chat = GenerateAll(stub_.get(), GrpcChat());
  ASSERT_TRUE(grpc_chat.status.ok() && grpc_chat.finished.has_value());

  for (const bool chat : {false, true}) {
    SCOPED_TRACE(chat ? "chat" : "completions");
    const std::string path = chat ? "/v1/chat/completions" : "/v1/completions";
    const StreamResult& want = chat ? grpc_chat : grpc;
    json body = chat ? ChatBody() : CompletionBody();
    const HttpResult plain = served_->Post(path, body);
    ASSERT_EQ(plain.status, 200) << plain.body;
    EXPECT_FALSE(plain.Json()["choices"][0].contains("token_loops")) << plain.body;
    EXPECT_FALSE(plain.Json()["usage"].contains("recursion_loops")) << plain.body;

    body["return_loops"] = true;
    const HttpResult whole = served_->Post(path, body);
    ASSERT_EQ(whole.status, 200) << whole.body;
    EXPECT_EQ(whole.Json()["choices"][0]["token_loops"].get<std::vector<int>>(), want.loops);
    EXPECT_EQ(whole.Json()["usage"]["recursion_loops"].get<int64_t>(),
              want.finished->usage().recursion_loops());

    body["n"] = 2;  // greedy: both choices are the request above
    const HttpResult two = served_->Post(path, body);
    ASSERT_EQ(two.status, 200) << two.body;
    for (const json& c : two.Json()["choices"]) {
      EXPECT_EQ(c["token_loops"].get<std::vector<int>>(), want.loops) << two.body;
    }
    EXPECT_EQ(two.Json()["usage"]["recursion_loops"].get<int64_t>(),
              2 * want.finished->usage().recursion_loops());

    body["n"] = 1;
    body["stream"] = true;
    body["stream_options"] = {{"include_usage", true}};
    const HttpResult streamed = served_->Post(path, body);
    ASSERT_EQ(streamed.status, 200) << streamed.body;
    std::vector<int> loops;
    int64_t usage_loops = -1;
    for (const std::string& data : SseData(streamed.body)) {
      if (data == "[DONE]") continue;
      const json chunk = json::parse(data);
      if (chunk.contains("usage") && chunk["usage"].is_object()) {
        usage_loops = chunk["usage"]["recursion_loops"].get<int64_t>();
      }
      for (const json& c : chunk["choices"]) {
        if (!c.contains("token_loops")) continue;
        for (const json& l : c["token_loops"]) loops.push_back(l.get<int>());
      }
    }
    EXPECT_EQ(loops, want.loops) << streamed.body;
    EXPECT_EQ(usage_loops, want.finished->usage().recursion_loops()) << streamed.body;
  }
  EXPECT_GT(grpc_loops, 0);
}

}  // namespace
}  // namespace morserve::testing
