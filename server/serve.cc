// `morserve serve` (see serve.h). Lifecycle, in order:
//   1. bind gRPC and metrics (port 0 picks one; "listening on HOST:PORT" and
//      "metrics on HOST:PORT" go to stdout), health NOT_SERVING, calls get UNAVAILABLE;
//   2. load the tokenizer and chat template (when the model directory has tokenizer.json),
//      the model, start the engine thread, run a warm-up request, then publish the engine
//      and turn health SERVING;
//   3. watchdog: health NOT_SERVING while the engine thread's heartbeat stands still
//      longer than --stall-timeout;
//   4. SIGTERM / SIGINT: drain (health NOT_SERVING, new calls UNAVAILABLE, running streams
//      finish, bounded by --drain-timeout), then cancel what is left, stop, exit 0.
// The signal handler only writes to a pipe; a thread turns that into a condition variable
// the main thread waits on.
#include "server/serve.h"

#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "engine/model/weights.h"
#include "engine/runtime/engine.h"
#include "engine/tokenizer/chat_template.h"
#include "engine/tokenizer/incremental_detokenizer.h"
#include "engine/tokenizer/tokenizer.h"
#include "engine/tools/engine_flags.h"
#include "nlohmann/json.hpp"
#include "server/metrics.h"
#include "server/morserve_service.h"
#include "server/serving_state.h"
#include "server/wake_queue.h"

