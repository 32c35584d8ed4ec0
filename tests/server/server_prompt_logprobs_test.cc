// Prompt logprobs through the real server: `morserve serve` on 127.0.0.1 port 0 (a tiny MoR
// model on a tokenizer `morserve mktokenizer` trains from this repo's README), generated gRPC
// stubs as the client. GenerateRequest.prompt_logprobs puts one Token per prompt token on the
// first message (the first bare, rank 0), equal to the in-process engine's values bit for bit
// and to the reference's within the engine tests' stated tolerance, with each token's own
// text under token_text; max_tokens 0 scores without generating; bad values are
// INVALID_ARGUMENT naming the field.
#include <gtest/gtest.h>

#include <cmath>

#include "engine/reference/reference_model.h"
#include "engine/tokenizer/tokenizer.h"
#include "tests/engine_harness.h"
#include "tests/server/served_suite.h"
#include "tests/server/server_process.h"
#include "tests/server/test_models.h"

namespace morserve::testing {
namespace {

using grpc::StatusCode;

class ServerPromptLogprobsTest : public ServedSuite<ServerPromptLogprobsTest, ServedTextModel> {
 protected:
  static void SetUpTestSuite() { StartSuite("mor-ec"); }

  static v1::GenerateRequest Scored(const std::vector<int>& prompt, int max_tokens, int k) {
    v1::GenerateRequest r = TokenRequest(prompt, max_tokens);
    r.set_prompt_logprobs(k);
    return r;
  }

  // The in-process engine's prompt logprobs for the same prompt.
  static std::vector<PromptTokenLogprob> EngineValues(const std::shared_ptr<const ModelWeights>& w,
                                                      const std::vector<int>& prompt, int k) {
    GenerateRequest r = Greedy(prompt, 1);
    r.params.prompt_logprobs = k;
    return RunAlone(w, r).prompt_logprobs.value_or(std::vector<PromptTokenLogprob>{});
  }
};

TEST_F(ServerPromptLogprobsTest, FirstMessageCarriesEngineAndReferenceValues) {
  auto weights = LoadModel(served_->model_dir());
  ASSERT_TRUE(weights.ok()) << weights.status();
  auto tokenizer = Tokenizer::FromDirectory(served_->model_dir());
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  const std::vector<int> prompt = {5, 17, 42, 99, 3, 250, 7, 301, 64};
  v1::GenerateRequest req = Scored(prompt, 4, 3);
  req.set_token_text(true);
  req.set_echo(true);
  const StreamResult got = GenerateAll(stub_.get(), req);
  ASSERT_TRUE(got.status.ok()) << got.status.error_message();
  EXPECT_EQ(got.prompt_logprob_messages, std::vector<int>{0}) << "only the first message";
  EXPECT_EQ(got.tokens.size(), 4u);
  ASSERT_EQ(got.prompt_logprobs.size(), prompt.size());

  const v1::Token& first = got.prompt_logprobs[0];
  EXPECT_EQ(first.id(), prompt[0]);
  EXPECT_EQ(first.rank(), 0);
  EXPECT_EQ(first.logprob(), 0.0f);
  EXPECT_EQ(first.top_logprobs_size(), 0);
  EXPECT_EQ(first.text(), (*tokenizer)->Decode({prompt[0]}, false));

  const std::vector<PromptTokenLogprob> local = EngineValues(*weights, prompt, 3);
  ASSERT_EQ(local.size(), prompt.size() - 1);
  ReferenceModel ref(*weights);
  const std::vector<StepOutput> outs = ref.Forward(prompt);
  for (size_t i = 1; i < prompt.size(); ++i) {
    SCOPED_TRACE(i);
    const v1::Token& t = got.prompt_logprobs[i];
    const PromptTokenLogprob& e = local[i - 1];
    EXPECT_EQ(t.id(), prompt[i]);
    EXPECT_EQ(t.logprob(), e.logprob);
    EXPECT_EQ(t.rank(), e.rank);
    EXPECT_GE(t.rank(), 1);
    EXPECT_EQ(t.text(), (*tokenizer)->Decode({prompt[i]}, false));
    ASSERT_EQ(t.top_logprobs_size(), 3);
    for (int j = 0; j < 3; ++j) {
      EXPECT_EQ(t.top_logprobs(j).token_id(), e.top_logprobs[j].token);
      EXPECT_EQ(t.top_logprobs(j).logprob(), e.top_logprobs[j].logprob);
      EXPECT_EQ(t.top_logprobs(j).text(), (*tokenizer)->Decode({e.top_logprobs[j].token}, false));
    }
    // The reference: log_softmax of position i - 1's logits at prompt[i].
    const RefLogprob r = ReferenceLogprob(outs[i - 1].logits, prompt[i]);
    EXPECT_NEAR(t.logprob(), r.logprob, 2e-4 * r.scale);
  }
}

TEST_F(ServerPromptLogprobsTest, MaxTokensZeroIsOneFinalMessage) {
  const std::vector<int> prompt = {9, 8, 7, 6, 5};
  const StreamResult got = GenerateAll(stub_.get(), Scored(prompt, 0, 0));
  ASSERT_TRUE(got.status.ok()) << got.status.error_message();
  EXPECT_EQ(got.messages, 1);
  EXPECT_TRUE(got.tokens.empty());
  ASSERT_EQ(got.prompt_logprobs.size(), prompt.size());
  for (size_t i = 1; i < prompt.size(); ++i) {
    EXPECT_EQ(got.prompt_logprobs[i].id(), prompt[i]);
    EXPECT_LT(got.prompt_logprobs[i].logprob(), 0.0f);
    EXPECT_EQ(got.prompt_logprobs[i].top_logprobs_size(), 0);
  }
  ASSERT_TRUE(got.finished.has_value());
  EXPECT_EQ(got.finished->reason(), v1::FINISH_REASON_LENGTH);
  EXPECT_EQ(got.finished->usage().prompt_tokens(), 5);
  EXPECT_EQ(got.finished->usage().completion_tokens(), 0);
  EXPECT_EQ(got.finished->usage().total_tokens(), 5);

  // Without prompt_logprobs nothing is scored and no message carries them.
  const StreamResult plain = GenerateAll(stub_.get(), TokenRequest(prompt, 2));
  ASSERT_TRUE(plain.status.ok());
  EXPECT_TRUE(plain.prompt_logprobs.empty());
  EXPECT_EQ(plain.tokens.size(), 2u);
}

TEST_F(ServerPromptLogprobsTest, BadValuesAreInvalidArgumentNamingTheField) {
  struct Case {
    v1::GenerateRequest request;
    std::string field;
  };
  v1::GenerateRequest zero_without = TokenRequest({1, 2, 3}, 0);
  std::vector<Case> cases = {{Scored({1, 2, 3}, 2, 21), "prompt_logprobs"},
                             {Scored({1, 2, 3}, 2, -1), "prompt_logprobs"},
                             {zero_without, "max_tokens"},
                             {Scored({1, 2, 3}, -2, 1), "max_tokens"}};
  for (const Case& c : cases) {
    const StreamResult got = GenerateAll(stub_.get(), c.request);
    EXPECT_EQ(got.status.error_code(), StatusCode::INVALID_ARGUMENT) << c.field;
    EXPECT_NE(got.status.error_message().find(c.field), std::string::npos)
        << got.status.error_message();
    EXPECT_EQ(got.messages, 0);
  }
}

}  // namespace
}  // namespace morserve::testing
