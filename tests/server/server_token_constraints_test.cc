// logit_bias, allowed_token_ids and min_tokens through the real server: `morserve serve` on
// 127.0.0.1 port 0 with a tiny model whose eos is its greedy first token for kPrompt (a
// `morserve mktokenizer` tokenizer, so stop strings work), generated gRPC stubs as the
// client. Values: +100 bias gives all-one-token output; allowed ids equal the in-process
// engine's tokens and logprobs bit for bit; min_tokens holds EOS back exactly until the
// count; stop strings only match past the first min_tokens tokens' text; bad values are
// INVALID_ARGUMENT naming the field.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>

#include "engine/tokenizer/tokenizer.h"
#include "tests/engine_harness.h"
#include "tests/server/served_suite.h"
#include "tests/server/server_process.h"
#include "tests/server/test_models.h"

namespace morserve::testing {
namespace {

using grpc::StatusCode;

const std::vector<int> kPrompt = {5, 17, 42, 99, 3, 250, 7};

class ServerTokenConstraintsTest : public ServedSuite<ServerTokenConstraintsTest, ServedTextModel> {
 protected:
  // The same weights with eos = the greedy first token of kPrompt.
  static void SetUpTestSuite() { StartSuiteWithEosAt("vanilla", kPrompt, &first_, &vocab_); }

