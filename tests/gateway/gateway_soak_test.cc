// Soak and overload through the gateway: the real `morserve serve` with a small capacity
// (--max-running 4 --max-queue 4, 40 KV blocks of 16 tokens, so long requests preempt each
// other) behind the real `morserve-gateway`, both on 127.0.0.1 port 0, and 10x that capacity
// of concurrent /v1/completions clients (streaming and not, mixed) driven from one poll loop
// of raw non-blocking sockets for MORSERVE_SOAK_SECONDS (default 20; scripts/soak.sh runs it
// longer). A third of the clients close their socket at a random point (after a random delay
// or a random number of received bytes; with a FIN or with a reset), the rest read to the end.
//
// Every request must end as one of: a complete answer (200 with a finish reason; SSE ending
// in [DONE]), a clean 429 in the OpenAI error shape (the backend's RESOURCE_EXHAUSTED), or a
// close by the client. Anything else (another status, a reset or EOF before the headers or
// mid-body, an in-band error event, a request that hangs) fails the test. After the load and a
// short settle: every KV block free, no stream, running or waiting request left on the server,
// nothing in flight and no extra open connection on the gateway, and neither process's RSS
// grew by more than a bound between the first and the last quarter of the run. One JSON
// summary line goes to stdout ({"soak": ...}). The randomness is seeded from
// MORSERVE_SOAK_SEED (default: random) and the seed is printed, so a failing run replays its
// request mix (not its timing).
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "tests/gateway/gateway_process.h"
#include "tests/gateway/raw_http.h"
#include "tests/server/server_process.h"
#include "tests/server/test_models.h"
#include "tests/testutil.h"

namespace morserve::testing {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

// The server's capacity: requests holding KV plus requests queued; beyond that it refuses
// (RESOURCE_EXHAUSTED, the gateway's 429).
constexpr int kMaxRunning = 4;
constexpr int kMaxQueue = 4;
// KV blocks of 16 tokens. The tiny vanilla model has 4 layers, each its own cache slot, so a
// full 128-token context takes 4 x 8 = 32 blocks: 40 hold any admissible request alone (with
// fewer, a long request that can never fit fails mid-generation with an engine error, the
// gateway's 500) but far from 4 long ones at once, so running requests preempt each other.
constexpr int kKvBlocks = 40;
constexpr int kClients = 10 * (kMaxRunning + kMaxQueue);
constexpr int kMaxTokens = 64;  // + at most ~40 prompt tokens: inside the 128-token context
// RSS bound: the maximum over the last quarter of the run may exceed the maximum over the
// first quarter by at most this much. Both processes allocate their big pieces at start (the
// KV cache and the engine's scratch, the gateway's io threads) and warm up in the first
// quarter (gRPC's thread pool, per-thread malloc arenas, the kernel's socket buffers are not
// RSS), so a healthy run is flat after it; 64 MiB leaves room for allocator fragmentation and
// arena growth under the changing mix, and is still far below what a per-request leak of a
// few KiB (a lost response buffer, a call's state, a sequence) adds over the tens of
// thousands of requests of a run. The summary gives the request count, so a run's detection
// limit is 64 MiB / requests.
constexpr double kRssGrowthLimitMib = 64;

int EnvInt(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::atoi(v) : fallback;
}

double VmRssMib(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stod(line.substr(6)) / 1024.0;  // kB
  }
  return -1;
}

double Scrape(const std::string& text, const std::string& series) {
  return ScrapeValue(text, series).value_or(-1);
}

// Every series of `name` with labels: "{labels}" -> value.
std::map<std::string, double> ScrapeAll(const std::string& text, const std::string& name) {
  std::map<std::string, double> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(name + "{", 0) != 0) continue;
    const size_t space = line.rfind(' ');
    out[line.substr(name.size(), space - name.size())] = std::stod(line.substr(space + 1));
  }
  return out;
}

