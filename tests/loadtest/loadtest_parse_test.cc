// The load tester's parsers on their own: SSE framing (every split point, CRLF, multi-line
// data, comments), OpenAI stream chunks into a record, length distributions, URLs and the
// loopback rule, Prometheus text, workloads (random, decode, JSONL and its errors), options.
#include <gtest/gtest.h>

#include <fstream>
#include <random>

#include "loadtest/compare_report.h"
#include "loadtest/distribution.h"
#include "loadtest/http_target.h"
#include "loadtest/options.h"
#include "loadtest/prometheus_text.h"
#include "loadtest/sse_parser.h"
#include "loadtest/url.h"
#include "loadtest/workload.h"
#include "tests/testutil.h"

namespace morserve::loadtest {
namespace {

TEST(SseParser, EventsAtEverySplitPoint) {
  const std::string stream =
      ": keep-alive comment\r\n"
      "data: {\"a\":1}\r\n\r\n"
      "event: message\ndata: line one\ndata: line two\n\n"
      "data:nospace\r\r"
      "id: 7\n\n"  // no data: no event
      "data: [DONE]\n\n";
  const std::vector<std::string> want = {"{\"a\":1}", "line one\nline two", "nospace", "[DONE]"};
  for (size_t split = 0; split <= stream.size(); ++split) {
    std::vector<std::string> got;
    SseParser p([&](const std::string& d) { got.push_back(d); });
    p.Feed(std::string_view(stream).substr(0, split));
    p.Feed(std::string_view(stream).substr(split));
    EXPECT_EQ(got, want) << "split at " << split;
  }
  std::vector<std::string> bytewise;
  SseParser p([&](const std::string& d) { bytewise.push_back(d); });
  for (char c : stream) p.Feed(std::string_view(&c, 1));
  EXPECT_EQ(bytewise, want);
}

TEST(OpenAiEvents, CompletionChunksUsageAndDone) {
  RequestRecord r;
  bool done = false;
  ApplyOpenAiEvent(R"({"choices":[{"index":0,"text":"Hel","finish_reason":null}]})", false, 0.1, &r,
                   &done);
  ApplyOpenAiEvent(R"({"choices":[{"index":0,"text":"","finish_reason":null}]})", false, 0.2, &r,
                   &done);
  ApplyOpenAiEvent(R"({"choices":[{"index":0,"text":"lo","finish_reason":"length"}]})", false, 0.3,
                   &r, &done);
  ApplyOpenAiEvent(
      R"({"choices":[],"usage":{"prompt_tokens":4,"completion_tokens":3,"total_tokens":7}})", false,
      0.3, &r, &done);
  EXPECT_FALSE(done);
  ApplyOpenAiEvent("[DONE]", false, 0.4, &r, &done);
  EXPECT_TRUE(done);
  EXPECT_EQ(r.measured_tokens, 3);  // the empty-text chunk before the finish is a token
  EXPECT_EQ(r.chunk_s, (std::vector<double>{0.1, 0.2, 0.3}));
  EXPECT_EQ(r.usage_prompt_tokens, 4);
  EXPECT_EQ(r.usage_completion_tokens, 3);
  EXPECT_EQ(r.finish_reason, "length");
  EXPECT_TRUE(r.failure.empty());
}

TEST(OpenAiEvents, ChatRoleChunkIsNoTokenAndErrorsFail) {
  RequestRecord r;
  bool done = false;
  ApplyOpenAiEvent(
      R"({"choices":[{"delta":{"role":"assistant","content":""},"finish_reason":null}]})", true,
      0.1, &r, &done);
  ApplyOpenAiEvent(R"({"choices":[{"delta":{"content":"Hi"},"finish_reason":null}]})", true, 0.2,
                   &r, &done);
  ApplyOpenAiEvent(R"({"choices":[{"delta":{},"finish_reason":"stop"}]})", true, 0.3, &r, &done);
  EXPECT_EQ(r.measured_tokens, 1);
  EXPECT_EQ(r.chunk_s, (std::vector<double>{0.2}));
  EXPECT_EQ(r.finish_reason, "stop");
  ApplyOpenAiEvent(R"({"error":{"message":"boom","type":"server_error"}})", true, 0.4, &r, &done);
  EXPECT_EQ(r.failure, "stream_error");
  RequestRecord bad;
  ApplyOpenAiEvent("{not json", false, 0.1, &bad, &done);
  EXPECT_EQ(bad.failure, "bad_sse_json");
}

TEST(OpenAiEvents, LogprobsGiveExactTokenCounts) {
  RequestRecord r;
  bool done = false;
  ApplyOpenAiEvent(
      R"({"choices":[{"text":"","logprobs":{"tokens":["",""],"token_logprobs":[-1,-2]},"finish_reason":null}]})",
      false, 0.1, &r, &done);
  ApplyOpenAiEvent(R"({"choices":[{"text":"","logprobs":null,"finish_reason":"length"}]})", false,
                   0.2, &r, &done);
  EXPECT_EQ(r.measured_tokens, 2);
  EXPECT_EQ(r.chunk_tokens, std::vector<int>{2});
  RequestRecord c;
  ApplyOpenAiEvent(
      R"({"choices":[{"delta":{"content":"ab"},"logprobs":{"content":[{"token":"a"},{"token":"b"},{"token":""}]},"finish_reason":null}]})",
      true, 0.1, &c, &done);
  EXPECT_EQ(c.measured_tokens, 3);
}

TEST(LengthDistribution, ParseSampleAndClamp) {
  std::mt19937_64 rng(1);
  auto fixed = LengthDistribution::Parse("12");
  ASSERT_TRUE(fixed.ok());
  EXPECT_EQ(fixed->Sample(rng, 100), 12);
  EXPECT_EQ(fixed->Sample(rng, 5), 5);  // clamped to the cap
  auto uni = LengthDistribution::Parse("uniform:3:6");
  ASSERT_TRUE(uni.ok());
  std::set<int> seen;
  for (int i = 0; i < 400; ++i) seen.insert(uni->Sample(rng, 100));
  EXPECT_EQ(seen, (std::set<int>{3, 4, 5, 6}));
  auto normal = LengthDistribution::Parse("normal:256:64");
  ASSERT_TRUE(normal.ok());
  double sum = 0;
  for (int i = 0; i < 4000; ++i) sum += normal->Sample(rng, 100000);
  EXPECT_NEAR(sum / 4000, 256, 4);  // SE 1
  for (int i = 0; i < 1000; ++i) EXPECT_GE(LengthDistribution::Normal(2, 50).Sample(rng, 10), 1);
  for (const char* bad :
       {"0", "fixed:", "uniform:5:2", "normal:10:-1", "poisson:3", "x", "uniform:1"}) {
    EXPECT_FALSE(LengthDistribution::Parse(bad).ok()) << bad;
  }
}

TEST(Url, ParseAndLoopbackRule) {
  auto u = ParseHttpUrl("http://127.0.0.1:8000/v1/completions");
  ASSERT_TRUE(u.ok());
  EXPECT_EQ(u->host, "127.0.0.1");
  EXPECT_EQ(u->port, "8000");
  EXPECT_EQ(u->target, "/v1/completions");
  auto v6 = ParseHttpUrl("http://[::1]:9/metrics");
  ASSERT_TRUE(v6.ok());
  EXPECT_EQ(v6->host, "::1");
  EXPECT_EQ(ParseHttpUrl("http://localhost/x")->port, "80");
  EXPECT_FALSE(ParseHttpUrl("https://127.0.0.1:1/").ok());
  EXPECT_FALSE(ParseHttpUrl("127.0.0.1:1").ok());
  EXPECT_FALSE(ParseHostPort("127.0.0.1").ok());
  EXPECT_FALSE(ParseHostPort("127.0.0.1:70000").ok());
  EXPECT_TRUE(IsLoopbackHost("127.0.0.1"));
  EXPECT_TRUE(IsLoopbackHost("127.8.9.10"));
  EXPECT_TRUE(IsLoopbackHost("::1"));
  EXPECT_TRUE(IsLoopbackHost("localhost"));
  EXPECT_FALSE(IsLoopbackHost("10.0.0.1"));
  EXPECT_FALSE(IsLoopbackHost("example.com"));
  EXPECT_FALSE(CheckHostAllowed("10.0.0.1", false).ok());
  EXPECT_TRUE(CheckHostAllowed("10.0.0.1", true).ok());
}

TEST(PrometheusText, SeriesLabelsAndSums) {
  const std::string text =
      "# HELP morserve_rows_per_loop_total Rows\n# TYPE morserve_rows_per_loop_total counter\n"
      "morserve_rows_per_loop_total{loop=\"1\"} 30\n"
      "morserve_rows_per_loop_total{loop=\"2\"} 12.5\n"
      "morserve_kv_cache_usage_ratio 0.25\n"
      "morserve_batch_fill_ratio_sum 3.5 1700000000000\n"
      "weird{a=\"x y\"} 2\n";
  const PrometheusSample s = PrometheusSample::Parse(text);
  EXPECT_EQ(s.Get("morserve_kv_cache_usage_ratio"), 0.25);
  EXPECT_EQ(s.Get("morserve_batch_fill_ratio_sum"), 3.5);
  EXPECT_EQ(s.Get("weird{a=\"x y\"}"), 2);
  EXPECT_EQ(s.Sum("morserve_rows_per_loop_total"), 42.5);
  EXPECT_EQ(s.ByLabel("morserve_rows_per_loop_total", "loop"),
            (std::map<std::string, double>{{"1", 30}, {"2", 12.5}}));
  EXPECT_FALSE(s.Get("missing").has_value());
}

TEST(Workload, RandomDecodeAndJsonl) {
  WorkloadOptions o;
  o.vocab_size = 50;
  o.context_length = 40;
  o.input_len = *LengthDistribution::Parse("uniform:4:8");
  o.output_len = *LengthDistribution::Parse("100");  // clamped to the context
  auto w = MakeWorkload(o, 30);
  ASSERT_TRUE(w.ok());
  for (const RequestSpec& r : *w) {
    EXPECT_GE(r.prompt_tokens(), 4);
    EXPECT_LE(r.prompt_tokens(), 8);
    EXPECT_EQ(r.max_tokens, 40 - r.prompt_tokens());
    for (int id : r.prompt_ids) EXPECT_TRUE(id >= 1 && id < 50);
  }
  o.vocab_size = 0;
  EXPECT_FALSE(MakeWorkload(o, 1).ok());

  WorkloadOptions d;
  d.kind = "decode";
  auto dw = MakeWorkload(d, 2000);
  ASSERT_TRUE(dw.ok());
  double sum = 0;
  for (const RequestSpec& r : *dw) {
    EXPECT_EQ(r.prompt_ids, std::vector<int>{1});
    sum += r.max_tokens;
  }
  EXPECT_NEAR(sum / 2000, 256, 5);

  testing::TempDir dir;
  testing::WriteFile(dir.File("p.jsonl"),
                     "{\"prompt\": [5, 6, 7], \"max_tokens\": 9}\n\n{\"prompt\": \"hello\"}\n");
  WorkloadOptions j;
  j.kind = "jsonl";
  j.dataset = dir.File("p.jsonl");
  j.output_len = LengthDistribution::Fixed(3);
  auto jw = MakeWorkload(j, 3);
  ASSERT_TRUE(jw.ok()) << jw.status();
  EXPECT_EQ((*jw)[0].prompt_ids, (std::vector<int>{5, 6, 7}));
  EXPECT_EQ((*jw)[0].max_tokens, 9);
  EXPECT_EQ((*jw)[1].prompt_text, "hello");
  EXPECT_EQ((*jw)[1].max_tokens, 3);
  EXPECT_EQ((*jw)[2].prompt_ids, (*jw)[0].prompt_ids);  // cycles
  for (const auto& [text, needle] : std::vector<std::pair<std::string, std::string>>{
           {"[1,2]", ":1: not a JSON object"},
           {"{\"max_tokens\": 3}", ":1: no \"prompt\""},
           {"{\"prompt\": [1, \"a\"]}", "token ids"},
           {"{\"prompt\": \"x\", \"max_tokens\": 0}", "max_tokens"},
           {"{\"prompt\": \"ok\"}\n{oops", ":2: not a JSON object"}}) {
    testing::WriteFile(dir.File("bad.jsonl"), text);
    j.dataset = dir.File("bad.jsonl");
    auto bad = MakeWorkload(j, 1);
    EXPECT_TRUE(testing::ErrorHas(bad.status(), {needle})) << text;
  }
  j.dataset = dir.File("missing.jsonl");
  EXPECT_TRUE(testing::ErrorHas(MakeWorkload(j, 1).status(), {"cannot open"}));
}

TEST(Options, ErrorsNameTheFlag) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{}, "exactly one target"},
      {{"--grpc", "127.0.0.1:1", "--url", "http://127.0.0.1:2/v1/completions"},
       "exactly one target"},
      {{"--grpc", "10.1.2.3:50051"}, "--allow-remote-host"},
      {{"--url", "http://127.0.0.1:1/v1/models"}, "/v1/completions"},
      {{"--grpc", "127.0.0.1:1", "--request-rate", "0"}, "--request-rate"},
      {{"--grpc", "127.0.0.1:1", "--burstiness", "-1"}, "--burstiness"},
      {{"--grpc", "127.0.0.1:1", "--num-requests", "0"}, "--num-requests"},
      {{"--grpc", "127.0.0.1:1", "--duration", "0"}, "--duration"},
      {{"--grpc", "127.0.0.1:1", "--workload", "jsonl"}, "--dataset"},
      {{"--grpc", "127.0.0.1:1", "--input-len", "uniform:9:1"}, "uniform:9:1"},
      {{"--grpc", "127.0.0.1:1", "--slo", "ttft:abc"}, "--slo"},
      {{"--grpc", "127.0.0.1:1", "--cpu-pid", "x"}, "--cpu-pid"},
      {{"--grpc", "127.0.0.1:1", "--metrics-url", "http://10.0.0.1:9/metrics"},
       "--allow-remote-host"},
      {{"--grpc", "127.0.0.1:1", "--bogus", "1"}, "bogus"}};
  for (const auto& [args, needle] : cases) {
    auto o = ParseLoadTestOptions(args);
    EXPECT_TRUE(testing::ErrorHas(o.status(), {needle})) << needle;
  }
  auto ok = ParseLoadTestOptions({"--grpc", "10.1.2.3:50051", "--allow-remote-host",
                                  "--request-rate", "inf", "--slo", "ttft:100,tpot:20"});
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_TRUE(std::isinf(ok->run.request_rate));
  EXPECT_EQ(ok->slo.tpot_ms, 20);
  auto cpu = ParseLoadTestOptions({"--grpc", "127.0.0.1:1", "--cpu-pid", "gateway=12,34"});
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  EXPECT_EQ(cpu->cpu_pids, (std::vector<int>{12, 34}));
  EXPECT_EQ(cpu->cpu_names, (std::vector<std::string>{"gateway", "34"}));
  EXPECT_FALSE(ParseLoadTestOptions({"--grpc", "127.0.0.1:1", "--cpu-pid", "=5"}).ok());
  EXPECT_FALSE(ParseLoadTestOptions({"--grpc", "127.0.0.1:1", "--logprobs", "21"}).ok());
}

