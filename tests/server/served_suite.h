// The gtest fixture base of a test suite on one text-taking tiny model served for real for
// the whole suite: `Served` is ServedTextModel (the server) or GatewayStack (the gateway in
// front too). The suite's SetUpTestSuite calls StartSuite (the README tokenizer, the spec
// adjusted by the suite, the processes started); TearDownTestSuite stops them (each must
// exit 0); every test gets a gRPC stub on the server. `Suite` (CRTP) gives each suite its
// own processes.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tests/server/server_process.h"
#include "tests/server/test_models.h"

namespace morserve::testing {

template <class Suite, class Served>
class ServedSuite : public ::testing::Test {
 protected:
  // An fp32 `family` model on the README tokenizer (ReadmeTokenizerSpec), changed by
  // `adjust` (given the spec and the suite's files), then served. Fatal test failures.
  static void StartSuite(const std::string& family,
                         const std::function<void(TinyModelSpec*, const TempDir&)>& adjust = {}) {
    served_ = new Served();
    absl::StatusOr<TinyModelSpec> spec = ReadmeTokenizerSpec(served_->dir(), family);
    ASSERT_TRUE(spec.ok()) << spec.status();
    if (adjust) ASSERT_NO_FATAL_FAILURE(adjust(&*spec, served_->dir()));
    ASSERT_NO_FATAL_FAILURE(served_->Start(*spec));
  }
  // StartSuite with eos set to the greedy first token the model gives for `prompt`
  // (EosAtGreedyFirstToken): that token in *first, the vocabulary size in *vocab.
  static void StartSuiteWithEosAt(const std::string& family, const std::vector<int>& prompt,
                                  int* first, int* vocab) {
    StartSuite(family, [&](TinyModelSpec* spec, const TempDir& dir) {
      const absl::StatusOr<int> token = EosAtGreedyFirstToken(prompt, dir.File("probe"), spec);
      ASSERT_TRUE(token.ok()) << token.status();
      *first = *token;
      *vocab = spec->vocab;
    });
  }
  static void TearDownTestSuite() {
    if (served_ != nullptr) served_->Stop();
    delete served_;
    served_ = nullptr;
  }
  void SetUp() override {
    ASSERT_NE(served_, nullptr);
    stub_ = served_->server().Stub();
  }

  static inline Served* served_ = nullptr;
  std::unique_ptr<v1::Morserve::Stub> stub_;
};

}  // namespace morserve::testing