enum class Outcome {
  kComplete,         // 200, a finish reason (stream: then [DONE])
  kRejected,         // 429 with the OpenAI error body
  kClientCancelled,  // the client closed first
  // Failures:
  kConnectFailed,
  kResetBeforeHeaders,  // EOF or reset before the status line and headers
  kTruncated,           // EOF or reset after the headers, before the end of the body
  kBadStatus,           // any status but 200 and 429
  kBadBody,             // 200/429 whose body is not what it must be (incl. in-band errors)
  kTimeout,             // no end within kRequestTimeout
  kCount
};
constexpr const char* kOutcomeNames[] = {
    "complete",  "rejected_429", "client_cancelled", "connect_failed", "reset_before_headers",
    "truncated", "bad_status",   "bad_body",         "timeout"};
bool IsFailure(Outcome o) { return o >= Outcome::kConnectFailed; }

constexpr auto kRequestTimeout = std::chrono::seconds(90);

struct Request {
  int fd = -1;
  bool stream = false;
  bool include_usage = false;
  int max_tokens = 0;
  std::string out;
  size_t sent = 0;
  std::string in;
  Clock::time_point started;
  Clock::time_point cancel_at = Clock::time_point::max();
  size_t cancel_after_bytes = SIZE_MAX;
  bool reset_on_cancel = false;
  bool keep_alive = false;  // sent without "Connection: close"
  bool reused = false;      // on the connection of the slot's previous request
};

// j[key], or null when j is not an object or has no such key (const json's [] asserts).
json Field(const json& j, const char* key) {
  if (!j.is_object()) return json();
  auto it = j.find(key);
  return it == j.end() ? json() : *it;
}

// The check of a complete 200 or 429 response; empty when it is right, else why not.
std::string CheckBody(const Request& r, const ParsedResponse& p) {
  if (p.status == 429) {
    const auto ct = p.headers.find("content-type");
    if (ct == p.headers.end() || ct->second.find("application/json") == std::string::npos) {
      return "429 without a JSON content type";
    }
    const json j = json::parse(p.body, nullptr, false);
    const json e = Field(j, "error");
    if (!e.is_object()) return "429 body: " + p.body.substr(0, 300);
    if (!e.contains("message") || !e["message"].is_string() ||
        e["message"].get<std::string>().find("overloaded") == std::string::npos ||
        e.value("type", "") != "rate_limit_error" || e.value("code", "") != "rate_limit_exceeded" ||
        !e.contains("param")) {
      return "429 error object: " + e.dump();
    }
    return "";
  }
  auto finish_ok = [&](const json& choice, const json& usage) -> std::string {
    const json fr = Field(choice, "finish_reason");
    if (!fr.is_string()) return "no finish_reason";
    const std::string f = fr;
    if (f != "length" && f != "stop") return "finish_reason " + f;
    if (usage.is_object()) {
      const int n = usage.value("completion_tokens", -1);
      if (n < 0 || n > r.max_tokens || (f == "length" && n != r.max_tokens)) {
        return absl::StrCat("completion_tokens ", n, " of ", r.max_tokens, " (", f, ")");
      }
    }
    return "";
  };
  if (!r.stream) {
    const json j = json::parse(p.body, nullptr, false);
    const json choices = Field(j, "choices");
    if (Field(j, "object") != "text_completion" || !choices.is_array() || choices.size() != 1) {
      return "completion body: " + p.body.substr(0, 300);
    }
    return finish_ok(choices[0], Field(j, "usage"));
  }
  std::vector<std::string> other;
  const std::vector<std::string> events = SseEvents(p.body, &other);
  if (!other.empty()) return "not an SSE data line: " + other[0];
  if (events.empty() || events.back() != "[DONE]") return "no [DONE] at the end";
  std::string why = "no finish chunk";
  json usage;
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    const json c = json::parse(events[i], nullptr, false);
    if (!c.is_object()) return "not JSON: " + events[i];
    if (c.contains("error")) return "in-band error: " + events[i];
    if (Field(c, "usage").is_object()) usage = Field(c, "usage");
    const json choices = Field(c, "choices");
    if (!choices.is_array()) return "chunk without choices: " + events[i];
    for (const json& ch : choices) {
      if (!Field(ch, "finish_reason").is_null()) why = finish_ok(ch, json());
    }
  }
  if (!why.empty()) return why;
  if (r.include_usage) {
    if (!usage.is_object()) return "no usage chunk";
    const int n = usage.value("completion_tokens", -1);
    if (n < 0 || n > r.max_tokens) return "usage " + usage.dump();
  }
  return "";
}

