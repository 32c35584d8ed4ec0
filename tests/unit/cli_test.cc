// The `morserve generate` and `morserve bench` commands, run as a user runs them.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "engine/model/weights.h"
#include "engine/reference/reference_model.h"
#include "engine/tools/mkmodel.h"
#include "nlohmann/json.hpp"
#include "tests/testutil.h"

namespace morserve {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;
using ::testing::Not;

std::string MakeModelDir(testing::TempDir& dir, const std::string& family) {
  TinyModelSpec spec;
  spec.family = family;
  std::string path = dir.File(family);
  EXPECT_TRUE(WriteTinyModel(spec, path).ok());
  return path;
}

// --prompt-logprobs with --max-tokens 0: the prompt scored against the reference, nothing
// generated.
TEST(CliTest, GenerateScoresThePrompt) {
  testing::TempDir dir;
  const std::string model = MakeModelDir(dir, "mor-ec");
  auto r = testing::RunCommand(testing::MorserveBinary() + " generate --model " + model +
                               " --prompt-ids 5,6,7,8 --max-tokens 0 --prompt-logprobs 2 --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const json out = json::parse(r.output);
  EXPECT_TRUE(out["tokens"].empty());
  EXPECT_EQ(out["usage"]["completion_tokens"], 0);
  const json& plp = out["prompt_logprobs"];
  ASSERT_EQ(plp.size(), 4u) << r.output;
  EXPECT_TRUE(plp[0].is_null());
  auto weights = LoadModel(model);
  ASSERT_TRUE(weights.ok());
  ReferenceModel ref(*weights);
  const std::vector<StepOutput> steps = ref.Forward({5, 6, 7, 8});
  for (int i = 1; i < 4; ++i) {
    const std::vector<float>& logits = steps[i - 1].logits;
    double m = -INFINITY, z = 0, scale = 1;
    for (float x : logits) {
      m = std::max(m, static_cast<double>(x));
      scale = std::max(scale, std::fabs(static_cast<double>(x)));
    }
    for (float x : logits) z += std::exp(x - m);
    EXPECT_EQ(plp[i]["id"], 5 + i);
    EXPECT_NEAR(plp[i]["logprob"].get<double>(), logits[5 + i] - m - std::log(z), 2e-4 * scale);
    EXPECT_EQ(plp[i]["top_logprobs"].size(), 2u);
  }
  r = testing::RunCommand(testing::MorserveBinary() + " generate --model " + model +
                          " --prompt-ids 5,6 --max-tokens 0");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("max_tokens"), std::string::npos) << r.output;
}

TEST(CliTest, GenerateMatchesReferenceForEveryFamily) {
  testing::TempDir dir;
  for (const char* family :
       {"vanilla", "recursive-cycle", "recursive-untied-attn", "mor-ec", "mor-tc"}) {
    const std::string model = MakeModelDir(dir, family);
    auto r = testing::RunCommand(
        testing::MorserveBinary() + " generate --model " + model +
        " --prompt-ids 5,6,7,8 --max-tokens 6 --ignore-eos --logprobs 3 --json");
    ASSERT_EQ(r.exit_code, 0) << family << ": " << r.output;
    const json out = json::parse(r.output);
    auto weights = LoadModel(model);
    ASSERT_TRUE(weights.ok());
    ReferenceModel ref(*weights);
    std::vector<StepOutput> steps;
    const std::vector<int> want = ref.GenerateGreedy({5, 6, 7, 8}, 6, &steps);
    ASSERT_EQ(out["tokens"].size(), want.size()) << family;
    for (size_t i = 0; i < want.size(); ++i) {
      EXPECT_EQ(out["tokens"][i]["id"].get<int>(), want[i]) << family << " token " << i;
      EXPECT_EQ(out["tokens"][i]["loops"].get<int>(), steps[3 + i].trace.loops) << family;
      EXPECT_EQ(out["tokens"][i]["top_logprobs"].size(), 3u);
      EXPECT_EQ(out["tokens"][i]["top_logprobs"][0]["id"].get<int>(), want[i]);
    }
    EXPECT_EQ(out["finish_reason"], "length");
    EXPECT_EQ(out["usage"]["completion_tokens"], 6);
    EXPECT_EQ(out["usage"]["prompt_tokens"], 4);
  }
}

TEST(CliTest, GenerateRejectsBadInput) {
  testing::TempDir dir;
  const std::string model = MakeModelDir(dir, "mor-ec");
  auto r = testing::RunCommand(testing::MorserveBinary() + " generate --model " + model +
                               " --prompt-ids 1,4096");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.output, HasSubstr("outside the vocabulary"));
  r = testing::RunCommand(testing::MorserveBinary() + " generate --model " + model +
                          " --prompt-ids 1 --top-p 0");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.output, HasSubstr("top_p"));
  r = testing::RunCommand(testing::MorserveBinary() + " generate --model " + model +
                          " --prompt-ids 1 --bogus 3");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.output, HasSubstr("unknown flag --bogus"));
  r = testing::RunCommand(testing::MorserveBinary() + " generate --model " + dir.File("missing") +
                          " --prompt-ids 1");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.output, HasSubstr("config.json"));
}

