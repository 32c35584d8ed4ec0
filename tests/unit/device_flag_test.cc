// `--device cpu|cuda`: the flag parses into EngineConfig::device, bad values are errors, and
// asking for the CUDA backend where it cannot run (a build without MORSERVE_CUDA, or no
// Hopper device, as on CI) is a clear error from Engine::Create, never a crash.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "engine/tools/engine_flags.h"
#include "tests/engine_harness.h"

namespace morserve {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

absl::StatusOr<EngineConfig> Parse(const std::vector<std::string>& args) {
  auto flags = Flags::Parse(args, EngineFlagNames(), {});
  if (!flags.ok()) return flags.status();
  return EngineConfigFromFlags(*flags);
}

TEST(DeviceFlagTest, ParsesCpuAndCuda) {
  auto def = Parse({});
  ASSERT_TRUE(def.ok());
  EXPECT_EQ(def->device, Device::kCpu);
  auto cuda = Parse({"--device", "cuda"});
  ASSERT_TRUE(cuda.ok());
  EXPECT_EQ(cuda->device, Device::kCuda);
  auto bad = Parse({"--device", "tpu"});
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("--device: cpu or cuda"));
}

TEST(DeviceFlagTest, CudaWithoutABackendOrDeviceIsAClearError) {
  TinyModelSpec s;
  s.hidden = 256;  // head_dim 64: a shape the CUDA backend takes
  testing::TempDir dir;
  auto weights = testing::MakeModel(s, &dir);
  ASSERT_NE(weights, nullptr);
  EngineConfig cfg;
  cfg.device = Device::kCuda;
  cfg.num_kv_blocks = 64;
  auto engine = Engine::Create(weights, cfg);
  if (engine.ok()) GTEST_SKIP() << "this machine runs the CUDA backend (tests/gpu covers it)";
  EXPECT_THAT(std::string(engine.status().message()), StartsWith("--device cuda: "));
}

}  // namespace
}  // namespace morserve