// The load generator: kClients slots, each running one request after another.
class Load {
 public:
  Load(int port, uint64_t seed) : port_(port), rng_(seed) {}

  // Runs until `load_end`, then lets the requests in flight end (their planned cancels
  // included; one that does not end within kRequestTimeout counts as a timeout).
  void Run(Clock::time_point load_end) {
    std::vector<Slot> slots(kClients);
    for (Slot& s : slots) s.next_start = Clock::now() + Ms(Uniform(0, 200));
    std::vector<pollfd> fds;
    std::vector<Slot*> polled;
    for (;;) {
      Clock::time_point now = Clock::now();
      const bool loading = now < load_end;
      int active = 0;
      for (Slot& s : slots) {
        if (!s.active && loading && now >= s.next_start) Start(&s);
        if (s.active) ++active;
      }
      if (!loading && active == 0) break;
      fds.clear();
      polled.clear();
      for (Slot& s : slots) {
        if (!s.active) continue;
        short events = POLLIN;
        if (s.r.sent < s.r.out.size()) events |= POLLOUT;
        fds.push_back({s.r.fd, events, 0});
        polled.push_back(&s);
      }
      if (poll(fds.data(), fds.size(), 10) < 0 && errno != EINTR) {
        ADD_FAILURE() << "poll: " << errno;
        return;
      }
      now = Clock::now();
      for (size_t i = 0; i < fds.size(); ++i) {
        Slot& s = *polled[i];
        if (fds[i].revents & POLLOUT) Send(&s);
        if (s.active && (fds[i].revents & (POLLIN | POLLHUP | POLLERR))) Receive(&s);
      }
      now = Clock::now();
      for (Slot& s : slots) {
        if (!s.active) continue;
        if (now >= s.r.cancel_at) {
          Cancel(&s);
        } else if (now - s.r.started > kRequestTimeout) {
          End(&s, Outcome::kTimeout, "no end after 90 s: " + s.r.in.substr(0, 200));
        }
      }
    }
  }

  int count(Outcome o) const { return counts_[static_cast<int>(o)]; }
  int total() const { return total_; }
  int complete_stream() const { return complete_stream_; }
  int cancelled_before_headers() const { return cancelled_before_headers_; }
  int reused_connections() const { return reused_; }
  int failures() const {
    int n = 0;
    for (int o = 0; o < static_cast<int>(Outcome::kCount); ++o) {
      if (IsFailure(static_cast<Outcome>(o))) n += counts_[o];
    }
    return n;
  }
  const std::vector<std::string>& examples() const { return examples_; }