// The benchmark's counts add up: every requested token is generated, rows per loop sum to
// the shared-block rows, step phases fit in the run's time, and each depth-wise run has its
// sequence-wise twin in the ratios. The read bandwidth is measured and each run reports its weight
// traffic against it (the CPU runner may count 0 weight bytes: only the fields and their
// consistency are checked); the prefill of one 24-token prompt is timed per model.
// --temperature samples every request with its own seed: recorded in the protocol, and the
// tokens (so the depths of a MoR model) vary; a negative temperature is refused by name.
TEST(CliTest, BenchTemperatureSamples) {
  testing::TempDir dir;
  const std::string mor = MakeModelDir(dir, "mor-ec");
  const std::string out = dir.File("bench.json");
  auto r =
      testing::RunCommand(testing::MorserveBinary() + " bench --models " + mor +
                          " --requests 8 --mean-tokens 12 --std-tokens 0 --batches 8 --modes depth"
                          " --warmup 1 --kv-cache-mb 16 --membw-mb 0 --temperature 1.0 --out " +
                          out);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const json report = json::parse(testing::ReadFile(out));
  EXPECT_EQ(report["protocol"]["temperature"].get<double>(), 1.0);
  ASSERT_EQ(report["runs"].size(), 1u);
  int depths = 0;
  for (int64_t exits : report["runs"][0]["stats"]["exits_per_loop"]) depths += exits > 0;
  EXPECT_GE(depths, 2) << "sampled tokens of distinct prompts exit at more than one depth";
  auto bad = testing::RunCommand(testing::MorserveBinary() + " bench --models " + mor +
                                 " --temperature -1 --membw-mb 0 --out " + out);
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_THAT(bad.output, HasSubstr("--temperature"));
}

// --repetition-penalty applies to every request: recorded in the protocol; a greedy run's
// tokens change with it (the same prompts, another first repeated token), and 0 is refused by
// name.
TEST(CliTest, BenchRepetitionPenaltyAppliesToEveryRequest) {
  testing::TempDir dir;
  const std::string mor = MakeModelDir(dir, "mor-ec");
  auto run = [&](const std::string& extra, const std::string& out) {
    auto r = testing::RunCommand(testing::MorserveBinary() + " bench --models " + mor +
                                 " --requests 8 --mean-tokens 24 --std-tokens 0 --batches 8"
                                 " --modes depth --warmup 0 --kv-cache-mb 16 --membw-mb 0" +
                                 extra + " --out " + out);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return json::parse(testing::ReadFile(out));
  };
  const json plain = run("", dir.File("plain.json"));
  const json penalised = run(" --repetition-penalty 3", dir.File("penalised.json"));
  EXPECT_EQ(plain["protocol"]["repetition_penalty"].get<double>(), 1.0);
  EXPECT_EQ(penalised["protocol"]["repetition_penalty"].get<double>(), 3.0);
  EXPECT_NE(plain["runs"][0]["stats"]["exits_per_loop"],
            penalised["runs"][0]["stats"]["exits_per_loop"])
      << "a strong repetition penalty changed no token's depth";
  auto bad =
      testing::RunCommand(testing::MorserveBinary() + " bench --models " + mor +
                          " --repetition-penalty 0 --membw-mb 0 --out " + dir.File("bad.json"));
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_THAT(bad.output, HasSubstr("--repetition-penalty"));
}

