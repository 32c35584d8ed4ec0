// The server's transport end to end: `morserve serve` as a subprocess (see server_process.h).
//   - TLS: a self-signed certificate for localhost / 127.0.0.1 made at test time with the
//     `openssl` command (scripts/install_deps.sh installs it); a client that trusts it gets
//     the reference greedy tokens, a plaintext client and a client trusting another
//     certificate get no response.
//   - Many streams: 1000 concurrent Generate streams from callback-API client reactors (no
//     thread per stream) against one server on a small thread budget (--threads 1
//     --wake-threads 1); every stream ends with its tokens and FINISH_REASON_LENGTH, the
//     server's thread count stays far below the stream count, every KV block is free after.
#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <sstream>
#include <thread>

#include "engine/reference/reference_model.h"
#include "engine/tools/mkmodel.h"
#include "tests/child_process.h"
#include "tests/engine_harness.h"
#include "tests/server/server_process.h"
#include "tests/server/test_models.h"
#include "tests/testutil.h"

namespace morserve::testing {
namespace {

using Clock = std::chrono::steady_clock;

// A self-signed certificate (a CA too, so it can be its own root) for localhost and
// 127.0.0.1, with its unencrypted key. False with `log` holding openssl's output.
bool MakeCertificate(const TempDir& dir, const std::string& name, std::string* cert,
                     std::string* key, std::string* log) {
  *cert = dir.File(name + ".crt");
  *key = dir.File(name + ".key");
  const std::string out = dir.File(name + ".log");
  const std::string cmd =
      "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 "
      "-subj /CN=localhost -addext subjectAltName=DNS:localhost,IP:127.0.0.1 -keyout " +
      *key + " -out " + *cert + " >" + out + " 2>&1";
  const int rc = std::system(cmd.c_str());
  *log = "$ " + cmd + "\n" + ReadFile(out);
  return rc == 0;
}

// No target name override: the address is 127.0.0.1:PORT and the certificate's IP
// subjectAltName must match it.
std::shared_ptr<grpc::Channel> TlsChannel(const std::string& address, const std::string& root_pem) {
  grpc::SslCredentialsOptions opts;
  opts.pem_root_certs = root_pem;
  return grpc::CreateChannel(address, grpc::SslCredentials(opts));
}

class TransportTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    model_dir_ = new std::string(dir_->File("mor-ec"));
    ASSERT_TRUE(WriteTinyModel(ServingSpec("mor-ec"), *model_dir_).ok());
  }
  static void TearDownTestSuite() {
    delete model_dir_;
    delete dir_;
  }
  static TempDir* dir_;
  static std::string* model_dir_;
};

TempDir* TransportTest::dir_ = nullptr;
std::string* TransportTest::model_dir_ = nullptr;

