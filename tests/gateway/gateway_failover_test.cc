// A backend lost with SIGKILL and brought back, end to end: two real `morserve serve`
// processes behind one real `morserve-gateway` (127.0.0.1), long SSE streams running on both,
// one backend killed. Its streams end with an in-band OpenAI error event and then [DONE] (a
// complete chunked response), the other backend's streams go on untouched, the gateway
// reports the killed one down and sends every new request to the healthy one; then the
// killed backend is started again on the same address and the same gateway (no restart)
// reports it up and spreads requests over both again (each backend's finished counter).
// The model is a slow one (hidden 512, 6 layers, 4096 positions) on the README tokenizer, so
// a stream of 4000 tokens is still running when the kill lands. No npm.
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <memory>
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

double Scrape(const std::string& text, const std::string& series) {
  return ScrapeValue(text, series).value_or(-1);
}

std::string BackendSeries(const char* name, const std::string& address) {
  return absl::StrCat("morserve_gateway_backend_", name, "{backend=\"", address, "\"}");
}

// Polls `fn` every 50 ms until it is true or `timeout_s` passed.
template <class Fn>
bool WaitFor(Fn fn, int timeout_s) {
  const auto end = Clock::now() + std::chrono::seconds(timeout_s);
  while (!fn()) {
    if (Clock::now() >= end) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return true;
}

double FinishedLength(ServerProcess& s) {
  return std::max(0.0, Scrape(HttpGet(s.metrics_port(), "/metrics").value_or(""),
                              "morserve_requests_finished_total{reason=\"length\"}"));
}

TEST(GatewayFailoverTest, KilledBackendStreamsErrorInBandAndItComesBackOnItsAddress) {
  TempDir dir;
  absl::StatusOr<TinyModelSpec> spec = ReadmeTokenizerSpec(dir, "vanilla");
  ASSERT_TRUE(spec.ok()) << spec.status();
  const TinyModelSpec slow = SlowVanillaSpec();
  spec->hidden = slow.hidden;
  spec->intermediate = slow.intermediate;
  spec->heads = slow.heads;
  spec->kv_heads = slow.kv_heads;
  spec->layers = slow.layers;
  spec->max_pos = slow.max_pos;
  const std::string model = dir.File("model");
  ASSERT_TRUE(WriteTinyModel(*spec, model).ok());
  const std::vector<std::string> flags = {"--threads", "1"};
  ServerProcess a, b;
  ASSERT_NO_FATAL_FAILURE(StartOrDie(&a, model, flags));
  ASSERT_NO_FATAL_FAILURE(StartOrDie(&b, model, flags));
  const std::string b_address = b.address();
  GatewayProcess g;
  ASSERT_TRUE(g.Start({"--backend", a.address() + "," + b_address, "--health-interval-ms", "100"}))
      << g.output();
  auto metrics = [&g] { return Curl("GET", g.url() + "/metrics", "", {}).body; };
  auto up = [&](const std::string& address) {
    return Scrape(metrics(), BackendSeries("up", address));
  };
  ASSERT_TRUE(WaitFor([&] { return up(a.address()) == 1 && up(b_address) == 1; }, 30)) << metrics();
  const pid_t gateway_pid = g.pid();

  // Six long streams, opened one after another (each has its first chunk before the next is
  // sent): the least-loaded choice puts three on each backend.
  constexpr int kStreams = 6;
  const std::string stream_body = json({{"prompt", "the stream goes on"},
                                        {"max_tokens", 4000},
                                        {"ignore_eos", true},
                                        {"stream", true}})
                                      .dump();
  std::vector<std::unique_ptr<RawStream>> streams;
  for (int i = 0; i < kStreams; ++i) {
    streams.push_back(std::make_unique<RawStream>(g.port(), "/v1/completions", stream_body));
    ASSERT_TRUE(streams.back()->ReadUntil("data: {")) << streams.back()->received();
  }
  std::string m = metrics();
  ASSERT_EQ(Scrape(m, BackendSeries("outstanding_requests", a.address())), kStreams / 2) << m;
  ASSERT_EQ(Scrape(m, BackendSeries("outstanding_requests", b_address)), kStreams / 2) << m;

  // SIGKILL b: read every stream until b's three have ended (the chunked body's last chunk,
  // which follows [DONE]).
  b.Signal(SIGKILL);
  const auto killed_at = Clock::now();
  auto ended = [](const RawStream& s) { return ParseHttpResponse(s.received()).complete; };
  int ended_count = 0;
  std::vector<pollfd> fds(kStreams);
  while (ended_count < kStreams / 2 && Clock::now() - killed_at < std::chrono::seconds(30)) {
    for (int i = 0; i < kStreams; ++i) fds[i] = {streams[i]->fd(), POLLIN, 0};
    ASSERT_GE(poll(fds.data(), fds.size(), 200), 0);
    ended_count = 0;
    for (int i = 0; i < kStreams; ++i) {
      if (fds[i].revents != 0 && !ended(*streams[i])) streams[i]->ReadSome();
      ended_count += ended(*streams[i]) ? 1 : 0;
    }
  }
  ASSERT_EQ(ended_count, kStreams / 2);
  std::vector<RawStream*> on_a;
  for (auto& s : streams) {
    const ParsedResponse p = ParseHttpResponse(s->received());
    ASSERT_EQ(p.status, 200) << s->received();
    std::vector<std::string> other;
    const std::vector<std::string> events = SseEvents(p.body, &other);
    EXPECT_TRUE(other.empty()) << p.body;
    if (!ended(*s)) {
      // On a: tokens only, no error.
      EXPECT_EQ(p.body.find("\"error\""), std::string::npos) << p.body;
      on_a.push_back(s.get());
      continue;
    }
    // On b: ..., the error event, [DONE], and the chunked body's end.
    ASSERT_GE(events.size(), 3u) << p.body;
    EXPECT_EQ(events.back(), "[DONE]");
    const json e = json::parse(events[events.size() - 2], nullptr, false);
    ASSERT_TRUE(e.is_object() && e.contains("error")) << p.body;
    EXPECT_EQ(e["error"]["code"], "service_unavailable") << e.dump();
    EXPECT_TRUE(e["error"]["message"].is_string()) << e.dump();
    for (size_t i = 0; i + 2 < events.size(); ++i) {
      EXPECT_EQ(events[i].find("\"error\""), std::string::npos) << events[i];
    }
  }
  ASSERT_EQ(on_a.size(), static_cast<size_t>(kStreams / 2));
  EXPECT_EQ(b.Terminate(), 128 + SIGKILL);  // reaped

  // The gateway marks b down; every new request goes to a and succeeds.
  ASSERT_TRUE(WaitFor([&] { return up(b_address) == 0; }, 20)) << metrics();
  EXPECT_EQ(up(a.address()), 1);
  const json short_body = {{"prompt", "after the kill"}, {"max_tokens", 2}, {"ignore_eos", true}};
  const double a0 = FinishedLength(a);
  for (int i = 0; i < 8; ++i) {
    json body = short_body;
    body["stream"] = i % 2 == 1;
    const HttpResult r = Curl("POST", g.url() + "/v1/completions", body.dump());
    ASSERT_EQ(r.status, 200) << r.body;
    if (i % 2 == 1) {
      EXPECT_EQ(SseData(r.body).back(), "[DONE]") << r.body;
      EXPECT_EQ(r.body.find("\"error\""), std::string::npos) << r.body;
    } else {
      EXPECT_EQ(r.Json()["usage"]["completion_tokens"], 2) << r.body;
    }
  }
  EXPECT_EQ(FinishedLength(a), a0 + 8);

  // a's streams went on through all of it; then their clients close them.
  for (RawStream* s : on_a) {
    const size_t before = s->received().size();
    ASSERT_TRUE(s->ReadSome());
    EXPECT_GT(s->received().size(), before);
    EXPECT_EQ(s->received().find("\"error\""), std::string::npos);
    EXPECT_EQ(s->received().find("[DONE]"), std::string::npos);  // still generating
    std::printf("a stream closed by its client after %zu events, %.1f s after the kill\n",
                SseEvents(ParseHttpResponse(s->received()).body).size(),
                std::chrono::duration<double>(Clock::now() - killed_at).count());
    s->Close();
  }
  ASSERT_TRUE(WaitFor(
      [&] { return Scrape(metrics(), BackendSeries("outstanding_requests", a.address())) == 0; },
      30))
      << metrics();

  // b again, on the same address: the gateway (the same process) brings it back.
  ServerProcess b2;
  std::vector<std::string> b2_flags = flags;
  const std::string b_port = b_address.substr(b_address.rfind(':') + 1);
  b2_flags.insert(b2_flags.end(), {"--port", b_port});  // after Start's own --port 0: it wins
  ASSERT_NO_FATAL_FAILURE(StartOrDie(&b2, model, b2_flags));
  ASSERT_EQ(b2.address(), b_address);
  ASSERT_TRUE(WaitFor([&] { return up(b_address) == 1; }, 30)) << metrics();
  EXPECT_EQ(g.pid(), gateway_pid);
  EXPECT_TRUE(g.Running());
  const double a1 = FinishedLength(a);
  for (int i = 0; i < 8; ++i) {
    const HttpResult r = Curl("POST", g.url() + "/v1/completions", short_body.dump());
    ASSERT_EQ(r.status, 200) << r.body;
  }
  EXPECT_EQ(FinishedLength(a), a1 + 4);
  EXPECT_EQ(FinishedLength(b2), 4);

  EXPECT_EQ(g.Terminate(), 0) << g.output();
  EXPECT_EQ(a.Terminate(), 0) << a.output();
  EXPECT_EQ(b2.Terminate(), 0) << b2.output();
}

}  // namespace
}  // namespace morserve::testing
