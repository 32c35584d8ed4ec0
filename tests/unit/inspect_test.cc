// `morserve inspect --json` on mkmodel outputs of every family, through the built binary.
// Expected numbers are worked out by hand for one tiny config:
//   hidden 16, heads 4, kv heads 2 (head_dim 4, kv_dim 8), intermediate 32, vocab 32.
//   one layer: norms 2*16 + q 16*16 + k,v 2*8*16 + o 16*16 + gate,up,down 3*32*16 = 2336
//   globals:   embed 32*16 + final norm 16 + lm_head 32*16 = 1040
//   KV: 2 (K, V) * kv_dim 8 * 2 bytes = 32 bytes per token per cache slot.
#include <string>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testutil.h"

namespace morserve {
namespace {

using nlohmann::json;

constexpr int64_t kLayer = 2336;
constexpr int64_t kGlobals = 1040;
constexpr int64_t kAttention = 768;  // q, k, v, o of one layer
constexpr int64_t kKvSlot = 32;

json Inspect(const std::string& family, const std::string& extra = "") {
  testing::TempDir dir;
  const std::string bin = testing::MorserveBinary();
  auto mk = testing::RunCommand(bin + " mkmodel --family " + family + " --out " + dir.path() +
                                " --hidden 16 --heads 4 --kv-heads 2 --intermediate 32" +
                                " --vocab 32 " + extra);
  EXPECT_EQ(mk.exit_code, 0) << mk.output;
  auto r = testing::RunCommand(bin + " inspect --json " + dir.path() + " 2>/dev/null");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  json j = json::parse(r.output, nullptr, false);
  EXPECT_FALSE(j.is_discarded()) << r.output;
  return j;
}

struct Expected {
  const char* family;
  const char* extra;
  int64_t stored;
  int64_t unrolled;
  int64_t checkpoint;
  int cache_slots;
  size_t deduplicated;
  size_t untied;
};

TEST(Inspect, EveryFamilyByHand) {
  const Expected cases[] = {
      // 4 unique layers.
      {"vanilla", "", kGlobals + 4 * kLayer, kGlobals + 4 * kLayer, kGlobals + 4 * kLayer, 4, 0, 0},
      // 6 unrolled layers, K = 2 stored once; 9 tensors per layer deduplicated.
      {"recursive-cycle", "", kGlobals + 2 * kLayer, kGlobals + 6 * kLayer, kGlobals + 6 * kLayer,
       6, 18, 0},
      {"recursive-sequence", "", kGlobals + 2 * kLayer, kGlobals + 6 * kLayer,
       kGlobals + 6 * kLayer, 6, 18, 0},
      // 8 unrolled: 1 + (2 x 3) + 1.
      {"recursive-middle-cycle", "", kGlobals + 4 * kLayer, kGlobals + 8 * kLayer,
       kGlobals + 8 * kLayer, 8, 18, 0},
      {"recursive-middle-sequence", "", kGlobals + 4 * kLayer, kGlobals + 8 * kLayer,
       kGlobals + 8 * kLayer, 8, 18, 0},
      // Attention kept 3 times per layer: 2 extra copies of 768.
      {"recursive-untied-attn", "", kGlobals + 2 * (kLayer + 2 * kAttention), kGlobals + 6 * kLayer,
       kGlobals + 6 * kLayer, 6, 10, 8},
      // LoRA rank 4 on q (4*16 + 16*4 = 128) and v (4*16 + 8*4 = 96), per loop and layer.
      {"relaxed-lora", "", kGlobals + 2 * kLayer + 6 * 224, kGlobals + 6 * kLayer,
       kGlobals + 6 * kLayer + 6 * 224, 6, 18, 0},
      // Three linear routers [1, 16].
      {"mor-ec", "", kGlobals + 4 * kLayer + 48, kGlobals + 8 * kLayer, kGlobals + 8 * kLayer + 48,
       8, 18, 0},
      // Plus three aux routers; KV shared: 1 + 2 + 1 slots.
      {"mor-ec", "--aux-router --kv shared", kGlobals + 4 * kLayer + 96, kGlobals + 8 * kLayer,
       kGlobals + 8 * kLayer + 96, 4, 18, 0},
      // mlp routers: [32, 16] + [1, 32] per loop; cycle sharing over 6 layers.
      {"mor-ec", "--router mlp --sharing cycle --layers 6", kGlobals + 2 * kLayer + 3 * 544,
       kGlobals + 6 * kLayer, kGlobals + 6 * kLayer + 3 * 544, 6, 18, 0},
      // Router [3, 16]; the router_bias buffer [3] is in the files, not a parameter.
      {"mor-tc", "", kGlobals + 4 * kLayer + 48, kGlobals + 8 * kLayer,
       kGlobals + 8 * kLayer + 48 + 3, 8, 18, 0},
      {"early-exit", "", kGlobals + 4 * kLayer, kGlobals + 8 * kLayer, kGlobals + 8 * kLayer, 8, 18,
       0},
      {"recurrent", "", kGlobals + 4 * kLayer, kGlobals + 4 * kLayer, kGlobals + 4 * kLayer, 4, 0,
       0},
      // Tied embeddings: no lm_head.
      {"vanilla", "--tie-embeddings", kGlobals - 512 + 4 * kLayer, kGlobals - 512 + 4 * kLayer,
       kGlobals - 512 + 4 * kLayer, 4, 0, 0},
      // Only loop 0's copies stored.
      {"recursive-cycle", "--first-copy-only", kGlobals + 2 * kLayer, kGlobals + 6 * kLayer,
       kGlobals + 2 * kLayer, 6, 18, 0},
      // Nanbeige: 3 stored layers looped twice, one copy in the checkpoint, KV per (loop, layer).
      {"nanbeige", "--recursions 2 --layers 6", kGlobals + 3 * kLayer, kGlobals + 6 * kLayer,
       kGlobals + 3 * kLayer, 6, 27, 0},
  };
  for (const Expected& e : cases) {
    SCOPED_TRACE(std::string(e.family) + " " + e.extra);
    const json j = Inspect(e.family, e.extra);
    ASSERT_TRUE(j.is_object());
    EXPECT_EQ(j["parameters"]["stored"].get<int64_t>(), e.stored);
    EXPECT_EQ(j["parameters"]["unrolled_equivalent"].get<int64_t>(), e.unrolled);
    EXPECT_EQ(j["parameters"]["checkpoint"].get<int64_t>(), e.checkpoint);
    EXPECT_EQ(j["memory_bf16_bytes"].get<int64_t>(), 2 * e.stored);
    EXPECT_EQ(j["kv"]["bytes_per_token_per_slot"].get<int64_t>(), kKvSlot);
    EXPECT_EQ(j["kv"]["cache_slots"].get<int>(), e.cache_slots);
    EXPECT_EQ(j["kv"]["bytes_per_token"].get<int64_t>(), kKvSlot * e.cache_slots);
    EXPECT_EQ(j["dedup"]["deduplicated"].size(), e.deduplicated);
    EXPECT_EQ(j["dedup"]["untied"].size(), e.untied);
    EXPECT_FALSE(j["plan"]["describe"].get<std::string>().empty());
  }
}

TEST(Inspect, NanbeigeSaysItsModelTypeAndTheNormBetweenLoops) {
  const json j = Inspect("nanbeige", "--recursions 2 --layers 6");
  ASSERT_TRUE(j.is_object());
  EXPECT_EQ(j["config"]["model_type"], "nanbeige");
  EXPECT_TRUE(j["config"]["norm_between_loops"].get<bool>());
  EXPECT_EQ(j["plan"]["looped_segment"].get<int>(), 0);
  testing::TempDir dir;
  const std::string bin = testing::MorserveBinary();
  auto mk = testing::RunCommand(bin + " mkmodel --family nanbeige --recursions 2 --layers 4 --out " + dir.path());
  ASSERT_EQ(mk.exit_code, 0) << mk.output;
  auto text = testing::RunCommand(bin + " inspect " + dir.path());
  ASSERT_EQ(text.exit_code, 0) << text.output;
  EXPECT_NE(text.output.find("(model_type nanbeige; model.norm between loops)"), std::string::npos) << text.output;
  EXPECT_FALSE(Inspect("vanilla")["config"]["norm_between_loops"].get<bool>());
}

TEST(Inspect, UntiedAttentionListsPerLoopWeights) {
  const json j = Inspect("recursive-untied-attn");
  ASSERT_TRUE(j.is_object());
  for (const json& line : j["dedup"]["untied"]) {
    EXPECT_NE(line.get<std::string>().find("self_attn."), std::string::npos) << line;
    EXPECT_NE(line.get<std::string>().find("3 copies differ"), std::string::npos) << line;
  }
  int per_loop = 0, shared = 0;
  for (const json& w : j["weights"]) {
    const std::string t = w["tensor"];
    const bool attention = t == "q_proj" || t == "k_proj" || t == "v_proj" || t == "o_proj";
    EXPECT_EQ(w["copies"].get<int>(), attention ? 3 : 1) << t;
    (attention ? per_loop : shared)++;
  }
  EXPECT_EQ(per_loop, 8);
  EXPECT_EQ(shared, 10);
  EXPECT_EQ(j["plan"]["looped_segment"].get<int>(), 0);
  EXPECT_EQ(j["plan"]["num_unrolled_layers"].get<int>(), 6);
  EXPECT_EQ(j["config"]["recursion"]["sharing"], "cycle");
}

TEST(Inspect, LoraAndRoutersAreReported) {
  json j = Inspect("relaxed-lora", "--lora-rank 2");
  ASSERT_TRUE(j.is_object());
  for (const json& w : j["weights"]) {
    const std::string t = w["tensor"];
    EXPECT_EQ(w["lora"].get<int>(), t == "q_proj" || t == "v_proj" ? 3 : 0) << t;
  }
  j = Inspect("mor-tc", "--router-bias 0.5");
  ASSERT_TRUE(j.is_object());
  EXPECT_TRUE(j["routers"]["token_choice"].get<bool>());
  EXPECT_EQ(j["routers"]["token_choice_bias"], json({0.0, 0.5, 1.0}));
  j = Inspect("mor-ec", "--router mlp --aux-router");
  EXPECT_EQ(j["routers"]["expert"].get<int>(), 3);
  EXPECT_EQ(j["routers"]["aux"].get<int>(), 3);
  EXPECT_EQ(j["routers"]["expert_arch"], "mlp");
}

TEST(Inspect, TextOutputAndErrors) {
  testing::TempDir dir;
  const std::string bin = testing::MorserveBinary();
  ASSERT_EQ(
      testing::RunCommand(bin + " mkmodel --family recursive-cycle --out " + dir.path()).exit_code,
      0);
  auto text = testing::RunCommand(bin + " inspect " + dir.path());
  ASSERT_EQ(text.exit_code, 0) << text.output;
  EXPECT_NE(text.output.find("segment 0: 2 layer(s) x 3 loops"), std::string::npos) << text.output;
  EXPECT_NE(text.output.find("3 copies equal"), std::string::npos) << text.output;
  EXPECT_NE(text.output.find("bytes per token"), std::string::npos) << text.output;

  // Usage errors exit 2; load errors exit 1 with the loader's message.
  testing::TempDir broken;
  auto usage = testing::RunCommand(bin + " inspect");
  EXPECT_EQ(usage.exit_code, 2);
  auto missing = testing::RunCommand(bin + " inspect " + broken.path());
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_NE(missing.output.find("config.json"), std::string::npos) << missing.output;
}

}  // namespace
}  // namespace morserve
