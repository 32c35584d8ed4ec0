// `--prefix-cache on|off` (every command that takes the engine flags: serve, generate, bench,
// morserve_grpc_bench): on by default, parsed into EngineConfig::prefix_cache; any other
// value is an error naming the flag.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "engine/tools/engine_flags.h"

namespace morserve {
namespace {

using ::testing::HasSubstr;

absl::StatusOr<EngineConfig> Parse(const std::vector<std::string>& args) {
  auto flags = Flags::Parse(args, EngineFlagNames(), {});
  if (!flags.ok()) return flags.status();
  return EngineConfigFromFlags(*flags);
}

TEST(PrefixCacheFlagTest, OnByDefaultAndParsesOnAndOff) {
  EXPECT_TRUE(EngineFlagNames().count("prefix-cache"));
  auto def = Parse({});
  ASSERT_TRUE(def.ok()) << def.status();
  EXPECT_TRUE(def->prefix_cache);
  auto on = Parse({"--prefix-cache", "on"});
  ASSERT_TRUE(on.ok()) << on.status();
  EXPECT_TRUE(on->prefix_cache);
  auto off = Parse({"--prefix-cache=off"});
  ASSERT_TRUE(off.ok()) << off.status();
  EXPECT_FALSE(off->prefix_cache);
}

TEST(PrefixCacheFlagTest, BadValuesNameTheFlag) {
  for (const char* bad : {"yes", "true", "1", "", "ON"}) {
    auto r = Parse({"--prefix-cache", bad});
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_THAT(std::string(r.status().message()), HasSubstr("--prefix-cache")) << bad;
  }
}

}  // namespace
}  // namespace morserve