namespace morserve {
namespace {

constexpr char kUsage[] =
    "usage: morserve serve --model DIR [--host 127.0.0.1] [--port 50051] [--metrics-port 9400]\n"
    "         [--tls-cert FILE --tls-key FILE] [--max-queue N] [--drain-timeout SECONDS]\n"
    "         [--stall-timeout SECONDS] [--wake-threads N]\n"
    "         [--chat-template FILE] [--no-tokenizer]\n"
    "         [engine flags: --mode depth|sequence --max-batch N --kv-blocks N --threads N ...]\n"
    "Port 0 picks a free port; the bound ports are printed on stdout as\n"
    "  listening on HOST:PORT\n  metrics on HOST:PORT\n"
    "Text input needs DIR/tokenizer.json (tokenizer_config.json: special tokens, chat template;\n"
    "DIR/chat_template.jinja or --chat-template FILE override the template); --no-tokenizer\n"
    "serves token ids only.\n"
    "Testing only: --debug-load-delay-ms N (delay loading), --debug-signals (SIGUSR1 stops\n"
    "the engine thread, to exercise the health watchdog).\n";

using Clock = std::chrono::steady_clock;

void Say(const std::string& line) {
  std::fprintf(stdout, "%s\n", line.c_str());
  std::fflush(stdout);
}

int Fail(const std::string& what) {
  std::fprintf(stderr, "morserve serve: %s\n", what.c_str());
  return 1;
}

absl::StatusOr<std::string> ReadAll(const std::string& path, const char* flag) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(flag, ": cannot read ", path));
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> Credentials(const Flags& f) {
  if (!f.Has("tls-cert") && !f.Has("tls-key")) return grpc::InsecureServerCredentials();
  if (!f.Has("tls-cert") || !f.Has("tls-key")) {
    return absl::InvalidArgumentError("--tls-cert and --tls-key go together");
  }
  auto cert = ReadAll(f.Get("tls-cert"), "--tls-cert");
  if (!cert.ok()) return cert.status();
  auto key = ReadAll(f.Get("tls-key"), "--tls-key");
  if (!key.ok()) return key.status();
  grpc::SslServerCredentialsOptions opts;
  opts.pem_key_cert_pairs.push_back({*key, *cert});
  return grpc::SslServerCredentials(opts);
}

// What the signal thread tells the main thread.
struct Signals {
  std::mutex mu;
  std::condition_variable cv;
  bool terminate = false;
  bool stop_engine = false;  // --debug-signals: SIGUSR1
};

// Signals may land on any thread (libraries start threads before `serve` runs), so the
// handler only writes the signal number to a pipe (async-signal-safe); a thread reads it.
int g_signal_pipe[2] = {-1, -1};

void OnSignal(int sig) {
  const unsigned char b = static_cast<unsigned char>(sig);
  [[maybe_unused]] ssize_t n = write(g_signal_pipe[1], &b, 1);
}

void SignalThread(Signals* s) {
  for (;;) {
    unsigned char b = 0;
    const ssize_t n = read(g_signal_pipe[0], &b, 1);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    std::lock_guard<std::mutex> lock(s->mu);
    if (b == SIGUSR1) {
      s->stop_engine = true;
    } else {
      s->terminate = true;
    }
    s->cv.notify_all();
  }
}

bool InstallSignalHandlers(Signals* s) {
  if (pipe(g_signal_pipe) != 0) return false;
  struct sigaction sa {};
  sa.sa_handler = OnSignal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  for (int sig : {SIGTERM, SIGINT, SIGUSR1}) sigaction(sig, &sa, nullptr);
  std::thread(SignalThread, s).detach();
  return true;
}

// One token through the whole engine path before the server reports SERVING.
absl::Status WarmUp(Engine* engine) {
  GenerateRequest r;
  r.request_id = "warm-up";
  r.prompt = {0};
  r.params.temperature = 0;
  r.params.max_tokens = 1;
  r.params.ignore_eos = true;
  auto channel = engine->Submit(r);
  if (!channel.ok()) return channel.status();
  const auto deadline = Clock::now() + std::chrono::seconds(120);
  while (Clock::now() < deadline) {
    std::optional<RequestEvent> e = (*channel)->Pop(100);
    if (e && e->final()) {
      if (e->finish == FinishReason::kError) return e->error;
      return absl::OkStatus();
    }
  }
  return absl::DeadlineExceededError("warm-up: no token within 120 s");
}

// The tokenizer and chat template `serve` owns; ServingState points at them.
struct LoadedText {
  std::unique_ptr<Tokenizer> tokenizer;
  std::optional<ChatTemplate> chat_template;
};

absl::StatusOr<nlohmann::json> ReadTokenizerConfig(const std::string& dir) {
  const std::string path = dir + "/tokenizer_config.json";
  if (!std::filesystem::exists(path)) return nlohmann::json::object();
  auto text = ReadAll(path, "tokenizer_config.json");
  if (!text.ok()) return text.status();
  nlohmann::json j = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return absl::InvalidArgumentError(absl::StrCat(path, ": not valid JSON"));
  return j;
}

// The chat template: --chat-template FILE, else DIR/chat_template.jinja, else
// tokenizer_config.json's. A model's own template that does not load is a warning (chat
// requests then get FAILED_PRECONDITION); a --chat-template FILE that does not is an error.
absl::StatusOr<std::optional<ChatTemplate>> LoadChatTemplate(const std::string& dir,
                                                             const Flags& f,
                                                             const nlohmann::json& config) {
  if (f.Has("chat-template")) {
    auto source = ReadAll(f.Get("chat-template"), "--chat-template");
    if (!source.ok()) return source.status();
    auto t = ChatTemplate::FromString(*source, config);
    if (!t.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--chat-template: ", t.status().message()));
    }
    return std::optional<ChatTemplate>(*std::move(t));
  }
  absl::StatusOr<ChatTemplate> t = absl::NotFoundError("no chat template");
  const std::string jinja = dir + "/chat_template.jinja";
  if (std::filesystem::exists(jinja)) {
    auto source = ReadAll(jinja, "chat_template.jinja");
    if (!source.ok()) return source.status();
    t = ChatTemplate::FromString(*source, config);
  } else {
    t = ChatTemplate::FromTokenizerConfig(config);
  }
  if (t.ok()) return std::optional<ChatTemplate>(*std::move(t));
  if (!absl::IsNotFound(t.status())) {
    std::fprintf(stderr, "morserve serve: warning: the chat template does not load (%s): chat "
                 "requests get FAILED_PRECONDITION\n", std::string(t.status().message()).c_str());
  }
  return std::optional<ChatTemplate>();
}

absl::StatusOr<LoadedText> LoadText(const std::string& dir, const Flags& f, int model_vocab) {
  LoadedText out;
  const bool has_files = std::filesystem::exists(dir + "/tokenizer.json");
  if (f.Has("no-tokenizer") || !has_files) {
    if (f.Has("chat-template")) {
      return absl::InvalidArgumentError(
          f.Has("no-tokenizer") ? "--chat-template needs the tokenizer (drop --no-tokenizer)"
                                : absl::StrCat("--chat-template: ", dir, " has no tokenizer.json"));
    }
    return out;
  }
  auto tok = Tokenizer::FromDirectory(dir);
  if (!tok.ok()) {
    return absl::Status(tok.status().code(),
                        absl::StrCat("tokenizer: ", tok.status().message(),
                                     " (--no-tokenizer serves token ids only)"));
  }
  for (bool skip : {true, false}) {
    if (auto d = IncrementalDetokenizer::Create(**tok, skip); !d.ok()) {
      return absl::Status(d.status().code(),
                          absl::StrCat("tokenizer: no streaming detokenizer: ", d.status().message(),
                                       " (--no-tokenizer serves token ids only)"));
    }
  }
  if ((*tok)->vocab_size() > model_vocab) {
    std::fprintf(stderr, "morserve serve: warning: the tokenizer has %d tokens, the model %d: "
                 "text that encodes to ids >= %d is rejected\n", (*tok)->vocab_size(), model_vocab,
                 model_vocab);
  }
  auto config = ReadTokenizerConfig(dir);
  if (!config.ok()) return config.status();
  auto chat = LoadChatTemplate(dir, f, *config);
  if (!chat.ok()) return chat.status();
  out.tokenizer = *std::move(tok);
  out.chat_template = *std::move(chat);
  return out;
}

struct ServeOptions {
  std::string host, model_dir;
  int port = 0, metrics_port = 0, max_queue = 0, wake_threads = 1, load_delay_ms = 0;
  double drain_timeout = 30, stall_timeout = 30;
  bool debug_signals = false;
};

absl::StatusOr<ServeOptions> ParseOptions(const Flags& f) {
  ServeOptions o;
  o.model_dir = f.Get("model");
  o.host = f.Get("host", "127.0.0.1");
  struct IntFlag {
    const char* name;
    int* out;
    int fallback, min;
  };
  for (IntFlag i : {IntFlag{"port", &o.port, 50051, 0}, IntFlag{"metrics-port", &o.metrics_port, 9400, 0},
                    IntFlag{"max-queue", &o.max_queue, EngineConfig().max_queue, 0},
                    IntFlag{"wake-threads", &o.wake_threads, 1, 1},
                    IntFlag{"debug-load-delay-ms", &o.load_delay_ms, 0, 0}}) {
    auto v = f.GetInt(i.name, i.fallback);
    if (!v.ok()) return v.status();
    if (*v < i.min) return absl::InvalidArgumentError(absl::StrCat("--", i.name, ": must be >= ", i.min));
    *i.out = *v;
  }
  auto drain = f.GetDouble("drain-timeout", 30);
  if (!drain.ok()) return drain.status();
  auto stall = f.GetDouble("stall-timeout", 30);
  if (!stall.ok()) return stall.status();
  if (*drain < 0) return absl::InvalidArgumentError("--drain-timeout: must be >= 0");
  if (*stall <= 0) return absl::InvalidArgumentError("--stall-timeout: must be > 0");
  o.drain_timeout = *drain;
  o.stall_timeout = *stall;
  o.debug_signals = f.Has("debug-signals");
  return o;
}

}  // namespace