// The JSON is rewritten after every batch setting: a run that fails on its second model (a
// directory that does not exist) leaves the first model's runs and ratios, marked incomplete.
TEST(CliTest, BenchKeepsWhatItMeasuredWhenCutShort) {
  testing::TempDir dir;
  const std::string mor = MakeModelDir(dir, "mor-ec");
  const std::string out = dir.File("bench.json");
  auto r = testing::RunCommand(testing::MorserveBinary() + " bench --models " + mor + "," +
                               dir.File("missing") +
                               " --requests 6 --mean-tokens 6 --std-tokens 0 --batches 2,4"
                               " --warmup 1 --kv-cache-mb 16 --membw-mb 0 --out " +
                               out);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.output, HasSubstr("config.json"));
  const json report = json::parse(testing::ReadFile(out));
  EXPECT_FALSE(report["complete"].get<bool>());
  ASSERT_EQ(report["runs"].size(), 4u);  // 2 batches x 2 modes of the first model
  EXPECT_EQ(report["ratios"].size(), 2u);
  EXPECT_FALSE(std::filesystem::exists(out + ".partial"));
}

// An --out the report cannot be written to (its directory does not exist) is an error that names
// it, before any run, never a "wrote" over a lost report.
TEST(CliTest, BenchRefusesAnOutItCannotWrite) {
  testing::TempDir dir;
  const std::string mor = MakeModelDir(dir, "mor-ec");
  const std::string out = dir.File("missing") + "/bench.json";
  auto r = testing::RunCommand(testing::MorserveBinary() + " bench --models " + mor +
                               " --requests 2 --mean-tokens 4 --std-tokens 0 --batches 1"
                               " --warmup 0 --kv-cache-mb 16 --membw-mb 0 --out " +
                               out);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.output, HasSubstr("--out: cannot write " + out));
  EXPECT_THAT(r.output, Not(HasSubstr("wrote")));
  EXPECT_THAT(r.output, Not(HasSubstr("rows per loop"))) << "it failed after starting the runs";
}

