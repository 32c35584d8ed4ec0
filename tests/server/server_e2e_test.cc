// End to end through the real server: `morserve serve` as a subprocess on 127.0.0.1 port 0,
// generated gRPC stubs as the client. Tokens must equal the reference implementation's
// greedy tokens and the in-process engine's (tokens, loops, logprobs); streams stay
// independent under concurrency; cancellation frees every KV block; each bad input gets its
// status code and a message naming the field; a full queue gets RESOURCE_EXHAUSTED; health
// flips while loading and when the engine thread stops; SIGTERM drains and exits 0.
#include <gtest/gtest.h>
#include <signal.h>

#include <atomic>
#include <memory>
#include <thread>

#include "engine/reference/reference_model.h"
#include "engine/runtime/engine.h"
#include "tests/engine_harness.h"
#include "tests/server/server_process.h"
#include "tests/server/test_models.h"

namespace morserve::testing {
namespace {

using grpc::StatusCode;

class ServerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    mor_dir_ = new std::string(dir_->File("mor-ec"));
    ASSERT_TRUE(WriteTinyModel(ServingSpec("mor-ec"), *mor_dir_).ok());
    vanilla_dir_ = new std::string(dir_->File("vanilla"));
    ASSERT_TRUE(WriteTinyModel(ServingSpec("vanilla"), *vanilla_dir_).ok());
    // Wide enough that a long generation takes seconds on one thread: cancellation and
    // draining land mid-stream, never after the request finished on its own.
    slow_dir_ = new std::string(dir_->File("slow"));
    ASSERT_TRUE(WriteTinyModel(SlowVanillaSpec(), *slow_dir_).ok());
  }
  static void TearDownTestSuite() {
    delete mor_dir_;
    delete vanilla_dir_;
    delete slow_dir_;
    delete dir_;
  }

  static int KvBlocksUsed(v1::Morserve::Stub* stub) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    v1::ModelInfo info;
    grpc::Status s = stub->GetModelInfo(&ctx, v1::GetModelInfoRequest(), &info);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return s.ok() ? info.kv_blocks_used() : -1;
  }

  // Polls until the engine holds no KV block (the cancelled request left at a step).
  static bool WaitKvFree(v1::Morserve::Stub* stub, int timeout_s = 20) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
    while (std::chrono::steady_clock::now() < end) {
      if (KvBlocksUsed(stub) == 0) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return false;
  }

  // Polls until the engine's gauge shows KV blocks held. A token can reach the client before
  // the step that produced it refreshes the gauge, so a running request's blocks may not show
  // yet; seeing them first makes a later WaitKvFree mean that this request let them go.
  static bool WaitKvUsed(v1::Morserve::Stub* stub, int timeout_s = 20) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
    while (std::chrono::steady_clock::now() < end) {
      if (KvBlocksUsed(stub) > 0) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return false;
  }

  static TempDir* dir_;
  static std::string* mor_dir_;
  static std::string* vanilla_dir_;
  static std::string* slow_dir_;
};

TempDir* ServerTest::dir_ = nullptr;
std::string* ServerTest::mor_dir_ = nullptr;
std::string* ServerTest::vanilla_dir_ = nullptr;
std::string* ServerTest::slow_dir_ = nullptr;