 private:
  struct Slot {
    ~Slot() {
      if (r.fd >= 0) close(r.fd);
      if (idle_fd >= 0) close(idle_fd);
    }
    int idle_fd = -1;  // a kept-alive connection for the next request
    bool active = false;
    Clock::time_point next_start;
    Request r;
  };
  static std::chrono::milliseconds Ms(int ms) { return std::chrono::milliseconds(ms); }
  int Uniform(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng_); }
  bool Chance(double p) { return std::uniform_real_distribution<double>(0, 1)(rng_) < p; }

  std::string Prompt() {
    static const char* kWords[] = {"the",   "model", "server", "gateway", "token", "stream",
                                   "cache", "block", "batch",  "loop",    "depth", "request"};
    std::string p;
    const int n = Uniform(1, 8);
    for (int i = 0; i < n; ++i) {
      if (i > 0) p += ' ';
      p += kWords[Uniform(0, 11)];
    }
    return p;
  }

  void Start(Slot* s) {
    Request& r = s->r;
    r = Request();
    r.stream = Chance(0.5);
    r.include_usage = r.stream && Chance(0.5);
    r.max_tokens = Uniform(1, kMaxTokens);
    json body = {{"prompt", Prompt()}, {"max_tokens", r.max_tokens}, {"stream", r.stream}};
    if (Chance(0.5)) body["ignore_eos"] = true;
    if (Chance(0.5)) body["temperature"] = 0;
    if (r.include_usage) body["stream_options"] = {{"include_usage", true}};
    const std::string b = body.dump();
    // Half ask to close; the other half keep the connection alive, and half of those send
    // their slot's next request on it after a complete answer or a 429.
    r.keep_alive = Chance(0.5);
    r.out =
        absl::StrCat("POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n",
                     r.keep_alive ? "" : "Connection: close\r\n",
                     "Content-Type: application/json\r\nContent-Length: ", b.size(), "\r\n\r\n", b);
    r.started = Clock::now();
    if (Chance(1.0 / 3)) {  // the client gives up at a random point
      if (Chance(0.5)) {
        r.cancel_at = r.started + Ms(Uniform(0, 400));
      } else {
        r.cancel_after_bytes = static_cast<size_t>(Uniform(1, 1500));
      }
      r.reset_on_cancel = Chance(0.5);
    }
    ++total_;
    s->active = true;
    if (s->idle_fd >= 0) {
      r.fd = s->idle_fd;
      s->idle_fd = -1;
      r.reused = true;
      ++reused_;
      return;
    }
    r.fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port_));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (r.fd < 0 || (connect(r.fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 &&
                     errno != EINPROGRESS)) {
      End(s, Outcome::kConnectFailed, absl::StrCat("connect: errno ", errno));
    }
  }

  void Send(Slot* s) {
    Request& r = s->r;
    while (r.sent < r.out.size()) {
      const ssize_t n = send(r.fd, r.out.data() + r.sent, r.out.size() - r.sent, MSG_NOSIGNAL);
      if (n > 0) {
        r.sent += static_cast<size_t>(n);
        continue;
      }
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return;
      int err = 0;
      socklen_t len = sizeof err;
      getsockopt(r.fd, SOL_SOCKET, SO_ERROR, &err, &len);
      End(s,
          errno == ECONNREFUSED || err == ECONNREFUSED ? Outcome::kConnectFailed
                                                       : Outcome::kResetBeforeHeaders,
          absl::StrCat("send: errno ", errno));
      return;
    }
  }

  void Receive(Slot* s) {
    Request& r = s->r;
    char buf[16384];
    bool eof = false;
    int error = 0;
    for (;;) {
      const ssize_t n = recv(r.fd, buf, sizeof buf, 0);
      if (n > 0) {
        r.in.append(buf, static_cast<size_t>(n));
        continue;
      }
      if (n == 0) {
        eof = true;
      } else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
        error = errno;
      }
      break;
    }
    const ParsedResponse p = ParseHttpResponse(r.in);
    if (p.malformed) {
      End(s, Outcome::kBadBody, "malformed HTTP: " + r.in.substr(0, 300));
    } else if (p.complete) {
      if (p.status != 200 && p.status != 429) {
        End(s, Outcome::kBadStatus, absl::StrCat(p.status, " ", p.body.substr(0, 300)));
        return;
      }
      const std::string why = CheckBody(r, p);
      const auto connection = p.headers.find("connection");
      const bool reusable = r.keep_alive && (connection == p.headers.end() ||
                                             connection->second.find("close") == std::string::npos);
      if (!why.empty()) {
        End(s, Outcome::kBadBody, absl::StrCat(p.status, ": ", why));
      } else if (p.status == 429) {
        End(s, Outcome::kRejected, "", reusable);
      } else {
        if (r.stream) ++complete_stream_;
        End(s, Outcome::kComplete, "", reusable);
      }
    } else if (eof || error != 0) {
      const std::string why = absl::StrCat(eof ? "EOF" : "errno ", eof ? 0 : error, " after ",
                                           r.in.size(), " bytes: ", r.in.substr(0, 300));
      End(s, p.headers_complete ? Outcome::kTruncated : Outcome::kResetBeforeHeaders, why);
    } else if (r.in.size() >= r.cancel_after_bytes) {
      Cancel(s);
    }
  }

  void Cancel(Slot* s) {
    Request& r = s->r;
    if (r.reset_on_cancel) {  // close with a reset (RST) instead of a FIN
      linger l{1, 0};
      setsockopt(r.fd, SOL_SOCKET, SO_LINGER, &l, sizeof l);
    }
    if (!ParseHttpResponse(r.in).headers_complete) ++cancelled_before_headers_;
    End(s, Outcome::kClientCancelled, "");
  }

  // `reusable`: the connection may carry the slot's next request (kept or not by chance).
  void End(Slot* s, Outcome o, const std::string& why, bool reusable = false) {
    Request& r = s->r;
    if (reusable && Chance(0.5)) {
      s->idle_fd = r.fd;
    } else if (r.fd >= 0) {
      close(r.fd);
    }
    r.fd = -1;
    s->active = false;
    ++counts_[static_cast<int>(o)];
    if (IsFailure(o) && examples_.size() < 10) {
      examples_.push_back(absl::StrCat(kOutcomeNames[static_cast<int>(o)],
                                       r.stream ? " (stream" : " (", r.reused ? ", reused)" : ")",
                                       ": ", why));
    }
    // A refused client backs off a little (as OpenAI clients do); the others go again at once.
    s->next_start = Clock::now() + Ms(o == Outcome::kRejected ? Uniform(20, 100) : Uniform(0, 10));
  }

  int port_;
  std::mt19937_64 rng_;
  int counts_[static_cast<int>(Outcome::kCount)] = {};
  int total_ = 0;
  int complete_stream_ = 0;
  int cancelled_before_headers_ = 0;
  int reused_ = 0;
  std::vector<std::string> examples_;
};