TEST(CompareReport, ColumnsPerRunAndCpuRows) {
  const nlohmann::json a = {
      {"target", {{"kind", "grpc"}}},
      {"server", {{"batching_mode", "depth"}}},
      {"results",
       {{"requests", {{"sent", 10}, {"completed", 9}, {"failed", 1}}},
        {"failures", {{"UNAVAILABLE", 1}}},
        {"output_throughput", 123.456},
        {"ttft_ms", {{"p99", 12.345}}}}},
      {"cpu", {{{"name", "server"}, {"cpu_seconds", 2.5}, {"cpu_us_per_output_token", 900.0}}}}};
  const nlohmann::json b = {
      {"target", {{"kind", "http"}}},
      {"results",
       {{"requests", {{"sent", 10}, {"completed", 10}, {"failed", 0}}},
        {"output_throughput", 100.0}}},
      {"cpu",
       {{{"name", "server"}, {"cpu_seconds", 2.0}, {"cpu_us_per_output_token", 800.0}},
        {{"name", "gateway"}, {"cpu_seconds", 0.25}, {"cpu_us_per_output_token", 125.04}}}}};
  const std::string md = CompareMarkdown("T", {{"direct", a}, {"gw", b}}, {"x.svg"});
  for (const char* row :
       {"| metric | direct | gw |", "| target | grpc | http |", "| batching mode | depth | - |",
        "| completed | 9 | 10 |", "| output throughput (tok/s) | 123.5 | 100.0 |",
        "| TTFT p99 (ms) | 12.35 | - |", "| server: CPU seconds | 2.50 | 2.00 |",
        "| gateway: CPU us per output token | - | 125.0 |", "direct: {\"UNAVAILABLE\":1}",
        "[x.svg](x.svg)"}) {
    EXPECT_NE(md.find(row), std::string::npos) << row << "\n" << md;
  }
  EXPECT_EQ(md.find("TPOT mean"), std::string::npos);  // rows no run has are left out
  const nlohmann::json j = CompareJson("T", {{"direct", a}, {"gw", b}});
  EXPECT_EQ(j["runs"]["gw"]["target"]["kind"], "http");
}

}  // namespace
}  // namespace morserve::loadtest