TEST(CliTest, BenchWritesConsistentJson) {
  testing::TempDir dir;
  const std::string mor = MakeModelDir(dir, "mor-ec");
  const std::string vanilla = MakeModelDir(dir, "vanilla");
  const std::string out = dir.File("bench.json");
  auto r =
      testing::RunCommand(testing::MorserveBinary() + " bench --models " + mor + "," + vanilla +
                          " --requests 12 --mean-tokens 10 --std-tokens 3 --batches 4,16 --warmup 2"
                          " --kv-cache-mb 16 --membw-mb 32 --membw-passes 2 --prefill 24 --out " +
                          out);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const json report = json::parse(testing::ReadFile(out));
  EXPECT_TRUE(report["complete"].get<bool>());
  ASSERT_EQ(report["runs"].size(), 8u);
  EXPECT_THAT(r.output, HasSubstr("read bandwidth:"));
  ASSERT_TRUE(report["read_bandwidth"].is_object());
  const double read_gbs = report["read_bandwidth_gbs"].get<double>();
  EXPECT_GT(read_gbs, 0.0);
  EXPECT_EQ(report["read_bandwidth"]["read_bandwidth_gbs"].get<double>(), read_gbs);
  EXPECT_EQ(report["read_bandwidth"]["buffer_bytes"].get<int64_t>(), int64_t{32} << 20);
  EXPECT_GE(report["read_bandwidth"]["threads"].get<int>(), 1);
  EXPECT_EQ(report["read_bandwidth"]["passes"].get<int>(), 2);
  ASSERT_EQ(report["prefill"].size(), 2u);
  for (const json& p : report["prefill"]) {
    EXPECT_EQ(p["prompt_tokens"].get<int>(), 24);
    EXPECT_GT(p["prefill_tokens_per_s"].get<double>(), 0.0);
    EXPECT_NEAR(p["prefill_tokens_per_s"].get<double>(), 24 / p["seconds"].get<double>(), 1e-6);
    EXPECT_GT(p["weight_bytes_read"].get<int64_t>(), 0) << "the CPU runner counts its weight reads";
    EXPECT_GT(p["linear_gflops"].get<double>(), 0.0);
    // Against the VDPBF16PS peak where the host has one (the amx-bf16 roof without AMX).
    const double bf16_peak = report["read_bandwidth"]["bf16_dot_gflops"].get<double>();
    if (bf16_peak > 0) {
      EXPECT_NEAR(p["bf16_dot_fraction"].get<double>(),
                  p["linear_gflops"].get<double>() / bf16_peak, 1e-9);
    } else {
      EXPECT_TRUE(p["bf16_dot_fraction"].is_null());
    }
  }
  // The bf16 dot-product peak is measured where the host has AVX-512 BF16, and only there.
  EXPECT_EQ(report["read_bandwidth"]["bf16_dot_gflops"].get<double>() > 0,
            __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bf16"));
  // The FMA peak is measured beside the read bandwidth (0 only on a host without AVX2+FMA).
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    EXPECT_GT(report["read_bandwidth"]["fma_gflops"].get<double>(), 0.0);
  }
  EXPECT_EQ(report["protocol"]["temperature"].get<double>(), 0.0);
  EXPECT_TRUE(report["protocol"]["distinct_prompts"].get<bool>());
  int64_t expected_tokens = -1;
  for (const json& run : report["runs"]) {
    const json& s = run["stats"];
    if (expected_tokens < 0) expected_tokens = s["tokens_generated"];
    const double weight_bytes = s["weight_bytes_read"].get<double>();
    EXPECT_GT(weight_bytes, 0.0);
    EXPECT_NEAR(s["weight_gbs"].get<double>(), weight_bytes / s["seconds"].get<double>() / 1e9,
                1e-9);
    EXPECT_NEAR(s["weight_bw_fraction"].get<double>(), s["weight_gbs"].get<double>() / read_gbs,
                1e-9);
    EXPECT_EQ(s["tokens_generated"], expected_tokens) << "same workload in every run";
    // Greedy requests without logits: the runner samples every token; the CPU runner has no
    // device, so its launch / copy / sync counts are zero.
    EXPECT_EQ(s["runner_sampled_rows"], s["tokens_generated"]);
    EXPECT_EQ(s["device_per_step"]["launches"].get<double>(), 0.0);
    EXPECT_EQ(s["device_per_step"]["syncs"].get<double>(), 0.0);
    int64_t loop_rows = 0;
    for (int64_t v : s["rows_per_loop"]) loop_rows += v;
    // Step phases: model work took time in each, and all of them fit in the run's wall time;
    // the process's CPU time per token is reported with it.
    double phases = 0;
    for (const char* p : {"schedule", "enter", "pass", "tail", "sample", "report"}) {
      ASSERT_TRUE(s["step_phase_seconds"].contains(p)) << p;
      phases += s["step_phase_seconds"][p].get<double>();
    }
    for (const char* p : {"enter", "tail", "sample"})
      EXPECT_GT(s["step_phase_seconds"][p].get<double>(), 0.0) << p;
    if (run["model"]["routing"] == "expert_choice")
      EXPECT_GT(s["step_phase_seconds"]["pass"].get<double>(), 0.0);
    EXPECT_LE(phases, s["seconds"].get<double>());
    EXPECT_GT(s["cpu_seconds"].get<double>(), 0.0);
    EXPECT_NEAR(s["cpu_us_per_token"].get<double>(),
                1e6 * s["cpu_seconds"].get<double>() / s["tokens_generated"].get<double>(), 1e-6);
    if (run["model"]["routing"] == "expert_choice") {
      EXPECT_EQ(loop_rows, s["shared_block_rows"].get<int64_t>());
      EXPECT_GT(s["batch_fill_ratio"].get<double>(), 0.0);
      EXPECT_LE(s["batch_fill_ratio"].get<double>(), 1.0);
    }
  }
  EXPECT_GT(expected_tokens, 12);
  int depth_vs_sequence = 0, vs_vanilla = 0;
  for (const json& ratio : report["ratios"]) {
    depth_vs_sequence += ratio["what"] == "depth-wise / sequence-wise";
    vs_vanilla += ratio["what"] == "model / vanilla (same mode)";
  }
  EXPECT_EQ(depth_vs_sequence, 4);
  EXPECT_EQ(vs_vanilla, 4);
}

}  // namespace
}  // namespace morserve
