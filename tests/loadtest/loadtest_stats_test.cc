// The load tester's statistics on hand-made data: percentiles against values worked out by
// hand (numpy's linear interpolation), and the report's TTFT / TPOT / ITL / E2E, throughput,
// goodput and failure counts on synthetic request records with known timings; and plots of
// a run with an empty metric (every request one chunk: no ITL) still draw.
#include <gtest/gtest.h>

#include "loadtest/plots.h"
#include "loadtest/report.h"
#include "loadtest/stats.h"
#include "tests/testutil.h"

namespace morserve::loadtest {
namespace {

TEST(Percentile, LinearInterpolationOnKnownSet) {
  // 10, 9, ..., 1 in reverse: order must not matter. Rank = q/100 * 9.
  std::vector<double> v = {10, 9, 8, 7, 6, 5, 4, 3, 2, 1};
  EXPECT_DOUBLE_EQ(Percentile(v, 0), 1);
  EXPECT_DOUBLE_EQ(Percentile(v, 50), 5.5);   // rank 4.5: 5 + 0.5
  EXPECT_DOUBLE_EQ(Percentile(v, 90), 9.1);   // rank 8.1: 9 + 0.1
  EXPECT_DOUBLE_EQ(Percentile(v, 99), 9.91);  // rank 8.91
  EXPECT_DOUBLE_EQ(Percentile(v, 100), 10);
  EXPECT_DOUBLE_EQ(Percentile({42}, 99), 42);
  EXPECT_DOUBLE_EQ(Percentile({}, 50), 0);
  // Uneven gaps: {0, 100, 101}: p25 at rank 0.5 = 50, p75 at rank 1.5 = 100.5.
  EXPECT_DOUBLE_EQ(Percentile({101, 0, 100}, 25), 50);
  EXPECT_DOUBLE_EQ(Percentile({101, 0, 100}, 75), 100.5);
}

TEST(Summarize, MeanMedianTailAndMax) {
  std::vector<double> v;
  for (int i = 1; i <= 100; ++i) v.push_back(i);
  const Summary s = Summarize(v);
  EXPECT_EQ(s.count, 100);
  EXPECT_DOUBLE_EQ(s.mean, 50.5);
  EXPECT_DOUBLE_EQ(s.median, 50.5);
  EXPECT_NEAR(s.p90, 90.1, 1e-9);   // rank 89.1
  EXPECT_NEAR(s.p99, 99.01, 1e-9);  // rank 98.01
  EXPECT_DOUBLE_EQ(s.max, 100);
  EXPECT_EQ(Summarize({}).count, 0);
}

TEST(Quantiles, EndpointsAndMonotone) {
  const std::vector<double> q = Quantiles({3, 1, 2}, 5);  // 0, 25, 50, 75, 100
  ASSERT_EQ(q.size(), 5u);
  EXPECT_DOUBLE_EQ(q[0], 1);
  EXPECT_DOUBLE_EQ(q[1], 1.5);
  EXPECT_DOUBLE_EQ(q[2], 2);
  EXPECT_DOUBLE_EQ(q[3], 2.5);
  EXPECT_DOUBLE_EQ(q[4], 3);
}

// A request sent at `send` with chunks at the given offsets, each one token, ending `end`.
RequestRecord Rec(double send, std::vector<double> chunks, double end, bool ok = true,
                  std::string why = "") {
  RequestRecord r;
  r.send_s = send;
  r.end_s = end;
  r.chunk_s = chunks;
  r.chunk_tokens.assign(chunks.size(), 1);
  r.measured_tokens = static_cast<int>(chunks.size());
  r.usage_completion_tokens = r.measured_tokens;
  r.prompt_tokens = 4;
  r.ok = ok;
  r.failure = why;
  return r;
}

TEST(ComputeStats, KnownTimings) {
  std::vector<RequestRecord> recs = {
      // TTFT 0.1, ITLs 0.1 0.2, E2E 0.5, TPOT (0.5-0.1)/2 = 0.2
      Rec(0.0, {0.1, 0.2, 0.4}, 0.5),
      // TTFT 0.3, ITL 0.1, E2E 0.4 (ends at 1.4), TPOT 0.1
      Rec(1.0, {0.3, 0.4}, 1.4),
      Rec(1.5, {}, 1.6, false, "UNAVAILABLE"),
      Rec(1.5, {}, 1.7, false, "UNAVAILABLE"),
      Rec(1.5, {}, 1.8, false, "http_500"),
  };
  RequestRecord warm = Rec(0, {0.01}, 9.0);  // excluded, though it ends last
  warm.warmup = true;
  recs.push_back(warm);
  Slo slo;
  slo.ttft_ms = 200;  // only the first request meets it
  const RunStats s = ComputeStats(recs, slo);
  EXPECT_EQ(s.sent, 5);
  EXPECT_EQ(s.completed, 2);
  EXPECT_EQ(s.failed, 3);
  EXPECT_EQ(s.failures.at("UNAVAILABLE"), 2);
  EXPECT_EQ(s.failures.at("http_500"), 1);
  EXPECT_DOUBLE_EQ(s.duration_s, 1.8);
  EXPECT_EQ(s.output_tokens, 5);
  EXPECT_EQ(s.input_tokens, 8);
  EXPECT_EQ(s.good, 1);
  EXPECT_NEAR(s.ttft_ms.mean, 200, 1e-9);
  EXPECT_NEAR(s.ttft_ms.max, 300, 1e-9);
  EXPECT_NEAR(s.tpot_ms.mean, 150, 1e-9);
  EXPECT_EQ(s.itl_ms.count, 3);
  EXPECT_NEAR(s.itl_ms.median, 100, 1e-9);
  EXPECT_NEAR(s.itl_ms.max, 200, 1e-9);
  EXPECT_NEAR(s.e2e_ms.mean, 450, 1e-9);
  EXPECT_NEAR(s.output_throughput(), 5 / 1.8, 1e-9);
  EXPECT_NEAR(s.request_throughput(), 2 / 1.8, 1e-9);
  EXPECT_NEAR(s.total_throughput(), 13 / 1.8, 1e-9);
  EXPECT_NEAR(s.goodput(), 1 / 1.8, 1e-9);
  EXPECT_EQ(s.usage_mismatches, 0);
}

TEST(ComputeStats, UsageMismatchAndMultiTokenChunks) {
  RequestRecord r = Rec(0, {0.1, 0.3}, 0.3);
  r.chunk_tokens = {1, 3};  // the second message carried 3 tokens
  r.measured_tokens = 4;
  r.usage_completion_tokens = 5;  // the server says 5: reported, and usage wins
  const RunStats s = ComputeStats({r}, Slo());
  EXPECT_EQ(s.usage_mismatches, 1);
  EXPECT_EQ(s.output_tokens, 5);
  EXPECT_EQ(s.measured_tokens, 4);
  EXPECT_NEAR(s.tpot_ms.mean, 50, 1e-9);  // (0.3 - 0.1) / 4
}

TEST(Slo, ParseAndEveryLimit) {
  auto slo = ParseSlo({"ttft:100", "itl:50", "e2e:1000", "tpot:45"});
  ASSERT_TRUE(slo.ok());
  EXPECT_TRUE(MeetsSlo(Rec(0, {0.05, 0.09, 0.13}, 0.13), *slo));
  EXPECT_FALSE(MeetsSlo(Rec(0, {0.15, 0.16}, 0.2), *slo));         // ttft
  EXPECT_FALSE(MeetsSlo(Rec(0, {0.05, 0.06, 0.12}, 0.12), *slo));  // an ITL of 60
  EXPECT_FALSE(MeetsSlo(Rec(0, {0.05}, 1.5), *slo));               // e2e
  EXPECT_FALSE(MeetsSlo(Rec(0, {0.05, 0.1}, 0.1, false, "x"), *slo));
  EXPECT_FALSE(ParseSlo({"ttft"}).ok());
  EXPECT_FALSE(ParseSlo({"ttft:-1"}).ok());
  EXPECT_FALSE(ParseSlo({"latency:5"}).ok());
}

TEST(ThroughputOverTime, OneSecondBins) {
  std::vector<RequestRecord> recs = {Rec(0.5, {0.1, 0.2, 0.7}, 1.3), Rec(1.0, {0.5}, 2.5)};
  const nlohmann::json t = ThroughputOverTime(recs, 1.0);
  ASSERT_EQ(t.size(), 3u);
  EXPECT_DOUBLE_EQ(t[0]["output_tokens_per_s"].get<double>(), 2);  // 0.6, 0.7
  EXPECT_DOUBLE_EQ(t[1]["output_tokens_per_s"].get<double>(), 2);  // 1.2, 1.5
  EXPECT_DOUBLE_EQ(t[1]["requests_per_s"].get<double>(), 1);
  EXPECT_DOUBLE_EQ(t[2]["requests_per_s"].get<double>(), 1);
}

// A panel without data (here ITL, and no throughput bins) gets fixed ranges: gnuplot cannot
// autoscale on no points and used to fail the whole plot ("all points y value undefined").
TEST(Plots, EmptyMetricStillDraws) {
  morserve::testing::TempDir dir;
  std::vector<double> cdf(201);
  for (int i = 0; i < 201; ++i) cdf[i] = 1 + i;
  const nlohmann::json run = {
      {"cdf_ms", {{"ttft", cdf}, {"tpot", cdf}, {"itl", nlohmann::json::array()}, {"e2e", cdf}}}};
  auto svgs = WritePlots(dir.File("plots"), {{"a", run}});
  ASSERT_TRUE(svgs.ok()) << svgs.status();
  for (const std::string& svg : *svgs)
    EXPECT_NE(morserve::testing::ReadFile(svg).find("<svg"), std::string::npos) << svg;
  EXPECT_NE(morserve::testing::ReadFile(dir.File("plots/latency_cdf.svg")).find("no data"),
            std::string::npos);
}

}  // namespace
}  // namespace morserve::loadtest