  static inline int first_ = -1;
  static inline int vocab_ = 0;
};

TEST_F(ServerTokenConstraintsTest, LargeBiasMakesGreedyOutputOneToken) {
  const int x = first_ == 77 ? 78 : 77;
  v1::GenerateRequest r = TokenRequest(kPrompt, 6);
  (*r.mutable_sampling()->mutable_logit_bias())[x] = 100.0f;
  const StreamResult got = GenerateAll(stub_.get(), r);
  ASSERT_TRUE(got.status.ok()) << got.status.error_message();
  EXPECT_EQ(got.tokens, std::vector<int>(6, x));
  auto tokenizer = Tokenizer::FromDirectory(served_->model_dir());
  ASSERT_TRUE(tokenizer.ok());
  EXPECT_EQ(got.text, (*tokenizer)->Decode(std::vector<int>(6, x), true));
}

TEST_F(ServerTokenConstraintsTest, EqualTheInProcessEngineBitForBit) {
  auto weights = LoadModel(served_->model_dir());
  ASSERT_TRUE(weights.ok());
  const std::vector<int> allowed = {11, 60, 61, 200, vocab_ - 1};
  v1::GenerateRequest r = TokenRequest(kPrompt, 8);
  r.mutable_sampling()->set_temperature(0.9f);
  r.mutable_sampling()->set_seed(31);
  for (int id : allowed) r.mutable_sampling()->mutable_allowed_token_ids()->add_ids(id);
  (*r.mutable_sampling()->mutable_logit_bias())[60] = -3.5f;
  (*r.mutable_sampling()->mutable_logit_bias())[vocab_ - 1] = 1.25f;
  r.set_logprobs(2);
  const StreamResult got = GenerateAll(stub_.get(), r);
  ASSERT_TRUE(got.status.ok()) << got.status.error_message();

  GenerateRequest local = Greedy(kPrompt, 8);
  local.params.temperature = 0.9f;
  local.params.seed = 31;
  local.params.allowed_token_ids = allowed;
  local.params.logit_bias = {{60, -3.5f}, {vocab_ - 1, 1.25f}};
  local.params.logprobs = 2;
  const RunResult want = RunAlone(*weights, local);
  EXPECT_EQ(got.tokens, want.tokens);
  ASSERT_EQ(got.tokens.size(), 8u);
  for (int t : got.tokens) {
    EXPECT_NE(std::find(allowed.begin(), allowed.end(), t), allowed.end()) << t;
  }
  // Logprobs are of the raw model output: log_softmax of the returned raw logits.
  for (size_t i = 0; i < got.tokens.size(); ++i) {
    const std::vector<float>& row = want.logits[i];
    const double log_z = LogSumExp(row);
    EXPECT_NEAR(got.logprobs[i], row[got.tokens[i]] - log_z, 1e-5) << i;
  }
}

TEST_F(ServerTokenConstraintsTest, MinTokensHoldsEosBackExactlyUntilTheCount) {
  v1::GenerateRequest r = TokenRequest(kPrompt, 10);
  r.set_ignore_eos(false);
  StreamResult got = GenerateAll(stub_.get(), r);
  ASSERT_TRUE(got.status.ok()) << got.status.error_message();
  EXPECT_EQ(got.tokens, std::vector<int>{first_}) << "eos is the greedy first token";
  ASSERT_TRUE(got.finished.has_value());
  EXPECT_EQ(got.finished->reason(), v1::FINISH_REASON_STOP);
  for (int min_tokens : {1, 5, 10}) {
    r.set_min_tokens(min_tokens);
    got = GenerateAll(stub_.get(), r);
    ASSERT_TRUE(got.status.ok()) << got.status.error_message();
    ASSERT_GE(got.tokens.size(), static_cast<size_t>(min_tokens)) << min_tokens;
    for (int t = 0; t < min_tokens; ++t) EXPECT_NE(got.tokens[t], first_) << min_tokens;
    ASSERT_TRUE(got.finished.has_value());
    if (got.finished->reason() == v1::FINISH_REASON_STOP) {
      EXPECT_EQ(got.tokens.back(), first_);
    } else {
      EXPECT_EQ(got.tokens.size(), 10u);
    }
  }
}

// A stop string that the output contains in its first tokens: with min_tokens the match
// must end in the text of a later token (vLLM's detokenizer rule). Each run is compared with
// the same request without the stop string (min_tokens also bans eos, which changes tokens).
TEST_F(ServerTokenConstraintsTest, StopStringsMatchOnlyPastMinTokens) {
  auto tokenizer = Tokenizer::FromDirectory(served_->model_dir());
  ASSERT_TRUE(tokenizer.ok());
  for (int min_tokens : {0, 2, 6}) {
    v1::GenerateRequest r = TokenRequest(kPrompt, 12);
    r.set_min_tokens(min_tokens);
    const StreamResult base = GenerateAll(stub_.get(), r);
    ASSERT_TRUE(base.status.ok()) << base.status.error_message();
    const std::string& text = base.text;
    ASSERT_FALSE(text.empty());
    const std::string stop = text.substr(0, 1);
    r.add_stop(stop);
    const StreamResult got = GenerateAll(stub_.get(), r);
    ASSERT_TRUE(got.status.ok()) << got.status.error_message();
    const size_t kept =
        (*tokenizer)
            ->Decode(std::vector<int>(base.tokens.begin(), base.tokens.begin() + min_tokens), true)
            .size();
    const size_t at = text.find(stop, kept >= stop.size() ? kept - stop.size() + 1 : 0);
    EXPECT_EQ(got.text, at == std::string::npos ? text : text.substr(0, at))
        << "min_tokens " << min_tokens << " stop '" << stop << "' in '" << text << "'";
    ASSERT_TRUE(got.finished.has_value());
    EXPECT_EQ(got.finished->reason(),
              at == std::string::npos ? v1::FINISH_REASON_LENGTH : v1::FINISH_REASON_STOP);
    // The stop string starts the text: only the protection keeps any of it.
    if (min_tokens == 0) EXPECT_EQ(got.text, "");
    if (kept > 0) EXPECT_FALSE(got.text.empty()) << "min_tokens " << min_tokens;
  }
}

TEST_F(ServerTokenConstraintsTest, BadValuesAreInvalidArgumentNamingTheField) {
  struct Case {
    std::function<void(v1::GenerateRequest*)> mutate;
    std::string field;
  };
  const std::vector<Case> cases = {
      {[](v1::GenerateRequest* r) { (*r->mutable_sampling()->mutable_logit_bias())[vocab_] = 1; },
       "logit_bias"},
      {[](v1::GenerateRequest* r) { (*r->mutable_sampling()->mutable_logit_bias())[-2] = 1; },
       "logit_bias"},
      {[](v1::GenerateRequest* r) { (*r->mutable_sampling()->mutable_logit_bias())[3] = 150; },
       "logit_bias"},
      {[](v1::GenerateRequest* r) { r->mutable_sampling()->mutable_allowed_token_ids(); },
       "allowed_token_ids"},
      {[](v1::GenerateRequest* r) {
         r->mutable_sampling()->mutable_allowed_token_ids()->add_ids(vocab_);
       },
       "allowed_token_ids"},
      {[](v1::GenerateRequest* r) { r->set_min_tokens(5); }, "min_tokens"},  // max_tokens 4
      {[](v1::GenerateRequest* r) { r->set_min_tokens(-1); }, "min_tokens"},
      {[](v1::GenerateRequest* r) {  // only eos allowed: min_tokens cannot be met
         r->set_min_tokens(1);
         r->mutable_sampling()->mutable_allowed_token_ids()->add_ids(first_);
       },
       "min_tokens"},
  };
  for (const Case& c : cases) {
    v1::GenerateRequest r = TokenRequest(kPrompt, 4);
    c.mutate(&r);
    const StreamResult got = GenerateAll(stub_.get(), r);
    EXPECT_EQ(got.status.error_code(), StatusCode::INVALID_ARGUMENT) << c.field;
    EXPECT_EQ(got.status.error_message().find(c.field), 0u) << got.status.error_message();
    EXPECT_EQ(got.messages, 0);
  }
}

}  // namespace
}  // namespace morserve::testing
