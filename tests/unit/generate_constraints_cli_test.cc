// `morserve generate --logit-bias / --min-tokens / --allowed-ids`, run as a user runs it: a
// +100 bias makes every token that id, allowed ids hold the output inside the set, min_tokens
// holds back an eos that is the greedy first token, bad values exit 2 naming the field.
#include <gtest/gtest.h>

#include <algorithm>

#include "engine/tools/mkmodel.h"
#include "nlohmann/json.hpp"
#include "tests/testutil.h"

namespace morserve {
namespace {

using nlohmann::json;

std::string WriteModel(testing::TempDir& dir, const std::string& name, std::vector<int> eos) {
  TinyModelSpec spec;
  spec.family = "vanilla";
  spec.eos_token_ids = std::move(eos);
  const std::string path = dir.File(name);
  EXPECT_TRUE(WriteTinyModel(spec, path).ok());
  return path;
}

std::vector<int> Tokens(const testing::CommandResult& r) {
  std::vector<int> ids;
  const json out = json::parse(r.output, nullptr, false);
  if (out.is_discarded()) return ids;
  for (const json& t : out["tokens"]) ids.push_back(t["id"].get<int>());
  return ids;
}

testing::CommandResult Generate(const std::string& model, const std::string& extra) {
  return testing::RunCommand(testing::MorserveBinary() + " generate --model " + model +
                             " --prompt-ids 5,9,14,3 --json " + extra);
}

TEST(GenerateConstraintsCliTest, BiasAllowedIdsAndMinTokens) {
  testing::TempDir dir;
  const std::string model = WriteModel(dir, "plain", {2});
  auto r = Generate(model, "--max-tokens 5 --ignore-eos --logit-bias 77:100,3:-2.5");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(Tokens(r), std::vector<int>(5, 77));
  r = Generate(model, "--max-tokens 6 --ignore-eos --allowed-ids 40,41,200");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  ASSERT_EQ(Tokens(r).size(), 6u);
  for (int t : Tokens(r)) EXPECT_TRUE(t == 40 || t == 41 || t == 200) << t;

  // The same weights with eos = the greedy first token.
  r = Generate(model, "--max-tokens 1 --ignore-eos");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const int first = Tokens(r).at(0);
  const std::string eos_model = WriteModel(dir, "eos", {first});
  r = Generate(eos_model, "--max-tokens 8");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(Tokens(r), std::vector<int>{first});
  r = Generate(eos_model, "--max-tokens 8 --min-tokens 3");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::vector<int> held = Tokens(r);
  ASSERT_GE(held.size(), 3u) << r.output;
  for (int t = 0; t < 3; ++t) EXPECT_NE(held[t], first);
}

TEST(GenerateConstraintsCliTest, BadValuesExit2NamingTheField) {
  testing::TempDir dir;
  const std::string model = WriteModel(dir, "plain", {2});
  for (const auto& [flags, field] : std::vector<std::pair<std::string, std::string>>{
           {"--logit-bias 5:101", "logit_bias"},
           {"--logit-bias 300:1", "logit_bias"},
           {"--logit-bias 5", "--logit-bias"},
           {"--logit-bias x:1", "--logit-bias"},
           {"--allowed-ids 1,256", "allowed_token_ids"},
           {"--allowed-ids a", "--allowed-ids"},
           {"--min-tokens 5 --max-tokens 4", "min_tokens"},
           {"--min-tokens -1", "min_tokens"}}) {
    const auto r = Generate(model, flags);
    EXPECT_EQ(r.exit_code, 2) << flags << ": " << r.output;
    EXPECT_NE(r.output.find(field), std::string::npos) << flags << ": " << r.output;
  }
}

}  // namespace
}  // namespace morserve