TEST_F(ServerTest, GenerateEqualsReferenceAndEngine) {
  for (const std::string* model : {mor_dir_, vanilla_dir_}) {
    SCOPED_TRACE(*model);
    auto weights = LoadModel(*model);
    ASSERT_TRUE(weights.ok()) << weights.status();
    ServerProcess server;
    ASSERT_NO_FATAL_FAILURE(StartOrDie(&server, *model));
    auto stub = server.Stub();
    const std::vector<int> prompt = {5, 17, 42, 99, 3, 250, 7};
    const int n = 12;

    v1::GenerateRequest req = TokenRequest(prompt, n);
    req.set_request_id("ref-check");
    req.set_logprobs(2);
    req.set_echo(true);
    StreamResult got = GenerateAll(stub.get(), req);
    ASSERT_TRUE(got.status.ok()) << got.status.error_message();

    ReferenceModel ref(*weights);
    EXPECT_EQ(got.tokens, ref.GenerateGreedy(prompt, n));

    // The same request on an in-process engine: tokens, loops and logprobs identical.
    auto engine = Engine::Create(*weights, EngineConfig());
    ASSERT_TRUE(engine.ok()) << engine.status();
    GenerateRequest er = Greedy(prompt, n);
    er.params.logprobs = 2;
    auto ch = (*engine)->Submit(er);
    ASSERT_TRUE(ch.ok());
    (*engine)->RunUntilIdle();
    RunResult local = Collect(ch->get());
    EXPECT_EQ(got.tokens, local.tokens);
    EXPECT_EQ(got.loops, local.loops);
    EXPECT_EQ(got.echoed, prompt);
    ASSERT_TRUE(got.finished.has_value());
    EXPECT_EQ(got.finished->reason(), v1::FINISH_REASON_LENGTH);
    EXPECT_EQ(got.finished->usage().prompt_tokens(), static_cast<int>(prompt.size()));
    EXPECT_EQ(got.finished->usage().completion_tokens(), n);
    EXPECT_EQ(got.finished->usage().total_tokens(), n + static_cast<int>(prompt.size()));
    EXPECT_EQ(got.finished->usage().recursion_loops(), local.usage.recursion_loops);
    EXPECT_EQ(got.finished->stop_token_id(), -1);
    EXPECT_EQ(server.Terminate(), 0) << server.output();
  }
}

TEST_F(ServerTest, LogprobsEqualEngine) {
  auto weights = LoadModel(*mor_dir_);
  ASSERT_TRUE(weights.ok());
  ServerProcess server;
  ASSERT_NO_FATAL_FAILURE(StartOrDie(&server, *mor_dir_));
  auto stub = server.Stub();
  v1::GenerateRequest req = TokenRequest({1, 2, 3, 4}, 6);
  req.set_logprobs(3);
  grpc::ClientContext ctx;
  auto reader = stub->Generate(&ctx, req);
  v1::GenerateResponse resp;
  std::vector<v1::Token> tokens;
  while (reader->Read(&resp))
    tokens.insert(tokens.end(), resp.tokens().begin(), resp.tokens().end());
  ASSERT_TRUE(reader->Finish().ok());

  auto engine = Engine::Create(*weights, EngineConfig());
  ASSERT_TRUE(engine.ok());
  GenerateRequest er = Greedy({1, 2, 3, 4}, 6);
  er.params.logprobs = 3;
  auto ch = (*engine)->Submit(er);
  ASSERT_TRUE(ch.ok());
  (*engine)->RunUntilIdle();
  std::vector<TokenEvent> local;
  for (RequestEvent& e : (*ch)->DrainUntilFinal()) {
    for (TokenEvent& t : e.tokens) local.push_back(t);
  }
  ASSERT_EQ(tokens.size(), local.size());
  for (size_t i = 0; i < local.size(); ++i) {
    EXPECT_EQ(tokens[i].id(), local[i].token);
    EXPECT_FLOAT_EQ(tokens[i].logprob(), local[i].logprob);
    ASSERT_EQ(tokens[i].top_logprobs_size(), 3);
    for (int k = 0; k < 3; ++k) {
      EXPECT_EQ(tokens[i].top_logprobs(k).token_id(), local[i].top_logprobs[k].token);
      EXPECT_FLOAT_EQ(tokens[i].top_logprobs(k).logprob(), local[i].top_logprobs[k].logprob);
    }
  }
}

