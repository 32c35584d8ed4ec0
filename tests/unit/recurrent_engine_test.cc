// The engine on recurrent-layer models (docs/models.md#recurrent-transformer-layers) against the
// reference: a prefill chunk runs in one engine step, by the tiled schedule or the naive one; both
// give the reference's greedy tokens with logits within 1e-4 (relative to max(|logit|, 1)), and the
// two schedules give bit-identical logits. Prompt lengths that are and are not powers of two,
// chunk budgets that cut prompts mid-tree, requests at different stages sharing batches, both
// batching modes, batch invariance (bitwise) and forced preemption; on the plain recurrent
// model and on recurrent MoR expert- and token-choice, Relaxed LoRA and early-exit (skip)
// models.
#include <gtest/gtest.h>

#include "engine/reference/reference_model.h"
#include "nlohmann/json.hpp"
#include "tests/engine_harness.h"

namespace morserve {
namespace {

using testing::Greedy;
using testing::RunResult;

constexpr double kLogitTolerance = 1e-4;
const std::vector<int> kPromptLengths = {1, 2, 7, 16, 33, 100};

struct ModelCase {
  std::string name;
  TinyModelSpec spec;
};

std::vector<ModelCase> Models() {
  TinyModelSpec plain;
  plain.family = "recurrent";
  plain.dtype = DType::kF32;
  TinyModelSpec mor;  // routed loop: a chunk's positions at one loop are a subset of it
  mor.family = "mor-ec";
  mor.layer_kind = "recurrent";
  mor.dtype = DType::kF32;
  std::vector<ModelCase> v = {{"recurrent", plain}, {"recurrent-mor-ec", mor}};
  for (const char* family : {"mor-tc", "relaxed-lora", "early-exit"}) {
    TinyModelSpec s;
    s.family = family;
    s.layer_kind = "recurrent";
    s.dtype = DType::kF32;
    s.exit_kv = "skip";         // propagate is refused for recurrent layers
    s.exit_threshold = 0.2f;    // exits after 1, 2 and 3 loops (as in engine_test)
    v.push_back({std::string("recurrent-") + family, s});
  }
  return v;
}

std::vector<GenerateRequest> Requests(int vocab, int max_tokens) {
  std::vector<GenerateRequest> out;
  for (size_t i = 0; i < kPromptLengths.size(); ++i) {
    const auto prompt = testing::MakePrompts(1, kPromptLengths[i], kPromptLengths[i], vocab, 40 + i)[0];
    out.push_back(Greedy(prompt, max_tokens));
  }
  return out;
}

void ExpectMatchesReference(const ModelWeights& weights, const std::vector<GenerateRequest>& reqs,
                            const std::vector<RunResult>& got, const std::string& label) {
  auto shared = std::shared_ptr<const ModelWeights>(&weights, [](const ModelWeights*) {});
  ReferenceModel ref(shared);
  for (size_t i = 0; i < reqs.size(); ++i) {
    std::vector<StepOutput> outs;
    const std::vector<int> want = ref.GenerateGreedy(reqs[i].prompt, reqs[i].params.max_tokens, &outs);
    ASSERT_EQ(got[i].tokens, want) << label << " prompt length " << reqs[i].prompt.size();
    for (size_t t = 0; t < want.size(); ++t) {
      EXPECT_LE(testing::MaxRelDiff(got[i].logits[t], outs[reqs[i].prompt.size() - 1 + t].logits),
                kLogitTolerance)
          << label << " prompt length " << reqs[i].prompt.size() << " token " << t;
    }
  }
}

EngineConfig Config(BatchingMode mode, RecurrentPrefill prefill, int step_tokens) {
  EngineConfig cfg;
  cfg.mode = mode;
  cfg.recurrent_prefill = prefill;
  cfg.max_batch_rows = 256;
  cfg.max_step_tokens = step_tokens;
  cfg.block_size = 4;  // key groups of 4: chunks of 5 and 33 start and end inside groups
  cfg.num_kv_blocks = 4096;
  return cfg;
}

class RecurrentEngineTest : public ::testing::TestWithParam<ModelCase> {};

// Every prompt length, whole or in chunks of 5 and 33, requests arriving at different steps so
// that prefill chunks share batches with other requests' decode rows; both schedules, both
// batching modes.
TEST_P(RecurrentEngineTest, SchedulesMatchReferenceAndEachOther) {
  testing::TempDir dir;
  auto weights = testing::MakeModel(GetParam().spec, &dir);
  ASSERT_NE(weights, nullptr);
  const auto reqs = Requests(weights->config.vocab_size, 5);
  const std::vector<int> arrivals = {0, 3, 1, 0, 2, 4};
  for (BatchingMode mode : {BatchingMode::kDepthWise, BatchingMode::kSequenceWise}) {
    for (int step_tokens : {2048, 33, 5}) {
      std::vector<RunResult> tiled;
      for (RecurrentPrefill prefill : {RecurrentPrefill::kTiled, RecurrentPrefill::kNaive}) {
        const std::string label = GetParam().name + (mode == BatchingMode::kDepthWise ? " depth" : " sequence") +
                                  (prefill == RecurrentPrefill::kTiled ? " tiled" : " naive") +
                                  " chunk " + std::to_string(step_tokens);
        auto engine = Engine::Create(weights, Config(mode, prefill, step_tokens));
        ASSERT_TRUE(engine.ok()) << engine.status();
        const auto got = testing::RunStaggered(engine->get(), reqs, arrivals);
        ExpectMatchesReference(*weights, reqs, got, label);
        EXPECT_EQ((*engine)->kv_pool().num_free(), 4096) << label << ": blocks leaked";
        if (prefill == RecurrentPrefill::kTiled) {
          tiled = got;
          continue;
        }
        for (size_t i = 0; i < got.size(); ++i) {
          EXPECT_EQ(got[i].logits, tiled[i].logits) << label << ": tiled and naive differ, request " << i;
        }
      }
    }
  }
}

// A prompt is no longer fed one token per step: its chunk runs every layer in one step.
TEST_P(RecurrentEngineTest, PrefillChunkTakesOneStep) {
  testing::TempDir dir;
  auto weights = testing::MakeModel(GetParam().spec, &dir);
  ASSERT_NE(weights, nullptr);
  const bool routed = weights->plan.looped_segment >= 0;
  for (int step_tokens : {2048, 33}) {
    auto engine = Engine::Create(weights, Config(BatchingMode::kSequenceWise, RecurrentPrefill::kTiled, step_tokens));
    ASSERT_TRUE(engine.ok()) << engine.status();
    const auto reqs = Requests(weights->config.vocab_size, 3);
    const auto got = testing::RunStaggered(engine->get(), {reqs.back()}, {0});  // 100 tokens
    ExpectMatchesReference(*weights, {reqs.back()}, got, GetParam().name);
    const int chunks = (100 + step_tokens - 1) / step_tokens;
    // Sequence-wise: a step runs all loops of what entered; 2 more steps decode.
    EXPECT_EQ((*engine)->stats().steps, chunks + 2) << "chunk " << step_tokens << (routed ? " routed" : "");
  }
}

// A request's logits are bit-identical alone and beside other recurrent requests whose
// arrivals change how its prompt is cut into chunks and what shares its passes.
TEST_P(RecurrentEngineTest, BatchInvariance) {
  testing::TempDir dir;
  auto weights = testing::MakeModel(GetParam().spec, &dir);
  ASSERT_NE(weights, nullptr);
  const int vocab = weights->config.vocab_size;
  const GenerateRequest probe = Greedy(testing::MakePrompts(1, 45, 45, vocab, 99)[0], 6);
  EngineConfig cfg = Config(BatchingMode::kDepthWise, RecurrentPrefill::kTiled, 24);
  cfg.max_batch_rows = 32;
  auto run = [&](const std::vector<GenerateRequest>& reqs, const std::vector<int>& arrivals) {
    auto engine = Engine::Create(weights, cfg);
    EXPECT_TRUE(engine.ok());
    return testing::RunStaggered(engine->get(), reqs, arrivals);
  };
  const RunResult alone = run({probe}, {0})[0];
  for (int variant = 0; variant < 3; ++variant) {
    auto others = Requests(vocab, 4 + variant);
    std::vector<int> arrivals;
    for (size_t i = 0; i < others.size(); ++i) arrivals.push_back(static_cast<int>((i * (variant + 2)) % 5));
    others.push_back(probe);
    arrivals.push_back(variant);
    const auto got = run(others, arrivals);
    EXPECT_EQ(got.back().tokens, alone.tokens) << "variant " << variant;
    EXPECT_EQ(got.back().logits, alone.logits) << "variant " << variant;
  }
}

// Too few KV blocks: newer requests are preempted and recompute their prompts in chunks.
TEST_P(RecurrentEngineTest, ForcedPreemptionChangesNothing) {
  testing::TempDir dir;
  auto weights = testing::MakeModel(GetParam().spec, &dir);
  ASSERT_NE(weights, nullptr);
  std::vector<GenerateRequest> reqs;
  for (const auto& p : testing::MakePrompts(16, 1, 40, weights->config.vocab_size, 5)) reqs.push_back(Greedy(p, 8));
  for (RecurrentPrefill prefill : {RecurrentPrefill::kTiled, RecurrentPrefill::kNaive}) {
    EngineConfig cfg = Config(BatchingMode::kDepthWise, prefill, 24);
    cfg.block_size = 2;
    cfg.num_kv_blocks = weights->plan.num_cache_slots * 28;  // 56 tokens a slot: a few requests
    auto engine = Engine::Create(weights, cfg);
    ASSERT_TRUE(engine.ok()) << engine.status();
    const auto got = testing::RunStaggered(engine->get(), reqs, std::vector<int>(reqs.size(), 0));
    EXPECT_GT((*engine)->stats().preemptions, 0) << "the pool was meant to be too small";
    ExpectMatchesReference(*weights, reqs, got, GetParam().name + " preempted");
    EXPECT_EQ((*engine)->kv_pool().num_free(), cfg.num_kv_blocks);
  }
}

// `--recurrent-prefill tiled|naive` reaches the engine from the command line; other values
// are refused with a message naming the flag.
TEST(RecurrentPrefillFlagTest, GenerateTakesBothSchedulesAndRefusesOthers) {
  testing::TempDir dir;
  TinyModelSpec spec = Models()[0].spec;
  const std::string model = dir.File("recurrent");
  ASSERT_TRUE(WriteTinyModel(spec, model).ok());
  auto weights = LoadModel(model);
  ASSERT_TRUE(weights.ok());
  const std::vector<int> prompt = testing::MakePrompts(1, 37, 37, (*weights)->config.vocab_size, 3)[0];
  std::string ids;
  for (int t : prompt) ids += (ids.empty() ? "" : ",") + std::to_string(t);
  const std::vector<int> want = ReferenceModel(*weights).GenerateGreedy(prompt, 4, nullptr);
  for (const char* schedule : {"tiled", "naive"}) {
    auto r = testing::RunCommand(testing::MorserveBinary() + " generate --model " + model + " --prompt-ids " +
                                 ids + " --max-tokens 4 --ignore-eos --json --max-step-tokens 16" +
                                 " --recurrent-prefill " + schedule);
    ASSERT_EQ(r.exit_code, 0) << schedule << ": " << r.output;
    const nlohmann::json out = nlohmann::json::parse(r.output);
    ASSERT_EQ(out["tokens"].size(), want.size()) << schedule;
    for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(out["tokens"][i]["id"].get<int>(), want[i]) << schedule;
  }
  auto bad = testing::RunCommand(testing::MorserveBinary() + " generate --model " + model +
                                 " --prompt-ids 1,2 --recurrent-prefill fast");
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.output.find("--recurrent-prefill: tiled or naive"), std::string::npos) << bad.output;
}

INSTANTIATE_TEST_SUITE_P(Models, RecurrentEngineTest, ::testing::ValuesIn(Models()),
                         [](const auto& info) {
                           std::string n = info.param.name;
                           for (char& c : n) c = std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
                           return n;
                         });

}  // namespace
}  // namespace morserve
