// logit_process_forward against the CPU sampler's own stages (Sampler::ProcessLogits), bit for
// bit, with the operations the CUDA runner stages (StageLogitOps): allowed ids (with
// duplicates) and a bias on ids in and out of them, a min_tokens ban of eos ids (one outside
// the vocabulary) and stop ids, the repetition penalty above and below 1 on prompt and output
// ids (repeated, shared by both), frequency and presence penalties on the output alone, and
// every stage at once; logits with -inf entries, an odd vocabulary, source rows out of order,
// and more rows than CTAs (the grid-stride loop). An op id outside the vocabulary writes
// nothing; n_rows = 0 launches nothing; the launcher's validation. Also built as
// kernel_logit_process_emu_test: the same checks on the emulated kernels and CUDA runtime.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "engine/cuda/sample_staging.h"
#include "engine/runtime/sampler.h"
#include "kernels/logit_process.cuh"
#include "tests/gpu/gpu_testutil.h"

namespace morserve::kernels {
namespace {

using ::morserve::testing::DeviceBuffer;
using ::morserve::testing::FloatBits;
using ::morserve::testing::FreshSeed;

constexpr int kVocab = 1003;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

class LogitProcessTest : public ::testing::Test {
 protected:
  void SetUp() override { MORSERVE_SKIP_WITHOUT_GPU(); }
};

// A request's sampling inputs, owning what SampleInput points to.
struct Case {
  std::string name;
  SamplingParams params;
  std::vector<int> prompt, output, eos;
};

std::vector<int> RandomIds(int count, std::mt19937_64& rng) {
  std::uniform_int_distribution<int> id(0, kVocab - 1);
  std::vector<int> v(count);
  for (int& x : v) x = id(rng);
  return v;
}

std::vector<Case> Cases(std::mt19937_64& rng) {
  std::vector<Case> cases;
  Case rep{"repetition 1.3", {}, RandomIds(40, rng), RandomIds(12, rng), {2}};
  rep.params.repetition_penalty = 1.3f;
  rep.output.push_back(rep.output[0]);  // repeated
  rep.output.push_back(rep.prompt[3]);  // in both
  cases.push_back(rep);
  Case rep_low = rep;
  rep_low.name = "repetition 0.7";
  rep_low.params.repetition_penalty = 0.7f;
  cases.push_back(rep_low);
  Case freq{"frequency and presence", {}, RandomIds(30, rng), RandomIds(20, rng), {2}};
  freq.params.frequency_penalty = 0.7f;
  freq.params.presence_penalty = -0.4f;
  freq.output.insert(freq.output.end(), {freq.output[1], freq.output[1], freq.prompt[0]});
  cases.push_back(freq);
  Case allowed{"allowed and bias", {}, RandomIds(10, rng), RandomIds(5, rng), {2}};
  allowed.params.allowed_token_ids = std::vector<int>{5, 17, 17, 400, 1002, 0, 999};
  allowed.params.logit_bias = {{17, 2.5f}, {400, -100.0f}, {6, 3.0f}, {1002, 0.125f}};
  cases.push_back(allowed);
  Case ban{"min_tokens ban", {}, RandomIds(10, rng), RandomIds(3, rng), {2, kVocab + 5, 7}};
  ban.params.min_tokens = 6;
  ban.params.stop_token_ids = {9, 2, 500};
  ban.params.repetition_penalty = 0.8f;
  cases.push_back(ban);
  Case ban_done = ban;
  ban_done.name = "min_tokens reached";
  ban_done.params.min_tokens = 3;
  cases.push_back(ban_done);
  Case all{"every stage", {}, RandomIds(50, rng), RandomIds(25, rng), {2, 3}};
  all.params.allowed_token_ids = std::vector<int>{2, 3, 9, all.prompt[0], all.output[0], 77};
  all.params.logit_bias = {{3, -1.0f}, {77, 4.0f}, {all.output[0], 0.5f}, {600, 1.0f}};
  all.params.min_tokens = 40;
  all.params.stop_token_ids = {9};
  all.params.repetition_penalty = 1.15f;
  all.params.frequency_penalty = 0.3f;
  all.params.presence_penalty = 0.2f;
  cases.push_back(all);
  Case bias_only{"bias only", {}, RandomIds(4, rng), {}, {2}};
  bias_only.params.logit_bias = {{0, 1.0f}, {kVocab - 1, -3.5f}};
  cases.push_back(bias_only);
  return cases;
}

SampleInput InputOf(const Case& c) {
  SampleInput in;
  in.params = &c.params;
  in.prompt_ids = c.prompt;
  in.output_ids = c.output;
  in.eos_ids = c.eos;
  return in;
}

// Random logits [rows, kVocab] (N(0, 3), about 2% -inf, some exact zeros).
std::vector<float> RandomLogits(int rows, std::mt19937_64& rng) {
  std::normal_distribution<float> dist(0.0f, 3.0f);
  std::uniform_int_distribution<int> pick(0, 99);
  std::vector<float> v(static_cast<size_t>(rows) * kVocab);
  for (float& x : v) {
    const int r = pick(rng);
    x = r < 2 ? kNegInf : r < 4 ? 0.0f : dist(rng);
  }
  return v;
}

struct Launch {
  std::vector<LogitOp> ops;
  std::vector<LogitRowProcess> rows;
};

// Runs the kernel and returns out [rows, kVocab].
std::vector<float> RunProcess(const std::vector<float>& logits, const Launch& l) {
  DeviceBuffer<float> dlogits(logits.size()), dout(l.rows.size() * kVocab);
  DeviceBuffer<LogitOp> dops(l.ops.size());
  DeviceBuffer<LogitRowProcess> drows(l.rows.size());
  EXPECT_TRUE(dlogits.ok() && dout.ok() && dops.ok() && drows.ok());
  EXPECT_EQ(dlogits.Upload(logits), cudaSuccess);
  if (!l.ops.empty()) EXPECT_EQ(dops.Upload(l.ops), cudaSuccess);
  EXPECT_EQ(drows.Upload(l.rows), cudaSuccess);
  LogitProcessParams p;
  p.logits = dlogits.get();
  p.vocab = kVocab;
  p.out = dout.get();
  p.rows = drows.get();
  p.n_rows = static_cast<int>(l.rows.size());
  p.ops = dops.get();
  EXPECT_EQ(logit_process_forward(p, nullptr), cudaSuccess);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<float> out;
  EXPECT_EQ(dout.Download(&out), cudaSuccess);
  return out;
}

// Processed row i of `out` against Sampler::ProcessLogits of its source row, bitwise.
void ExpectEqualsSampler(const std::vector<float>& logits, const std::vector<float>& out, int i,
                         int src_row, const Case& c) {
  SCOPED_TRACE(c.name + ", processed row " + std::to_string(i));
  SampleInput in = InputOf(c);
  in.logits = absl::MakeConstSpan(&logits[static_cast<size_t>(src_row) * kVocab], kVocab);
  ASSERT_TRUE(Sampler::ChangesLogits(in));
  Sampler sampler;
  const absl::Span<const float> want = sampler.ProcessLogits(in);
  for (int v = 0; v < kVocab; ++v) {
    const float got = out[static_cast<size_t>(i) * kVocab + v];
    ASSERT_EQ(FloatBits(got), FloatBits(want[v]))
        << "id " << v << ": " << got << ", want " << want[v] << " (raw " << in.logits[v] << ")";
  }
}

TEST_F(LogitProcessTest, EveryStageEqualsTheCpuSamplerBitwise) {
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE("seed=" + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const std::vector<Case> cases = Cases(rng);
  const int n = static_cast<int>(cases.size());
  const std::vector<float> logits = RandomLogits(n + 3, rng);
  Launch l;
  std::vector<int> src(n);
  for (int i = 0; i < n; ++i) {
    src[i] = n + 2 - i;  // out of order, and rows 0..2 never read
    l.rows.emplace_back();
    StageLogitOps(InputOf(cases[i]), kVocab, src[i], &l.ops, &l.rows.back());
  }
  const std::vector<float> out = RunProcess(logits, l);
  for (int i = 0; i < n; ++i)
    ASSERT_NO_FATAL_FAILURE(ExpectEqualsSampler(logits, out, i, src[i], cases[i]));
}

// 5000 rows: more than the launcher's 4096 CTAs, so some CTAs process two rows.
TEST_F(LogitProcessTest, MoreRowsThanCtas) {
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE("seed=" + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const std::vector<Case> cases = Cases(rng);
  const int rows = 5000;
  const std::vector<float> logits = RandomLogits(64, rng);
  Launch l;
  for (int i = 0; i < rows; ++i) {
    l.rows.emplace_back();
    StageLogitOps(InputOf(cases[i % cases.size()]), kVocab, i % 64, &l.ops, &l.rows.back());
  }
  const std::vector<float> out = RunProcess(logits, l);
  for (int i : {0, 1, 4095, 4096, 4097, 4999}) {
    ASSERT_NO_FATAL_FAILURE(ExpectEqualsSampler(logits, out, i, i % 64, cases[i % cases.size()]));
  }
}

// An op whose id is outside the vocabulary (a fault only the device could see) writes nothing:
// the row stays the raw copy.
TEST_F(LogitProcessTest, OpOutsideTheVocabularyWritesNothing) {
  std::mt19937_64 rng(FreshSeed());
  const std::vector<float> logits = RandomLogits(1, rng);
  Launch l;
  l.ops = {LogitOp{-1, kLogitOpBanned, 0.0f, 0}, LogitOp{kVocab, kLogitOpBanned, 0.0f, 0}};
  l.rows = {LogitRowProcess{0, 0, 2, 0, 1.0f, 0.0f, 0.0f}};
  const std::vector<float> out = RunProcess(logits, l);
  for (int v = 0; v < kVocab; ++v) ASSERT_EQ(FloatBits(out[v]), FloatBits(logits[v])) << v;
}

TEST_F(LogitProcessTest, ValidatesItsParameters) {
  DeviceBuffer<float> buf(kVocab);
  DeviceBuffer<LogitRowProcess> rows(1);
  ASSERT_TRUE(buf.ok() && rows.ok());
  LogitProcessParams p;
  p.logits = buf.get();
  p.out = buf.get();
  p.rows = rows.get();
  p.vocab = kVocab;
  p.n_rows = 0;
  EXPECT_EQ(logit_process_forward(p, nullptr), cudaSuccess);  // nothing to launch
  LogitProcessParams bad = p;
  bad.n_rows = -1;
  EXPECT_EQ(logit_process_forward(bad, nullptr), cudaErrorInvalidValue);
  bad = p;
  bad.vocab = 0;
  EXPECT_EQ(logit_process_forward(bad, nullptr), cudaErrorInvalidValue);
  bad = p;
  bad.row_stride = kVocab - 1;
  EXPECT_EQ(logit_process_forward(bad, nullptr), cudaErrorInvalidValue);
  bad = p;
  bad.n_rows = 1;
  bad.rows = nullptr;
  EXPECT_EQ(logit_process_forward(bad, nullptr), cudaErrorInvalidValue);
  bad = p;
  bad.n_rows = 1;
  bad.out = nullptr;
  EXPECT_EQ(logit_process_forward(bad, nullptr), cudaErrorInvalidValue);
}

}  // namespace
}  // namespace morserve::kernels
