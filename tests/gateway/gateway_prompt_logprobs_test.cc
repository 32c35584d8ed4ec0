// Prompt logprobs through the gateway with curl: the real `morserve serve` (a tiny MoR model
// on a tokenizer `morserve mktokenizer` trains from this repo's README: no npm) behind the
// real `morserve-gateway`, both on 127.0.0.1 port 0. /v1/completions with echo and logprobs
// leads the legacy logprobs object with the prompt's tokens (the first null) and equals the
// gRPC server's prompt logprobs, then the generated tokens; max_tokens 0 with echo is
// lm-eval's loglikelihood request, whose summed logprob equals the gRPC server's and the
// reference implementation's; streaming gives the same entries; vLLM's prompt_logprobs field
// in its shape; bad values are 400s naming the field.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <thread>

#include "engine/reference/reference_model.h"
#include "engine/tokenizer/tokenizer.h"
#include "engine/tools/mkmodel.h"
#include "nlohmann/json.hpp"
#include "tests/gateway/gateway_process.h"
#include "tests/server/server_process.h"
#include "tests/testutil.h"

namespace morserve::testing {
namespace {

using nlohmann::json;

class GatewayPromptLogprobsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    const std::string tok_dir = dir_->File("tokenizer");
    const std::string cmd = MorserveBinary() + " mktokenizer --corpus " + MORSERVE_FIXTURE_DIR +
                            "/../../README.md --vocab-size 400 --out " + tok_dir + " > /dev/null";
    ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
    TinyModelSpec spec;
    spec.family = "mor-ec";
    spec.dtype = DType::kF32;
    spec.max_pos = 128;
    ASSERT_TRUE(UseTokenizer(tok_dir, &spec).ok());
    model_dir_ = new std::string(dir_->File("mor-tiny"));
    ASSERT_TRUE(WriteTinyModel(spec, *model_dir_).ok());
    auto tok = Tokenizer::FromDirectory(*model_dir_);
    ASSERT_TRUE(tok.ok()) << tok.status();
    tokenizer_ = tok->release();
    server_ = new ServerProcess();
    gateway_ = new GatewayProcess();
    ASSERT_TRUE(server_->Start(*model_dir_, {}) && server_->WaitHealth(true)) << server_->output();
    ASSERT_TRUE(gateway_->Start({"--backend", server_->address(), "--health-interval-ms", "200"}))
        << gateway_->output();
    // Until its first health check the gateway knows no serving backend (503).
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (Curl("GET", gateway_->url() + "/health").status != 200) {
      ASSERT_LT(std::chrono::steady_clock::now(), end) << "the gateway never saw the backend serving";
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
  static void TearDownTestSuite() {
    if (gateway_ != nullptr) EXPECT_EQ(gateway_->Terminate(), 0) << gateway_->output();
    if (server_ != nullptr) EXPECT_EQ(server_->Terminate(), 0) << server_->output();
    delete gateway_;
    delete server_;
    delete tokenizer_;
    delete model_dir_;
    delete dir_;
    gateway_ = nullptr;
    server_ = nullptr;
  }
  void SetUp() override {
    ASSERT_NE(gateway_, nullptr);
    stub_ = server_->Stub();
  }

  static HttpResult Post(const json& body) {
    return Curl("POST", gateway_->url() + "/v1/completions", body.dump());
  }

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

  static inline TempDir* dir_ = nullptr;
  static inline std::string* model_dir_ = nullptr;
  static inline Tokenizer* tokenizer_ = nullptr;
  static inline ServerProcess* server_ = nullptr;
  static inline GatewayProcess* gateway_ = nullptr;
  std::unique_ptr<v1::Morserve::Stub> stub_;
};

json EchoBody(const std::string& prompt, int max_tokens, int logprobs) {
  return {{"prompt", prompt}, {"echo", true},         {"logprobs", logprobs},
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
  const std::vector<int> ids = tokenizer_->Encode(prompt, true);
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
  const std::vector<int> ids = tokenizer_->Encode(prompt, true);
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
  auto weights = LoadModel(*model_dir_);
  ASSERT_TRUE(weights.ok()) << weights.status();
  ReferenceModel ref(*weights);
  const std::vector<StepOutput> outs = ref.Forward(ids);
  // The continuation: the last 4 tokens, as lm-eval sums them.
  double sum_http = 0, sum_grpc = 0, sum_ref = 0, scale = 1;
  for (size_t i = ids.size() - 4; i < ids.size(); ++i) {
    sum_http += lp["token_logprobs"][i].get<double>();
    sum_grpc += want.prompt_logprobs[i].logprob();
    const std::vector<float>& logits = outs[i - 1].logits;
    double m = -INFINITY, z = 0;
    for (float x : logits) {
      m = std::max(m, static_cast<double>(x));
      scale = std::max(scale, std::fabs(static_cast<double>(x)));
    }
    for (float x : logits) z += std::exp(x - m);
    sum_ref += logits[ids[i]] - m - std::log(z);
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
    json body = {{"prompt", ids}, {"prompt_logprobs", 3}, {"max_tokens", 2}, {"temperature", 0},
                 {"ignore_eos", true}, {"stream", stream}};
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