TEST_F(ServerTest, ConcurrentStreamsAreIndependent) {
  ServerProcess server;
  ASSERT_NO_FATAL_FAILURE(StartOrDie(&server, *mor_dir_));
  auto stub = server.Stub();
  const int kStreams = 12;
  std::vector<v1::GenerateRequest> reqs;
  auto prompts = MakePrompts(kStreams, 1, 40, 256, 7);
  for (int i = 0; i < kStreams; ++i) {
    v1::GenerateRequest r = TokenRequest(prompts[i], 8 + 3 * i);
    r.set_request_id("s" + std::to_string(i));
    if (i % 2 == 1) {  // seeded sampling: the seed, not the batch, decides the tokens
      r.mutable_sampling()->set_temperature(0.9f);
      r.mutable_sampling()->set_top_k(20);
      r.mutable_sampling()->set_seed(1000 + i);
    }
    reqs.push_back(r);
  }
  // Alone, one at a time.
  std::vector<StreamResult> alone;
  for (const auto& r : reqs) alone.push_back(GenerateAll(stub.get(), r));
  // All at once, on separate stubs over the same channel.
  std::vector<StreamResult> together(kStreams);
  std::vector<std::thread> threads;
  for (int i = 0; i < kStreams; ++i) {
    threads.emplace_back([&, i] {
      auto s = server.Stub();
      together[i] = GenerateAll(s.get(), reqs[i]);
    });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < kStreams; ++i) {
    SCOPED_TRACE(i);
    ASSERT_TRUE(alone[i].status.ok()) << alone[i].status.error_message();
    ASSERT_TRUE(together[i].status.ok()) << together[i].status.error_message();
    EXPECT_EQ(static_cast<int>(together[i].tokens.size()), 8 + 3 * i);
    EXPECT_EQ(together[i].tokens, alone[i].tokens);
    EXPECT_EQ(together[i].loops, alone[i].loops);
  }
  EXPECT_TRUE(WaitKvFree(stub.get()));
  EXPECT_EQ(server.Terminate(), 0) << server.output();
}

TEST_F(ServerTest, CancelMidStreamFreesEveryKvBlock) {
  ServerProcess server;
  ASSERT_NO_FATAL_FAILURE(StartOrDie(&server, *slow_dir_, {"--threads", "1"}));
  auto stub = server.Stub();
  grpc::ClientContext ctx;
  auto reader = stub->Generate(&ctx, TokenRequest(MakePrompts(1, 300, 300, 256, 3)[0], 3000));
  v1::GenerateResponse resp;
  ASSERT_TRUE(reader->Read(&resp));
  EXPECT_GT(resp.tokens_size(), 0);
  EXPECT_TRUE(WaitKvUsed(stub.get()));
  ctx.TryCancel();
  while (reader->Read(&resp)) {
  }
  EXPECT_EQ(reader->Finish().error_code(), StatusCode::CANCELLED);
  EXPECT_TRUE(WaitKvFree(stub.get())) << "KV blocks still held after the cancel";
  auto metrics = HttpGet(server.metrics_port(), "/metrics");
  ASSERT_TRUE(metrics.has_value());
  EXPECT_EQ(ScrapeValue(*metrics, "morserve_requests_finished_total{reason=\"cancelled\"}"), 1.0);

  // A deadline that passes mid-stream is a cancellation too.
  StreamResult late = GenerateAll(stub.get(), TokenRequest(MakePrompts(1, 50, 50, 256, 4)[0], 3000),
                                  /*deadline_s=*/1);
  EXPECT_EQ(late.status.error_code(), StatusCode::DEADLINE_EXCEEDED);
  EXPECT_TRUE(WaitKvFree(stub.get())) << "KV blocks still held after the deadline";
  EXPECT_EQ(server.Terminate(), 0) << server.output();
}

