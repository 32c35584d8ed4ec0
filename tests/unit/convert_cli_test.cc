// The `morserve convert` command line: success writes a loadable directory, and usage
// mistakes exit 2 with a message naming the flag.
#include <filesystem>

#include "engine/model/weights.h"
#include "engine/tools/mkmodel.h"
#include "gtest/gtest.h"
#include "tests/testutil.h"

namespace morserve {
namespace {

using testing::MorserveBinary;
using testing::RunCommand;
using testing::TempDir;

std::string WriteVanilla(const TempDir& tmp) {
  TinyModelSpec s;
  s.family = "vanilla";
  s.layers = 6;
  s.hidden = 32;
  s.intermediate = 64;
  s.vocab = 64;
  EXPECT_TRUE(WriteTinyModel(s, tmp.File("vanilla")).ok());
  return tmp.File("vanilla");
}

testing::CommandResult Convert(const std::string& args) {
  return RunCommand(MorserveBinary() + " convert " + args + " 2>&1");
}

void ExpectUsageError(const std::string& args, const std::string& needle) {
  const testing::CommandResult r = Convert(args);
  EXPECT_EQ(r.exit_code, 2) << args << "\n" << r.output;
  EXPECT_NE(r.output.find(needle), std::string::npos) << args << "\n" << r.output;
}

TEST(ConvertCli, WritesALoadableRelaxedModel) {
  TempDir tmp;
  const std::string from = WriteVanilla(tmp);
  const std::string out = tmp.File("out");
  const testing::CommandResult r =
      Convert("--from " + from + " --out " + out +
              " --sharing middle_sequence --recursions 2 --init average --lora-rank 4"
              " --lora-alpha 8 --lora-targets q_proj,v_proj");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("wrote " + out), std::string::npos) << r.output;
  auto w = LoadModel(out);
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ((*w)->config.recursion.sharing, Sharing::kMiddleSequence);
  EXPECT_EQ((*w)->config.recursion.lora.rank, 4);
  EXPECT_FLOAT_EQ((*w)->config.recursion.lora.scale(), 2.0f);
  EXPECT_EQ((*w)->config.recursion.lora.targets, (std::vector<std::string>{"q_proj", "v_proj"}));
}

TEST(ConvertCli, UsageMistakesNameTheFlag) {
  TempDir tmp;
  const std::string from = WriteVanilla(tmp);
  const std::string base = "--from " + from + " --out " + tmp.File("out");
  ExpectUsageError(base + " --sharing cycle --recursions 4 --init stepwise", "--recursions: 4 does not divide");
  ExpectUsageError(base + " --sharing cycle --recursions 2 --init upper", "--init");
  ExpectUsageError(base + " --sharing spiral --recursions 2 --init lower", "--sharing");
  ExpectUsageError(base + " --sharing cycle --recursions two --init lower", "--recursions");
  ExpectUsageError(base + " --recursions 2 --init lower", "--sharing is required");
  ExpectUsageError(base + " --sharing cycle --recursions 2 --init lower --lora-rank 2 --lora-alpha 0",
                   "--lora-alpha");
  ExpectUsageError(base + " --sharing cycle --recursions 2 --init lower --norms some", "--norms");
  ExpectUsageError(base + " --sharing cycle --recursions 2 --init lower --bogus 1", "unknown flag --bogus");
  ExpectUsageError("--from-mor-yaml run.yaml --checkpoint x --out y --sharing cycle",
                   "--sharing does not apply to --from-mor-yaml");
  ExpectUsageError("--from-mor-yaml run.yaml --out y", "--checkpoint is required");
  EXPECT_FALSE(std::filesystem::exists(tmp.File("out")));
  const testing::CommandResult help = Convert("--help");
  EXPECT_EQ(help.exit_code, 0);
  EXPECT_NE(help.output.find("--from-mor-yaml"), std::string::npos);
  // A conversion failure (not a usage mistake) exits 1.
  const testing::CommandResult missing =
      Convert("--from " + tmp.File("none") + " --out " + tmp.File("o") +
              " --sharing cycle --recursions 2 --init lower");
  EXPECT_EQ(missing.exit_code, 1) << missing.output;
}

}  // namespace
}  // namespace morserve