TEST_F(TransportTest, TlsServesTrustingClientsOnly) {
  std::string cert, key, log;
  ASSERT_TRUE(MakeCertificate(*dir_, "server", &cert, &key, &log)) << log;
  std::string other_cert, other_key;
  ASSERT_TRUE(MakeCertificate(*dir_, "other", &other_cert, &other_key, &log)) << log;

  ServerProcess server;
  ASSERT_TRUE(server.Start(*model_dir_, {"--tls-cert", cert, "--tls-key", key})) << server.output();
  // Health goes over the helper's plaintext channel; the "ready" line says the same here.
  ASSERT_TRUE(server.WaitForLine("ready: ", 60)) << server.output();

  auto weights = LoadModel(*model_dir_);
  ASSERT_TRUE(weights.ok()) << weights.status();
  const std::vector<int> prompt = {5, 17, 42, 99, 3, 250, 7};
  const int n = 10;
  const v1::GenerateRequest req = TokenRequest(prompt, n);

  auto tls = TlsChannel(server.address(), ReadFile(cert));
  auto stub = v1::Morserve::NewStub(tls);
  StreamResult got = GenerateAll(stub.get(), req, 30);
  ASSERT_TRUE(got.status.ok()) << got.status.error_code() << ": " << got.status.error_message()
                               << "\n" << server.output();
  EXPECT_EQ(got.tokens, ReferenceModel(*weights).GenerateGreedy(prompt, n));
  ASSERT_TRUE(got.finished.has_value());
  EXPECT_EQ(got.finished->reason(), v1::FINISH_REASON_LENGTH);
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::ModelInfo info;
    EXPECT_TRUE(stub->GetModelInfo(&ctx, v1::GetModelInfoRequest(), &info).ok());
  }

  // Plaintext to the TLS port: the connection closes, no response.
  auto plain = v1::Morserve::NewStub(
      grpc::CreateChannel(server.address(), grpc::InsecureChannelCredentials()));
  StreamResult plain_got = GenerateAll(plain.get(), req, 5);
  EXPECT_EQ(plain_got.status.error_code(), grpc::StatusCode::UNAVAILABLE)
      << plain_got.status.error_message();
  EXPECT_TRUE(plain_got.tokens.empty());
  EXPECT_FALSE(plain_got.finished.has_value());

  // TLS trusting another certificate: the handshake fails, no response.
  auto wrong = v1::Morserve::NewStub(TlsChannel(server.address(), ReadFile(other_cert)));
  StreamResult wrong_got = GenerateAll(wrong.get(), req, 5);
  EXPECT_EQ(wrong_got.status.error_code(), grpc::StatusCode::UNAVAILABLE)
      << wrong_got.status.error_message();
  EXPECT_TRUE(wrong_got.tokens.empty());

  // The server is unharmed by both: the trusting client still gets the same tokens.
  StreamResult again = GenerateAll(stub.get(), req, 30);
  ASSERT_TRUE(again.status.ok()) << again.status.error_message();
  EXPECT_EQ(again.tokens, got.tokens);
  EXPECT_EQ(server.Terminate(), 0) << server.output();
}

TEST_F(TransportTest, TlsFlagsAreCheckedBeforeServing) {
  std::string cert, key, log;
  ASSERT_TRUE(MakeCertificate(*dir_, "half", &cert, &key, &log)) << log;
  struct Case {
    std::vector<std::string> args;
    const char* message;
  };
  const std::vector<Case> cases = {
      {{"--tls-cert", cert}, "--tls-cert and --tls-key go together"},
      {{"--tls-key", key}, "--tls-cert and --tls-key go together"},
      {{"--tls-cert", dir_->File("missing.crt"), "--tls-key", key}, "--tls-cert: cannot read"},
  };
  for (const Case& c : cases) {
    // `timeout`: a server that wrongly started would otherwise never return.
    std::string cmd = "timeout 30 " + MorserveBinary() + " serve --model " + *model_dir_ + " --port 0 --metrics-port 0";
    for (const std::string& a : c.args) cmd += " " + a;
    CommandResult r = RunCommand(cmd);
    SCOPED_TRACE(cmd);
    EXPECT_NE(r.exit_code, 0);
    EXPECT_NE(r.output.find(c.message), std::string::npos) << r.output;
  }
}

// One Generate stream read to its end by a callback-API reactor.
class StreamReader : public grpc::ClientReadReactor<v1::GenerateResponse> {
 public:
  StreamReader(v1::Morserve::Stub* stub, const v1::GenerateRequest& req, std::atomic<int>* left,
               std::mutex* mu, std::condition_variable* cv)
      : req_(req), left_(left), mu_(mu), cv_(cv) {
    ctx_.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
    stub->async()->Generate(&ctx_, &req_, this);
    StartRead(&resp_);
    StartCall();
  }
  void OnReadDone(bool ok) override {
    if (!ok) return;  // OnDone follows
    for (const v1::Token& t : resp_.tokens()) tokens.push_back(t.id());
    if (resp_.has_finished()) finished = resp_.finished();
    StartRead(&resp_);
  }
  void OnDone(const grpc::Status& s) override {
    status = s;
    // Under the lock: the test's mutex and condition variable outlive this call.
    std::lock_guard<std::mutex> lock(*mu_);
    if (left_->fetch_sub(1) == 1) cv_->notify_all();
  }

  grpc::Status status;
  std::vector<int> tokens;
  std::optional<v1::Finished> finished;

 private:
  grpc::ClientContext ctx_;
  v1::GenerateRequest req_;
  v1::GenerateResponse resp_;
  std::atomic<int>* left_;
  std::mutex* mu_;
  std::condition_variable* cv_;
};

