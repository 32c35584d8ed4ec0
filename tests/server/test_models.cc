// The serving tests' tiny models (see test_models.h).
#include "tests/server/test_models.h"

#include <gtest/gtest.h>

#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "engine/model/weights.h"
#include "engine/runtime/engine.h"
#include "tests/engine_harness.h"

namespace morserve::testing {

TinyModelSpec ServingSpec(const std::string& family) {
  TinyModelSpec spec;
  spec.family = family;
  spec.max_pos = 256;
  return spec;
}

TinyModelSpec SlowVanillaSpec() {
  TinyModelSpec slow;
  slow.family = "vanilla";
  slow.hidden = 512;
  slow.intermediate = 2048;
  slow.heads = 8;
  slow.kv_heads = 4;
  slow.layers = 6;
  slow.max_pos = 4096;
  return slow;
}

absl::StatusOr<TinyModelSpec> ReadmeTokenizerSpec(const TempDir& dir, const std::string& family) {
  const std::string tok_dir = dir.File("tokenizer");
  const std::string cmd = MorserveBinary() + " mktokenizer --corpus " + MORSERVE_FIXTURE_DIR +
                          "/../../README.md --vocab-size 400 --out " + tok_dir + " > /dev/null";
  if (std::system(cmd.c_str()) != 0) return absl::InternalError("failed: " + cmd);
  TinyModelSpec spec = F32Spec(family);
  spec.max_pos = 128;
  if (absl::Status s = UseTokenizer(tok_dir, &spec); !s.ok()) return s;
  return spec;
}

absl::StatusOr<int> EosAtGreedyFirstToken(const std::vector<int>& prompt,
                                          const std::string& probe_dir, TinyModelSpec* spec) {
  if (absl::Status s = WriteTinyModel(*spec, probe_dir); !s.ok()) return s;
  auto probe = LoadModel(probe_dir);
  if (!probe.ok()) return probe.status();
  const RunResult run = RunAlone(*probe, Greedy(prompt, 1));
  if (run.tokens.size() != 1) {
    return absl::InternalError(absl::StrCat("the probe gave ", run.tokens.size(), " tokens"));
  }
  spec->eos_token_ids = {run.tokens[0]};
  return run.tokens[0];
}

void ServedTextModel::Start(const TinyModelSpec& spec) {
  model_dir_ = dir_.File("model");
  const absl::Status s = WriteTinyModel(spec, model_dir_);
  ASSERT_TRUE(s.ok()) << s;
  WriteFile(model_dir_ + "/chat_template.jinja", kPlainChatTemplate);
  auto tok = Tokenizer::FromDirectory(model_dir_);
  ASSERT_TRUE(tok.ok()) << tok.status();
  tokenizer_ = *std::move(tok);
  ASSERT_NO_FATAL_FAILURE(StartOrDie(&server_, model_dir_));
}

void ServedTextModel::Stop() {
  if (server_.pid() > 0) EXPECT_EQ(server_.Terminate(), 0) << server_.output();
}

}  // namespace morserve::testing