int ServeCommand(const Args& args) {
  std::set<std::string> value_flags = {"model", "host", "port", "metrics-port", "tls-cert",
                                       "tls-key", "max-queue", "drain-timeout", "stall-timeout",
                                       "wake-threads", "debug-load-delay-ms", "chat-template"};
  value_flags.insert(EngineFlagNames().begin(), EngineFlagNames().end());
  auto flags = Flags::Parse(args, value_flags, {"help", "debug-signals", "no-tokenizer"});
  if (!flags.ok()) {
    std::fprintf(stderr, "morserve serve: %s\n%s", std::string(flags.status().message()).c_str(), kUsage);
    return 2;
  }
  if (flags->Has("help") || !flags->Has("model")) {
    std::fputs(kUsage, flags->Has("help") ? stdout : stderr);
    return flags->Has("help") ? 0 : 2;
  }
  auto opts = ParseOptions(*flags);
  if (!opts.ok()) return Fail(std::string(opts.status().message())) + 1;
  auto engine_config = EngineConfigFromFlags(*flags);
  if (!engine_config.ok()) return Fail(std::string(engine_config.status().message())) + 1;
  engine_config->max_queue = opts->max_queue;
  auto creds = Credentials(*flags);
  if (!creds.ok()) return Fail(std::string(creds.status().message()));
  // The config alone (cheap) sizes the per-loop metrics before the weights load.
  auto model_config = LoadModelConfig(opts->model_dir);
  if (!model_config.ok()) return Fail(std::string(model_config.status().message()));

  // Never freed: the detached signal thread may still use it while the process exits (a
  // second SIGTERM after the first one stopped the server; found by scripts/tsan.sh).
  Signals& signals = *new Signals;
  if (!InstallSignalHandlers(&signals)) return Fail("cannot install signal handlers");

  const int loops = std::max(1, model_config->recursion.num_recursions);
  auto metrics = ServerMetrics::Create(opts->host, opts->metrics_port, loops);
  if (!metrics.ok()) return Fail(std::string(metrics.status().message()));
  auto wake = std::make_unique<WakeQueue>(opts->wake_threads);
  LoadedText text;  // before the server: outlives every handler
  ServingState state;
  state.model_dir = opts->model_dir;
  state.metrics = metrics->get();
  state.wake = wake.get();
  MorserveService service(&state);

  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  int bound_port = 0;
  builder.AddListeningPort(absl::StrCat(opts->host, ":", opts->port), *creds, &bound_port);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || bound_port == 0) return Fail(absl::StrCat("cannot listen on ", opts->host, ":", opts->port));
  grpc::HealthCheckServiceInterface* health = server->GetHealthCheckService();
  health->SetServingStatus(false);
  Say(absl::StrCat("listening on ", opts->host, ":", bound_port));
  Say(absl::StrCat("metrics on ", opts->host, ":", (*metrics)->port()));

  if (opts->load_delay_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(opts->load_delay_ms));
  auto loaded_text = LoadText(opts->model_dir, *flags, model_config->vocab_size);
  if (!loaded_text.ok()) return Fail(std::string(loaded_text.status().message()));
  text = *std::move(loaded_text);
  state.text.tokenizer = text.tokenizer.get();
  state.text.chat_template = text.chat_template ? &*text.chat_template : nullptr;
  if (text.tokenizer) {
    Say(absl::StrCat("tokenizer: ", text.tokenizer->vocab_size(), " tokens, chat template: ",
                     text.chat_template ? "yes" : "no"));
  }
  auto weights = LoadModel(opts->model_dir);
  if (!weights.ok()) return Fail(std::string(weights.status().message()));
  auto engine = Engine::Create(*weights, *engine_config);
  if (!engine.ok()) return Fail(std::string(engine.status().message()));
  (*engine)->SetObserver(metrics->get());
  (*metrics)->SetKvCapacity((*engine)->stats().kv_blocks_total, engine_config->block_size);
  (*engine)->Start();
  if (auto s = WarmUp(engine->get()); !s.ok()) return Fail(absl::StrCat("warm-up: ", s.message()));
  (*metrics)->SetRecording(true);
  state.engine.store(engine->get());
  health->SetServingStatus(true);
  Say(absl::StrCat("ready: ", ModelFamilyName((*weights)->config), " model from ", opts->model_dir));

  // Watchdog until a termination signal.
  int64_t last_beat = (*engine)->heartbeat();
  auto last_change = Clock::now();
  bool serving = true;
  for (;;) {
    std::unique_lock<std::mutex> lock(signals.mu);
    signals.cv.wait_for(lock, std::chrono::milliseconds(100));
    if (signals.terminate) break;
    if (signals.stop_engine && opts->debug_signals) {
      signals.stop_engine = false;
      lock.unlock();
      (*engine)->Stop();
      Say("debug: engine thread stopped");
      continue;
    }
    lock.unlock();
    const int64_t beat = (*engine)->heartbeat();
    if (beat != last_beat) {
      last_beat = beat;
      last_change = Clock::now();
    }
    const bool stalled =
        std::chrono::duration<double>(Clock::now() - last_change).count() > opts->stall_timeout;
    if (stalled == serving) {
      serving = !stalled;
      health->SetServingStatus(serving);
      Say(serving ? "health: SERVING (the engine steps again)"
                  : "health: NOT_SERVING (the engine thread stopped stepping)");
    }
  }

  // Drain.
  state.draining.store(true);
  health->SetServingStatus(false);
  Say(absl::StrCat("draining: ", state.open_streams.load(), " open streams"));
  const auto drain_end = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                            std::chrono::duration<double>(opts->drain_timeout));
  while (state.open_streams.load() > 0 && Clock::now() < drain_end) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  const int left = state.open_streams.load();
  // Shutdown cancels what is left: their reactors cancel the engine requests.
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  server->Wait();
  (*engine)->Stop();
  server.reset();
  wake.reset();
  Say(absl::StrCat("drained: ", left, " streams cancelled at the drain timeout"));
  return 0;
}

}  // namespace morserve