TEST_F(ServerTest, BadInputsGetTheirCodeAndField) {
  ServerProcess server;
  ASSERT_NO_FATAL_FAILURE(StartOrDie(&server, *vanilla_dir_));
  auto stub = server.Stub();
  struct Case {
    const char* name;
    std::function<void(v1::GenerateRequest*)> edit;
    StatusCode code;
    const char* message;
  };
  const std::vector<Case> cases = {
      {"no input", [](v1::GenerateRequest* r) { r->clear_input(); }, StatusCode::INVALID_ARGUMENT,
       "input"},
      {"empty ids", [](v1::GenerateRequest* r) { r->mutable_token_ids()->clear_ids(); },
       StatusCode::INVALID_ARGUMENT, "token_ids"},
      {"id outside vocab", [](v1::GenerateRequest* r) { r->mutable_token_ids()->add_ids(9999); },
       StatusCode::INVALID_ARGUMENT, "prompt: token id 9999"},
      {"negative id", [](v1::GenerateRequest* r) { r->mutable_token_ids()->set_ids(0, -1); },
       StatusCode::INVALID_ARGUMENT, "prompt: token id -1"},
      {"temperature", [](v1::GenerateRequest* r) { r->mutable_sampling()->set_temperature(-1); },
       StatusCode::INVALID_ARGUMENT, "temperature"},
      {"top_p", [](v1::GenerateRequest* r) { r->mutable_sampling()->set_top_p(1.5f); },
       StatusCode::INVALID_ARGUMENT, "top_p"},
      {"min_p", [](v1::GenerateRequest* r) { r->mutable_sampling()->set_min_p(-0.5f); },
       StatusCode::INVALID_ARGUMENT, "min_p"},
      {"max_tokens", [](v1::GenerateRequest* r) { r->set_max_tokens(0); },
       StatusCode::INVALID_ARGUMENT, "max_tokens"},
      {"max_tokens over context", [](v1::GenerateRequest* r) { r->set_max_tokens(1000); },
       StatusCode::INVALID_ARGUMENT, "max_tokens"},
      {"logprobs", [](v1::GenerateRequest* r) { r->set_logprobs(50); },
       StatusCode::INVALID_ARGUMENT, "logprobs"},
      {"stop id", [](v1::GenerateRequest* r) { r->add_stop_token_ids(100000); },
       StatusCode::INVALID_ARGUMENT, "stop_token_ids"},
      {"prompt over context",
       [](v1::GenerateRequest* r) {
         for (int i = 0; i < 300; ++i) r->mutable_token_ids()->add_ids(1);
       },
       StatusCode::FAILED_PRECONDITION, "context"},
      {"text without tokenizer", [](v1::GenerateRequest* r) { r->set_text("hello"); },
       StatusCode::FAILED_PRECONDITION, "tokenizer"},
      {"chat without tokenizer",
       [](v1::GenerateRequest* r) { r->mutable_chat()->add_messages()->set_content("hi"); },
       StatusCode::FAILED_PRECONDITION, "tokenizer"},
      {"stop strings without tokenizer", [](v1::GenerateRequest* r) { r->add_stop("\n"); },
       StatusCode::FAILED_PRECONDITION, "stop"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    v1::GenerateRequest r = TokenRequest({1, 2, 3}, 4);
    c.edit(&r);
    StreamResult got = GenerateAll(stub.get(), r);
    EXPECT_EQ(got.status.error_code(), c.code) << got.status.error_message();
    EXPECT_NE(got.status.error_message().find(c.message), std::string::npos)
        << got.status.error_message();
    EXPECT_TRUE(got.tokens.empty());
  }
  {
    grpc::ClientContext ctx;
    v1::TokenizeRequest req;
    req.set_text("hello");
    v1::TokenizeResponse resp;
    grpc::Status s = stub->Tokenize(&ctx, req, &resp);
    EXPECT_EQ(s.error_code(), StatusCode::FAILED_PRECONDITION);
    EXPECT_NE(s.error_message().find("tokenizer"), std::string::npos);
  }
  {
    grpc::ClientContext ctx;
    v1::DetokenizeRequest req;
    req.add_ids(1);
    v1::DetokenizeResponse resp;
    grpc::Status s = stub->Detokenize(&ctx, req, &resp);
    EXPECT_EQ(s.error_code(), StatusCode::FAILED_PRECONDITION);
    EXPECT_NE(s.error_message().find("tokenizer"), std::string::npos);
  }
  auto metrics = HttpGet(server.metrics_port(), "/metrics");
  ASSERT_TRUE(metrics.has_value());
  EXPECT_EQ(ScrapeValue(*metrics, "morserve_requests_rejected_total{reason=\"invalid_argument\"}"),
            11.0);
  EXPECT_EQ(ScrapeValue(*metrics, "morserve_requests_rejected_total{reason=\"context_length\"}"),
            1.0);
  EXPECT_EQ(ScrapeValue(*metrics, "morserve_requests_rejected_total{reason=\"no_tokenizer\"}"),
            3.0);
  EXPECT_EQ(server.Terminate(), 0) << server.output();
}

TEST_F(ServerTest, FullQueueGetsResourceExhausted) {
  ServerProcess server;
  ASSERT_NO_FATAL_FAILURE(StartOrDie(&server, *slow_dir_,
                                     {"--threads", "1", "--max-running", "1", "--max-queue", "0"}));
  auto stub = server.Stub();
  grpc::ClientContext ctx;
  auto reader = stub->Generate(&ctx, TokenRequest({1, 2, 3}, 3000));
  v1::GenerateResponse resp;
  ASSERT_TRUE(reader->Read(&resp));  // it runs
  // Its blocks show in the gauge before the cancel, so the gauge's 0 below comes after the
  // engine finished it (and let its place in the queue go), not from before its first step.
  ASSERT_TRUE(WaitKvUsed(stub.get()));
  StreamResult second = GenerateAll(stub.get(), TokenRequest({4, 5, 6}, 4));
  EXPECT_EQ(second.status.error_code(), StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_NE(second.status.error_message().find("queue is full"), std::string::npos)
      << second.status.error_message();
  ctx.TryCancel();
  while (reader->Read(&resp)) {
  }
  EXPECT_EQ(reader->Finish().error_code(), StatusCode::CANCELLED);
  ASSERT_TRUE(WaitKvFree(stub.get()));
  // With the first one gone there is room again.
  StreamResult third = GenerateAll(stub.get(), TokenRequest({4, 5, 6}, 4));
  EXPECT_TRUE(third.status.ok()) << third.status.error_message();
  auto metrics = HttpGet(server.metrics_port(), "/metrics");
  ASSERT_TRUE(metrics.has_value());
  EXPECT_EQ(ScrapeValue(*metrics, "morserve_requests_rejected_total{reason=\"queue_full\"}"), 1.0);
  EXPECT_EQ(server.Terminate(), 0) << server.output();
}

TEST_F(ServerTest, HealthFlipsWhileLoadingAndWhenTheEngineStops) {
  ServerProcess server;
  ASSERT_TRUE(server.Start(*vanilla_dir_, {"--debug-load-delay-ms", "2000", "--debug-signals",
                                           "--stall-timeout", "0.5"}))
      << server.output();
  // Loading: NOT_SERVING, calls UNAVAILABLE.
  EXPECT_EQ(server.Health(), grpc::health::v1::HealthCheckResponse::NOT_SERVING);
  auto stub = server.Stub();
  StreamResult early = GenerateAll(stub.get(), TokenRequest({1, 2}, 2));
  EXPECT_EQ(early.status.error_code(), StatusCode::UNAVAILABLE);
  EXPECT_NE(early.status.error_message().find("loading"), std::string::npos);
  {
    grpc::ClientContext ctx;
    v1::ModelInfo info;
    EXPECT_EQ(stub->GetModelInfo(&ctx, v1::GetModelInfoRequest(), &info).error_code(),
              StatusCode::UNAVAILABLE);
  }
  ASSERT_TRUE(server.WaitHealth(true)) << server.output();
  EXPECT_TRUE(GenerateAll(stub.get(), TokenRequest({1, 2}, 2)).status.ok());
  {
    grpc::ClientContext ctx;
    v1::ModelInfo info;
    ASSERT_TRUE(stub->GetModelInfo(&ctx, v1::GetModelInfoRequest(), &info).ok());
    EXPECT_EQ(info.family(), "vanilla");
    EXPECT_EQ(info.context_length(), 256);
    EXPECT_EQ(info.vocab_size(), 256);
    EXPECT_GT(info.kv_blocks_total(), 0);
    EXPECT_FALSE(info.has_tokenizer());
    EXPECT_FALSE(info.has_chat_template());
    EXPECT_FALSE(info.plan().empty());
  }
  // The stats the info reads are refreshed after the step that sent the last token.
  EXPECT_TRUE(WaitKvFree(stub.get()));
  // The engine thread stops stepping: the watchdog turns health NOT_SERVING.
  server.Signal(SIGUSR1);
  EXPECT_TRUE(server.WaitHealth(false, 20)) << server.output();
  EXPECT_EQ(server.Terminate(), 0) << server.output();
}

TEST_F(ServerTest, SigtermDrainsRunningStreams) {
  ServerProcess server;
  ASSERT_NO_FATAL_FAILURE(StartOrDie(&server, *slow_dir_, {"--threads", "1"}));
  auto stub = server.Stub();
  const int n = 150;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
  auto reader = stub->Generate(&ctx, TokenRequest({1, 2, 3}, n));
  v1::GenerateResponse resp;
  ASSERT_TRUE(reader->Read(&resp));
  int tokens = resp.tokens_size();
  server.Signal(SIGTERM);
  ASSERT_TRUE(server.WaitForLine("draining")) << server.output();
  // Draining: health NOT_SERVING, new calls UNAVAILABLE; the running stream goes on.
  EXPECT_EQ(server.Health(), grpc::health::v1::HealthCheckResponse::NOT_SERVING);
  StreamResult refused = GenerateAll(stub.get(), TokenRequest({1}, 2));
  EXPECT_EQ(refused.status.error_code(), StatusCode::UNAVAILABLE);
  EXPECT_NE(refused.status.error_message().find("draining"), std::string::npos);
  std::optional<v1::Finished> finished;
  while (reader->Read(&resp)) {
    tokens += resp.tokens_size();
    if (resp.has_finished()) finished = resp.finished();
  }
  EXPECT_TRUE(reader->Finish().ok());
  EXPECT_EQ(tokens, n);
  ASSERT_TRUE(finished.has_value());
  EXPECT_EQ(finished->reason(), v1::FINISH_REASON_LENGTH);
  EXPECT_EQ(server.Terminate(), 0) << server.output();
}

TEST_F(ServerTest, DrainTimeoutCancelsWhatIsLeftAndExitsZero) {
  ServerProcess server;
  ASSERT_NO_FATAL_FAILURE(
      StartOrDie(&server, *slow_dir_, {"--threads", "1", "--drain-timeout", "0.5"}));
  auto stub = server.Stub();
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
  auto reader = stub->Generate(&ctx, TokenRequest({1, 2, 3}, 3000));
  v1::GenerateResponse resp;
  ASSERT_TRUE(reader->Read(&resp));
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(server.Terminate(30), 0) << server.output();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(20));
  while (reader->Read(&resp)) {
  }
  const grpc::Status s = reader->Finish();
  EXPECT_FALSE(s.ok());
  EXPECT_TRUE(s.error_code() == StatusCode::CANCELLED || s.error_code() == StatusCode::UNAVAILABLE)
      << s.error_code() << " " << s.error_message();
}

}  // namespace
}  // namespace morserve::testing
