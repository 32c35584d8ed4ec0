// The looped-model request fields through the real server: `mode` and `exit_threshold` of
// GenerateRequest, `morserve serve` on 127.0.0.1 port 0 with generated gRPC stubs as the
// client. Two models: a tiny vanilla one on a `morserve mktokenizer` tokenizer (no exit rule:
// "adaptive" is INVALID_ARGUMENT naming `mode`; "full" generates what no mode generates; a
// mode that is neither is INVALID_ARGUMENT naming `mode` and the allowed values), and an
// early-exit one (mkmodel --family early-exit, threshold 0.2: tokens leave after 1, 2 or 3
// loops) on which exit_threshold 1e-6 makes every token leave after the first loop and 1.5
// keeps every token for all 3 loops, per token (Token.loops) and in usage.recursion_loops.
// And an Ouro one (mkmodel --family ouro, no looped.json: full by default): "adaptive" makes
// generated tokens exit at the gate, with the reference's tokens and loop counts, the first
// token at full depth, and the exits in a real metrics scrape. And a Huginn-0125 one (mkmodel
// --family huginn, looped.json adaptive with a KL threshold): the reference's tokens and loop
// counts for the model's defaults and for a request's num_steps, init_scale (with its seed) and
// exit_threshold; num_steps outside 1..the model's recurrences, a negative init_scale, and either
// field on a model that is not Huginn are INVALID_ARGUMENT naming the field.
#include <gtest/gtest.h>

#include <algorithm>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "engine/model/weights.h"
#include "engine/reference/reference_model.h"
#include "tests/server/served_suite.h"
#include "tests/server/server_process.h"
#include "tests/server/test_models.h"

namespace morserve::testing {
namespace {

constexpr int kRecursions = 3;
const std::vector<int> kPrompt = {5, 17, 42, 9, 100, 23, 64};
constexpr int kMaxTokens = 10;

// mkmodel's early-exit family, fp32, with a threshold its unsure random weights reach after
// 1, 2 or 3 loops.
TinyModelSpec EarlyExitSpec() {
  TinyModelSpec s;
  s.family = "early-exit";
  s.dtype = DType::kF32;
  s.recursions = kRecursions;
  s.exit_threshold = 0.2f;
  s.max_pos = 128;
  return s;
}

constexpr int kOuroLoops = 4;

// Ouro's layout, fp32; a threshold that random gates reach after 1, 2 or 3 loops.
TinyModelSpec OuroSpec() {
  TinyModelSpec s;
  s.family = "ouro";
  s.dtype = DType::kF32;
  s.recursions = kOuroLoops;
  s.layers = 2 * kOuroLoops;
  s.exit_threshold = 0.55f;
  s.max_pos = 128;
  return s;
}

constexpr int kHuginnSteps = 4;

// Huginn's layout, fp32: prelude 1, core 2 x 4 recurrences, coda 1; looped.json adaptive with
// a KL threshold its random weights cross after 1, 2 or 3 recurrences.
TinyModelSpec HuginnSpec() {
  TinyModelSpec s;
  s.family = "huginn";
  s.dtype = DType::kF32;
  s.prelude_layers = 1;
  s.coda_layers = 1;
  s.recursions = kHuginnSteps;
  s.layers = 1 + 2 * kHuginnSteps + 1;
  s.exit_threshold = 3.7f;
  s.loop_mode = "adaptive";
  s.max_pos = 128;
  return s;
}

class ServerLoopParamsTest : public ServedSuite<ServerLoopParamsTest, ServedTextModel> {
 protected:
  static void SetUpTestSuite() {
    StartSuite("vanilla");
    if (served_ == nullptr || !served_->server().started()) return;
    const std::string dir = served_->dir().File("early-exit");
    const absl::Status s = WriteTinyModel(EarlyExitSpec(), dir);
    ASSERT_TRUE(s.ok()) << s;
    early_ = new ServerProcess();
    ASSERT_NO_FATAL_FAILURE(StartOrDie(early_, dir));
    ouro_dir_ = new std::string(served_->dir().File("ouro"));
    ASSERT_TRUE(WriteTinyModel(OuroSpec(), *ouro_dir_).ok());
    ouro_ = new ServerProcess();
    ASSERT_NO_FATAL_FAILURE(StartOrDie(ouro_, *ouro_dir_));
    huginn_dir_ = new std::string(served_->dir().File("huginn"));
    ASSERT_TRUE(WriteTinyModel(HuginnSpec(), *huginn_dir_).ok());
    huginn_ = new ServerProcess();
    ASSERT_NO_FATAL_FAILURE(StartOrDie(huginn_, *huginn_dir_));
  }
  static void TearDownTestSuite() {
    if (early_ != nullptr && early_->pid() > 0)
      EXPECT_EQ(early_->Terminate(), 0) << early_->output();
    delete early_;
    early_ = nullptr;
    if (ouro_ != nullptr && ouro_->pid() > 0) EXPECT_EQ(ouro_->Terminate(), 0) << ouro_->output();
    delete ouro_;
    ouro_ = nullptr;
    delete ouro_dir_;
    ouro_dir_ = nullptr;
    if (huginn_ != nullptr && huginn_->pid() > 0)
      EXPECT_EQ(huginn_->Terminate(), 0) << huginn_->output();
    delete huginn_;
    huginn_ = nullptr;
    delete huginn_dir_;
    huginn_dir_ = nullptr;
    ServedSuite::TearDownTestSuite();
  }
  void SetUp() override {
    ServedSuite::SetUp();
    ASSERT_NE(early_, nullptr);
    early_stub_ = early_->Stub();
  }

