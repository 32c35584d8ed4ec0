// The engine's on|off flags (every command that takes the engine flags: serve, generate,
// bench, morserve_grpc_bench): `--prefix-cache` (EngineConfig::prefix_cache) and
// `--cuda-graphs` (EngineConfig::cuda_graphs), both on by default; any other value is an error
// naming the flag. Also `--cuda-gemm auto|cublaslt|fixed` (EngineConfig::cuda_gemm) and
// `--cuda-attention-fold cta|warp` (EngineConfig::cuda_attention_fold).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "engine/tools/engine_flags.h"

namespace morserve {
namespace {

using ::testing::HasSubstr;

absl::StatusOr<EngineConfig> Parse(const std::vector<std::string>& args) {
  auto flags = Flags::Parse(args, EngineFlagNames(), {});
  if (!flags.ok()) return flags.status();
  return EngineConfigFromFlags(*flags);
}

struct OnOffFlag {
  const char* name;
  bool EngineConfig::*field;
};

class OnOffFlagTest : public ::testing::TestWithParam<OnOffFlag> {};

TEST_P(OnOffFlagTest, OnByDefaultAndParsesOnAndOff) {
  const OnOffFlag f = GetParam();
  const std::string flag = std::string("--") + f.name;
  EXPECT_TRUE(EngineFlagNames().count(f.name));
  auto def = Parse({});
  ASSERT_TRUE(def.ok()) << def.status();
  EXPECT_TRUE((*def).*f.field);
  auto on = Parse({flag, "on"});
  ASSERT_TRUE(on.ok()) << on.status();
  EXPECT_TRUE((*on).*f.field);
  auto off = Parse({flag + "=off"});
  ASSERT_TRUE(off.ok()) << off.status();
  EXPECT_FALSE((*off).*f.field);
}

TEST_P(OnOffFlagTest, BadValuesNameTheFlag) {
  const std::string flag = std::string("--") + GetParam().name;
  for (const char* bad : {"yes", "true", "1", "", "ON"}) {
    auto r = Parse({flag, bad});
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_THAT(std::string(r.status().message()), HasSubstr(flag)) << bad;
  }
}

INSTANTIATE_TEST_SUITE_P(Flags, OnOffFlagTest,
                         ::testing::Values(OnOffFlag{"prefix-cache", &EngineConfig::prefix_cache},
                                           OnOffFlag{"cuda-graphs", &EngineConfig::cuda_graphs}),
                         [](const auto& info) {
                           std::string name = info.param.name;
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

TEST(CudaGemmFlagTest, AutoByDefaultParsesEachChoiceAndNamesTheFlagOnBadValues) {
  EXPECT_TRUE(EngineFlagNames().count("cuda-gemm"));
  auto def = Parse({});
  ASSERT_TRUE(def.ok()) << def.status();
  EXPECT_EQ(def->cuda_gemm, CudaGemm::kAuto);
  for (auto [value, want] :
       {std::pair{"auto", CudaGemm::kAuto}, std::pair{"cublaslt", CudaGemm::kCublasLt},
        std::pair{"fixed", CudaGemm::kFixed}}) {
    auto got = Parse({"--cuda-gemm", value});
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->cuda_gemm, want) << value;
  }
  for (const char* bad : {"cublas", "", "FIXED", "on"}) {
    auto r = Parse({"--cuda-gemm", bad});
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_THAT(std::string(r.status().message()), HasSubstr("--cuda-gemm")) << bad;
  }
}

TEST(CudaAttentionFoldFlagTest, CtaByDefaultParsesEachChoiceAndNamesTheFlagOnBadValues) {
  EXPECT_TRUE(EngineFlagNames().count("cuda-attention-fold"));
  auto def = Parse({});
  ASSERT_TRUE(def.ok()) << def.status();
  EXPECT_EQ(def->cuda_attention_fold, CudaAttentionFold::kCta);
  for (auto [value, want] :
       {std::pair{"cta", CudaAttentionFold::kCta}, std::pair{"warp", CudaAttentionFold::kWarp}}) {
    auto got = Parse({"--cuda-attention-fold", value});
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->cuda_attention_fold, want) << value;
  }
  for (const char* bad : {"warps", "", "CTA", "on"}) {
    auto r = Parse({"--cuda-attention-fold", bad});
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_THAT(std::string(r.status().message()), HasSubstr("--cuda-attention-fold")) << bad;
  }
}

}  // namespace
}  // namespace morserve