TEST_F(TransportTest, ThousandConcurrentStreamsOnASmallThreadBudget) {
  constexpr int kStreams = 1000;
  constexpr int kTokens = 4;
  constexpr int kPrompts = 8;  // distinct prompts, checked against the reference
  ServerProcess server;
  ASSERT_TRUE(server.Start(*model_dir_, {"--threads", "1", "--wake-threads", "1", "--max-batch",
                                         "256", "--max-queue", "2000"}))
      << server.output();
  ASSERT_TRUE(server.WaitHealth(true)) << server.output();
  const int threads_idle = ThreadCount(server.pid());
  ASSERT_GT(threads_idle, 0);

  auto weights = LoadModel(*model_dir_);
  ASSERT_TRUE(weights.ok()) << weights.status();
  const auto prompts = MakePrompts(kPrompts, 3, 12, 256, 11);
  std::vector<std::vector<int>> want;
  for (const auto& p : prompts) want.push_back(ReferenceModel(*weights).GenerateGreedy(p, kTokens));

  auto stub = server.Stub();
  std::atomic<int> left{kStreams};
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::unique_ptr<StreamReader>> readers;
  const auto start = Clock::now();
  for (int i = 0; i < kStreams; ++i) {
    v1::GenerateRequest req = TokenRequest(prompts[i % kPrompts], kTokens);
    req.set_request_id("s" + std::to_string(i));
    readers.push_back(std::make_unique<StreamReader>(stub.get(), req, &left, &mu, &cv));
  }
  // The server's thread count, sampled while streams are open.
  int threads_max = ThreadCount(server.pid());
  {
    std::unique_lock<std::mutex> lock(mu);
    const auto end = Clock::now() + std::chrono::seconds(120);
    while (left.load() > 0 && Clock::now() < end) {
      cv.wait_for(lock, std::chrono::milliseconds(10), [&] { return left.load() == 0; });
      threads_max = std::max(threads_max, ThreadCount(server.pid()));
    }
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  ASSERT_EQ(left.load(), 0) << "streams still open after 120 s\n" << server.output();

  int ok = 0;
  for (int i = 0; i < kStreams; ++i) {
    const StreamReader& r = *readers[i];
    SCOPED_TRACE(i);
    if (!r.status.ok()) {
      ADD_FAILURE() << r.status.error_code() << ": " << r.status.error_message();
      continue;
    }
    ++ok;
    EXPECT_EQ(r.tokens, want[i % kPrompts]);
    ASSERT_TRUE(r.finished.has_value());
    EXPECT_EQ(r.finished->reason(), v1::FINISH_REASON_LENGTH);
    EXPECT_EQ(r.finished->usage().completion_tokens(), kTokens);
  }
  EXPECT_EQ(ok, kStreams);
  std::printf("%d streams in %.2f s; server threads: %d idle, %d at most while streaming\n",
              kStreams, seconds, threads_idle, threads_max);
  EXPECT_LT(threads_max, 64) << "server threads grow with the streams";

  // Every KV block is free again (the stats refresh after the step that sent the last token).
  int used = -1;
  const auto end = Clock::now() + std::chrono::seconds(20);
  while (Clock::now() < end) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    v1::ModelInfo info;
    ASSERT_TRUE(stub->GetModelInfo(&ctx, v1::GetModelInfoRequest(), &info).ok());
    used = info.kv_blocks_used();
    if (used == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(used, 0);
  auto metrics = HttpGet(server.metrics_port(), "/metrics");
  ASSERT_TRUE(metrics.has_value());
  EXPECT_EQ(ScrapeValue(*metrics, "morserve_requests_finished_total{reason=\"length\"}"),
            static_cast<double>(kStreams));
  // The streams ran side by side: one at a time they would take at least a step per token.
  const std::optional<double> steps = ScrapeValue(*metrics, "morserve_engine_steps_total");
  ASSERT_TRUE(steps.has_value());
  std::printf("engine steps: %.0f\n", *steps);
  EXPECT_LT(*steps, kStreams) << "the streams did not share engine steps";
  EXPECT_EQ(server.Terminate(), 0) << server.output();
}

}  // namespace
}  // namespace morserve::testing