  static v1::GenerateRequest WithMode(const std::string& mode) {
    v1::GenerateRequest r = TokenRequest(kPrompt, 4);
    r.set_mode(mode);
    return r;
  }
  static v1::GenerateRequest WithThreshold(float threshold) {
    v1::GenerateRequest r = TokenRequest(kPrompt, kMaxTokens);
    r.set_exit_threshold(threshold);
    return r;
  }
  // The call failed with INVALID_ARGUMENT and a message that starts with `field: `.
  static void ExpectInvalid(const StreamResult& got, const std::string& field) {
    EXPECT_EQ(got.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
        << got.status.error_message();
    EXPECT_EQ(got.status.error_message().rfind(field + ": ", 0), 0u) << got.status.error_message();
    EXPECT_TRUE(got.tokens.empty());
  }

  static inline ServerProcess* early_ = nullptr;
  static inline ServerProcess* ouro_ = nullptr;
  static inline std::string* ouro_dir_ = nullptr;
  static inline ServerProcess* huginn_ = nullptr;
  static inline std::string* huginn_dir_ = nullptr;
  std::unique_ptr<v1::Morserve::Stub> early_stub_;
};

TEST_F(ServerLoopParamsTest, AdaptiveOnAModelWithoutAnExitRuleNamesMode) {
  for (v1::Morserve::Stub* stub : {stub_.get(), early_stub_.get()}) {
    const StreamResult got = GenerateAll(stub, WithMode("adaptive"));
    ExpectInvalid(got, "mode");
    EXPECT_NE(got.status.error_message().find("adaptive"), std::string::npos)
        << got.status.error_message();
  }
  // The model's type is named: the vanilla model is a llama.
  const StreamResult got = GenerateAll(stub_.get(), WithMode("adaptive"));
  EXPECT_NE(got.status.error_message().find("model_type llama"), std::string::npos)
      << got.status.error_message();
}

TEST_F(ServerLoopParamsTest, UnknownModeNamesTheFieldAndTheAllowedValues) {
  for (const char* bad : {"bogus", "", "Full", "ADAPTIVE", "full "}) {
    SCOPED_TRACE(bad);
    const StreamResult got = GenerateAll(stub_.get(), WithMode(bad));
    ExpectInvalid(got, "mode");
    const std::string& msg = got.status.error_message();
    EXPECT_NE(msg.find("\"full\""), std::string::npos) << msg;
    EXPECT_NE(msg.find("\"adaptive\""), std::string::npos) << msg;
  }
  const StreamResult got = GenerateAll(stub_.get(), WithMode(std::string(1000, 'x')));
  ExpectInvalid(got, "mode");
  EXPECT_LT(got.status.error_message().size(), 200u) << "a long value is cut";
}

TEST_F(ServerLoopParamsTest, FullModeGeneratesWhatNoModeGenerates) {
  for (v1::Morserve::Stub* stub : {stub_.get(), early_stub_.get()}) {
    const StreamResult plain = GenerateAll(stub, TokenRequest(kPrompt, 4));
    const StreamResult full = GenerateAll(stub, WithMode("full"));
    ASSERT_TRUE(plain.status.ok()) << plain.status.error_message();
    ASSERT_TRUE(full.status.ok()) << full.status.error_message();
    EXPECT_EQ(full.tokens.size(), 4u);
    EXPECT_EQ(full.tokens, plain.tokens);
    EXPECT_EQ(full.loops, plain.loops);
  }
}

TEST_F(ServerLoopParamsTest, ExitThresholdReachesTheEngine) {
  // Forwards of the request: every prompt token and every generated token but the last.
  const int64_t forwards = static_cast<int64_t>(kPrompt.size()) + kMaxTokens - 1;

  const StreamResult model = GenerateAll(early_stub_.get(), TokenRequest(kPrompt, kMaxTokens));
  ASSERT_TRUE(model.status.ok()) << model.status.error_message();
  ASSERT_EQ(model.loops.size(), static_cast<size_t>(kMaxTokens));
  const std::set<int> depths(model.loops.begin(), model.loops.end());
  EXPECT_GT(depths.size(), 1u) << "the model's own threshold should give mixed depths";

  const StreamResult first = GenerateAll(early_stub_.get(), WithThreshold(1e-6f));
  ASSERT_TRUE(first.status.ok()) << first.status.error_message();
  ASSERT_EQ(first.loops.size(), static_cast<size_t>(kMaxTokens));
  for (size_t i = 0; i < first.loops.size(); ++i) EXPECT_EQ(first.loops[i], 1) << "token " << i;
  ASSERT_TRUE(first.finished.has_value());
  EXPECT_EQ(first.finished->usage().recursion_loops(), forwards);

  const StreamResult never = GenerateAll(early_stub_.get(), WithThreshold(1.5f));
  ASSERT_TRUE(never.status.ok()) << never.status.error_message();
  ASSERT_EQ(never.loops.size(), static_cast<size_t>(kMaxTokens));
  for (size_t i = 0; i < never.loops.size(); ++i) {
    EXPECT_EQ(never.loops[i], kRecursions) << "token " << i;
  }
  ASSERT_TRUE(never.finished.has_value());
  EXPECT_EQ(never.finished->usage().recursion_loops(), forwards * kRecursions);

  // Different depths, different logits: the first tokens' logprobs differ.
  ASSERT_FALSE(first.logprobs.empty());
  ASSERT_FALSE(never.logprobs.empty());
  EXPECT_NE(first.logprobs[0], never.logprobs[0]);
}

TEST_F(ServerLoopParamsTest, ExitThresholdMustBePositive) {
  for (float bad : {0.0f, -1.0f}) {
    SCOPED_TRACE(bad);
    ExpectInvalid(GenerateAll(early_stub_.get(), WithThreshold(bad)), "exit_threshold");
  }
}

TEST_F(ServerLoopParamsTest, OuroAdaptiveExitsAtTheGateAsTheReferenceDoes) {
  ASSERT_NE(ouro_, nullptr);
  auto stub = ouro_->Stub();
  auto weights = LoadModel(*ouro_dir_);
  ASSERT_TRUE(weights.ok()) << weights.status();
  constexpr int kTokens = 16;
  for (const char* mode : {"", "full", "adaptive"}) {
    SCOPED_TRACE(mode);
    v1::GenerateRequest r = TokenRequest(kPrompt, kTokens);
    if (*mode != '\0') r.set_mode(mode);
    const StreamResult got = GenerateAll(stub.get(), r);
    ASSERT_TRUE(got.status.ok()) << got.status.error_message();
    ReferenceOptions o;
    o.loop_mode = std::string(mode) == "adaptive" ? LoopMode::kAdaptive : LoopMode::kFull;
    ReferenceModel ref(*weights, o);
    std::vector<StepOutput> outs;
    EXPECT_EQ(got.tokens, ref.GenerateGreedy(kPrompt, kTokens, &outs));
    ASSERT_EQ(got.loops.size(), static_cast<size_t>(kTokens));
    for (int t = 0; t < kTokens; ++t) {
      EXPECT_EQ(got.loops[t], outs[kPrompt.size() - 1 + t].trace.loops) << "token " << t;
    }
    EXPECT_EQ(got.loops[0], kOuroLoops) << "the first token comes from the prompt's full depth";
    const std::set<int> depths(got.loops.begin(), got.loops.end());
    if (std::string(mode) == "adaptive") {
      EXPECT_GT(depths.size(), 2u) << "generated tokens should exit at several loops";
    } else {
      EXPECT_EQ(depths, std::set<int>{kOuroLoops});
    }
  }
  // The exits are in a real scrape: tokens that left after fewer loops than the model has.
  const std::optional<std::string> text = HttpGet(ouro_->metrics_port(), "/metrics");
  ASSERT_TRUE(text.has_value());
  double early_exits = 0;
  for (int l = 1; l < kOuroLoops; ++l) {
    early_exits +=
        ScrapeValue(*text, "morserve_exits_per_loop_total{loops=\"" + std::to_string(l) + "\"}")
            .value_or(0);
  }
  EXPECT_GT(early_exits, 0) << *text;
}

TEST_F(ServerLoopParamsTest, HuginnRequestFieldsReachTheEngine) {
  ASSERT_NE(huginn_, nullptr);
  auto stub = huginn_->Stub();
  auto weights = LoadModel(*huginn_dir_);
  ASSERT_TRUE(weights.ok()) << weights.status();
  constexpr int kTokens = 12;
  struct Case {
    const char* name;
    std::optional<int> num_steps;
    std::optional<float> init_scale;
    std::optional<float> exit_threshold;
    const char* mode;
  };
  for (const Case& c :
       {Case{"defaults", {}, {}, {}, ""}, Case{"num_steps 2", 2, {}, {}, ""},
        Case{"full, 3 steps", 3, {}, {}, "full"}, Case{"init_scale 1", {}, 1.0f, {}, ""},
        Case{"never exits", {}, {}, 1e-30f, ""}}) {
    SCOPED_TRACE(c.name);
    v1::GenerateRequest r = TokenRequest(kPrompt, kTokens);
    ReferenceOptions o;
    if (*c.mode != '\0') {
      r.set_mode(c.mode);
      o.loop_mode = LoopMode::kFull;
    }
    if (c.num_steps) r.set_num_steps(*c.num_steps);
    if (c.init_scale) {
      r.set_init_scale(*c.init_scale);
      r.mutable_sampling()->set_seed(11);
      o.seed = 11;
    }
    if (c.exit_threshold) r.set_exit_threshold(*c.exit_threshold);
    o.num_steps = c.num_steps;
    o.init_scale = c.init_scale;
    o.exit_threshold = c.exit_threshold;
    const StreamResult got = GenerateAll(stub.get(), r);
    ASSERT_TRUE(got.status.ok()) << got.status.error_message();
    ReferenceModel ref(*weights, o);
    std::vector<StepOutput> outs;
    EXPECT_EQ(got.tokens, ref.GenerateGreedy(kPrompt, kTokens, &outs));
    ASSERT_EQ(got.loops.size(), static_cast<size_t>(kTokens));
    const int steps = c.num_steps.value_or(kHuginnSteps);
    for (int t = 0; t < kTokens; ++t) {
      EXPECT_EQ(got.loops[t], outs[kPrompt.size() - 1 + t].trace.loops) << "token " << t;
      EXPECT_LE(got.loops[t], steps) << "token " << t;
    }
    EXPECT_EQ(got.loops[0], steps) << "the first token comes from the prompt's full depth";
  }
}

TEST_F(ServerLoopParamsTest, HuginnFieldsAreCheckedAndNamed) {
  ASSERT_NE(huginn_, nullptr);
  auto stub = huginn_->Stub();
  for (int bad : {0, -1, kHuginnSteps + 1}) {
    SCOPED_TRACE(bad);
    v1::GenerateRequest r = TokenRequest(kPrompt, 4);
    r.set_num_steps(bad);
    ExpectInvalid(GenerateAll(stub.get(), r), "num_steps");
  }
  v1::GenerateRequest r = TokenRequest(kPrompt, 4);
  r.set_init_scale(-0.5f);
  ExpectInvalid(GenerateAll(stub.get(), r), "init_scale");
  // Not Huginn: both fields are refused by name, with the model's type.
  v1::GenerateRequest steps = TokenRequest(kPrompt, 4);
  steps.set_num_steps(2);
  const StreamResult got = GenerateAll(early_stub_.get(), steps);
  ExpectInvalid(got, "num_steps");
  EXPECT_NE(got.status.error_message().find("huginn_raven"), std::string::npos)
      << got.status.error_message();
  v1::GenerateRequest scale = TokenRequest(kPrompt, 4);
  scale.set_init_scale(1.0f);
  ExpectInvalid(GenerateAll(stub_.get(), scale), "init_scale");
}

}  // namespace
}  // namespace morserve::testing
