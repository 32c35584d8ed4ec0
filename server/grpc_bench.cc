// morserve_grpc_bench: decode throughput through gRPC beside the engine alone, same workload,
// one run (not a test; prints JSON). The workload: --requests R requests with a fixed
// prompt of --prompt-len tokens and --max-tokens T greedy output tokens (EOS ignored), kept
// --concurrency N in flight. Engine-only runs an in-process Engine with the engine flags
// given; gRPC starts `morserve serve` (--morserve PATH) with the same flags on port 0 and
// streams with N client threads over one channel.
//
//   morserve_grpc_bench --model DIR --morserve build/server/morserve [--requests 256]
//       [--concurrency 32] [--prompt-len 16] [--max-tokens 64] [engine flags...]
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/model/weights.h"
#include "engine/runtime/engine.h"
#include "engine/tools/engine_flags.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "morserve/v1/morserve.grpc.pb.h"
#include "nlohmann/json.hpp"

namespace morserve {
namespace {

using Clock = std::chrono::steady_clock;

struct Workload {
  int requests = 256, concurrency = 32, prompt_len = 16, max_tokens = 64;
  std::vector<int> Prompt(int i, int vocab) const {
    std::vector<int> p(prompt_len);
    for (int k = 0; k < prompt_len; ++k) p[k] = (i * 131 + k * 17 + 1) % vocab;
    return p;
  }
};

struct Result {
  double seconds = 0;
  int64_t tokens = 0;
  int failures = 0;
  double tokens_per_second() const { return seconds > 0 ? tokens / seconds : 0; }
};

// Runs `one(i)` for i in [0, requests) on `concurrency` threads; returns tokens and time.
Result RunConcurrent(const Workload& w, const std::function<int64_t(int)>& one) {
  std::atomic<int> next{0};
  std::atomic<int64_t> tokens{0};
  std::atomic<int> failures{0};
  const auto start = Clock::now();
  std::vector<std::thread> threads;
  for (int t = 0; t < w.concurrency; ++t) {
    threads.emplace_back([&] {
      for (int i; (i = next.fetch_add(1)) < w.requests;) {
        const int64_t n = one(i);
        if (n < 0) {
          failures.fetch_add(1);
        } else {
          tokens.fetch_add(n);
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  Result r;
  r.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  r.tokens = tokens.load();
  r.failures = failures.load();
  return r;
}

Result EngineOnly(const Workload& w, std::shared_ptr<const ModelWeights> weights, const EngineConfig& c) {
  auto engine = Engine::Create(weights, c);
  if (!engine.ok()) {
    std::fprintf(stderr, "engine: %s\n", std::string(engine.status().message()).c_str());
    return {0, 0, w.requests};
  }
  (*engine)->Start();
  const int vocab = weights->config.vocab_size;
  Result r = RunConcurrent(w, [&](int i) -> int64_t {
    GenerateRequest req;
    req.request_id = absl::StrCat("bench-", i);
    req.prompt = w.Prompt(i, vocab);
    req.params.temperature = 0;
    req.params.max_tokens = w.max_tokens;
    req.params.ignore_eos = true;
    auto ch = (*engine)->Submit(req);
    if (!ch.ok()) return -1;
    int64_t n = 0;
    for (;;) {
      std::optional<RequestEvent> e = (*ch)->Pop(60000);
      if (!e) return -1;
      n += static_cast<int64_t>(e->tokens.size());
      if (e->final()) return e->finish == FinishReason::kError ? -1 : n;
    }
  });
  (*engine)->Stop();
  return r;
}

// Starts `morserve serve`, returns its pid and the address read from its stdout.
pid_t StartServer(const std::vector<std::string>& argv, std::string* address, FILE** out) {
  int fds[2];
  if (pipe(fds) != 0) return -1;
  const pid_t pid = fork();
  if (pid == 0) {
    dup2(fds[1], STDOUT_FILENO);
    close(fds[0]);
    close(fds[1]);
    std::vector<char*> args;
    for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execv(args[0], args.data());
    _exit(127);
  }
  close(fds[1]);
  *out = fdopen(fds[0], "r");
  char line[512];
  while (std::fgets(line, sizeof line, *out)) {
    std::string s(line);
    const std::string key = "listening on ";
    if (s.rfind(key, 0) == 0) {
      *address = s.substr(key.size());
      while (!address->empty() && (address->back() == '\n' || address->back() == '\r')) address->pop_back();
      return pid;
    }
  }
  return -1;
}

bool WaitServing(const std::shared_ptr<grpc::Channel>& channel, int seconds) {
  auto stub = grpc::health::v1::Health::NewStub(channel);
  const auto end = Clock::now() + std::chrono::seconds(seconds);
  while (Clock::now() < end) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(1));
    grpc::health::v1::HealthCheckRequest req;
    grpc::health::v1::HealthCheckResponse resp;
    if (stub->Check(&ctx, req, &resp).ok() &&
        resp.status() == grpc::health::v1::HealthCheckResponse::SERVING) {
      return true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}

Result ThroughGrpc(const Workload& w, const std::shared_ptr<grpc::Channel>& channel, int vocab) {
  auto stub = v1::Morserve::NewStub(channel);
  return RunConcurrent(w, [&](int i) -> int64_t {
    v1::GenerateRequest req;
    req.set_request_id(absl::StrCat("bench-", i));
    for (int t : w.Prompt(i, vocab)) req.mutable_token_ids()->add_ids(t);
    req.mutable_sampling()->set_temperature(0);
    req.set_max_tokens(w.max_tokens);
    req.set_ignore_eos(true);
    grpc::ClientContext ctx;
    auto reader = stub->Generate(&ctx, req);
    v1::GenerateResponse resp;
    int64_t n = 0;
    while (reader->Read(&resp)) n += resp.tokens_size();
    return reader->Finish().ok() ? n : -1;
  });
}

nlohmann::json ToJson(const Result& r) {
  return {{"seconds", r.seconds}, {"tokens", r.tokens}, {"failures", r.failures},
          {"tokens_per_second", r.tokens_per_second()}};
}

int Main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  std::set<std::string> value_flags = {"model", "morserve", "requests", "concurrency",
                                       "prompt-len", "max-tokens"};
  value_flags.insert(EngineFlagNames().begin(), EngineFlagNames().end());
  auto flags = Flags::Parse(args, value_flags, {});
  if (!flags.ok() || !flags->Has("model") || !flags->Has("morserve")) {
    std::fprintf(stderr,
                 "usage: morserve_grpc_bench --model DIR --morserve PATH [--requests N] "
                 "[--concurrency N] [--prompt-len N] [--max-tokens N] [engine flags]\n");
    return 2;
  }
  Workload w;
  for (auto [name, out] : {std::pair<const char*, int*>{"requests", &w.requests},
                           {"concurrency", &w.concurrency}, {"prompt-len", &w.prompt_len},
                           {"max-tokens", &w.max_tokens}}) {
    auto v = flags->GetInt(name, *out);
    if (!v.ok() || *v < 1) {
      std::fprintf(stderr, "--%s: a positive integer\n", name);
      return 2;
    }
    *out = *v;
  }
  auto config = EngineConfigFromFlags(*flags);
  if (!config.ok()) {
    std::fprintf(stderr, "%s\n", std::string(config.status().message()).c_str());
    return 2;
  }
  auto weights = LoadModel(flags->Get("model"));
  if (!weights.ok()) {
    std::fprintf(stderr, "%s\n", std::string(weights.status().message()).c_str());
    return 1;
  }
  const int vocab = (*weights)->config.vocab_size;

  // Warm the CPU kernels once, then engine-only, then gRPC (the server warms itself).
  Workload warm = w;
  warm.requests = std::min(w.requests, w.concurrency);
  EngineOnly(warm, *weights, *config);
  const Result engine = EngineOnly(w, *weights, *config);

  std::vector<std::string> server_argv = {flags->Get("morserve"), "serve", "--model", flags->Get("model"),
                                          "--port", "0", "--metrics-port", "0"};
  for (const std::string& name : EngineFlagNames()) {
    if (flags->Has(name)) {
      server_argv.push_back("--" + name);
      server_argv.push_back(flags->Get(name));
    }
  }
  std::string address;
  FILE* server_out = nullptr;
  const pid_t pid = StartServer(server_argv, &address, &server_out);
  if (pid < 0) {
    std::fprintf(stderr, "could not start %s\n", server_argv[0].c_str());
    return 1;
  }
  auto channel = grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
  Result grpc_result;
  if (WaitServing(channel, 120)) {
    ThroughGrpc(warm, channel, vocab);
    grpc_result = ThroughGrpc(w, channel, vocab);
  } else {
    grpc_result.failures = w.requests;
  }
  kill(pid, SIGTERM);
  int status = 0;
  waitpid(pid, &status, 0);
  if (server_out) fclose(server_out);

  nlohmann::json out = {
      {"model", flags->Get("model")},
      {"family", (*weights)->config.recursion.present ? "recursive" : "vanilla"},
      {"workload",
       {{"requests", w.requests}, {"concurrency", w.concurrency}, {"prompt_len", w.prompt_len},
        {"max_tokens", w.max_tokens}}},
      {"engine",
       {{"mode", BatchingModeName(config->mode)}, {"max_batch_rows", config->max_batch_rows},
        {"threads", config->threads}}},
      {"engine_only", ToJson(engine)},
      {"grpc", ToJson(grpc_result)},
      {"grpc_over_engine", engine.tokens_per_second() > 0
                               ? grpc_result.tokens_per_second() / engine.tokens_per_second()
                               : 0.0},
      {"server_exit_status", WIFEXITED(status) ? WEXITSTATUS(status) : -1}};
  std::printf("%s\n", out.dump(2).c_str());
  return engine.failures == 0 && grpc_result.failures == 0 ? 0 : 1;
}

}  // namespace
}  // namespace morserve

int main(int argc, char** argv) { return morserve::Main(argc, argv); }