// VmRSS of the two processes every 200 ms, with the time since the start.
class RssSampler {
 public:
  struct Sample {
    double t, server_mib, gateway_mib;
  };
  RssSampler(pid_t server, pid_t gateway) : start_(Clock::now()) {
    thread_ = std::thread([this, server, gateway] {
      while (!stop_.load()) {
        const double t = std::chrono::duration<double>(Clock::now() - start_).count();
        {
          std::lock_guard<std::mutex> lock(mu_);
          samples_.push_back({t, VmRssMib(server), VmRssMib(gateway)});
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
      }
    });
  }
  ~RssSampler() { Stop(); }
  void Stop() {
    stop_.store(true);
    if (thread_.joinable()) thread_.join();
  }
  // The maxima over samples with from <= t < to.
  Sample Max(double from, double to) const {
    Sample m{0, -1, -1};
    for (const Sample& s : samples_) {
      if (s.t < from || s.t >= to) continue;
      m.server_mib = std::max(m.server_mib, s.server_mib);
      m.gateway_mib = std::max(m.gateway_mib, s.gateway_mib);
    }
    return m;
  }
  size_t size() const { return samples_.size(); }

 private:
  Clock::time_point start_;
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  std::vector<Sample> samples_;
  std::thread thread_;
};

TEST(GatewaySoakTest, OverloadWithCancelsEndsCleanAndLeavesNothingBehind) {
  const int seconds = std::max(1, EnvInt("MORSERVE_SOAK_SECONDS", 20));
  const char* seed_env = std::getenv("MORSERVE_SOAK_SEED");
  const uint64_t seed =
      seed_env != nullptr && *seed_env != '\0'
          ? std::strtoull(seed_env, nullptr, 10)
          : (static_cast<uint64_t>(std::random_device()()) << 32) ^ std::random_device()();
  std::printf(
      "soak: seed %llu (MORSERVE_SOAK_SEED=%llu replays the request mix), %d s, %d "
      "clients on a capacity of %d\n",
      static_cast<unsigned long long>(seed), static_cast<unsigned long long>(seed), seconds,
      kClients, kMaxRunning + kMaxQueue);
  std::fflush(stdout);

  TempDir dir;
  absl::StatusOr<TinyModelSpec> spec = ReadmeTokenizerSpec(dir, "vanilla");
  ASSERT_TRUE(spec.ok()) << spec.status();
  const std::string model = dir.File("model");
  ASSERT_TRUE(WriteTinyModel(*spec, model).ok());
  ServerProcess server;
  ASSERT_NO_FATAL_FAILURE(
      StartOrDie(&server, model,
                 {"--threads", "1", "--max-batch", std::to_string(kMaxRunning), "--max-running",
                  std::to_string(kMaxRunning), "--max-queue", std::to_string(kMaxQueue),
                  "--block-size", "16", "--kv-blocks", std::to_string(kKvBlocks)}));
  GatewayProcess gateway;
  ASSERT_TRUE(gateway.Start({"--backend", server.address(), "--health-interval-ms", "200"}))
      << gateway.output();
  ASSERT_TRUE(gateway.WaitHealth(200)) << gateway.output();
  auto gateway_metrics = [&] { return Curl("GET", gateway.url() + "/metrics", "", {}).body; };
  auto server_metrics = [&] { return HttpGet(server.metrics_port(), "/metrics").value_or(""); };
  // Baselines: the scrape's own connection and request are counted in them.
  const std::string g0 = gateway_metrics();
  const double open0 = Scrape(g0, "morserve_gateway_open_connections");
  const double in_flight0 = Scrape(g0, "morserve_gateway_requests_in_flight");
  ASSERT_GE(open0, 1) << g0;
  const std::string s0 = server_metrics();
  ASSERT_EQ(Scrape(s0, "morserve_kv_cache_blocks{state=\"free\"}"), kKvBlocks) << s0;

  const auto load_start = Clock::now();
  RssSampler rss(server.pid(), gateway.pid());
  Load load(gateway.port(), seed);
  load.Run(load_start + std::chrono::seconds(seconds));
  const double load_s = std::chrono::duration<double>(Clock::now() - load_start).count();
  rss.Stop();
  EXPECT_TRUE(gateway.Running()) << gateway.output();
  ASSERT_EQ(server.Health(), grpc::health::v1::HealthCheckResponse::SERVING) << server.output();

  // Settle: every gauge back where it started.
  std::string sm, gm;
  auto settled = [&] {
    sm = server_metrics();
    gm = gateway_metrics();
    bool outstanding_zero = true;
    for (const auto& [labels, v] : ScrapeAll(gm, "morserve_gateway_backend_outstanding_requests")) {
      outstanding_zero = outstanding_zero && v == 0;
    }
    return Scrape(sm, "morserve_kv_cache_blocks{state=\"used\"}") == 0 &&
           Scrape(sm, "morserve_kv_cache_blocks{state=\"free\"}") == kKvBlocks &&
           Scrape(sm, "morserve_kv_cache_usage_ratio") == 0 &&
           Scrape(sm, "morserve_open_streams") == 0 &&
           Scrape(sm, "morserve_requests_running") == 0 &&
           Scrape(sm, "morserve_requests_waiting") == 0 &&
           Scrape(gm, "morserve_gateway_requests_in_flight") == in_flight0 &&
           Scrape(gm, "morserve_gateway_open_connections") == open0 && outstanding_zero;
  };
  const auto settle_start = Clock::now();
  bool ok = false;
  while (!(ok = settled()) && Clock::now() - settle_start < std::chrono::seconds(30)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  const double settle_s = std::chrono::duration<double>(Clock::now() - settle_start).count();
  EXPECT_TRUE(ok) << "not settled after " << settle_s << " s";
  EXPECT_EQ(Scrape(sm, "morserve_kv_cache_blocks{state=\"used\"}"), 0);
  EXPECT_EQ(Scrape(sm, "morserve_kv_cache_blocks{state=\"free\"}"), kKvBlocks);
  EXPECT_EQ(Scrape(sm, "morserve_kv_cache_usage_ratio"), 0);
  EXPECT_EQ(Scrape(sm, "morserve_open_streams"), 0);
  EXPECT_EQ(Scrape(sm, "morserve_requests_running"), 0);
  EXPECT_EQ(Scrape(sm, "morserve_requests_waiting"), 0);
  EXPECT_EQ(Scrape(gm, "morserve_gateway_requests_in_flight"), in_flight0);
  EXPECT_EQ(Scrape(gm, "morserve_gateway_open_connections"), open0);
  EXPECT_EQ(Scrape(gm, absl::StrCat("morserve_gateway_backend_outstanding_requests{backend=\"",
                                    server.address(), "\"}")),
            0);
  EXPECT_EQ(
      Scrape(gm, absl::StrCat("morserve_gateway_backend_up{backend=\"", server.address(), "\"}")),
      1);
  // Even a fresh, complete answer is served after the storm.
  const HttpResult after = Curl("POST", gateway.url() + "/v1/completions",
                                json({{"prompt", "after"}, {"max_tokens", 4}}).dump());
  EXPECT_EQ(after.status, 200) << after.body;

  // The outcomes, as the client saw them.
  for (const std::string& e : load.examples()) ADD_FAILURE() << e;
  EXPECT_EQ(load.failures(), 0);
  EXPECT_GT(load.count(Outcome::kComplete), 0);
  EXPECT_GT(load.count(Outcome::kRejected), 0) << "10x the capacity never overloaded it";
  EXPECT_GT(load.count(Outcome::kClientCancelled), 0);
  // And as the processes counted them: only 200, 429 and 499 (client gone) on the gateway;
  // every 429 a queue-full refusal of the backend; no request that ended in error.
  std::map<std::string, double> codes;
  for (const auto& [labels, v] : ScrapeAll(gm, "morserve_gateway_requests_total")) {
    if (labels.find("endpoint=\"completions\"") == std::string::npos) continue;
    const size_t c = labels.find("code=\"");
    codes[labels.substr(c + 6, labels.find('"', c + 6) - c - 6)] += v;
  }
  for (const auto& [code, n] : codes) {
    EXPECT_TRUE(code == "200" || code == "429" || code == "499") << code << ": " << n;
  }
  EXPECT_GE(codes["200"], load.count(Outcome::kComplete));
  EXPECT_GE(codes["429"], load.count(Outcome::kRejected));
  std::map<std::string, double> finished, rejected;
  for (const auto& [labels, v] : ScrapeAll(sm, "morserve_requests_finished_total")) {
    finished[labels] = v;
  }
  for (const auto& [labels, v] : ScrapeAll(sm, "morserve_requests_rejected_total")) {
    rejected[labels] = v;
  }
  EXPECT_EQ(finished["{reason=\"error\"}"], 0);
  EXPECT_GE(rejected["{reason=\"queue_full\"}"], codes["429"]);
  for (const auto& [labels, v] : rejected) {
    if (labels != "{reason=\"queue_full\"}") EXPECT_EQ(v, 0) << labels;
  }

  // RSS: the last quarter of the load against the first.
  const RssSampler::Sample first = rss.Max(0, load_s / 4);
  const RssSampler::Sample last = rss.Max(load_s * 3 / 4, load_s + 1);
  ASSERT_GT(first.server_mib, 0);
  ASSERT_GT(last.server_mib, 0);
  EXPECT_LE(last.server_mib, first.server_mib + kRssGrowthLimitMib);
  EXPECT_LE(last.gateway_mib, first.gateway_mib + kRssGrowthLimitMib);

  json summary = {
      {"seed", std::to_string(seed)},
      {"seconds", seconds},
      {"load_s", std::round(load_s * 10) / 10},
      {"clients", kClients},
      {"capacity", kMaxRunning + kMaxQueue},
      {"requests", load.total()},
      {"complete_stream", load.complete_stream()},
      {"cancelled_before_headers", load.cancelled_before_headers()},
      {"reused_connections", load.reused_connections()},
      {"settle_s", std::round(settle_s * 10) / 10},
      {"gateway_codes", codes},
      {"server_finished",
       {{"length", finished["{reason=\"length\"}"]},
        {"stop", finished["{reason=\"stop\"}"]},
        {"cancelled", finished["{reason=\"cancelled\"}"]},
        {"error", finished["{reason=\"error\"}"]}}},
      {"server_rejected_queue_full", rejected["{reason=\"queue_full\"}"]},
      {"server_preemptions", Scrape(sm, "morserve_preemptions_total")},
      {"rss_mib",
       {{"server_first", std::round(first.server_mib * 10) / 10},
        {"server_last", std::round(last.server_mib * 10) / 10},
        {"gateway_first", std::round(first.gateway_mib * 10) / 10},
        {"gateway_last", std::round(last.gateway_mib * 10) / 10},
        {"limit_growth", kRssGrowthLimitMib},
        {"samples", rss.size()}}},
  };
  for (int o = 0; o < static_cast<int>(Outcome::kCount); ++o) {
    summary["outcomes"][kOutcomeNames[o]] = load.count(static_cast<Outcome>(o));
  }
  std::printf("%s\n", json({{"soak", summary}}).dump().c_str());
  std::fflush(stdout);

  EXPECT_EQ(gateway.Terminate(), 0) << gateway.output();
  EXPECT_EQ(server.Terminate(), 0) << server.output();
}

}  // namespace
}  // namespace morserve::testing
